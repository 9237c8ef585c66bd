//! Server plumbing: the curator's listener, TLS connections carrying the client's
//! certificate, and the layer that authenticates and authorizes every call before it
//! reaches a handler.
//!
//! ```text
//!   accept ─▶ TCP_NODELAY ─▶ connection slot? ─▶ handshake slot? ─▶ TLS (≤ 5 s) ─▶ tonic
//!             (no slot: closed at once)                                │
//!   TlsConn: closed when no call starts within 10 s of the handshake, or when no call
//!            has been in flight for 120 s (AuthLayer counts calls per connection)
//! ```
//!
//! Invariants (see [`Limits`] for the numbers and why):
//! - A client holds a descriptor only while it makes progress: a handshake is bounded,
//!   a connection that never calls (no HTTP/2 preface, or silence after it) is closed,
//!   and so is one that stopped calling.
//! - Open connections and concurrent handshakes are capped; beyond a cap a new connection
//!   is closed at once, never queued, so a flood cannot hold the curator's descriptors.
//! - Refusals and accept errors are logged at most once a second, with a count, and an
//!   accept error that signals exhaustion (EMFILE, ENFILE, ENOBUFS, ENOMEM) pauses the
//!   accept loop briefly instead of spinning on it.
//!
//! Modules, by layer (each imports only from those below it):
//!
//! ```text
//!   accept    incoming(): accept loop, caps, bounded handshake
//!      │
//!      ▼                                    auth   AuthLayer: classify, forwarded
//!   conn      TlsConn, PeerInfo  ◀───────────────  identity, authorize; counts
//!      │                                           each call in flight
//!      ▼                                      │
//!   calls     Calls in flight per connection ◀┘
//!      │
//!      ▼
//!   limits    Limits (caps, timeouts)
//!
//!   settings  builder(), MAX_REQUEST_BYTES, RequestSizeLimit (leaf)
//!   rate      RateLayer: per-source token buckets on RegisterNode and Escrow (leaf
//!             beside auth; reads PeerInfo)
//!   audit     AuditLayer: audited calls handed to an AuditSink before they end
//! ```

mod accept;
mod audit;
mod auth;
mod calls;
mod conn;
mod limits;
mod rate;
mod settings;

pub use accept::{LogBudget, incoming, incoming_with};
pub use audit::{AuditCall, AuditLayer, AuditSink, first_message};
pub use auth::{
    AuthLayer, AuthService, ClientCertificate, CountedBody, CrlSource, DenialHook, Forwarders,
    denied_status,
};
pub use conn::{PeerInfo, TlsConn};
pub use limits::Limits;
pub use rate::{Buckets, LIMITED, RateLayer, RateService, RateSettings, source_key};
pub use settings::{
    HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT, MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_SIZE, MAX_PENDING_ACCEPT_RESET_STREAMS, MAX_REQUEST_BYTES, RequestSizeLimit,
    SizeLimited, builder,
};

#[cfg(test)]
mod tests;
