//! Node and owner identities: Ed25519 keys and the names derived from them.
//!
//! Every actor in a Polis cluster is an Ed25519 key. A node's ID is derived from its
//! public key, so anyone holding a node's certificate can check that the name in it
//! belongs to the key in it, without asking the cluster:
//!
//! ```text
//!   Ed25519 public key (32 bytes) ──first 16 bytes──▶ hex ──▶ "polis-" + 32 hex digits
//! ```
//!
//! Invariants:
//! - Private keys leave this crate only as PKCS#8 DER (for storage with mode 0600).
//! - A loaded key is checked: it must be a valid Ed25519 PKCS#8 document.

use ring::signature::{Ed25519KeyPair, KeyPair as _};

/// Length of an Ed25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;

/// The prefix of every node ID.
pub const NODE_ID_PREFIX: &str = "polis-";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("not a valid Ed25519 PKCS#8 private key: {reason}")]
    InvalidPrivateKey { reason: String },
    #[error("public key must be {PUBLIC_KEY_LEN} bytes, got {len}")]
    InvalidPublicKeyLength { len: usize },
    #[error("not a node ID (want \"{NODE_ID_PREFIX}\" and 32 lowercase hex digits): {id:?}")]
    InvalidNodeId { id: String },
    #[error("generating a key failed")]
    Generate,
}

/// An Ed25519 key pair.
pub struct NodeKey {
    pkcs8: Vec<u8>,
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKey")
            .field("node_id", &self.node_id())
            .finish_non_exhaustive()
    }
}

impl Clone for NodeKey {
    fn clone(&self) -> Self {
        NodeKey::from_pkcs8(&self.pkcs8).expect("a key that loaded once loads again")
    }
}

impl NodeKey {
    /// A fresh key from the system's random source.
    pub fn generate() -> Result<NodeKey, IdentityError> {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| IdentityError::Generate)?;
        NodeKey::from_pkcs8(doc.as_ref())
    }

    /// Loads a key from PKCS#8 DER (v1 or v2).
    pub fn from_pkcs8(der: &[u8]) -> Result<NodeKey, IdentityError> {
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).map_err(|e| {
            IdentityError::InvalidPrivateKey {
                reason: e.to_string(),
            }
        })?;
        Ok(NodeKey {
            pkcs8: der.to_vec(),
            pair,
        })
    }

    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8
    }

    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.pair
            .public_key()
            .as_ref()
            .try_into()
            .expect("Ed25519 public keys are 32 bytes")
    }

    pub fn node_id(&self) -> String {
        node_id(&self.public_key())
    }
}

/// The node ID for a public key: `polis-` + hex of its first 16 bytes.
pub fn node_id(public_key: &[u8; PUBLIC_KEY_LEN]) -> String {
    format!("{NODE_ID_PREFIX}{}", hex::encode(&public_key[..16]))
}

/// Checks a public key's length, e.g. one read from a parameters file.
pub fn public_key_from_slice(bytes: &[u8]) -> Result<[u8; PUBLIC_KEY_LEN], IdentityError> {
    bytes
        .try_into()
        .map_err(|_| IdentityError::InvalidPublicKeyLength { len: bytes.len() })
}

/// Checks that `id` has the form of a node ID.
pub fn validate_node_id(id: &str) -> Result<(), IdentityError> {
    let ok = id.strip_prefix(NODE_ID_PREFIX).is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(IdentityError::InvalidNodeId { id: id.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_is_prefix_and_hex_of_first_half_of_key() {
        let mut key = [0u8; 32];
        for (i, b) in key.iter_mut().enumerate() {
            *b = i as u8;
        }
        assert_eq!(node_id(&key), "polis-000102030405060708090a0b0c0d0e0f");
    }

    #[test]
    fn generated_keys_round_trip() {
        let key = NodeKey::generate().unwrap();
        let again = NodeKey::from_pkcs8(key.pkcs8_der()).unwrap();
        assert_eq!(key.public_key(), again.public_key());
        assert_eq!(key.node_id(), again.node_id());
        validate_node_id(&key.node_id()).unwrap();
    }

    #[test]
    fn garbage_is_not_a_key() {
        assert!(matches!(
            NodeKey::from_pkcs8(b"not a key"),
            Err(IdentityError::InvalidPrivateKey { .. })
        ));
    }

    #[test]
    fn node_id_validation() {
        let cases = [
            ("polis-000102030405060708090a0b0c0d0e0f", true),
            ("polis-000102030405060708090A0B0C0D0E0F", false),
            ("polis-0001", false),
            ("metropolis-000102030405060708090a0b0c0d0e0f", false),
            ("", false),
        ];
        for (id, ok) in cases {
            assert_eq!(validate_node_id(id).is_ok(), ok, "{id}");
        }
    }

    #[test]
    fn public_key_length_is_checked() {
        assert_eq!(
            public_key_from_slice(&[1, 2, 3]),
            Err(IdentityError::InvalidPublicKeyLength { len: 3 })
        );
        assert!(public_key_from_slice(&[0; 32]).is_ok());
    }
}
