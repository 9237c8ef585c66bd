//! RPC plumbing: mutual TLS for the curator's gRPC services, and who may call what.
//!
//! ```text
//!   client (polisctl, node) ──TLS 1.3, client cert──▶ incoming() ──▶ AuthLayer ──▶ handler
//!                                                     handshake:      per call:
//!                                                     proves key      classify cert (CA, expiry, CRL)
//!                                                     possession      authorize(method, identity)
//!                                                                     Identity → request extensions
//! ```
//!
//! The handshake accepts any client certificate, because registering nodes and an owner
//! taking ownership can only present self-signed ones. The decision happens per call:
//! [`tls::Authenticator`] classifies the certificate as anonymous, self-signed, node,
//! user or invalid (expired, revoked, foreign CA, no known kind mark), and
//! [`authz::authorize`] checks it against the one permission table, [`authz::METHODS`].
//! [`incoming`] is the curator's listener, with its caps and timeouts
//! ([`server::Limits`]); [`server::builder`] the tonic settings every curator uses.
//!
//! Invariants:
//! - An RPC that is not in the table is denied, whoever calls it.
//! - Certificates that claim the cluster but fail verification are never downgraded to
//!   anonymous: they are denied everywhere.
//! - A cluster certificate is a node's or a user's only by the kind the CA marked it with
//!   (`pki::CertificateKind`); without a known mark it is invalid.
//! - Every cluster certificate is checked against the current CRL on every call (a
//!   verdict on a certificate is remembered only for the CRL it was reached under, and
//!   only until the certificate expires).
//! - A call's request body is at most [`server::MAX_REQUEST_BYTES`].
//! - Renewed certificates apply without a restart: servers and clients take theirs from a
//!   [`CredentialSlot`] at every handshake, and [`CuratorClient`] drops a connection made
//!   with credentials that were replaced since.
//! - A client never takes an answer from a curator of an older cluster epoch than one
//!   it has seen (`epoch`).
//! - rustls uses the ring provider only, and TLS 1.3 only (Polis controls both ends).
//!
//! Modules, by layer (each imports only from those below it; the crate root holds
//! [`RpcError`], [`REVOKED`] and [`fingerprint`] for all of them):
//!
//! ```text
//!   client    CuratorClient (follows the leader), connect()
//!      │                      server   listener (accept, conn, calls, limits),
//!      │                         │     AuthLayer (auth), builder() (settings),
//!      │                         │     RateLayer (rate: per-source limits)
//!      │                         ├──────────────┐
//!      ▼                         ▼              ▼
//!   tls       credentials, server_side,      forward   ForwardLayer: calls a
//!             client_side, trust_slot,          │      follower sends to the leader
//!             authenticator, crypto             │
//!      │                                        │
//!      ▼                                        ▼
//!   authz     Identity, the permission table, authorize() (pure, leaf)
//!   spread    by_preference(): the curator order that spreads nodes (pure, leaf)
//!   epoch     EpochLayer (each answer names the curator's cluster epoch), EpochSlot
//!             (the newest a client saw; older answers refused by CuratorClient) (leaf)
//! ```

pub mod authz;
pub mod client;
pub mod epoch;
pub mod forward;
pub mod server;
pub mod spread;
pub mod tls;

pub use authz::{Identity, Permission};

/// How the curator says that a client certificate is on the CRL (in the status message
/// of an Unauthenticated refusal). Node certificates are revoked only when their node
/// is decommissioned or deleted, so for a node this means it left the cluster.
pub const REVOKED: &str = "the certificate is revoked";

/// Whether `status` refuses the caller because its certificate is revoked.
pub fn is_revoked(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unauthenticated && status.message().contains(REVOKED)
}
pub use client::{
    CURATOR_PORT, CallError, CuratorClient, NODE_LOGS_PORT, connect, connect_from, connect_with,
    leader_endpoint, parse_endpoint, parse_endpoints, url_address,
};
pub use forward::{ForwardLayer, Forwarding};
pub use server::{AuthLayer, Forwarders, Limits, PeerInfo, Port, TrustSource, incoming};
pub use tls::{
    Anchors, Authenticator, CredentialSlot, Credentials, ServerTrust, TrustSlot, self_signed,
};

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("TLS configuration")]
    Tls(#[from] rustls::Error),
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("invalid endpoint {endpoint:?}: want an IP address, optionally with :PORT")]
    BadEndpoint { endpoint: String },
    #[error("{endpoint} does not present a certificate of the trusted cluster CA ({reason})")]
    UntrustedServer {
        endpoint: std::net::SocketAddr,
        reason: String,
    },
    #[error("{endpoint} is no curator of this cluster: {reason}")]
    NotACurator {
        endpoint: std::net::SocketAddr,
        reason: String,
    },
    #[error("{endpoint} is not the node asked for: {reason}")]
    NotTheNode {
        endpoint: std::net::SocketAddr,
        reason: String,
    },
    #[error("cannot reach {endpoint}: {reason}")]
    Connect {
        endpoint: std::net::SocketAddr,
        reason: String,
    },
}

/// SHA-256 fingerprint of a DER certificate, as lowercase hex.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, der))
}
