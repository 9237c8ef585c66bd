//! The start paths: what runs once per start, before or as the node takes its place in
//! a cluster. Preflight's refusals and the start decision; the join, bootstrap and
//! register paths the cluster manager carries out; and the subcommands that change a
//! stopped node's root (`recover`, `restore`, `set-curators`). Never imports a runnable.
//!
//! ```text
//!   recover         `polis-node recover`: its refusals, then a join with
//!     │             --force-new-cluster for one etcd start
//!     └──▶ preflight, restore (serve_backup), data::datadev
//!   restore         `polis-node restore`: an empty root made the only member of a
//!     │             backup's cluster, then a join
//!     └──▶ preflight, bootstrap, data::datadev
//!   set_curators    `polis-node set-curators`: the cluster directory replaced
//!     └──▶ preflight (lock_root)
//!   preflight       every refusal before anything is written; the Plan
//!     ├──▶ decision     the start decision (pure)
//!     ├──▶ join         a member's identity, roles, directory, loaded and checked
//!     └──▶ bootstrap    prepare (before etcd), trace, finish (once etcd runs)
//!            └──▶ decision (BootstrapTrace)
//!   register        the register path (RegisterNode, CommitNode)
//! ```

pub(crate) mod bootstrap;
pub(crate) mod decision;
pub(crate) mod join;
pub(crate) mod preflight;
pub(crate) mod recover;
pub(crate) mod register;
pub(crate) mod restore;
pub(crate) mod set_curators;
