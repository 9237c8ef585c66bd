//! Reading DER certificates and CRLs: the public key, the time left, a CRL's number
//! (only once its signature checks out against the CA) and the serials it lists.
//!
//! A leaf: pure; may not issue or sign.

use std::time::Duration;

use crate::PkiError;

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

/// The first common name of `name` (a certificate's subject or issuer), empty when it
/// has none.
pub fn common_name(name: &x509_parser::x509::X509Name<'_>) -> String {
    name.iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string()
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

/// Whether `signature` is the CA `ca_der`'s Ed25519 signature of `message`
/// (`Ca::sign`). A CA that does not parse signed nothing.
pub fn signed_by(ca_der: &[u8], message: &[u8], signature: &[u8]) -> bool {
    let Ok((_, ca)) = x509_parser::parse_x509_certificate(ca_der) else {
        return false;
    };
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::ED25519,
        &ca.public_key().subject_public_key.data,
    )
    .verify(message, signature)
    .is_ok()
}

/// Whether the CA `ca_der` issued the certificate `der`: its issuer is the CA's subject
/// and the CA's key verifies its signature (Ed25519, as every CA here signs). A
/// certificate or CA that does not parse was not.
pub fn issued_by(der: &[u8], ca_der: &[u8]) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(der),
        x509_parser::parse_x509_certificate(ca_der),
    ) else {
        return false;
    };
    cert.issuer().as_raw() == ca.subject().as_raw()
        && ring::signature::UnparsedPublicKey::new(
            &ring::signature::ED25519,
            &ca.public_key().subject_public_key.data,
        )
        .verify(cert.tbs_certificate.as_ref(), &cert.signature_value.data)
        .is_ok()
}
