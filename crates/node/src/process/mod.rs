//! The process on its host: how a runnable ends it (`fatal`), the test hooks that crash
//! it (`crash`, feature `crash-points`), the TCP retransmission bound of its network
//! namespace (`tcp`), and its `/metrics` endpoint (`exporter`). Each stands alone.
//!
//! ```text
//!   exporter        `/metrics`: --metrics-listen and its default, the node's collectors
//!   fatal           FatalSender, LeftCluster
//!   crash           POLIS_CRASH_AFTER crash points (feature `crash-points`)
//!   tcp             --tcp-rto-max-ms: TCP retransmission backoff ceiling (one sysctl)
//! ```

pub(crate) mod crash;
pub(crate) mod exporter;
pub(crate) mod fatal;
pub(crate) mod tcp;
