//! The runnables: long-running work under the supervisor, each a named runnable.
//!
//! ```text
//!   root.cluster                 cluster     carries out the Plan, logs state changes
//!   root.role.controlplane       controlplane  etcd + curator (consensus members only)
//!   root.role.rolefetch          rolefetch   this node's record: roles, curators, CRL
//!   root.role.heartbeat          heartbeat   alive + status; Home ⇄ Split
//!   root.role.renew              renew       node and etcd peer certificates, live
//! ```
//! Runnables use the start paths and the leaf modules; they may not import each other
//! or the role server (which starts and stops them), and they talk to each other only
//! through `NodeValues`.

pub mod cluster;
pub mod controlplane;
pub mod heartbeat;
pub mod renew;
pub mod rolefetch;
