//! The node's settings, fixed for the life of the process (from its flags): root,
//! address, etcd binary and timing, curator lease, heartbeat timing, etcd upkeep,
//! snapshot interval bounds and start time. (Whether etcd starts forced by a recover is
//! not here: it is kept on disk, `epochs::resume_recover`, so that it survives a crash.)
//!
//! Plain data: may not do I/O; imports only `storage` (for the root's paths).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use consensus::RaftTiming;

use crate::disk::storage::Root;

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
    /// The folder of the Kubernetes programs (KubernetesController).
    pub kubernetes_binaries: PathBuf,
    /// The Kubernetes components' certificate lifetime to ask for (`None`: the default).
    pub kubernetes_certificate_lifetime: Option<Duration>,
    /// The container runtime's programs (KubernetesWorker).
    pub runtime_binaries: PathBuf,
    /// OCI image archives a worker imports at start.
    pub kubernetes_images: PathBuf,
    /// The CNI plugins' folder.
    pub cni_plugins: PathBuf,
}
