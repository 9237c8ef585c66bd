//! The test CA of the x509 targets and their seeds, and what it issued.
//!
//! A CRL or a client certificate is only looked at past its signature check, so the
//! targets check against a fixed CA (`fixtures/ca.der`) and the seeds are signed by its
//! key (`fixtures/ca.key.der`, a test key that signs nothing else; `polis-fuzz fixture`
//! makes a new pair). Everything issued here is made once per process: under AFL's
//! persistent mode a target runs many inputs in one process.

use std::sync::OnceLock;

/// The CA every x509 target checks against (DER).
pub const CA_DER: &[u8] = include_bytes!("../fixtures/ca.der");
const CA_KEY_PKCS8: &[u8] = include_bytes!("../fixtures/ca.key.der");

/// The fixed test CA.
pub fn ca() -> &'static pki::Ca {
    static CA: OnceLock<pki::Ca> = OnceLock::new();
    CA.get_or_init(|| {
        pki::Ca::from_parts(CA_DER.to_vec(), CA_KEY_PKCS8.to_vec())
            .expect("fuzz/fixtures hold a matching CA certificate and key")
    })
}

/// A node certificate of the test CA, as a node presents it to a curator.
pub fn node_certificate() -> &'static [u8] {
    static CERT: OnceLock<Vec<u8>> = OnceLock::new();
    CERT.get_or_init(|| issue(curator::templates::node_certificate_template))
}

/// A curator certificate of the test CA, as a curator serves it.
pub fn curator_certificate() -> &'static [u8] {
    static CERT: OnceLock<Vec<u8>> = OnceLock::new();
    CERT.get_or_init(|| issue(curator::templates::curator_certificate_template))
}

/// An owner certificate of the test CA.
pub fn owner_certificate() -> &'static [u8] {
    static CERT: OnceLock<Vec<u8>> = OnceLock::new();
    CERT.get_or_init(|| {
        let template =
            curator::templates::owner_certificate_template(pki::OWNER_CERTIFICATE_LIFETIME);
        let key = identity::NodeKey::generate().expect("a key");
        ca().issue(&template, &key.public_key())
            .expect("the test CA issues")
            .der
    })
}

fn issue(template: fn(&str, std::net::IpAddr, std::time::Duration) -> pki::Template) -> Vec<u8> {
    let key = identity::NodeKey::generate().expect("a key");
    let template = template(
        &key.node_id(),
        [127, 0, 0, 1].into(),
        pki::CERTIFICATE_LIFETIME,
    );
    ca().issue(&template, &key.public_key())
        .expect("the test CA issues")
        .der
}

/// The test CA's CRL, revoking one certificate (not [`node_certificate`]).
pub fn crl() -> &'static [u8] {
    static CRL: OnceLock<Vec<u8>> = OnceLock::new();
    CRL.get_or_init(|| {
        let revoked = pki::certificate_serial(owner_certificate()).expect("it parses");
        ca().crl(&[revoked], 7).expect("the test CA signs a CRL")
    })
}

/// A CA that succeeded the test CA in a rotation (made once per process).
pub fn successor() -> &'static pki::Ca {
    static CA: OnceLock<pki::Ca> = OnceLock::new();
    CA.get_or_init(|| pki::Ca::generate("polis fuzz test CA", pki::CA_LIFETIME).expect("a CA"))
}

/// The test CA's handover to [`successor`], as a curator answers it after a rotation.
pub fn handover() -> &'static [u8] {
    static HANDOVER: OnceLock<Vec<u8>> = OnceLock::new();
    HANDOVER.get_or_init(|| {
        ca().hand_over_to(successor())
            .expect("the test CA hands over")
    })
}

/// A new test CA: its certificate and its PKCS#8 key (what `fixtures/` holds).
pub fn generate() -> (Vec<u8>, Vec<u8>) {
    let ca = pki::Ca::generate("polis fuzz test CA", pki::CA_LIFETIME).expect("a CA");
    (ca.cert_der.clone(), ca.key_pkcs8().to_vec())
}
