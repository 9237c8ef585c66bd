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

/// CA handovers as polisctl follows them after a rotation it missed
/// (`pki::handed_over`): a configuration pinning the test CA, a curator presenting some
/// CA and answering some handovers, none of it trusted yet. The input is chunks, each a
/// 2-byte big-endian length and its bytes: the presented CA, then the handovers. The
/// verdict does not depend on the handovers' order.
pub fn handover(data: &[u8]) {
    let chunks = chunks(data);
    let Some((presented, handovers)) = chunks.split_first() else {
        return;
    };
    let pinned = [fixture::CA_DER.to_vec()];
    let followed = pki::handed_over(&pinned, handovers, presented);
    if handovers.len() <= pki::MAX_HANDOVERS {
        let reversed: Vec<Vec<u8>> = handovers.iter().rev().cloned().collect();
        assert_eq!(
            pki::handed_over(&pinned, &reversed, presented),
            followed,
            "the order of the handovers changed the verdict"
        );
    }
}

/// `data` cut into chunks of a 2-byte big-endian length and that many bytes (a short
/// last chunk is taken as it is).
fn chunks(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let [high, low, rest @ ..] = data {
        let length = usize::from(u16::from_be_bytes([*high, *low])).min(rest.len());
        out.push(rest[..length].to_vec());
        data = &rest[length..];
    }
    out
}

fn chunked(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for part in parts {
        out.extend_from_slice(&u16::try_from(part.len()).expect("short").to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

pub fn handover_seeds() -> Vec<Vec<u8>> {
    let successor = fixture::successor();
    let next = pki::Ca::generate("polis fuzz test CA", pki::CA_LIFETIME).expect("a CA");
    let onward = successor
        .hand_over_to(&next)
        .expect("the successor hands over");
    let stranger = pki::Ca::generate("another cluster", pki::CA_LIFETIME).expect("a CA");
    let handover = fixture::handover();
    vec![
        chunked(&[&successor.cert_der, handover]),
        chunked(&[&next.cert_der, &onward, handover]),
        chunked(&[&stranger.cert_der, handover]),
        chunked(&[fixture::CA_DER]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handover_seeds_reach_both_verdicts() {
        let verdicts: Vec<bool> = handover_seeds()
            .iter()
            .map(|seed| {
                let chunks = chunks(seed);
                let pinned = [fixture::CA_DER.to_vec()];
                pki::handed_over(&pinned, &chunks[1..], &chunks[0])
            })
            .collect();
        assert_eq!(verdicts, [true, true, false, true]);
    }
}
