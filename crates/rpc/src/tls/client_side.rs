//! Client TLS configurations: how a client checks the server it dials
//! ([`ServerTrust`]: pinned CA, cluster CA with its CRL, or trust on first use), and
//! which credentials it presents.
//!
//! May not classify callers (that is the server's `authenticator`).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::credentials::{CredentialSlot, Credentials, SlotResolver};
use super::crl_slot::CrlSlot;
use super::crypto::{ProofOfPossession, handshake_signature_checks, provider};
use crate::RpcError;

/// How a client checks the server it talks to.
#[derive(Debug, Clone)]
pub enum ServerTrust {
    /// The server certificate must chain to this CA (DER) and name the address dialed.
    PinnedCa(Vec<u8>),
    /// As `PinnedCa`, and the certificate must not be on the CRL in `crl` (as it is
    /// when the connection is made): what nodes and owners use once they belong to the
    /// cluster.
    ClusterCa { ca: Vec<u8>, crl: CrlSlot },
    /// Accept any server certificate: only for fetching the CA to pin (trust on first
    /// use, confirmed by the operator through its fingerprint).
    FirstUse,
}

#[derive(Debug)]
struct AcceptAnyServer {
    keys: ProofOfPossession,
}

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    handshake_signature_checks!();
}

/// A client TLS configuration (HTTP/2), optionally presenting `client` credentials.
pub fn client_config(
    trust: &ServerTrust,
    client: Option<&Credentials>,
) -> Result<Arc<rustls::ClientConfig>, RpcError> {
    client_config_from(
        trust,
        client
            .map(|c| CredentialSlot::new(c.clone()))
            .transpose()?
            .as_ref(),
    )
}

/// A client TLS configuration (HTTP/2), presenting what `client` holds at each
/// handshake, if given.
pub fn client_config_from(
    trust: &ServerTrust,
    client: Option<&CredentialSlot>,
) -> Result<Arc<rustls::ClientConfig>, RpcError> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let pinned = |ca: &Vec<u8>| -> Result<Arc<rustls::RootCertStore>, RpcError> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca.clone()))
            .map_err(|e| RpcError::Certificate(format!("pinned CA: {e}")))?;
        Ok(Arc::new(roots))
    };
    let builder = match trust {
        ServerTrust::PinnedCa(ca) => builder.with_root_certificates(pinned(ca)?),
        ServerTrust::ClusterCa { ca, crl } => match crl.current() {
            None => builder.with_root_certificates(pinned(ca)?),
            Some(crl) => {
                let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    pinned(ca)?,
                    provider,
                )
                .with_crls([CertificateRevocationListDer::from(crl)])
                .build()
                .map_err(|e| RpcError::Certificate(format!("cluster CRL: {e}")))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(verifier)
            }
        },
        ServerTrust::FirstUse => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServer {
                keys: ProofOfPossession { provider },
            })),
    };
    let mut config = match client {
        Some(slot) => builder.with_client_cert_resolver(Arc::new(SlotResolver(slot.clone()))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
