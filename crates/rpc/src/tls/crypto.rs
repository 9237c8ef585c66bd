//! The one crypto provider Polis uses (ring), and the handshake-signature checks every
//! certificate verifier here shares: a peer must hold the key of the certificate it
//! presents, whatever is decided about the certificate itself.
//!
//! A leaf: may not build configurations or judge certificates.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The only crypto provider Polis uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Checks handshake signatures: that the peer holds the key of the certificate it
/// presented. Kept even where the certificate itself is judged later (or never).
#[derive(Debug)]
pub(super) struct ProofOfPossession {
    pub(super) provider: Arc<CryptoProvider>,
}

impl ProofOfPossession {
    pub(super) fn verify_tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }
    pub(super) fn verify_tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }
    pub(super) fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The handshake-signature methods both rustls verifier traits require, delegated to
/// the verifier's `keys: ProofOfPossession`.
macro_rules! handshake_signature_checks {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.keys.verify_tls12(message, cert, dss)
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.keys.verify_tls13(message, cert, dss)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.keys.schemes()
        }
    };
}
pub(super) use handshake_signature_checks;
