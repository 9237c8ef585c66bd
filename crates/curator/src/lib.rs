//! The curator: the only API to cluster state, and the owner of its layout in etcd.
//!
//! Every node-facing and operator-facing question about the cluster ("which nodes
//! exist?", "who owns this cluster?") is answered by the curator from etcd; nothing else
//! reads or writes the `curator` namespace. A curator runs on every consensus member;
//! they elect one leader through etcd; the leader serves the calls that read or change
//! cluster state, and every other curator forwards them to it.
//!
//! ```text
//!   polisctl / nodes ──mTLS──▶ any curator: rpc::AuthLayer (identity + permission table)
//!                                 │             └─ follower: rpc::ForwardLayer ──mTLS,
//!                                 │                node cert + verified caller──▶ leader
//!        CuratorLocal (answered by every curator)   AAA, Management, Curator (leader)
//!                                 │                     │ every write: leader_txn
//!                                 ▼                     ▼ (guarded by the election key)
//!                        election ──campaign/lease──▶ etcd namespaced:curator/
//!                                                       etcd membership (consensus_members)
//! ```
//!
//! Layout inside `namespaced:curator/`:
//! ```text
//!   nodes/<node id>            state::Node (protobuf)
//!   deleted/<node id>          the record of a deleted node (tombstone: never registers again)
//!   global/initial_owner       raw Ed25519 public key of the owner named at bootstrap
//!   global/register_ticket     32 random bytes, created on first request
//!   cluster/configuration      config::ClusterConfiguration (protobuf)
//!   cluster-pki/…              the cluster CA and issued certificates (pki crate)
//!   leader/<lease>             state::LeaderElectionValue of the elected curator
//! ```
//!
//! Invariants:
//! - The bootstrap records (first node, initial owner, cluster configuration) are
//!   created together in one create-if-absent transaction: all or none exist.
//!   Re-running it with the same records succeeds; with different ones it fails.
//! - Every leader write is an etcd transaction guarded by the leader's election key
//!   (`election::leader_txn`): a deposed leader cannot write.
//! - Followers answer CuratorLocal from their own etcd member and forward every other
//!   call to the leader with the caller's verified identity; the leader accepts a
//!   forwarded identity only from the node certificate of an UP consensus member.
//! - etcd membership changes (a learner added and promoted, a member removed) are made
//!   by the leader one at a time (`service::consensus_members`); a removal that would
//!   leave the remaining voters without a healthy majority (asked of each member's
//!   curator) is refused. A leader asked to remove its own node hands leadership over
//!   first, so the removal is made by a curator whose etcd stays.
//! - A campaigning curator revokes the lease of a leader whose endpoint refuses
//!   connections (its process is gone); guarded writes make this safe even when wrong.
//! - Register tickets are compared in constant time (`state::ticket_matches`).
//! - A node leaves for good: decommissioning takes it out of consensus (quorum-checked
//!   up front), revokes its certificates and marks it DECOMMISSIONED, a state no event
//!   leads out of; deleting leaves a tombstone. RegisterNode refuses both keys.
//! - Node health is judged by the leader from heartbeats with hysteresis (`health`,
//!   pure); the verdict is written into the record only when it changes, and a new
//!   leader reports the stored verdict until it has watched for one timeout itself.

pub mod election;
pub mod health;
pub mod lifecycle;

pub mod service;
pub mod state;
mod writes;

pub use state::{BootstrapRecords, CuratorError, cluster_pki, create_bootstrap_records, load_node};
