//! One stranger cannot hurt the cluster (issue 25): every attack of that issue, run by
//! an attacker against real polis-node processes and real etcd on 127.x addresses,
//! bounded in count and time. Each module runs its own cluster:
//!
//! ```text
//!   audit             byte-sized entries, floods of refused calls that cannot evict the
//!                     owner's entry, 10 000 entries and 1 000 nodes × 128 labels read
//!   connections       idle-connection and handshake floods (one source, many, under a
//!                     low open-files limit), metrics scrapes, Heartbeat writes, the
//!                     unauthenticated entry points' per-source limits
//!   etcd_history      etcd's history compacted by its size, not only its length
//!   revoked_curator   a revoked curator certificate refused before a node belongs
//!   terminal_escapes  a compromised node's texts reach the owner's terminal escaped
//! ```
//! The 10-minute worst flood and its bound on etcd's growth are a benchmark
//! (`scripts/bench flood`), not a test.

#[path = "hostile/audit.rs"]
mod audit;
#[path = "hostile/connections.rs"]
mod connections;
#[path = "hostile/etcd_history.rs"]
mod etcd_history;
#[path = "hostile/revoked_curator.rs"]
mod revoked_curator;
#[path = "hostile/terminal_escapes.rs"]
mod terminal_escapes;
