//! The curator: the only API to cluster state, and the owner of its layout in etcd.
//!
//! Every node-facing and operator-facing question about the cluster ("which nodes
//! exist?", "who owns this cluster?") is answered by the curator from etcd; nothing else
//! reads or writes the `curator` namespace. This crate currently holds the state layout
//! and the bootstrap transaction; the leader-elected gRPC services build on it.
//!
//! Layout inside `namespaced:curator/`:
//! ```text
//!   nodes/<node id>            state::Node (protobuf)
//!   global/initial_owner       raw Ed25519 public key of the owner named at bootstrap
//!   cluster/configuration      config::ClusterConfiguration (protobuf)
//!   cluster-pki/…              the cluster CA (see the pki crate)
//! ```
//!
//! Invariants:
//! - The bootstrap records (first node, initial owner, cluster configuration) are
//!   created together in one create-if-absent transaction: all or none exist.
//! - Re-running the bootstrap transaction with the same records succeeds (idempotent);
//!   with different records it fails and changes nothing.

pub mod election;
pub mod labels;
pub mod service;
pub mod state;

pub use state::{BootstrapRecords, CuratorError, cluster_pki, create_bootstrap_records, load_node};
