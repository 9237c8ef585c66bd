//! The ESP files of an encrypted data device (issue 18), beside the data they unlock:
//!
//! ```text
//!   <root>/esp/data-local-half      local half of the data key (datafs encoding)   0600
//!   <root>/esp/data-join-key.der    join key (Ed25519 PKCS#8): proves the node      0600
//!                                   before its data (and node key) is unlocked
//!   <root>/esp/data-cluster-half    the cluster half, only until the cluster keeps   0600
//!                                   it (registration; removed once sealed)
//!   <root>/esp/data-bootstrap-cluster   a sole member only (bootstrapped, restored or     0600
//!                                   recovered): the cluster name of its data marker
//!                                   (a first node's is made before the cluster CA
//!                                   exists); while it exists the cluster half stays in
//!                                   the ESP until another member keeps it (`datapeers`)
//!   <root>/esp/data-crl.der         the newest cluster CRL seen (a copy of              0600
//!                                   data/node/crl.der): curators are checked against
//!                                   it while data/ is locked (`crlfetch`)
//!   <root>/esp/data-trust.pem       after a CA rotation, the cluster CAs trusted and    0600
//!                                   their CRLs (a copy of data/node/trust.pem), for
//!                                   the same checks
//!   <root>/datafs/                  where the data file system is mounted; its
//!                                   encrypted directory is bind-mounted on data/
//! ```
//! A leaf: paths and files only (on `storage`); what to do with them is `datadev`'s.

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use identity::NodeKey;

use crate::disk::storage::{Root, write_atomic};

pub fn local_half(root: &Root) -> PathBuf {
    root.esp().join("data-local-half")
}
pub fn join_key(root: &Root) -> PathBuf {
    root.esp().join("data-join-key.der")
}
pub fn pending_half(root: &Root) -> PathBuf {
    root.esp().join("data-cluster-half")
}
pub fn crl_copy(root: &Root) -> PathBuf {
    root.esp().join("data-crl.der")
}
/// A copy of `data/node/trust.pem` (the cluster CAs trusted, after a CA rotation): the
/// locked unlock checks curators against it.
pub fn trust_copy(root: &Root) -> PathBuf {
    root.esp().join("data-trust.pem")
}
pub fn bootstrap_cluster(root: &Root) -> PathBuf {
    root.esp().join("data-bootstrap-cluster")
}
/// Whether this node bootstrapped its cluster on an encrypted data device.
pub fn is_bootstrap(root: &Root) -> bool {
    bootstrap_cluster(root).exists()
}

/// The marker's cluster name of a first node: created once (from the owner's key), read
/// on every later start.
pub fn bootstrap_cluster_name(root: &Root, owner_key: &[u8]) -> Result<String> {
    let path = bootstrap_cluster(root);
    match std::fs::read_to_string(&path) {
        Ok(name) => Ok(name.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let digest = ring::digest::digest(&ring::digest::SHA256, owner_key);
            let name = format!("boot-{}", hex::encode(&digest.as_ref()[..8]));
            write_atomic(&path, name.as_bytes())
                .context("saving the data marker's cluster name")?;
            Ok(name)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Keeps the node's own cluster half in the ESP with the marker's cluster name, as a
/// first node does (a restored or recovered sole member): later starts read both, and
/// the half stays until another member keeps it (`datapeers::confirm_held_elsewhere`).
/// A name already kept must be `cluster` (the marker on the device names it).
pub fn keep_own_half(root: &Root, cluster: &str, half: &datafs::Half) -> Result<()> {
    let path = bootstrap_cluster(root);
    if path.exists() {
        let kept = bootstrap_cluster_name(root, &[])?;
        if kept != cluster {
            bail!(
                "{} names data cluster {kept}, not {cluster}",
                path.display()
            );
        }
    } else {
        write_atomic(&path, cluster.as_bytes()).context("saving the data marker's cluster name")?;
    }
    write_atomic(&pending_half(root), &half.encode()).context("saving the cluster half")
}

pub fn fs_dir(root: &Root) -> PathBuf {
    root.root.join("datafs")
}

/// The keys of a node that has not joined yet.
pub struct Fresh {
    pub join: NodeKey,
    pub local: datafs::Half,
    pub cluster: datafs::Half,
}

/// The join key in the ESP; refused by name when missing or unreadable.
pub fn read_join_key(root: &Root) -> Result<NodeKey> {
    let path = join_key(root);
    let der = std::fs::read(&path).with_context(|| {
        format!(
            "reading the data device's join key {} (a missing or replaced ESP?)",
            path.display()
        )
    })?;
    NodeKey::from_pkcs8(&der)
        .with_context(|| format!("the join key {} is corrupted", path.display()))
}

/// The cluster half kept until the cluster has it, if present.
pub fn read_pending(root: &Root) -> Result<Option<datafs::Half>> {
    let path = pending_half(root);
    match std::fs::read(&path) {
        Ok(bytes) => datafs::Half::decode(&bytes)
            .map(Some)
            .with_context(|| format!("the cluster half {} is unusable", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The keys of a fresh node: all three created when none exists, all three read when
/// an interrupted start left them; a partial set is refused, naming what is missing.
pub fn load_or_create(root: &Root) -> Result<Fresh> {
    let paths = [local_half(root), join_key(root), pending_half(root)];
    let present: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
    if present.iter().all(|p| !p) {
        let join = NodeKey::generate().context("generating the data join key")?;
        let cluster = datafs::Half::generate().context("generating the cluster half")?;
        // The cluster half and join key first: the local half's presence means "all
        // three were written".
        write_atomic(&pending_half(root), &cluster.encode()).context("saving the cluster half")?;
        write_atomic(&join_key(root), join.pkcs8_der()).context("saving the data join key")?;
        let local = datafs::halffile::create(&local_half(root))?;
        return Ok(Fresh {
            join,
            local,
            cluster,
        });
    }
    if let Some(missing) = paths.iter().zip(&present).find(|(_, p)| !**p) {
        bail!(
            "{} is missing while other data device keys are in {}: the ESP is incomplete \
             (restore it, or start over on a new root with --data-device-format)",
            missing.0.display(),
            root.esp().display()
        );
    }
    Ok(Fresh {
        join: read_join_key(root)?,
        local: datafs::halffile::load(&local_half(root))?,
        cluster: read_pending(root)?
            .with_context(|| format!("{} vanished while starting", pending_half(root).display()))?,
    })
}

/// RegisterNode's data fields: the join key and the cluster half, when this node has an
/// encrypted data device (its ESP holds both).
pub fn registration(root: &Root) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    if !join_key(root).exists() {
        return Ok(None);
    }
    let Some(half) = read_pending(root)? else {
        return Ok(None);
    };
    Ok(Some((
        read_join_key(root)?.public_key().to_vec(),
        half.encode(),
    )))
}

/// Removes the cluster half from the ESP once the cluster keeps it (the node sealed).
pub fn forget_pending(root: &Root) -> Result<()> {
    let path = pending_half(root);
    match std::fs::remove_file(&path) {
        Ok(()) => {
            tracing::info!(
                "the cluster keeps this node's cluster half now; removed it from the ESP"
            );
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// After a decommission: the ESP's keys go (without the cluster's half they are useless,
/// but nothing of the node's data key is kept).
pub fn erase(root: &Root) -> Result<()> {
    for path in [
        local_half(root),
        join_key(root),
        pending_half(root),
        bootstrap_cluster(root),
        crl_copy(root),
        trust_copy(root),
        root.esp().join("data-peers"),
    ] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sole_member_keeps_its_half_under_the_markers_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().to_path_buf());
        privatefs::ensure_private_dir(&root.esp()).unwrap();
        let half = datafs::Half::generate().unwrap();
        keep_own_half(&root, "ca-0123456789abcdef", &half).unwrap();
        assert!(is_bootstrap(&root));
        assert_eq!(
            bootstrap_cluster_name(&root, b"ignored").unwrap(),
            "ca-0123456789abcdef"
        );
        assert_eq!(
            read_pending(&root).unwrap().unwrap().encode(),
            half.encode()
        );
        // Again with the same name (a second recover): kept; another name: refused.
        keep_own_half(&root, "ca-0123456789abcdef", &half).unwrap();
        let e = keep_own_half(&root, "boot-0000000000000000", &half)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("boot-0000000000000000") && e.contains("ca-0123456789abcdef"),
            "{e}"
        );
    }

    #[test]
    fn a_first_node_keeps_its_marker_name_and_its_peers_go_with_the_keys() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().to_path_buf());
        privatefs::ensure_private_dir(&root.esp()).unwrap();
        assert!(!is_bootstrap(&root));
        let name = bootstrap_cluster_name(&root, b"owner one").unwrap();
        assert!(name.starts_with("boot-") && name.len() == 5 + 16, "{name}");
        assert!(is_bootstrap(&root));
        // Later starts read it, whatever key they are handed.
        assert_eq!(bootstrap_cluster_name(&root, &[]).unwrap(), name);
        std::fs::write(root.esp().join("data-peers"), b"x").unwrap();
        load_or_create(&root).unwrap();
        erase(&root).unwrap();
        assert!(!is_bootstrap(&root));
        assert!(!root.esp().join("data-peers").exists());
        assert!(!local_half(&root).exists());
    }
}
