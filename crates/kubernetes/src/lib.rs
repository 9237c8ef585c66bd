//! Upstream Kubernetes on a Polis cluster: what the KubernetesController role runs.
//! Below `node` (whose role server starts [`controller::run`]) and `curator` (which
//! issues the certificates [`certs`] describes); imports neither.
//!
//! ```text
//!   controller  root.role.kubernetes: keys ─▶ curator leader ─▶ files ─▶ runnables
//!     │           etcdproxy · apiserver · controllermanager · scheduler · rbac
//!     ├─ component  one upstream program as a child (PDEATHSIG, klog → node log)
//!     ├─ etcdproxy  etcd's gRPC API on a unix socket, every key under /polis-k8s
//!     │    └─ namespace  the rewriting (pure, proptested)
//!     ├─ board      each component's state for the node's status (running,
//!     │             restarts, last error)
//!     ├─ config     files, flags, kubeconfigs, RBAC bindings (pure)
//!     └─ certs      what each certificate says; Polis role → Kubernetes group (pure)
//!   worker      root.role.kubeworker: kubelet keys ─▶ curator leader ─▶ files ─▶
//!     │           apiproxy · containerd · images imported · kubelet
//!     ├─ workerconfig  containerd.toml, kubelet.yaml and kubeconfig, CNI (pure)
//!     └─ apiproxy   a TCP forwarder to the first apiserver that accepts (also
//!                   `polisctl kubernetes proxy`)
//! ```
//! Invariants:
//! - The apiserver is never given the etcd member: only the proxy's socket (0600, in a
//!   0700 folder); no request through it names a key outside `namespace::PREFIX`, no
//!   answer shows one, and Snapshot, Compact, Defragment and the like are refused.
//! - Private keys are made on the node and never leave it; certificates come only from
//!   the curator leader (fenced); the service-account key is the cluster's.
//! - Every child program dies with polis-node, and stopping the runnable stops them all.

pub mod apiproxy;
pub mod board;
pub mod certs;
pub mod component;
pub mod config;
pub mod controller;
pub mod etcdproxy;
pub mod namespace;
pub mod worker;
pub mod workerconfig;
