//! The curator's TLS server configuration: TLS 1.3 and HTTP/2 only, presenting a
//! credential slot, and accepting any client certificate at the handshake (with proof of
//! possession): who the client is gets decided per call by the authenticator.
//!
//! May not classify clients.

use std::sync::Arc;

use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::credentials::{CredentialSlot, Credentials, SlotResolver};
use super::crypto::{ProofOfPossession, handshake_signature_checks, provider};
use crate::RpcError;

/// Accepts any client certificate at the handshake (while still checking that the client
/// holds its key); who the client is gets decided per RPC by [`Authenticator`](super::Authenticator).
#[derive(Debug)]
struct DeferClientAuthentication {
    keys: ProofOfPossession,
}

impl ClientCertVerifier for DeferClientAuthentication {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    handshake_signature_checks!();
}

/// The curator's TLS server configuration (HTTP/2 only) with fixed credentials.
pub fn server_config(credentials: &Credentials) -> Result<Arc<rustls::ServerConfig>, RpcError> {
    server_config_from(&CredentialSlot::new(credentials.clone())?)
}

/// The curator's TLS server configuration (HTTP/2 only), presenting whatever `slot`
/// holds at each handshake: a renewed certificate is served from the next one on.
pub fn server_config_from(slot: &CredentialSlot) -> Result<Arc<rustls::ServerConfig>, RpcError> {
    let provider = provider();
    let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(DeferClientAuthentication {
            keys: ProofOfPossession { provider },
        }))
        .with_cert_resolver(Arc::new(SlotResolver(slot.clone())));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
