//! Issuing, lifetimes, kind marks, serials and CRLs, checked by parsing the DER.

use super::*;
use crate::{
    CA_LIFETIME, MAX_CERTIFICATE_LIFETIME, MIN_CERTIFICATE_LIFETIME, Validity, crl_serials,
    time_to_expiry, unix_now, verified_crl_number,
};
use x509_parser::prelude::*;

#[test]
fn crls_are_checked_against_their_ca() {
    let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
    let other = Ca::generate("ca", CA_LIFETIME).unwrap();
    let crl = ca.crl(&[vec![1, 2, 3]], 7).unwrap();
    assert_eq!(verified_crl_number(&crl, &ca.cert_der).unwrap(), 7);
    // Same name, other key: the signature decides.
    let err = verified_crl_number(&crl, &other.cert_der).unwrap_err();
    assert!(err.to_string().contains("signature"), "{err}");
    let mut tampered = crl.clone();
    let at = tampered.len() / 2;
    tampered[at] ^= 1;
    assert!(verified_crl_number(&tampered, &ca.cert_der).is_err());
    assert!(verified_crl_number(b"garbage", &ca.cert_der).is_err());
}

fn node_key() -> [u8; 32] {
    identity::NodeKey::generate().unwrap().public_key()
}

fn template(usage: Usage) -> Template {
    Template {
        common_name: "polis-0123".into(),
        dns_names: vec!["polis-0123".into()],
        ip_addresses: vec!["127.0.0.2".parse().unwrap()],
        usage,
        lifetime: CERTIFICATE_LIFETIME,
        kind: CertificateKind::Node,
    }
}

#[test]
fn certificate_is_valid_for_its_whole_lifetime_from_issue() {
    let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
    let lifetime = Duration::from_secs(60);
    let mut owner = template(Usage::Client);
    owner.lifetime = lifetime;
    let before = OffsetDateTime::now_utc().unix_timestamp();
    let issued = ca.issue(&owner, &node_key()).unwrap();
    let after = OffsetDateTime::now_utc().unix_timestamp();
    let (_, cert) = parse_x509_certificate(&issued.der).unwrap();
    let not_before = cert.validity().not_before.timestamp();
    let not_after = cert.validity().not_after.timestamp();
    // X.509 times have whole seconds; rcgen truncates.
    assert!(
        not_after >= before + 60 - 1 && not_after <= after + 60,
        "{not_after}"
    );
    assert!(not_before <= before - BACKDATE.as_secs() as i64);
    let left = time_to_expiry(&issued.der).unwrap().expect("valid now");
    assert!(left >= Duration::from_secs(58), "{left:?}");
}

#[test]
fn lifetimes_below_the_minimum_are_refused() {
    let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
    let mut t = template(Usage::Client);
    t.lifetime = MIN_CERTIFICATE_LIFETIME - Duration::from_secs(1);
    let err = ca.issue(&t, &node_key()).unwrap_err();
    assert!(matches!(err, PkiError::LifetimeTooShort { .. }), "{err}");
    assert!(err.to_string().contains("at least 5s"), "{err}");
    t.lifetime = MIN_CERTIFICATE_LIFETIME;
    ca.issue(&t, &node_key()).unwrap();
}

#[test]
fn the_kind_is_marked_in_the_subject_and_read_back() {
    let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
    for kind in CertificateKind::ALL {
        let mut t = template(Usage::Client);
        t.kind = kind;
        let issued = ca.issue(&t, &node_key()).unwrap();
        let (_, cert) = parse_x509_certificate(&issued.der).unwrap();
        assert_eq!(CertificateKind::of(&cert), Some(kind));
        assert_eq!(CertificateKind::from_mark(kind.mark()), Some(kind));
    }
    let (_, ca_cert) = parse_x509_certificate(&ca.cert_der).unwrap();
    assert_eq!(CertificateKind::of(&ca_cert), None);
    // An unknown mark (polis:admin became an operator role's with operators).
    assert_eq!(CertificateKind::from_mark("polis:root"), None);
}

#[test]
fn ca_is_ed25519_and_constrained() {
    let ca = Ca::generate("Polis Cluster CA", CA_LIFETIME).unwrap();
    let (_, cert) = parse_x509_certificate(&ca.cert_der).unwrap();
    assert!(cert.is_ca());
    assert_eq!(
        cert.signature_algorithm.algorithm,
        x509_parser::oid_registry::OID_SIG_ED25519
    );
    let lifetime = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    assert!(lifetime > 0 && lifetime < 21 * 365 * 24 * 3600);
    Ca::from_parts(ca.cert_der.clone(), ca.key_pkcs8().to_vec()).unwrap();
}

#[test]
fn issued_certificate_carries_names_key_and_chains_to_ca() {
    let ca = Ca::generate("Polis etcd peer CA", CA_LIFETIME).unwrap();
    let key = node_key();
    let issued = ca.issue(&template(Usage::ServerAndClient), &key).unwrap();
    let (_, cert) = parse_x509_certificate(&issued.der).unwrap();
    let (_, ca_cert) = parse_x509_certificate(&ca.cert_der).unwrap();
    assert_eq!(cert.issuer(), ca_cert.subject());
    cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    assert_eq!(cert.public_key().subject_public_key.data.as_ref(), &key);
    assert_eq!(cert.raw_serial(), issued.serial.as_slice());
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    let names: Vec<String> = san.general_names.iter().map(|n| format!("{n}")).collect();
    assert!(names.iter().any(|n| n.contains("polis-0123")), "{names:?}");
    assert!(names.iter().any(|n| n.contains("7f:00:00:02")), "{names:?}");
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    assert!(!cert.is_ca());
    assert!(cert.validity().time_to_expiration().is_some());
    let left = time_to_expiry(&issued.der).unwrap().unwrap();
    assert!(
        left > CERTIFICATE_LIFETIME - Duration::from_secs(3600),
        "{left:?}"
    );
    let old = ca
        .issue_at(
            &template(Usage::Client),
            &key,
            OffsetDateTime::now_utc() - 2 * CERTIFICATE_LIFETIME,
        )
        .unwrap();
    assert_eq!(time_to_expiry(&old.der).unwrap(), None);
}

#[test]
fn lifetimes_are_bounded() {
    let s = Duration::from_secs;
    for (lifetime, ok) in [
        (s(4), false),
        (s(5), true),
        (s(3600), true),
        (MAX_CERTIFICATE_LIFETIME, true),
        (MAX_CERTIFICATE_LIFETIME + s(1), false),
    ] {
        assert_eq!(check_lifetime(lifetime).is_ok(), ok, "{lifetime:?}");
    }
    let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
    let mut t = template(Usage::Client);
    t.lifetime = s(4);
    assert!(matches!(
        ca.issue(&t, &node_key()),
        Err(PkiError::LifetimeTooShort { .. })
    ));
}

#[test]
fn renewal_and_warning_points() {
    let b = BACKDATE.as_secs();
    // (not_before, not_after) → (issued, renew_at, warn_at)
    let cases = [
        ((1000 - b, 1030), (1000, 1020, 1025)),
        ((1000 - b, 1015), (1000, 1010, 1012)),
        (
            (0, 365 * 86400 + b),
            (b, b + 243 * 86400 + 28800, b + 304 * 86400 + 14400),
        ),
        // A certificate shorter than the backdate (not ours): issued = not_after.
        ((1000, 1010), (1010, 1010, 1010)),
    ];
    for ((not_before, not_after), expected) in cases {
        let v = Validity {
            not_before,
            not_after,
        };
        assert_eq!((v.issued(), v.renew_at(), v.warn_at()), expected, "{v:?}");
    }
    let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
    let mut t = template(Usage::Client);
    t.lifetime = Duration::from_secs(30);
    let now = unix_now();
    let v = Validity::of(&ca.issue(&t, &node_key()).unwrap().der).unwrap();
    assert!(v.issued().abs_diff(now) <= 1, "{v:?} {now}");
    assert_eq!(v.lifetime(), 30);
}

#[test]
fn serials_differ_for_the_same_key() {
    let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
    let key = node_key();
    let a = ca.issue(&template(Usage::Server), &key).unwrap();
    let b = ca.issue(&template(Usage::Server), &key).unwrap();
    assert_ne!(a.serial, b.serial);
}

#[test]
fn random_serials_are_positive_and_non_zero() {
    for _ in 0..1000 {
        let s = random_serial();
        assert_eq!(s.len(), 16);
        assert!(s[0] > 0 && s[0] < 0x80);
    }
}

#[test]
fn crl_lists_revoked_serials_and_is_signed_by_ca() {
    let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
    let revoked = ca.issue(&template(Usage::Client), &node_key()).unwrap();
    let empty = ca.crl(&[], 1).unwrap();
    assert!(crl_serials(&empty).unwrap().is_empty());
    let crl = ca.crl(std::slice::from_ref(&revoked.serial), 2).unwrap();
    assert_eq!(crl_serials(&crl).unwrap(), vec![revoked.serial]);
    let (_, parsed) = parse_x509_crl(&crl).unwrap();
    let (_, ca_cert) = parse_x509_certificate(&ca.cert_der).unwrap();
    parsed.verify_signature(ca_cert.public_key()).unwrap();
}

#[test]
fn mismatched_ca_parts_are_refused() {
    let a = Ca::generate("a", CA_LIFETIME).unwrap();
    let b = Ca::generate("b", CA_LIFETIME).unwrap();
    assert!(matches!(
        Ca::from_parts(a.cert_der.clone(), b.key_pkcs8().to_vec()),
        Err(PkiError::Invalid { .. })
    ));
    assert!(Ca::from_parts(b"junk".to_vec(), a.key_pkcs8().to_vec()).is_err());
}

#[test]
fn a_certificate_was_issued_by_its_ca_only_even_under_the_same_name() {
    let a = Ca::generate("Polis Cluster CA", CA_LIFETIME).unwrap();
    let same_name = Ca::generate("Polis Cluster CA", CA_LIFETIME).unwrap();
    let other = Ca::generate("Polis Cluster CA 2", CA_LIFETIME).unwrap();
    let cert = a.issue(&template(Usage::Client), &node_key()).unwrap().der;
    assert!(crate::issued_by(&cert, &a.cert_der));
    assert!(!crate::issued_by(&cert, &same_name.cert_der));
    assert!(!crate::issued_by(&cert, &other.cert_der));
    assert!(!crate::issued_by(b"junk", &a.cert_der));
    assert!(!crate::issued_by(&cert, b"junk"));
}
