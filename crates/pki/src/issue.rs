//! Pure certificate logic: generating CAs, issuing certificates and CRLs (no I/O).

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    PKCS_ED25519, PublicKeyData, RevokedCertParams, SanType, SerialNumber, SignatureAlgorithm,
};
use time::OffsetDateTime;

use crate::PkiError;

/// Lifetime of a CA certificate.
pub const CA_LIFETIME: Duration = Duration::from_secs(20 * 365 * 24 * 3600);
/// Default lifetime of node and etcd peer certificates.
pub const CERTIFICATE_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// Default lifetime of owner certificates.
pub const OWNER_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// Shortest lifetime a certificate may be issued with. Holders renew at 2/3 of the
/// lifetime, so this leaves a renewal a few seconds: enough for tests on one machine,
/// never sensible in production (where lifetimes are days to a year).
pub const MIN_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(5);
/// Longest lifetime a certificate may be issued with: well inside the CAs' lifetime.
pub const MAX_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Refuses certificate lifetimes outside [`MIN_CERTIFICATE_LIFETIME`] ..=
/// [`MAX_CERTIFICATE_LIFETIME`].
pub fn check_lifetime(lifetime: Duration) -> Result<(), PkiError> {
    if lifetime < MIN_CERTIFICATE_LIFETIME {
        return Err(PkiError::LifetimeTooShort {
            lifetime,
            minimum: MIN_CERTIFICATE_LIFETIME,
        });
    }
    if lifetime > MAX_CERTIFICATE_LIFETIME {
        return Err(PkiError::LifetimeTooLong {
            lifetime,
            maximum: MAX_CERTIFICATE_LIFETIME,
        });
    }
    Ok(())
}

/// When a certificate was issued and when it expires (seconds since the Unix epoch),
/// read from its validity: issued = `not_before + BACKDATE` (see [`BACKDATE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: u64,
    pub not_after: u64,
}

impl Validity {
    /// The validity of a DER certificate.
    pub fn of(cert_der: &[u8]) -> Result<Validity, PkiError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(cert_der).map_err(|e| PkiError::Invalid {
                what: "certificate",
                reason: e.to_string(),
            })?;
        let v = cert.validity();
        let secs = |t: x509_parser::time::ASN1Time| u64::try_from(t.timestamp()).unwrap_or(0);
        Ok(Validity {
            not_before: secs(v.not_before),
            not_after: secs(v.not_after),
        })
    }

    /// When it was issued: its lifetime starts here.
    pub fn issued(&self) -> u64 {
        (self.not_before + BACKDATE.as_secs()).min(self.not_after)
    }

    pub fn lifetime(&self) -> u64 {
        self.not_after - self.issued()
    }

    /// The point `num/den` of the way through its lifetime.
    fn fraction(&self, num: u64, den: u64) -> u64 {
        self.issued() + self.lifetime() * num / den
    }

    /// When its holder renews it: once 2/3 of its lifetime have passed.
    pub fn renew_at(&self) -> u64 {
        self.fraction(2, 3)
    }

    /// From when a certificate that was not replaced yet deserves an operator's
    /// attention: 5/6 of its lifetime (half of the time its holder had to renew it
    /// has gone by without success).
    pub fn warn_at(&self) -> u64 {
        self.fraction(5, 6)
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Tolerance for clocks that are slightly behind the issuer's: `not_before` lies this
/// much before the issue time, *outside* the lifetime, so a certificate is valid for its
/// whole lifetime from the moment it is issued.
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// What a certificate's holder is, written by the CA into the subject as the
/// organizational unit `polis:<kind>` (exactly one). Clients are classified from this
/// mark alone (see `rpc::tls`): a cluster certificate without a known mark is denied,
/// so a new kind of certificate never inherits another kind's permissions by accident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateKind {
    /// A node: the common name is the node ID of the certified key.
    Node,
    /// A cluster owner (an operator): may manage the cluster.
    Owner,
    /// An etcd member talking to its peers (etcd peer CA only).
    EtcdPeer,
}

impl CertificateKind {
    const ALL: [CertificateKind; 3] = [
        CertificateKind::Node,
        CertificateKind::Owner,
        CertificateKind::EtcdPeer,
    ];

    /// The organizational unit that marks this kind.
    pub const fn mark(self) -> &'static str {
        match self {
            CertificateKind::Node => "polis:node",
            CertificateKind::Owner => "polis:owner",
            CertificateKind::EtcdPeer => "polis:etcd-peer",
        }
    }

    pub fn from_mark(mark: &str) -> Option<CertificateKind> {
        Self::ALL.into_iter().find(|k| k.mark() == mark)
    }

    /// The kind a parsed certificate is marked with: `None` unless its subject holds
    /// exactly one organizational unit and that unit is a known mark.
    pub fn of(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<CertificateKind> {
        let mut units = cert.subject().iter_organizational_unit();
        let only = units.next()?;
        if units.next().is_some() {
            return None;
        }
        CertificateKind::from_mark(only.as_str().ok()?)
    }
}

/// What a certificate may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    ServerAndClient,
}

/// The subject part of a certificate to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub common_name: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub usage: Usage,
    pub lifetime: Duration,
    pub kind: CertificateKind,
}

/// A certificate issued by a [`Ca`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub der: Vec<u8>,
    pub serial: Vec<u8>,
}

/// A certificate authority: its certificate and private key.
#[derive(Clone, PartialEq, Eq)]
pub struct Ca {
    pub cert_der: Vec<u8>,
    key_pkcs8: Vec<u8>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A raw Ed25519 public key, as rcgen wants it for signing someone else's key.
struct Ed25519PublicKey<'a>(&'a [u8; 32]);

impl PublicKeyData for Ed25519PublicKey<'_> {
    fn der_bytes(&self) -> &[u8] {
        self.0
    }
    fn algorithm(&self) -> &'static SignatureAlgorithm {
        &PKCS_ED25519
    }
}

/// A random, positive, non-zero 16-byte serial number.
pub fn random_serial() -> Vec<u8> {
    use ring::rand::SecureRandom;
    let rng = ring::rand::SystemRandom::new();
    loop {
        let mut serial = [0u8; 16];
        rng.fill(&mut serial)
            .expect("the system random source does not fail on Linux");
        serial[0] &= 0x7f;
        if serial[0] != 0 {
            return serial.to_vec();
        }
    }
}

/// `(not_before, not_after)` for a certificate issued at `issued`: the whole lifetime
/// from `issued` on, plus the clock-skew allowance before it.
fn validity(issued: OffsetDateTime, lifetime: Duration) -> (OffsetDateTime, OffsetDateTime) {
    (issued - BACKDATE, issued + lifetime)
}

impl Ca {
    /// A new self-signed CA.
    pub fn generate(common_name: &str, lifetime: Duration) -> Result<Ca, PkiError> {
        let key = KeyPair::generate_for(&PKCS_ED25519)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(SerialNumber::from_slice(&random_serial()));
        params.key_identifier_method = KeyIdMethod::Sha256;
        (params.not_before, params.not_after) = validity(OffsetDateTime::now_utc(), lifetime);
        let cert = params.self_signed(&key)?;
        Ok(Ca {
            cert_der: cert.der().to_vec(),
            key_pkcs8: key.serialize_der(),
        })
    }

    /// A CA loaded from storage; checks that the key belongs to the certificate.
    pub fn from_parts(cert_der: Vec<u8>, key_pkcs8: Vec<u8>) -> Result<Ca, PkiError> {
        let key = KeyPair::try_from(key_pkcs8.as_slice()).map_err(|e| PkiError::Invalid {
            what: "CA private key",
            reason: e.to_string(),
        })?;
        let cert_key = certificate_public_key(&cert_der)?;
        if key.public_key_raw() != cert_key.as_slice() {
            return Err(PkiError::Invalid {
                what: "CA",
                reason: "private key does not match certificate".into(),
            });
        }
        Ok(Ca {
            cert_der,
            key_pkcs8,
        })
    }

    pub fn key_pkcs8(&self) -> &[u8] {
        &self.key_pkcs8
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, PkiError> {
        let key = KeyPair::try_from(self.key_pkcs8.as_slice())?;
        Ok(Issuer::from_ca_cert_der(
            &self.cert_der.clone().into(),
            key,
        )?)
    }

    /// Issues a certificate for `subject_key` (a raw Ed25519 public key), valid for the
    /// template's whole lifetime from now (and [`BACKDATE`] before now, for clock skew).
    pub fn issue(&self, template: &Template, subject_key: &[u8; 32]) -> Result<Issued, PkiError> {
        self.issue_at(template, subject_key, OffsetDateTime::now_utc())
    }

    /// Issues a certificate as if at `issued`: valid from `issued - BACKDATE` until
    /// `issued + lifetime`. Refuses lifetimes outside [`check_lifetime`]'s bounds.
    pub fn issue_at(
        &self,
        template: &Template,
        subject_key: &[u8; 32],
        issued: OffsetDateTime,
    ) -> Result<Issued, PkiError> {
        check_lifetime(template.lifetime)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, template.common_name.as_str());
        params
            .distinguished_name
            .push(DnType::OrganizationalUnitName, template.kind.mark());
        for dns in &template.dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName(dns.as_str().try_into().map_err(|_| {
                    PkiError::Invalid {
                        what: "DNS name",
                        reason: dns.clone(),
                    }
                })?));
        }
        for ip in &template.ip_addresses {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match template.usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::ServerAndClient => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        let serial = random_serial();
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = validity(issued, template.lifetime);
        let cert = params.signed_by(&Ed25519PublicKey(subject_key), &self.issuer()?)?;
        Ok(Issued {
            der: cert.der().to_vec(),
            serial,
        })
    }

    /// A CRL listing `revoked` serials, with a CRL number that must grow with every update.
    pub fn crl(&self, revoked: &[Vec<u8>], number: u64) -> Result<Vec<u8>, PkiError> {
        let now = OffsetDateTime::now_utc();
        let params = CertificateRevocationListParams {
            this_update: now - BACKDATE,
            next_update: now + CERTIFICATE_LIFETIME,
            crl_number: SerialNumber::from_slice(&number.to_be_bytes()),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|serial| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(serial),
                    revocation_time: now,
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&self.issuer()?)?.der().to_vec())
    }
}

/// The raw Ed25519 public key inside a DER certificate.
pub fn certificate_public_key(cert_der: &[u8]) -> Result<Vec<u8>, PkiError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|e| PkiError::Invalid {
            what: "certificate",
            reason: e.to_string(),
        })?;
    Ok(cert.public_key().subject_public_key.data.to_vec())
}

/// How long a DER certificate stays valid from now; `None` once it has expired.
pub fn time_to_expiry(cert_der: &[u8]) -> Result<Option<Duration>, PkiError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|e| PkiError::Invalid {
            what: "certificate",
            reason: e.to_string(),
        })?;
    Ok(cert
        .validity()
        .time_to_expiration()
        .and_then(|d| u64::try_from(d.whole_seconds()).ok())
        .map(Duration::from_secs))
}

/// The CRL number of a DER CRL, once its signature is checked against the CA
/// certificate `ca_der` (Ed25519) and its issuer is that CA: what a client needs before
/// it trusts a CRL that reached it over the network.
pub fn verified_crl_number(crl_der: &[u8], ca_der: &[u8]) -> Result<u64, PkiError> {
    let invalid = |reason: String| PkiError::Invalid {
        what: "CRL",
        reason,
    };
    let (_, crl) = x509_parser::parse_x509_crl(crl_der).map_err(|e| invalid(e.to_string()))?;
    let (_, ca) = x509_parser::parse_x509_certificate(ca_der).map_err(|e| PkiError::Invalid {
        what: "CA certificate",
        reason: e.to_string(),
    })?;
    if crl.issuer().as_raw() != ca.subject().as_raw() {
        return Err(invalid("it was not issued by the cluster CA".into()));
    }
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::ED25519,
        &ca.public_key().subject_public_key.data,
    )
    .verify(crl.tbs_cert_list.as_ref(), &crl.signature_value.data)
    .map_err(|_| invalid("its signature does not verify against the cluster CA".into()))?;
    let number = crl
        .crl_number()
        .ok_or_else(|| invalid("it carries no CRL number".into()))?;
    let digits = number.to_u64_digits();
    match digits.as_slice() {
        [] => Ok(0),
        [n] => Ok(*n),
        _ => Err(invalid("its CRL number is out of range".into())),
    }
}

/// The serial numbers a DER CRL lists.
pub fn crl_serials(crl_der: &[u8]) -> Result<Vec<Vec<u8>>, PkiError> {
    let (_, crl) = x509_parser::parse_x509_crl(crl_der).map_err(|e| PkiError::Invalid {
        what: "CRL",
        reason: e.to_string(),
    })?;
    Ok(crl
        .iter_revoked_certificates()
        .map(|r| r.raw_serial().to_vec())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(CertificateKind::from_mark("polis:admin"), None);
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
        let lifetime =
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
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
            let v = super::Validity {
                not_before,
                not_after,
            };
            assert_eq!((v.issued(), v.renew_at(), v.warn_at()), expected, "{v:?}");
        }
        let ca = Ca::generate("ca", CA_LIFETIME).unwrap();
        let mut t = template(Usage::Client);
        t.lifetime = Duration::from_secs(30);
        let now = unix_now();
        let v = super::Validity::of(&ca.issue(&t, &node_key()).unwrap().der).unwrap();
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
}
