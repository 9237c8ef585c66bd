//! Every protobuf message and gRPC service of Polis, generated with prost/tonic.
//!
//! Two kinds of formats live here:
//! - on-disk formats a node reads and writes under its root (`config`): node
//!   parameters and the sealed configuration;
//! - cluster state the curator keeps in etcd (`state`): node records.
//!
//! It also holds the validation rules of API fields that clients and servers must agree
//! on (`labels`; how errors quote what a caller sent, `echo`), so that `polisctl` refuses bad input before sending it and the curator
//! refuses it again; the order of cluster epochs and when a former member may drop
//! its data (`epoch`); and the bounds of the etcd backend quota (`quota`) and of the
//! scheduled snapshots' interval and count (`snapshots`); which versions of nodes and
//! curators work together (`version`, the skew policy).
//!
//! Invariant: these are the only serialization formats Polis writes; changing a field
//! number breaks existing clusters, so fields are only ever added.

pub mod echo;
pub mod epoch;
pub mod labels;
pub mod operators;
pub mod quota;
pub mod snapshots;
pub mod version;

pub mod config {
    tonic::include_proto!("polis.config");
}

pub mod state {
    tonic::include_proto!("polis.state");
}

pub mod api {
    tonic::include_proto!("polis.api");
}

/// The encoded `FileDescriptorSet` of every Polis proto: lets tests check that tables
/// keyed by RPC name (the permission table) name exactly the RPCs that exist.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/polis_descriptor.bin"));

/// Role names as the API spells them.
pub const ROLE_CONSENSUS_MEMBER: &str = "ConsensusMember";
/// The role that runs Kubernetes' control plane (requires ConsensusMember).
pub const ROLE_KUBERNETES_CONTROLLER: &str = "KubernetesController";
/// The role of a node that runs pods: containerd and a kubelet (issue 37).
pub const ROLE_KUBERNETES_WORKER: &str = "KubernetesWorker";
