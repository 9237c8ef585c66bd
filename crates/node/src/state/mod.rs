//! What the start paths and the runnables share: the values they publish and watch
//! (`values::NodeValues`), the settings fixed for the process (`settings`), and the
//! plain data and pure rules those values hold (`membership`, `cluster_state`,
//! `staleview`). Holds values, not behaviour: talks to no one, starts nothing.
//!
//! ```text
//!   values          NodeValues: membership, cluster state, curators, roles, CRL, ...
//!     └──▶ membership, cluster_state, staleview
//!   settings        Settings (from the flags)
//!   membership      Membership, BootstrapData, JoinData (pure data)
//!   cluster_state   ClusterState, Contact (pure)
//!   staleview       which WatchNode update may be applied (pure rule; the newest
//!                   applied one kept in the directory)
//! ```

pub(crate) mod cluster_state;
pub(crate) mod membership;
pub(crate) mod settings;
pub(crate) mod staleview;
pub(crate) mod values;
