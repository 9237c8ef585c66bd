//! What a party checks cluster certificates against ([`Anchors`]: the cluster CAs it
//! trusts, each with the newest CRL seen for it), and the slot a client keeps them in
//! ([`TrustSlot`]).
//!
//! A cluster trusts one CA, or two while its CA is rotated (the old one and its
//! successor): a certificate of either verifies, and each is checked against the CRL of
//! the CA that issued it. CRLs are taken only when signed by a trusted CA and not older
//! (by CRL number) than the one held for that CA, so it does not matter which server
//! delivered them.
//!
//! A leaf: may not build configurations.

use std::sync::{Arc, Mutex};

use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};

use crate::RpcError;

/// At most this many CAs are trusted at once: the current one, its successor while a
/// rotation runs, and room for one more step. A longer list is refused rather than
/// kept: every handshake tries each.
pub const MAX_TRUSTED_CAS: usize = 4;

/// The CAs (DER) a verifier trusts and the CRLs (DER) it checks against: one per CA
/// when known. A snapshot; compare two to see whether a verifier built from one still
/// holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Anchors {
    pub cas: Vec<Vec<u8>>,
    pub crls: Vec<Vec<u8>>,
}

impl Anchors {
    /// One CA and its CRL, if known.
    pub fn one(ca: Vec<u8>, crl: Option<Vec<u8>>) -> Anchors {
        Anchors {
            cas: vec![ca],
            crls: crl.into_iter().collect(),
        }
    }

    /// The trusted CAs as roots of a verifier.
    pub(crate) fn roots(&self) -> Result<Arc<rustls::RootCertStore>, String> {
        if self.cas.is_empty() {
            return Err("no cluster CA is trusted".into());
        }
        let mut roots = rustls::RootCertStore::empty();
        for ca in &self.cas {
            roots
                .add(CertificateDer::from(ca.clone()))
                .map_err(|e| format!("cluster CA unusable: {e}"))?;
        }
        Ok(Arc::new(roots))
    }

    pub(crate) fn crl_ders(&self) -> Vec<CertificateRevocationListDer<'static>> {
        self.crls
            .iter()
            .map(|crl| CertificateRevocationListDer::from(crl.clone()))
            .collect()
    }
}

/// One trusted CA and the newest CRL taken for it, with that CRL's number.
#[derive(Debug, Clone)]
struct Held {
    ca: Vec<u8>,
    crl: Option<(Vec<u8>, u64)>,
}

/// The cluster CAs a client trusts and the newest CRL of each, shared by all its
/// connections: a server whose certificate a CRL lists is refused at the handshake, so
/// that a node removed from the cluster cannot pose as a curator.
#[derive(Debug, Clone)]
pub struct TrustSlot(Arc<Mutex<Vec<Held>>>);

impl TrustSlot {
    /// Trusting `ca` alone, with no CRL yet.
    pub fn new(ca: Vec<u8>) -> TrustSlot {
        TrustSlot(Arc::new(Mutex::new(vec![Held { ca, crl: None }])))
    }

    /// Trusting no CA yet: a node before it joined (it learns its cluster's CA when it
    /// does) takes the first list it is given ([`TrustSlot::adopt`]).
    pub fn empty() -> TrustSlot {
        TrustSlot(Arc::new(Mutex::new(Vec::new())))
    }

    /// Trusts `cas` if the slot trusts no CA yet (what a party starts from: the CAs it
    /// saved), and leaves a slot that already does as it is: a rotation's later steps
    /// come through [`TrustSlot::trust`]. Returns whether it took them.
    pub fn adopt(&self, cas: Vec<Vec<u8>>) -> Result<bool, RpcError> {
        if !self.held().is_empty() {
            return Ok(false);
        }
        self.trust(cas)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<Held>> {
        self.0.lock().expect("trust slot lock poisoned")
    }

    /// The CAs trusted (DER), in the order given.
    pub fn cas(&self) -> Vec<Vec<u8>> {
        self.held().iter().map(|h| h.ca.clone()).collect()
    }

    /// The CAs and the CRLs held for them.
    pub fn anchors(&self) -> Anchors {
        let held = self.held();
        Anchors {
            cas: held.iter().map(|h| h.ca.clone()).collect(),
            crls: held
                .iter()
                .filter_map(|h| h.crl.as_ref().map(|(der, _)| der.clone()))
                .collect(),
        }
    }

    /// The CRL held for `ca`, if any.
    pub fn crl_of(&self, ca: &[u8]) -> Option<Vec<u8>> {
        self.held()
            .iter()
            .find(|h| h.ca == ca)
            .and_then(|h| h.crl.as_ref().map(|(der, _)| der.clone()))
    }

    /// Offers `crl_der`: kept when signed by a trusted CA and at least as new as the CRL
    /// held for that CA. Returns whether it replaced that CRL (false: the same or an
    /// older one).
    pub fn offer(&self, crl_der: &[u8]) -> Result<bool, RpcError> {
        let cas = {
            let held = self.held();
            // The one held, offered again (every WatchNode update carries it): it was
            // verified when it was taken.
            if held
                .iter()
                .any(|h| h.crl.as_ref().is_some_and(|(der, _)| der == crl_der))
            {
                return Ok(false);
            }
            held.iter().map(|h| h.ca.clone()).collect::<Vec<_>>()
        };
        let mut refusals = Vec::new();
        for ca in cas {
            let number = match pki::verified_crl_number(crl_der, &ca) {
                Ok(n) => n,
                Err(e) => {
                    refusals.push(e.to_string());
                    continue;
                }
            };
            let mut held = self.held();
            // The CA may have left the trust while the signature was checked.
            let Some(h) = held.iter_mut().find(|h| h.ca == ca) else {
                return Ok(false);
            };
            return Ok(match &h.crl {
                Some((der, n)) if *n > number || (*n == number && der == crl_der) => false,
                _ => {
                    h.crl = Some((crl_der.to_vec(), number));
                    true
                }
            });
        }
        Err(RpcError::Certificate(format!(
            "cluster CRL: not signed by a trusted CA ({})",
            refusals.join("; ")
        )))
    }

    /// Trusts exactly `cas` from now on (a rotation's step, learnt from a curator the
    /// client verified under the trust it holds): the CRLs of the CAs that stay are
    /// kept. Refused when empty, too long, or sharing no CA with the CAs trusted now: a
    /// rotation adds a CA, then drops the old one, so every step keeps one; a list that
    /// keeps none is not a step of one. Returns whether the trust changed.
    pub fn trust(&self, cas: Vec<Vec<u8>>) -> Result<bool, RpcError> {
        let refuse = |why: String| Err(RpcError::Certificate(format!("cluster CAs: {why}")));
        if cas.is_empty() {
            return refuse("none given".into());
        }
        if cas.len() > MAX_TRUSTED_CAS {
            return refuse(format!(
                "{} given, at most {MAX_TRUSTED_CAS} are trusted at once",
                cas.len()
            ));
        }
        for ca in &cas {
            if let Err(e) = webpki_anchor(ca) {
                return refuse(e);
            }
        }
        let mut held = self.held();
        // From nothing (`empty`), any list is the first step.
        if held.len() == cas.len() && held.iter().zip(&cas).all(|(h, ca)| h.ca == *ca) {
            return Ok(false);
        }
        if !held.is_empty() && !cas.iter().any(|ca| held.iter().any(|h| h.ca == *ca)) {
            return refuse("the new list keeps none of the CAs trusted now".into());
        }
        let next = cas
            .into_iter()
            .map(|ca| {
                let crl = held.iter().find(|h| h.ca == ca).and_then(|h| h.crl.clone());
                Held { ca, crl }
            })
            .collect();
        *held = next;
        Ok(true)
    }
}

/// Whether `ca` (DER) is a certificate a verifier can take as a root.
fn webpki_anchor(ca: &[u8]) -> Result<(), String> {
    rustls::RootCertStore::empty()
        .add(CertificateDer::from(ca.to_vec()))
        .map_err(|e| format!("a CA certificate is unusable: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str) -> pki::Ca {
        pki::Ca::generate(name, std::time::Duration::from_secs(3600)).unwrap()
    }

    #[test]
    fn a_crl_is_kept_per_ca_and_only_when_newer() {
        let (old, new) = (ca("old"), ca("new"));
        let slot = TrustSlot::new(old.cert_der.clone());
        assert!(
            slot.trust(vec![old.cert_der.clone(), new.cert_der.clone()])
                .unwrap()
        );
        assert!(slot.offer(&old.crl(&[], 5).unwrap()).unwrap());
        assert!(slot.offer(&new.crl(&[], 2).unwrap()).unwrap());
        assert_eq!(slot.anchors().crls.len(), 2);
        // Older than the one held for its CA: not taken, whatever the other CA holds.
        assert!(!slot.offer(&old.crl(&[], 4).unwrap()).unwrap());
        assert!(slot.offer(&new.crl(&[], 3).unwrap()).unwrap());
        assert_eq!(slot.crl_of(&new.cert_der), Some(new.crl(&[], 3).unwrap()));
        assert_eq!(slot.crl_of(&old.cert_der), Some(old.crl(&[], 5).unwrap()));
    }

    #[test]
    fn an_empty_slot_adopts_the_first_cas_and_only_those() {
        let (first, other) = (ca("first"), ca("other"));
        let slot = TrustSlot::empty();
        assert!(slot.offer(&first.crl(&[], 1).unwrap()).is_err());
        assert!(slot.adopt(vec![first.cert_der.clone()]).unwrap());
        assert!(!slot.adopt(vec![other.cert_der.clone()]).unwrap());
        assert_eq!(slot.cas(), vec![first.cert_der.clone()]);
    }

    #[test]
    fn a_crl_of_an_untrusted_ca_is_refused() {
        let (old, stranger) = (ca("old"), ca("stranger"));
        let slot = TrustSlot::new(old.cert_der.clone());
        let refused = slot.offer(&stranger.crl(&[], 9).unwrap()).unwrap_err();
        assert!(
            refused.to_string().contains("not signed by a trusted CA"),
            "{refused}"
        );
        assert!(slot.anchors().crls.is_empty());
    }

    #[test]
    fn the_trust_moves_one_step_at_a_time_and_keeps_crls_of_cas_that_stay() {
        let (old, new, stranger) = (ca("old"), ca("new"), ca("stranger"));
        let slot = TrustSlot::new(old.cert_der.clone());
        slot.offer(&old.crl(&[], 1).unwrap()).unwrap();
        // A list that keeps none of the trusted CAs is no step of a rotation.
        let refused = slot.trust(vec![stranger.cert_der.clone()]).unwrap_err();
        assert!(refused.to_string().contains("keeps none"), "{refused}");
        assert!(slot.trust(vec![]).is_err());
        assert!(slot.trust(vec![b"junk".to_vec()]).is_err());
        assert!(
            slot.trust(vec![old.cert_der.clone(); MAX_TRUSTED_CAS + 1])
                .is_err()
        );
        assert_eq!(slot.cas(), vec![old.cert_der.clone()]);

        assert!(
            slot.trust(vec![old.cert_der.clone(), new.cert_der.clone()])
                .unwrap()
        );
        assert!(
            !slot
                .trust(vec![old.cert_der.clone(), new.cert_der.clone()])
                .unwrap()
        );
        assert_eq!(slot.anchors().crls, vec![old.crl(&[], 1).unwrap()]);
        slot.offer(&new.crl(&[], 1).unwrap()).unwrap();
        // The old CA retired: its CRL goes with it, the new one's stays.
        assert!(slot.trust(vec![new.cert_der.clone()]).unwrap());
        assert_eq!(
            slot.anchors(),
            Anchors::one(new.cert_der.clone(), Some(new.crl(&[], 1).unwrap()))
        );
        // Its CRLs are no longer taken.
        assert!(slot.offer(&old.crl(&[], 2).unwrap()).is_err());
    }
}
