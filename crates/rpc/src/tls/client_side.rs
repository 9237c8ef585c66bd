//! Client TLS configurations: how a client checks the server it dials
//! ([`ServerTrust`]: pinned CA, the cluster CAs with their CRLs, or trust on first use), and
//! which credentials it presents. Under a CA (pinned or cluster) the server must also
//! present a curator certificate (`pki::CertificateKind::Curator`, [`CuratorOnly`]): a
//! node's own certificate, valid as it is, does not make its holder a curator.
//!
//! May not classify callers (that is the server's `authenticator`).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::credentials::{CredentialSlot, Credentials, SlotResolver};
use super::crypto::{ProofOfPossession, handshake_signature_checks, provider};
use super::trust_slot::{Anchors, TrustSlot};
use crate::RpcError;

/// How a client checks the server it talks to. Every server a client dials is a
/// curator: under `PinnedCa` and `ClusterCa` its certificate must be marked
/// `polis:curator`.
#[derive(Debug, Clone)]
pub enum ServerTrust {
    /// The server certificate must chain to this CA (DER), name the address dialed and
    /// be a curator certificate.
    PinnedCa(Vec<u8>),
    /// As `PinnedCa`, but the certificate may chain to any CA `trust` holds and must
    /// not be on that CA's CRL (as they are when the connection is made): what nodes
    /// and owners use once they belong to the cluster.
    ClusterCa { trust: TrustSlot },
    /// As `ClusterCa`, but the server must be node `node_id` itself (its node
    /// certificate, not a curator's): for what a node serves about itself on its own
    /// port (its logs). Any other node, curator or not, is refused.
    ClusterNode { trust: TrustSlot, node_id: String },
    /// As `ClusterCa`, but the server may be any node of the cluster (its node
    /// certificate, for the address dialed, like every server certificate): for what a
    /// consensus member answers about itself on its own port while its curator cannot
    /// run (`cluster status` without a quorum), when the caller does not know its ID.
    ClusterMember { trust: TrustSlot },
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

/// Who the server must be, on top of a CA-checked certificate.
#[derive(Debug)]
enum ExpectedServer {
    Curator,
    Node(String),
    AnyNode,
}

/// A CA-checked server certificate (`inner`: chain, name, validity, CRL) that must
/// also be the expected server's: a curator certificate, or one node's own.
#[derive(Debug)]
struct CuratorOnly {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    expected: ExpectedServer,
    keys: ProofOfPossession,
}

/// Why a server certificate that verified is still not a curator's (`None`: it is one).
fn why_not_a_curator(end_entity: &[u8]) -> Option<String> {
    let kind = x509_parser::parse_x509_certificate(end_entity)
        .ok()
        .and_then(|(_, cert)| pki::CertificateKind::of(&cert));
    match kind {
        Some(pki::CertificateKind::Curator) => None,
        Some(other) => Some(format!(
            "the server's certificate is not a curator certificate (it is marked {})",
            other.mark()
        )),
        None => Some(
            "the server's certificate is not a curator certificate (it carries no known \
             role mark)"
                .into(),
        ),
    }
}

/// Why a server certificate that verified is no node certificate (`None`: it is one).
fn why_not_a_node(end_entity: &[u8]) -> Option<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(end_entity) else {
        return Some("the server's certificate does not parse".into());
    };
    (pki::CertificateKind::of(&cert) != Some(pki::CertificateKind::Node))
        .then(|| "the server's certificate is not a node certificate".into())
}

/// Why a server certificate that verified is still not node `node_id`'s own node
/// certificate (`None`: it is).
fn why_not_the_node(end_entity: &[u8], node_id: &str) -> Option<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(end_entity) else {
        return Some("the server's certificate does not parse".into());
    };
    if pki::CertificateKind::of(&cert) != Some(pki::CertificateKind::Node) {
        return Some("the server's certificate is not a node certificate".into());
    }
    let name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default();
    (name != node_id).then(|| {
        format!("the server is node {name:?}, not node {node_id} (its address changed hands?)")
    })
}

impl ServerCertVerifier for CuratorOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let refusal: Option<Arc<dyn std::error::Error + Send + Sync>> = match &self.expected {
            ExpectedServer::Curator => {
                why_not_a_curator(end_entity).map(|r| Arc::new(NotACurator(r)) as _)
            }
            ExpectedServer::Node(id) => {
                why_not_the_node(end_entity, id).map(|r| Arc::new(NotTheNode(r)) as _)
            }
            ExpectedServer::AnyNode => {
                why_not_a_node(end_entity).map(|r| Arc::new(NotTheNode(r)) as _)
            }
        };
        match refusal {
            None => Ok(verified),
            Some(reason) => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(reason)),
            )),
        }
    }
    handshake_signature_checks!();
}

/// The error a client's handshake fails with when the server is no curator.
#[derive(Debug)]
struct NotACurator(String);

/// The reason, when a refused server certificate was refused for being no curator's.
pub(crate) fn not_a_curator(refusal: &rustls::CertificateError) -> Option<String> {
    match refusal {
        rustls::CertificateError::Other(other) => {
            other.0.downcast_ref::<NotACurator>().map(|n| n.0.clone())
        }
        _ => None,
    }
}

impl std::fmt::Display for NotACurator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotACurator {}

/// The error a client's handshake fails with when the server is not the node asked for.
#[derive(Debug)]
struct NotTheNode(String);

/// The reason, when a refused server certificate was refused for being another node's.
pub(crate) fn not_the_node(refusal: &rustls::CertificateError) -> Option<String> {
    match refusal {
        rustls::CertificateError::Other(other) => {
            other.0.downcast_ref::<NotTheNode>().map(|n| n.0.clone())
        }
        _ => None,
    }
}

impl std::fmt::Display for NotTheNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotTheNode {}

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
    let checked = |anchors: Anchors, expected| -> Result<_, RpcError> {
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            anchors.roots().map_err(RpcError::Certificate)?,
            provider.clone(),
        )
        .with_crls(anchors.crl_ders())
        .build()
        .map_err(|e| RpcError::Certificate(format!("cluster CRL: {e}")))?;
        Ok(Arc::new(CuratorOnly {
            inner,
            expected,
            keys: ProofOfPossession {
                provider: provider.clone(),
            },
        }))
    };
    let builder = match trust {
        ServerTrust::PinnedCa(ca) => builder
            .dangerous()
            .with_custom_certificate_verifier(checked(
                Anchors::one(ca.clone(), None),
                ExpectedServer::Curator,
            )?),
        ServerTrust::ClusterCa { trust } => builder
            .dangerous()
            .with_custom_certificate_verifier(checked(trust.anchors(), ExpectedServer::Curator)?),
        ServerTrust::ClusterNode { trust, node_id } => builder
            .dangerous()
            .with_custom_certificate_verifier(checked(
                trust.anchors(),
                ExpectedServer::Node(node_id.clone()),
            )?),
        ServerTrust::ClusterMember { trust } => builder
            .dangerous()
            .with_custom_certificate_verifier(checked(trust.anchors(), ExpectedServer::AnyNode)?),
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
