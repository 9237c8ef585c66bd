//! A consensus member's standing in its cluster, beside its etcd data: which epoch that
//! data belongs to and what the other members answer about theirs (`epochs`), the etcd
//! members last listed (`memberbook`), whether this node's etcd member is still a member
//! (`rejoin`), and whether a newer epoch superseded it (`superseded`). Asked by the
//! control plane, the log server and the recover and restore paths; starts nothing.
//!
//! ```text
//!   superseded      a member of an older epoch never serves: drop its data or hold back
//!     └──▶ epochs, memberbook
//!   rejoin          is this node's etcd member still a member? (JoinConsensus answer,
//!                   the pure rule `verdict`)
//!   epochs          data/etcd/epoch.pb, recover.pb; the members' epochs on :7836
//!   memberbook      data/etcd/members.pb: the etcd members last listed
//! ```

pub(crate) mod epochs;
pub(crate) mod memberbook;
pub(crate) mod rejoin;
pub(crate) mod superseded;
