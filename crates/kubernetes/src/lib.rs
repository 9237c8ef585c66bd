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
//!     ├─ tokenreview  the apiserver's token webhook: a kubelet's token checked
//!     │    │          against the node records (quorum read) on every uncached request
//!     │    └─ kubelet_token  the token's form, making and matching (pure)
//!     ├─ nodesync   Nodes in step with Polis: polis.dev/ labels; a Node no worker
//!     │             holds drained and deleted
//!     ├─ kubectl    kubectl with a credential, each call bounded
//!     ├─ board      each component's state for the node's status (running,
//!     │             restarts, last error)
//!     ├─ config     files, flags, kubeconfigs, RBAC bindings (pure)
//!     └─ certs      what each certificate says; Polis role → Kubernetes group (pure)
//!   worker      root.role.kubeworker: kubelet key ─▶ curator leader (certificate,
//!     │           token) ─▶ files ─▶ apiproxy · containerd · images imported ·
//!     │           kubelet · nodestate
//!     ├─ workerconfig  containerd.toml, kubelet.yaml and kubeconfig, CNI (pure)
//!     ├─ workerstate   the Node's state for the status; pods stopped and the
//!     │                folder removed when the role goes
//!     └─ apiproxy   a TCP forwarder to the first apiserver that accepts (also
//!                   `polisctl kubernetes proxy`)
//! ```
//! Invariants:
//! - The apiserver is never given the etcd member: only the proxy's socket (0600, in a
//!   0700 folder); no request through it names a key outside `namespace::PREFIX`, no
//!   answer shows one, and Snapshot, Compact, Defragment and the like are refused.
//! - Private keys are made on the node and never leave it; certificates come only from
//!   the curator leader (fenced); the service-account key is the cluster's.
//! - No kubelet holds a client certificate the apiserver would trust: a kubelet is
//!   known only by its token, which holds while its node is UP, a worker, and the
//!   token its newest (refused within `kubelet_token::TOKEN_CACHE_TTL` otherwise).
//! - Every child program dies with polis-node, and stopping the runnable stops them all.

pub mod apiproxy;
pub mod board;
pub mod certs;
pub mod component;
pub mod config;
pub mod controller;
pub mod etcdproxy;
pub mod kubectl;
pub mod kubelet_token;
pub mod namespace;
pub mod nodesync;
pub mod tokenreview;
pub mod worker;
pub mod workerconfig;
pub mod workerstate;
