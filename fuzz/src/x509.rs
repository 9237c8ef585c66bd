//! Certificates and CRLs: from parameters files and PEM files on disk, from curators'
//! answers, and from TLS clients (the curator classifies every client certificate
//! before it authorizes a call).

use rustls::pki_types::{CertificateDer, UnixTime};

use crate::fixture;
use crate::{pick, picked};

/// A certificate as DER or PEM: every reader Polis has for one.
pub fn certificate(data: &[u8]) {
    let _ = metrics::certs::seconds_left(data, 1_795_000_000);
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(block) = pem::parse(text)
    {
        // polis-node and polisctl read PEM files with `pem`, then go on with the DER.
        der(block.contents());
    }
    der(data);
}

fn der(data: &[u8]) {
    let Ok(key) = pki::certificate_public_key(data) else {
        return;
    };
    let _ = identity::public_key_from_slice(&key).map(|k| identity::node_id(&k));
    pki::certificate_serial(data).expect("a certificate that parsed has a serial");
    let _ = pki::time_to_expiry(data);
    let validity = pki::Validity::of(data).expect("a certificate that parsed has a validity");
    assert!(validity.issued() <= validity.renew_at(), "{validity:?}");
    assert!(validity.renew_at() <= validity.warn_at(), "{validity:?}");
    assert!(validity.warn_at() <= validity.not_after, "{validity:?}");
    if let Ok((_, parsed)) = x509_parser::parse_x509_certificate(data) {
        let _ = pki::CertificateKind::of(&parsed);
    }
}

pub fn certificate_seeds() -> Vec<Vec<u8>> {
    let pem = |der: &[u8]| pem::encode(&pem::Pem::new("CERTIFICATE", der.to_vec())).into_bytes();
    vec![
        fixture::CA_DER.to_vec(),
        fixture::node_certificate().to_vec(),
        fixture::owner_certificate().to_vec(),
        pem(fixture::curator_certificate()),
    ]
}

/// A CRL: its serials, and its number once it verifies against the test CA (verified
/// twice, it says the same); then offered to a client's `rpc::TrustSlot` that trusts
/// the test CA and holds its CRL number 7, as one a curator hands out: kept only when
/// newer.
pub fn crl(data: &[u8]) {
    let _ = pki::crl_serials(data);
    let verified = pki::verified_crl_number(data, fixture::CA_DER);
    if let Ok(number) = verified {
        assert_eq!(
            pki::verified_crl_number(data, fixture::CA_DER).ok(),
            Some(number)
        );
        pki::crl_serials(data).expect("a verified CRL lists its serials");
    }
    let slot = rpc::TrustSlot::new(fixture::CA_DER.to_vec());
    assert_eq!(slot.offer(fixture::crl()).ok(), Some(true));
    match slot.offer(data) {
        Ok(replaced) => {
            let number = verified.expect("the slot keeps only verified CRLs");
            assert_eq!(
                replaced,
                number > 7 || (number == 7 && data != fixture::crl())
            );
            assert_eq!(slot.offer(data).ok(), Some(false));
        }
        Err(_) => assert!(verified.is_err()),
    }
}

pub fn crl_seeds() -> Vec<Vec<u8>> {
    let ca = fixture::ca();
    let newest = ca.crl(&[], u64::MAX).expect("the test CA signs a CRL");
    let older = ca
        .crl(&[vec![1, 2, 3]], 6)
        .expect("the test CA signs a CRL");
    vec![fixture::crl().to_vec(), newest, older]
}

/// The curator's classification of a TLS client (`rpc::Authenticator`), the first byte
/// picking what the input is: 0 — the client's certificate, checked against the test
/// CA's CRL; 1 — the CRL (as a curator loads it from etcd), with a node's certificate.
pub fn authenticator(data: &[u8]) {
    let Some((choice, bytes)) = pick(data, 2) else {
        return;
    };
    let authenticator = rpc::Authenticator::new();
    let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_795_000_000));
    let (leaf, crl) = match choice {
        0 => (bytes, fixture::crl()),
        _ => (fixture::node_certificate(), bytes),
    };
    let leaf = CertificateDer::from(leaf);
    let anchors = rpc::Anchors::one(fixture::CA_DER.to_vec(), Some(crl.to_vec()));
    let first = authenticator.classify(Some(&leaf), &anchors, now);
    // A second call is answered from what the first remembered: the same verdict.
    let second = authenticator.classify(Some(&leaf), &anchors, now);
    assert_eq!(format!("{first:?}"), format!("{second:?}"));
}

pub fn authenticator_seeds() -> Vec<Vec<u8>> {
    vec![
        picked(0, fixture::node_certificate()),
        picked(0, fixture::owner_certificate()),
        picked(0, fixture::curator_certificate()),
        picked(1, fixture::crl()),
    ]
}
