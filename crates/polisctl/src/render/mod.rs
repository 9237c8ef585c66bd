//! Rendering command results (nodes, certificates, the consensus status, cluster
//! information) as a table, JSON or YAML, on top of the primitives in `output`.
//! May not talk to the cluster or touch files: results in, text on stdout out.

pub(crate) mod audit;
pub(crate) mod backup;
pub(crate) mod ca;
pub(crate) mod certificates;
pub(crate) mod cluster;
pub(crate) mod dashboard;
pub(crate) mod logs;
pub(crate) mod node;
pub(crate) mod operators;
pub(crate) mod snapshots;
pub(crate) mod status;
pub(crate) mod tickets;
pub(crate) mod versions;
