//! Key halves and the data key derived from them (pure logic, no I/O).
//!
//! A half is 256 random bits. On disk (the local half in the ESP) and on the wire it is
//! encoded with a magic, a version and a checksum, so a truncated or corrupted file is
//! refused by name instead of silently deriving a wrong key:
//!
//! ```text
//!   "PLSH" | version (1) | 32 key bytes | first 4 bytes of SHA-256 over the preceding 37
//! ```
//!
//! The data key is HKDF-SHA256(salt = SALT, ikm = local ‖ cluster, info = INFO), 64 bytes:
//! the size fscrypt v2 needs for AES-256-XTS. Neither half alone says anything about it.

use ring::{digest, hkdf, rand::SecureRandom};

/// Bytes of key material in one half.
pub const HALF_LEN: usize = 32;
/// Bytes of an encoded half.
pub const ENCODED_HALF_LEN: usize = 4 + 1 + HALF_LEN + 4;
/// Bytes of the derived fscrypt master key.
pub const DATA_KEY_LEN: usize = 64;

const MAGIC: &[u8; 4] = b"PLSH";
const VERSION: u8 = 1;
const SALT: &[u8] = b"polis datafs v1";
const INFO: &[u8] = b"polis datafs fscrypt master key";

/// Why bytes are not a valid encoded half.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HalfError {
    #[error("wrong length {0} bytes (a key half is {ENCODED_HALF_LEN})")]
    Length(usize),
    #[error("not a Polis key half (bad magic)")]
    Magic,
    #[error("unsupported key half version {0} (this build knows {VERSION})")]
    Version(u8),
    #[error("checksum mismatch: the key half is corrupted")]
    Checksum,
    #[error("no randomness available to generate a key half")]
    Random,
}

/// One 256-bit half of a node's data key. Zeroed when dropped; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Half([u8; HALF_LEN]);

impl Half {
    /// A new random half.
    pub fn generate() -> Result<Half, HalfError> {
        let mut bytes = [0u8; HALF_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| HalfError::Random)?;
        Ok(Half(bytes))
    }

    pub fn from_bytes(bytes: [u8; HALF_LEN]) -> Half {
        Half(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; HALF_LEN] {
        &self.0
    }

    /// The checksummed encoding (see the module doc).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_HALF_LEN);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.0);
        let sum = digest::digest(&digest::SHA256, &out);
        out.extend_from_slice(&sum.as_ref()[..4]);
        out
    }

    /// Parses [`Half::encode`]'s output, naming what is wrong with anything else.
    pub fn decode(bytes: &[u8]) -> Result<Half, HalfError> {
        if bytes.len() != ENCODED_HALF_LEN {
            return Err(HalfError::Length(bytes.len()));
        }
        if &bytes[..4] != MAGIC {
            return Err(HalfError::Magic);
        }
        if bytes[4] != VERSION {
            return Err(HalfError::Version(bytes[4]));
        }
        let body = &bytes[..ENCODED_HALF_LEN - 4];
        let sum = digest::digest(&digest::SHA256, body);
        if sum.as_ref()[..4] != bytes[ENCODED_HALF_LEN - 4..] {
            return Err(HalfError::Checksum);
        }
        let mut half = [0u8; HALF_LEN];
        half.copy_from_slice(&body[5..]);
        Ok(Half(half))
    }
}

impl std::fmt::Debug for Half {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Half(<secret>)")
    }
}

impl Drop for Half {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// The fscrypt master key of a node's data directory. Zeroed when dropped; never printed.
pub struct DataKey([u8; DATA_KEY_LEN]);

impl DataKey {
    /// Derives the data key from both halves; the order matters (local first).
    pub fn derive(local: &Half, cluster: &Half) -> DataKey {
        let mut ikm = [0u8; 2 * HALF_LEN];
        ikm[..HALF_LEN].copy_from_slice(&local.0);
        ikm[HALF_LEN..].copy_from_slice(&cluster.0);
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(&ikm);
        wipe(&mut ikm);
        let mut key = [0u8; DATA_KEY_LEN];
        prk.expand(&[INFO], KeyLen)
            .and_then(|okm| okm.fill(&mut key))
            .expect("64 bytes is a valid HKDF-SHA256 output length");
        DataKey(key)
    }

    pub fn as_bytes(&self) -> &[u8; DATA_KEY_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(<secret>)")
    }
}

impl Drop for DataKey {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

struct KeyLen;

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        DATA_KEY_LEN
    }
}

/// Overwrites a secret so the compiler cannot elide it as a dead store.
fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: `b` is a valid, aligned, exclusive reference to a byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        let half = Half::generate().unwrap();
        let bytes = half.encode();
        assert_eq!(bytes.len(), ENCODED_HALF_LEN);
        assert_eq!(Half::decode(&bytes).unwrap(), half);
    }

    #[test]
    fn decoding_names_what_is_wrong() {
        let good = Half::from_bytes([7; HALF_LEN]).encode();
        assert_eq!(Half::decode(&good[..10]), Err(HalfError::Length(10)));
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(Half::decode(&b), Err(HalfError::Magic));
        let mut b = good.clone();
        b[4] = 9;
        assert_eq!(Half::decode(&b), Err(HalfError::Version(9)));
        for i in [5, 20, ENCODED_HALF_LEN - 1] {
            let mut b = good.clone();
            b[i] ^= 1;
            assert_eq!(Half::decode(&b), Err(HalfError::Checksum), "byte {i}");
        }
    }

    #[test]
    fn derivation_needs_both_halves_in_order() {
        let a = Half::from_bytes([1; HALF_LEN]);
        let b = Half::from_bytes([2; HALF_LEN]);
        let c = Half::from_bytes([3; HALF_LEN]);
        let ab = DataKey::derive(&a, &b);
        assert_eq!(ab.as_bytes(), DataKey::derive(&a, &b).as_bytes());
        assert_ne!(ab.as_bytes(), DataKey::derive(&b, &a).as_bytes());
        assert_ne!(ab.as_bytes(), DataKey::derive(&a, &c).as_bytes());
        assert_ne!(ab.as_bytes(), DataKey::derive(&c, &b).as_bytes());
        assert_ne!(&ab.as_bytes()[..32], &ab.as_bytes()[32..]);
    }

    #[test]
    fn derivation_is_hkdf_sha256_with_fixed_salt_and_info() {
        // Pinned so a change of derivation (which would lock every node out of its data)
        // cannot slip in unnoticed.
        let key = DataKey::derive(&Half::from_bytes([0; 32]), &Half::from_bytes([0xff; 32]));
        assert_eq!(hex::encode(&key.as_bytes()[..8]), PINNED_PREFIX);
    }

    // Computed independently with Python's hmac module (RFC 5869 by hand).
    const PINNED_PREFIX: &str = "a6f887c6ea37d728";

    #[test]
    fn secrets_are_not_printed() {
        let half = Half::from_bytes([0xab; 32]);
        assert_eq!(format!("{half:?}"), "Half(<secret>)");
        let key = DataKey::derive(&half, &half);
        assert!(!format!("{key:?}").contains("ab"));
    }
}

/// Properties over arbitrary bytes (proptest): every half round-trips, and nothing but
/// an exact encoding decodes.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_half_round_trips(bytes in any::<[u8; HALF_LEN]>()) {
            let half = Half::from_bytes(bytes);
            prop_assert_eq!(Half::decode(&half.encode()), Ok(half));
        }

        #[test]
        fn only_an_encoding_decodes(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(half) = Half::decode(&bytes) {
                prop_assert_eq!(half.encode(), bytes);
            }
        }

        #[test]
        fn any_changed_byte_is_refused(
            bytes in any::<[u8; HALF_LEN]>(),
            at in 0..ENCODED_HALF_LEN,
            flip in 1u8..,
        ) {
            let mut encoded = Half::from_bytes(bytes).encode();
            encoded[at] ^= flip;
            prop_assert!(Half::decode(&encoded).is_err());
        }
    }
}
