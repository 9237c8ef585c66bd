//! The node's settings, fixed for the life of the process (from its flags): root,
//! address, etcd binary and timing, curator lease, heartbeat timing, etcd upkeep,
//! snapshot interval bounds,
//! start time, and whether this start recovers a lost quorum (`polis-node recover`,
//! one etcd start).
//!
//! Plain data: may not do I/O; imports only `storage` (for the root's paths).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use consensus::RaftTiming;

use crate::storage::Root;

/// Node settings the role server and its runnables need.
#[derive(Debug, Clone)]
pub struct Settings {
    pub root: Root,
    pub address: IpAddr,
    pub etcd_binary: PathBuf,
    pub raft_timing: RaftTiming,
    pub curator_lease_ttl: Duration,
    /// How often this node heartbeats; its curator's timeout (`curator::health`).
    pub heartbeat: curator::health::Timing,
    /// etcd upkeep: how often the leader looks, the defragmentation floor.
    pub upkeep: curator::upkeep::Settings,
    /// Scheduled snapshots: the shortest interval this node's curator accepts.
    pub snapshot_bounds: proto::snapshots::Bounds,
    /// Per-source limits on RegisterNode and Escrow at this node's curator.
    pub entry_rate: rpc::server::RateSettings,
    /// When this polis-node process started (reported in its status).
    pub started_at_unix_ms: u64,
    /// Armed by `polis-node recover`: the etcd start of this process forces a new
    /// one-member cluster from the member's data.
    pub force_new_cluster: ForceNewCluster,
}

/// `--force-new-cluster` for one etcd start only: armed by `polis-node recover`,
/// disarmed by the control plane once that etcd answered. Never armed on any other
/// start, and never again in this process: a later restart of etcd with the flag would
/// remove every member that joined since.
#[derive(Debug, Clone, Default)]
pub struct ForceNewCluster(Arc<AtomicBool>);

impl ForceNewCluster {
    /// Armed: the next etcd start on existing data forces a new cluster.
    pub fn armed() -> Self {
        ForceNewCluster(Arc::new(AtomicBool::new(true)))
    }

    pub fn is_armed(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Returns whether it was armed.
    pub fn disarm(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn force_new_cluster_is_for_one_start() {
        assert!(!ForceNewCluster::default().is_armed());
        let armed = ForceNewCluster::armed();
        let seen_by_the_control_plane = armed.clone();
        assert!(seen_by_the_control_plane.is_armed());
        assert!(seen_by_the_control_plane.disarm());
        assert!(!armed.is_armed(), "disarmed for every holder");
        assert!(!armed.disarm());
    }
}
