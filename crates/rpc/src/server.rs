//! Server plumbing: the curator's listener, TLS connections carrying the client's
//! certificate, and the layer that authenticates and authorizes every call before it
//! reaches a handler.
//!
//! ```text
//!   accept ─▶ TCP_NODELAY ─▶ seat (admission: per source, in all; the oldest idle
//!             stranger evicted to make room) ─▶ its source's handshake turn ─▶ TLS (≤ 5 s)
//!             ─▶ tonic
//!   TlsConn: closed when no call starts within 10 s of the handshake, when no call
//!            has been in flight for 120 s (AuthLayer counts calls per connection), or
//!            at once when evicted; proven (kept, not counted per source) while its
//!            latest call came with a node's or an admin's certificate
//! ```
//!
//! Invariants (see [`Limits`] for the numbers and why):
//! - A client holds a descriptor only while it makes progress: a handshake is bounded,
//!   a connection that never calls (no HTTP/2 preface, or silence after it) is closed,
//!   and so is one that stopped calling.
//! - No source holds more than its cap of connections without a cluster identity, nor
//!   more than its cap of handshakes at once; at the listener's cap the oldest
//!   connection without a cluster identity and without a call in flight is closed to
//!   seat the newcomer. So a flood, from one address or many, cannot keep a node or
//!   an owner out, and connections of nodes and owners are never the ones closed.
//!   A connection whose certificate was revoked (a removed admin) counts again from
//!   its next call on: revocation takes the seat's protection too.
//! - The caps come from the open-files limit, shared among the node's listeners with a
//!   reserve, so the caps decide before EMFILE does; when descriptors run out anyway,
//!   the oldest idle stranger is closed and the accept loop pauses briefly instead of
//!   spinning on the error (EMFILE, ENFILE, ENOBUFS, ENOMEM).
//! - A connection whose certificate verified is closed once it no longer does (its CA
//!   retired by a rotation, its serial revoked, its time run out; checked as the
//!   anchors change, and every 30 s): the streams it carries end with it.
//! - Refusals, evictions and accept errors are logged at most once a second, with a
//!   count.
//!
//! Modules, by layer (each imports only from those below it):
//!
//! ```text
//!   accept    incoming(): accept loop, seats, handshake turns, bounded handshake
//!      │
//!      ▼                                    auth   AuthLayer: classify, forwarded
//!   conn      TlsConn, PeerInfo  ◀───────────────  identity, authorize; counts
//!      │                                           each call in flight; proven
//!      ▼                                      │    while the latest is a node/admin
//!   sweep     Sweeper: connections whose certificate verified, evicted once it
//!      │      no longer does under the current anchors (owned by auth)
//!   calls     Calls: in flight, proven, evicted ◀┘
//!      │
//!      ▼
//!   admission Table: seats per source and in all, who is evicted; source_key (pure)
//!   limits    Limits (caps, timeouts), Port (shares of the open-files limit)
//!
//!   settings  builder(), MAX_REQUEST_BYTES, RequestSizeLimit (leaf)
//!   rate      RateLayer: per-source token buckets on the calls anyone may make, and
//!             a cap on their streams open per source (leaf beside auth; reads
//!             PeerInfo)
//!      │
//!   streams   OpenStreams, Place, HeldBody: streams open per source (leaf)
//!   audit     AuditLayer: audited calls handed to an AuditSink before they end
//! ```

mod accept;
mod admission;
mod audit;
mod auth;
mod calls;
mod conn;
mod expiry;
mod limits;
mod rate;
mod settings;
mod streams;
mod sweep;

pub use accept::{LogBudget, incoming, incoming_with};
pub use admission::source_key;
pub use audit::{
    AuditCall, AuditLayer, AuditSink, CallInProgress, call_in_progress, first_message, run_in_call,
};
pub use auth::{
    AuthLayer, AuthService, ClientCertificate, CountedBody, DenialHook, Forwarders, STREAM_REVOKED,
    TrustSource, denied_status,
};
pub use conn::{PeerInfo, TlsConn};
pub use expiry::{Expiring, STREAM_EXPIRED, ending_at_expiry};
pub use limits::{Limits, Port};
pub use rate::{Buckets, LIMITED, RateLayer, RateService, RateSettings, STREAMED};
pub use settings::{
    HTTP2_KEEPALIVE_INTERVAL, HTTP2_KEEPALIVE_TIMEOUT, MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_SIZE, MAX_PENDING_ACCEPT_RESET_STREAMS, MAX_REQUEST_BYTES, RequestSizeLimit,
    SizeLimited, builder,
};
pub use streams::{HeldBody, OpenStreams, Place};

#[cfg(test)]
mod sweep_tests;
#[cfg(test)]
mod tests;
