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
//! - Private keys leave this crate only as PKCS#8 DER (for storage with mode 0600), and
//!   always as PKCS#8 **v1** (RFC 8410: version 0, the 32-byte seed, no public key).
//!   ring generates v2 documents (with the public key), which OpenSSL 3.0 and Python's
//!   `cryptography` refuse; v1 is what every tool reads. v2 keys written by earlier
//!   versions still load.
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

/// The DER of an RFC 8410 PKCS#8 v1 Ed25519 private key up to the seed: SEQUENCE,
/// version 0, algorithm id-Ed25519, OCTET STRING { OCTET STRING (32 bytes) }.
const PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The seed of a PKCS#8 Ed25519 document that ring accepted (v1 or v2). ring only takes
/// documents without attributes and with a short-form outer length, so the seed sits at a
/// fixed offset once the fixed bytes around it match.
fn pkcs8_seed(der: &[u8]) -> Option<&[u8]> {
    let fixed_ok = der.len() >= 48
        && der[0] == 0x30
        && usize::from(der[1]) == der.len() - 2
        && der[2..4] == [0x02, 0x01]
        && (der[4] == 0 || der[4] == 1)
        && der[5..16] == PKCS8_V1_PREFIX[5..16];
    fixed_ok.then(|| &der[16..48])
}

/// An Ed25519 key pair.
pub struct NodeKey {
    /// Always PKCS#8 v1 (see the crate invariants).
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
        let invalid = |reason: String| IdentityError::InvalidPrivateKey { reason };
        // ring checks a v2 document's public key against its seed, so the v1 form built
        // from the seed is the same key.
        Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).map_err(|e| invalid(e.to_string()))?;
        let seed = pkcs8_seed(der).ok_or_else(|| invalid("unexpected PKCS#8 layout".into()))?;
        let v1 = [PKCS8_V1_PREFIX.as_slice(), seed].concat();
        let pair_v1 = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&v1)
            .map_err(|e| invalid(format!("as PKCS#8 v1: {e}")))?;
        Ok(NodeKey {
            pkcs8: v1,
            pair: pair_v1,
        })
    }

    /// The key as PKCS#8 v1 DER (RFC 8410), whatever form it was loaded from: this is
    /// what every writer of a key file uses.
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
    fn keys_are_written_as_pkcs8_v1_and_v2_keys_still_load() {
        let rng = ring::rand::SystemRandom::new();
        let v2 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        assert_eq!(v2.as_ref()[4], 1, "ring generates v2 documents");
        let key = NodeKey::from_pkcs8(v2.as_ref()).unwrap();
        let v1 = key.pkcs8_der();
        assert_eq!(v1.len(), 48);
        assert_eq!(v1[..16], PKCS8_V1_PREFIX);
        assert_eq!(v1[16..], v2.as_ref()[16..48], "same seed");
        let reloaded = NodeKey::from_pkcs8(v1).unwrap();
        assert_eq!(reloaded.public_key(), key.public_key());
        assert_eq!(reloaded.pkcs8_der(), v1);
        assert_eq!(
            NodeKey::generate().unwrap().pkcs8_der()[..16],
            PKCS8_V1_PREFIX
        );
    }

    #[test]
    fn v2_key_with_a_foreign_public_key_is_refused() {
        let rng = ring::rand::SystemRandom::new();
        let a = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let b = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let mut forged = a.as_ref().to_vec();
        let len = forged.len();
        forged[len - 32..].copy_from_slice(&b.as_ref()[len - 32..]);
        assert!(matches!(
            NodeKey::from_pkcs8(&forged),
            Err(IdentityError::InvalidPrivateKey { .. })
        ));
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

/// Properties over arbitrary keys and text (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_key_names_a_valid_node_id(key in any::<[u8; PUBLIC_KEY_LEN]>()) {
            prop_assert!(validate_node_id(&node_id(&key)).is_ok());
        }

        #[test]
        fn valid_node_ids_are_exactly_prefix_and_32_lowercase_hex(
            id in prop_oneof![any::<String>(), "polis-[0-9a-fA-F]{30,34}"],
        ) {
            let rule = id
                .strip_prefix(NODE_ID_PREFIX)
                .is_some_and(|h| h.len() == 32 && h.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')));
            prop_assert_eq!(validate_node_id(&id).is_ok(), rule);
        }

        #[test]
        fn any_key_file_loads_or_is_refused(bytes in prop::collection::vec(any::<u8>(), 0..120)) {
            if let Ok(key) = NodeKey::from_pkcs8(&bytes) {
                let again = NodeKey::from_pkcs8(key.pkcs8_der()).unwrap();
                prop_assert_eq!(again.public_key(), key.public_key());
            }
        }

        #[test]
        fn a_changed_pkcs8_byte_never_loads_another_key(
            at in any::<prop::sample::Index>(),
            flip in 1u8..,
        ) {
            let key = NodeKey::generate().unwrap();
            let mut der = key.pkcs8_der().to_vec();
            let at = at.index(der.len());
            der[at] ^= flip;
            if let Ok(other) = NodeKey::from_pkcs8(&der) {
                // Only the seed's bytes make another key; the structure around them is
                // checked.
                prop_assert!(at >= der.len() - 32, "byte {} changed, still loads", at);
                prop_assert_ne!(other.public_key(), key.public_key());
            }
        }
    }
}
