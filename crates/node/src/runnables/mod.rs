//! The runnables: everything that runs under the supervisor once the start decision is
//! taken, from `root.cluster` (the cluster manager, which carries out the decision) and
//! `root.role` (the role server) down. They never import each other but as drawn here;
//! they talk through `state::values::NodeValues`.
//!
//! ```text
//!   roleserver      root.role: starts rolefetch, heartbeat, renew, catchup, logs; the
//!     │             control plane while the node holds ConsensusMember
//!     └──▶ controlplane, rolefetch, heartbeat, renew, catchup, logserver
//!   cluster         root.cluster: carries out the Plan (start::bootstrap, start::register)
//!   controlplane    etcd + curator; bootstrap::finish or the member checks; crlsync
//!     └──▶ peertrust    root.role.controlplane.peertrust: etcd peer CAs → ca.pem
//!   rolefetch       this node's record: roles, curators, CRL, decommission
//!   heartbeat       alive + status; Home ⇄ Split (reports peertrust's view)
//!   renew           node and etcd peer certificates, applied live
//!   catchup         a CA rotation missed: handovers followed, certificate reissued
//!   logserver       root.role.logs: NodeLogs on :7836 (owner only) from logs::logcapture
//! ```

pub(crate) mod catchup;
pub(crate) mod cluster;
pub(crate) mod controlplane;
pub(crate) mod heartbeat;
pub(crate) mod logserver;
pub(crate) mod peertrust;
pub(crate) mod renew;
pub(crate) mod rolefetch;
pub(crate) mod roleserver;
