//! How a runnable ends the node: the channel to main for errors no retry can fix, and
//! [`LeftCluster`], the one good ending (decommissioned: main wipes the data, exits 0).
//!
//! A leaf: imports no other module of this crate.

/// Where a fatal (not retryable) error goes: main stops the node with it. A
/// [`LeftCluster`] error is the one good ending: main wipes the node's data and exits 0.
pub type FatalSender = tokio::sync::mpsc::UnboundedSender<anyhow::Error>;

/// The node was decommissioned: it has left its cluster for good.
#[derive(Debug, thiserror::Error)]
#[error("node {node_id} was decommissioned and left its cluster")]
pub struct LeftCluster {
    pub node_id: String,
}
