//! Every protobuf message and gRPC service of Polis, generated with prost/tonic.
//!
//! Two kinds of formats live here:
//! - on-disk formats a node reads and writes under its root (`config`): node
//!   parameters and the sealed configuration;
//! - cluster state the curator keeps in etcd (`state`): node records.
//!
//! Invariant: these are the only serialization formats Polis writes; changing a field
//! number breaks existing clusters, so fields are only ever added.

pub mod config {
    tonic::include_proto!("polis.config");
}

pub mod state {
    tonic::include_proto!("polis.state");
}

pub mod api {
    tonic::include_proto!("polis.api");
}
