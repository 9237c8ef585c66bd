//! Upstream Kubernetes on a Polis cluster: what the KubernetesController role runs.
//!
//! (Module map and invariants: see the sections below as they are filled in.)
//!
//! - `namespace`: the apiserver's key space in the cluster's etcd and the rewriting that
//!   keeps every request inside it (pure).
//! - `certs`: what each Kubernetes certificate says, the groups of Polis roles (pure).
//! - `etcdproxy`: the etcd API the apiserver is given, on a unix socket: namespaced,
//!   everything else refused.

pub mod certs;
pub mod component;
pub mod config;
pub mod controller;
pub mod etcdproxy;
pub mod namespace;
