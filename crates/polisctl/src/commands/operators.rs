//! `key` and `cluster operator add|list|remove`: an operator makes its own key (`key`
//! prints its public half for an admin), an admin adds it with a role, the operator
//! then takes its certificate with `takeownership`.
//!
//! ```text
//!   operator: polisctl key [--out ada.pub]      CFG/owner-key.pem (made if absent) →
//!                                               PEM SubjectPublicKeyInfo (RFC 8410)
//!   admin:    polisctl cluster operator add ada --role operator --key-file ada.pub
//!   operator: polisctl takeownership            AAA.Escrow → certificate marked with
//!                                               the role, saved as CFG/owner.pem
//!   admin:    polisctl cluster operator remove ada   (record gone, certificates revoked)
//! ```
//! May not format results itself (`render::operators` does).

use std::path::Path;

use anyhow::{Context, Result, bail};
use proto::api;

use crate::config_dir::ensure_owner_key;
use crate::output::Format;
use crate::render::operators::print_operators;
use crate::session::owner_session;

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the key's 32 bytes
/// follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// `public_key` as a PEM "PUBLIC KEY" (SubjectPublicKeyInfo), as openssl writes it.
pub(crate) fn public_key_pem(public_key: &[u8; 32]) -> String {
    let mut der = ED25519_SPKI_PREFIX.to_vec();
    der.extend_from_slice(public_key);
    pem::encode(&pem::Pem::new("PUBLIC KEY", der))
}

/// The raw Ed25519 key in a PEM "PUBLIC KEY" text; errors say what is wrong with it.
pub(crate) fn parse_public_key_pem(text: &str) -> Result<[u8; 32], String> {
    let parsed = pem::parse(text).map_err(|e| format!("not a PEM file ({e})"))?;
    if parsed.tag() != "PUBLIC KEY" {
        return Err(format!(
            "it holds a {}, not a PUBLIC KEY (`polisctl key` prints one)",
            parsed.tag()
        ));
    }
    let der = parsed.contents();
    match der.strip_prefix(&ED25519_SPKI_PREFIX[..]) {
        Some(key) => key
            .try_into()
            .map_err(|_| "the Ed25519 key is not 32 bytes".to_string()),
        None => Err("it is not an Ed25519 public key".into()),
    }
}

/// `key [--out FILE]`: the config directory's key (made when absent), its public half
/// printed or written to FILE.
pub(crate) fn key(config: &Path, out: Option<&Path>) -> Result<()> {
    let key = ensure_owner_key(config)?;
    let text = public_key_pem(&key.public_key());
    match out {
        None => print!("{text}"),
        Some(path) => {
            std::fs::write(path, &text)
                .with_context(|| format!("writing the public key to {}", path.display()))?;
            eprintln!(
                "wrote the public key to {}: give it to a cluster admin",
                path.display()
            );
        }
    }
    Ok(())
}

fn check_name(name: &str) -> Result<()> {
    proto::operators::validate_name(name).map_err(anyhow::Error::msg)
}

/// `cluster operator add NAME --role ROLE --key-file FILE`.
pub(crate) async fn add(
    config: &Path,
    raw_endpoints: &[String],
    name: &str,
    role: &str,
    key_file: &Path,
) -> Result<()> {
    check_name(name)?;
    if pki::OperatorRole::from_name(role).is_none() {
        bail!("unknown role {role:?}: want reader, operator or admin");
    }
    let text = std::fs::read_to_string(key_file)
        .with_context(|| format!("reading the key file {}", key_file.display()))?;
    let public_key = parse_public_key_pem(&text)
        .map_err(|e| anyhow::anyhow!("key file {}: {e}", key_file.display()))?;
    let request = api::AddOperatorRequest {
        name: name.to_string(),
        role: role.to_string(),
        public_key: public_key.to_vec(),
    };
    let response = owner_session(config, raw_endpoints)
        .await?
        .management(&format!("adding operator {name}"), |mut m| {
            let request = request.clone();
            async move { m.add_operator(request).await }
        })
        .await?;
    if response.revoked > 0 {
        eprintln!(
            "revoked {} certificate(s) an earlier operator named {name} still held",
            response.revoked
        );
    }
    println!(
        "Added operator {name} ({role}). They sign in with `polisctl takeownership` using the key \
         they made."
    );
    Ok(())
}

/// `cluster operator list`.
pub(crate) async fn list(config: &Path, raw_endpoints: &[String], format: Format) -> Result<()> {
    let listed = owner_session(config, raw_endpoints)
        .await?
        .management("listing operators", |mut m| async move {
            m.list_operators(api::ListOperatorsRequest {}).await
        })
        .await?;
    print_operators(&listed.operators, &listed.unfinished_removals, format);
    Ok(())
}

/// `cluster operator remove NAME`.
pub(crate) async fn remove(config: &Path, raw_endpoints: &[String], name: &str) -> Result<()> {
    check_name(name)?;
    let request = api::RemoveOperatorRequest {
        name: name.to_string(),
    };
    let response = owner_session(config, raw_endpoints)
        .await?
        .management(&format!("removing operator {name}"), |mut m| {
            let request = request.clone();
            async move { m.remove_operator(request).await }
        })
        .await?;
    println!(
        "Removed operator {name}; {} certificate(s) revoked. Their connections end.",
        response.revoked
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8410, section 10.1: an Ed25519 public key as openssl writes it.
    const RFC8410: &str = "-----BEGIN PUBLIC KEY-----\n\
        MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n\
        -----END PUBLIC KEY-----\n";

    #[test]
    fn public_keys_read_and_write_as_openssl_does() {
        let key = parse_public_key_pem(RFC8410).unwrap();
        assert_eq!(
            key.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "19bf44096984cdfe8541bac167dc3b96c85086aa30b6b6cb0c5c38ad703166e1"
        );
        assert_eq!(
            public_key_pem(&key).replace("\r\n", "\n").trim(),
            RFC8410.trim()
        );
    }

    #[test]
    fn bad_key_files_are_named() {
        assert!(parse_public_key_pem("hello").unwrap_err().contains("PEM"));
        let private = pem::encode(&pem::Pem::new("PRIVATE KEY", vec![0; 48]));
        assert!(
            parse_public_key_pem(&private)
                .unwrap_err()
                .contains("PRIVATE KEY")
        );
        let rsa = pem::encode(&pem::Pem::new("PUBLIC KEY", vec![0x30, 0x82, 1, 2]));
        assert!(parse_public_key_pem(&rsa).unwrap_err().contains("Ed25519"));
    }
}
