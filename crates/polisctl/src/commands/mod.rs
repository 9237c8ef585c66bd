//! One handler module per command group: each checks its arguments, calls the cluster
//! through the owner session and hands the answer to `render`.
//! `launch` sits on top: it runs the other commands as steps.
//! May not parse the command line (main dispatches) nor format tables itself.

pub(crate) mod audit;
pub(crate) mod backup;
pub(crate) mod ca;
pub(crate) mod certificates;
pub(crate) mod cluster;
pub(crate) mod dashboard;
pub(crate) mod decommission;
pub(crate) mod kubernetes;
pub(crate) mod launch;
pub(crate) mod logs;
pub(crate) mod node;
pub(crate) mod operators;
pub(crate) mod owner;
pub(crate) mod params;
pub(crate) mod snapshots;
pub(crate) mod status;
pub(crate) mod tickets;
