//! The curator's errors: what failed against etcd or the stored records
//! ([`CuratorError`]), and what refused a change of one node record
//! ([`NodeUpdateError`]).
//!
//! A leaf: may not import any other module of this crate but the pure `lifecycle`
//! (whose transition errors a node update carries); no I/O.

/// A failure of the curator against etcd or its records.
#[derive(Debug, thiserror::Error)]
pub enum CuratorError {
    #[error("etcd request failed")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd request failed")]
    Consensus(#[from] consensus::ConsensusError),
    #[error("stored {what} is corrupt")]
    Corrupt {
        what: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("the cluster's etcd is out of space (NOSPACE alarm)")]
    NoSpace,
    #[error("this curator is not the leader (any more)")]
    NotLeader,
    #[error("the election lease was lost")]
    LeaseLost,
    #[error("{what}")]
    Pki {
        what: String,
        #[source]
        source: pki::PkiError,
    },
    #[error("unexpected etcd response: {0}")]
    Protocol(&'static str),
    #[error(
        "the cluster was already bootstrapped with different state ({what} differs); refusing to overwrite it"
    )]
    BootstrapConflict { what: &'static str },
    /// The cluster's etcd keys were laid out by a newer polis-node (`layout::LayoutFormat`).
    #[error(
        "the cluster's etcd key layout has format {found}, written by a newer polis-node; \
         this one (version {}) reads layout formats up to {}: it will not lead the \
         cluster (finish the upgrade: curators of the newer version lead it)",
        env!("CARGO_PKG_VERSION"),
        crate::layout::LAYOUT_FORMAT
    )]
    LayoutTooNew { found: u32 },
    #[error("the cluster's etcd key layout format is unreadable: {0:?}")]
    LayoutUnreadable(String),
}

/// Errors of operations on one node.
#[derive(Debug, thiserror::Error)]
pub enum NodeUpdateError {
    #[error("node {0} does not exist")]
    NotFound(String),
    #[error(transparent)]
    Labels(#[from] proto::labels::LabelError),
    #[error("node {id}: {source}")]
    Transition {
        id: String,
        #[source]
        source: crate::lifecycle::TransitionError,
    },
    #[error("node {0} is registered with a different key")]
    KeyMismatch(String),
    #[error("node {0} is not UP")]
    NotUp(String),
    #[error("node {id} does not hold {role}")]
    RoleMissing { id: String, role: &'static str },
    #[error("node {0} was deleted from this cluster; its key cannot register again")]
    Deleted(String),
    #[error(transparent)]
    Curator(#[from] CuratorError),
}
