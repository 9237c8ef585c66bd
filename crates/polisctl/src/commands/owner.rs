//! `cluster owner rotate`: a new owner key replaces the old one, every owner certificate
//! issued so far is revoked, and the config directory holds the new key and a new
//! owner certificate.
//!
//! ```text
//!   new key → CFG/owner-key.next.pem (0600, before anything changes in the cluster)
//!     → Management.RotateOwner(new public key)   (the cluster now knows only the new key)
//!     → AAA.Escrow with the new key → owner certificate
//!     → CFG/owner-key.pem, CFG/owner.pem replaced → owner-key.next.pem removed (last)
//! ```
//! Interrupted anywhere, running it again finishes the job: a leftover
//! `owner-key.next.pem` is tried first, and when the cluster already accepts it the
//! rotation is only completed locally. May not format tables.

use std::path::Path;

use anyhow::{Context, Result};
use identity::NodeKey;

use crate::config_dir::{
    endpoints, load_owner_key, owner_certificate_path, owner_key_path, pinned_cas, write_pem,
    write_private,
};
use crate::session::{escrow, owner_session};

fn next_key_path(config: &Path) -> std::path::PathBuf {
    config.join("owner-key.next.pem")
}

fn write_key(path: &Path, key: &NodeKey) -> Result<()> {
    let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", key.pkcs8_der()));
    write_private(path, pem.as_bytes())
        .with_context(|| format!("writing owner key to {}", path.display()))
}

/// `cluster owner rotate`.
pub(crate) async fn rotate(config: &Path, raw_endpoints: &[String]) -> Result<()> {
    let curators = endpoints(config, raw_endpoints)?;
    let ca = pinned_cas(config)?;
    let next_path = next_key_path(config);
    let resumed = next_path.exists();
    let new_key = if resumed {
        load_owner_key(&next_path)?
    } else {
        let key = NodeKey::generate().context("generating the new owner key")?;
        write_key(&next_path, &key)?;
        key
    };
    // An interrupted rotation the cluster already took: only the local half is missing.
    let done_before = if resumed {
        escrow(
            &curators,
            &ca,
            &new_key,
            &next_path,
            "escrowing for the new owner key",
        )
        .await
        .ok()
    } else {
        None
    };
    let (revoked, escrowed) = match done_before {
        Some(escrowed) => (None, escrowed),
        None => {
            let session = owner_session(config, raw_endpoints).await?;
            let revoked = session.rotate_owner(new_key.public_key().to_vec()).await?;
            let escrowed = escrow(
                &curators,
                &ca,
                &new_key,
                &next_path,
                "escrowing a certificate for the new owner key",
            )
            .await?;
            (Some(revoked), escrowed)
        }
    };
    write_key(&owner_key_path(config), &new_key)?;
    write_pem(
        &owner_certificate_path(config),
        "CERTIFICATE",
        &escrowed.owner_certificate,
    )?;
    std::fs::remove_file(&next_path)
        .with_context(|| format!("removing {}", next_path.display()))?;
    match revoked {
        Some(n) => println!(
            "Replaced the owner key ({}); {n} earlier owner certificate(s) revoked. Other copies \
             of the old key or certificates no longer work.",
            owner_key_path(config).display()
        ),
        None => println!(
            "Finished an interrupted owner key rotation ({}).",
            owner_key_path(config).display()
        ),
    }
    Ok(())
}
