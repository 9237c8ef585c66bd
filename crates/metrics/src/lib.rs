//! Prometheus metrics of one `polis-node`: the registry with every metric family, the
//! collectors read at scrape time, the tower layer that counts curator RPCs, and the
//! plain-HTTP `/metrics` endpoint.
//!
//! ```text
//! http       serve(): GET /metrics → OpenMetrics text of the registry (hyper, http1)
//!   │        seats: connections per source and in all, the idlest evicted (pure)
//!   │
//! rpc        RpcLayer: counts and times every curator call by method and gRPC code
//!   │
//! families   Metrics (global()): the registry and every family the node updates
//!   │
//! process · certs · snapshot · member
//!                   scrape-time collectors: /proc/self (RSS, fds, CPU, start time);
//!                   seconds left on each certificate file this node holds; gauge
//!                   families replaced as a whole; the last etcd member sample (leaves)
//! ```
//!
//! Every family is named `polis_…` in base units (`_seconds`, `_bytes`, `_total`).
//! Label sets on the hot path (RPCs) are made once per method and code, not per call.
//! This crate may not depend on any other Polis crate: the node feeds it values.

pub mod certs;
pub mod families;
pub mod http;
pub mod member;
pub mod process;
pub mod rpc;
mod seats;
pub mod snapshot;

pub use families::{Metrics, enabled, global, set_enabled};
pub use http::serve;
pub use rpc::RpcLayer;
