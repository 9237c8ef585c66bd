//! CA handovers (pure): when a rotation introduces a successor CA, the CA it replaces
//! certifies the successor's name and key (a cross certificate). A party that pins only
//! the old CA and missed the whole rotation (a polisctl configuration not used
//! meanwhile) can then follow the chain of handovers from the CA it pins to the CA the
//! curators present, and trust the new CA on the old one's word rather than on first
//! use.
//!
//! ```text
//!   pinned O ──handover O→N1──▶ N1 ──handover N1→N2──▶ N2 == presented CA's key: follow
//! ```
//!
//! A handover proves no more than the pinned CA itself would: whoever holds the old
//! CA's key could already impersonate the cluster to a party pinning it.

use crate::PkiError;
use crate::inspect::{certificate_public_key, common_name, issued_by};
use crate::issue::{Ca, Ed25519PublicKey, ca_params};
use crate::lifetime::CA_LIFETIME;

/// Most handovers a chain is followed through (one per rotation missed).
pub const MAX_HANDOVERS: usize = 16;

impl Ca {
    /// `successor`'s name and key certified by this CA: a CA certificate issued by
    /// this CA, for the key of `successor`, under the same name.
    pub fn hand_over_to(&self, successor: &Ca) -> Result<Vec<u8>, PkiError> {
        let (_, parsed) =
            x509_parser::parse_x509_certificate(&successor.cert_der).map_err(|e| {
                PkiError::Invalid {
                    what: "successor CA certificate",
                    reason: e.to_string(),
                }
            })?;
        let name = common_name(parsed.subject());
        let key: [u8; 32] = certificate_public_key(&successor.cert_der)?
            .try_into()
            .map_err(|_| PkiError::Invalid {
                what: "successor CA key",
                reason: "not an Ed25519 key".into(),
            })?;
        let mut params = ca_params(&name, CA_LIFETIME);
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&Ed25519PublicKey(&key), &self.issuer()?)?;
        Ok(cert.der().to_vec())
    }
}

/// Whether the chain of `handovers` (in any order) leads from one of the `pinned` CA
/// certificates to `presented` (a CA certificate): each step a handover issued by a CA
/// already reached, ending in one whose key is `presented`'s. Only the last
/// [`MAX_HANDOVERS`] are looked at: the list comes from a server not trusted yet, and
/// the work is quadratic in its length.
pub fn handed_over(pinned: &[Vec<u8>], handovers: &[Vec<u8>], presented: &[u8]) -> bool {
    let handovers = &handovers[handovers.len().saturating_sub(MAX_HANDOVERS)..];
    let Ok(wanted) = certificate_public_key(presented) else {
        return false;
    };
    let key_of = |der: &[u8]| certificate_public_key(der).ok();
    // Every certificate reached so far: a handover reached stands for its CA (it
    // carries the CA's name and key, which is what `issued_by` checks).
    let mut reached: Vec<&[u8]> = pinned.iter().map(Vec::as_slice).collect();
    if reached
        .iter()
        .any(|ca| key_of(ca).as_deref() == Some(&wanted))
    {
        return true;
    }
    for _ in 0..MAX_HANDOVERS {
        let next: Vec<&[u8]> = handovers
            .iter()
            .map(Vec::as_slice)
            .filter(|h| !reached.contains(h) && reached.iter().any(|ca| issued_by(h, ca)))
            .collect();
        if next.is_empty() {
            return false;
        }
        if next.iter().any(|h| key_of(h).as_deref() == Some(&wanted)) {
            return true;
        }
        reached.extend(next);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str) -> Ca {
        Ca::generate(name, CA_LIFETIME).expect("a CA")
    }

    #[test]
    fn one_handover_leads_from_the_old_ca_to_its_successor() {
        let (old, new) = (ca("Old"), ca("New"));
        let handover = old.hand_over_to(&new).unwrap();
        assert!(issued_by(&handover, &old.cert_der));
        assert_eq!(
            certificate_public_key(&handover).unwrap(),
            certificate_public_key(&new.cert_der).unwrap()
        );
        assert!(handed_over(
            std::slice::from_ref(&old.cert_der),
            &[handover],
            &new.cert_der
        ));
    }

    #[test]
    fn a_chain_of_rotations_is_followed_in_any_order() {
        let (a, b, c) = (ca("A"), ca("B"), ca("C"));
        let ab = a.hand_over_to(&b).unwrap();
        let bc = b.hand_over_to(&c).unwrap();
        assert!(handed_over(
            std::slice::from_ref(&a.cert_der),
            &[bc.clone(), ab.clone()],
            &c.cert_der
        ));
        // Without the first step the chain does not start at the pinned CA.
        assert!(!handed_over(
            std::slice::from_ref(&a.cert_der),
            &[bc],
            &c.cert_der
        ));
    }

    #[test]
    fn a_handover_not_issued_by_the_pinned_ca_is_not_followed() {
        let (pinned, stranger, new) = (ca("Pinned"), ca("Pinned"), ca("New"));
        // Same name as the pinned CA, another key: refused.
        let forged = stranger.hand_over_to(&new).unwrap();
        assert!(!handed_over(
            std::slice::from_ref(&pinned.cert_der),
            &[forged],
            &new.cert_der
        ));
        // A handover to another CA than the one presented: refused.
        let other = pinned.hand_over_to(&ca("Other")).unwrap();
        assert!(!handed_over(
            std::slice::from_ref(&pinned.cert_der),
            &[other],
            &new.cert_der
        ));
        // Garbage is refused, not a panic.
        assert!(!handed_over(
            std::slice::from_ref(&pinned.cert_der),
            &[b"junk".to_vec()],
            &new.cert_der
        ));
        assert!(!handed_over(
            std::slice::from_ref(&pinned.cert_der),
            &[],
            b"junk"
        ));
    }

    #[test]
    fn only_the_last_handovers_are_looked_at() {
        let (old, new) = (ca("Old"), ca("New"));
        let handover = old.hand_over_to(&new).unwrap();
        let mut flood = vec![handover.clone()];
        flood.extend(std::iter::repeat_n(b"junk".to_vec(), MAX_HANDOVERS));
        assert!(!handed_over(
            std::slice::from_ref(&old.cert_der),
            &flood,
            &new.cert_der
        ));
        flood.rotate_left(1);
        assert!(handed_over(
            std::slice::from_ref(&old.cert_der),
            &flood,
            &new.cert_der
        ));
    }

    #[test]
    fn the_pinned_ca_itself_needs_no_handover() {
        let pinned = ca("Pinned");
        assert!(handed_over(
            std::slice::from_ref(&pinned.cert_der),
            &[],
            &pinned.cert_der
        ));
    }
}
