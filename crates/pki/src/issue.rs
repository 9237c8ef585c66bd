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
/// Lifetime of node, peer and user certificates.
pub const CERTIFICATE_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Tolerance for clocks that are slightly behind the issuer's.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

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

fn validity(lifetime: Duration) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    (now - BACKDATE, now + lifetime)
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
        (params.not_before, params.not_after) = validity(lifetime);
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

    /// Issues a certificate for `subject_key` (a raw Ed25519 public key), valid from now
    /// (minus a small allowance for clock skew) for the template's lifetime.
    pub fn issue(&self, template: &Template, subject_key: &[u8; 32]) -> Result<Issued, PkiError> {
        let (not_before, _) = validity(template.lifetime);
        self.issue_at(template, subject_key, not_before)
    }

    /// Issues a certificate valid from `not_before` for the template's lifetime.
    pub fn issue_at(
        &self,
        template: &Template,
        subject_key: &[u8; 32],
        not_before: OffsetDateTime,
    ) -> Result<Issued, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, template.common_name.as_str());
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
        params.not_before = not_before;
        params.not_after = not_before + template.lifetime;
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
        }
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
