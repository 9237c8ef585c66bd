//! Pure certificate logic: generating CAs, issuing certificates and CRLs (no I/O).
//!
//! Uses the lifetime bounds, the kind marks and DER inspection; may not store anything
//! (that is `store`).

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    PKCS_ED25519, PublicKeyData, RevokedCertParams, SanType, SerialNumber, SignatureAlgorithm,
};
use time::OffsetDateTime;

use crate::PkiError;
use crate::inspect::certificate_public_key;
use crate::kind::CertificateKind;
use crate::lifetime::{BACKDATE, CERTIFICATE_LIFETIME, check_lifetime};

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
pub(crate) struct Ed25519PublicKey<'a>(pub(crate) &'a [u8; 32]);

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

/// A CA certificate named `common_name`, valid for `lifetime` from now, with a fresh
/// serial: what every CA of ours and every handover (`crate::handover`) shares.
pub(crate) fn ca_params(common_name: &str, lifetime: Duration) -> CertificateParams {
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
    (params.not_before, params.not_after) = validity(OffsetDateTime::now_utc(), lifetime);
    params
}

impl Ca {
    /// A new self-signed CA.
    pub fn generate(common_name: &str, lifetime: Duration) -> Result<Ca, PkiError> {
        let key = KeyPair::generate_for(&PKCS_ED25519)?;
        let mut params = ca_params(common_name, lifetime);
        params.key_identifier_method = KeyIdMethod::Sha256;
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

    /// An Ed25519 signature of `message` by the CA's key: for statements a client checks
    /// against the CAs it trusts (`crate::signed_by`), such as a cluster epoch.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, PkiError> {
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&self.key_pkcs8)
            .map_err(|e| PkiError::Invalid {
                what: "CA private key",
                reason: e.to_string(),
            })?;
        Ok(pair.sign(message).as_ref().to_vec())
    }

    pub(crate) fn issuer(&self) -> Result<Issuer<'static, KeyPair>, PkiError> {
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
        let subject = [(
            DnType::OrganizationalUnitName,
            template.kind.mark().to_string(),
        )];
        self.issue_leaf(template, &subject, subject_key, issued)
    }

    /// Issues a certificate of another PKI kept with Polis's (Kubernetes'): without the
    /// Polis kind mark (`template.kind` is not written), with `organizations` as the
    /// subject's O (Kubernetes reads its groups from them).
    pub fn issue_foreign(
        &self,
        template: &Template,
        organizations: &[String],
        subject_key: &[u8; 32],
    ) -> Result<Issued, PkiError> {
        let subject: Vec<(DnType, String)> = organizations
            .iter()
            .map(|o| (DnType::OrganizationName, o.clone()))
            .collect();
        self.issue_leaf(template, &subject, subject_key, OffsetDateTime::now_utc())
    }

    fn issue_leaf(
        &self,
        template: &Template,
        subject: &[(DnType, String)],
        subject_key: &[u8; 32],
        issued: OffsetDateTime,
    ) -> Result<Issued, PkiError> {
        check_lifetime(template.lifetime)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, template.common_name.as_str());
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), value.as_str());
        }
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

#[cfg(test)]
mod tests;
