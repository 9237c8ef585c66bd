//! The curator: the only API to cluster state, and the owner of its layout in etcd.
//!
//! Every node-facing and operator-facing question about the cluster ("which nodes
//! exist?", "who owns this cluster?") is answered by the curator from etcd; nothing else
//! reads or writes the `curator` namespace. A curator runs on every consensus member;
//! they elect one leader through etcd; the leader serves the calls that read or change
//! cluster state, and every other curator forwards them to it.
//!
//! ```text
//!   polisctl / nodes ──mTLS──▶ any curator: rpc::AuthLayer (identity + permission table)
//!                                 │             └─ follower: rpc::ForwardLayer ──mTLS,
//!                                 │                node cert + verified caller──▶ leader
//!        CuratorLocal (answered by every curator)   AAA, Management, Curator (leader)
//!                                 │                     │ every write: leader_txn
//!                                 ▼                     ▼ (guarded by the election key)
//!                        election ──campaign/lease──▶ etcd namespaced:curator/
//!                                                       etcd membership (membership)
//! ```
//!
//! Modules by layer (a module imports only from layers below it: no import cycles).
//! Where things live in etcd is in `layout`.
//! ```text
//!   service      gRPC services and runnables (its own layers: see `service`)
//!   ───────────────────────────────────────────────────────────────────────────────
//!   writes       every node-record mutation: modify_node, apply_event, labels,
//!                delete_node; writes::batch combines a record's writes (group commit);
//!                writes::claims: the address / join-key index (unique claims)
//!   ticket       register tickets: records, checks, a use spent (leader writes)
//!   owner        the owner's key, replaced by a rotation (leader write)
//!   operators    operator records: added, listed, removed; the key a rotation may take
//!   schedule     the snapshot schedule in the cluster configuration (local read,
//!                leader write)
//!   ───────────────────────────────────────────────────────────────────────────────
//!   election     leader election, the guard every leader write carries
//!   epochs       the cluster's epochs (recover, restore): the chain, one recorded
//!   records      node records decoded, loaded, listed, watched; owner, configuration
//!   bootstrap    the bootstrap records (first node, owner, configuration): all or none
//!   ───────────────────────────────────────────────────────────────────────────────
//!   error        CuratorError, NodeUpdateError
//!   layout       namespaces, keys, CA stores, certificate names        (pure)
//!   templates    certificate templates and lifetimes                    (pure)
//!   lifecycle    node states and the events that move them              (pure)
//!   health       heartbeat timing and verdict hysteresis                (pure)
//!   upkeep       etcd defragmentation order, NOSPACE disarm rule         (pure)
//!   snapshots    scheduled snapshots: file names, pruning, due time     (pure)
//!   audit        audit entry keys, caller and target, filter; tally        (pure)
//!                (refusals counted per window); bounds (entry size, budget,
//!                the share rule's Ledger)
//!   chunkmap     ordered map whose clones share unchanged chunks         (pure)
//!   pause        test-only pause points (feature `pause-points`)        (leaf)
//! ```
//!
//! Invariants:
//! - The bootstrap records (first node, initial owner, cluster configuration) are
//!   created together in one create-if-absent transaction: all or none exist.
//!   Re-running it with the same records succeeds; with different ones it fails.
//! - Every leader write is an etcd transaction guarded by the leader's election key
//!   (`election::leader_txn`): a deposed leader cannot write.
//! - A read the leader answers leaves only while its read lease holds: etcd found its
//!   election key in a linearizable read sent less than `election::READ_LEASE` before,
//!   or in one started after the answer was made (`service::confirm`); a winner acts only
//!   `election::TAKEOVER` after its win, when its predecessor's lease is over. A deposed
//!   leader answers no read from memory.
//! - Followers answer CuratorLocal from their own etcd member and forward every other
//!   call to the leader with the caller's verified identity; the leader accepts a
//!   forwarded identity only from the node certificate of an UP consensus member.
//! - etcd membership changes (a learner added and promoted, a member removed) are made
//!   by the leader one at a time (`service::membership`); a removal that would
//!   leave the remaining voters without a healthy majority (asked of each member's
//!   curator) is refused. A removal is a durable intent in the node record, carried
//!   out by the request or the leader's reconciler and resumed by the next leader
//!   (`service::removal`, `service::reconciler`); a join's learner is added only
//!   right after a guarded confirmation of leadership and record. A leader asked to
//!   remove its own node hands leadership over first, so the removal is made by a
//!   curator whose etcd stays.
//! - A campaigning curator revokes the lease of a leader whose endpoint refuses
//!   connections (its process is gone); guarded writes make this safe even when wrong.
//! - Every certificate a curator issues is issued through `service::issuance` (node,
//!   renewed node and peer, owner, joining member's peer certificates); only the
//!   bootstrapping node issues its own first ones, before any curator runs.
//! - Every node record is written through `writes` (the bootstrap record aside).
//! - Register tickets are stored as the SHA-256 of their secret, compared in constant
//!   time (`ticket::check`); a use is spent in the transaction creating the node record,
//!   guarded by the ticket's revision when its uses are limited (`writes::create_node`,
//!   `ticket::spend_plan`).
//! - A node record's address (unless DECOMMISSIONED) and data join key are its own: an
//!   index entry naming it is taken in the transaction creating it, guarded by the
//!   entry's revision (`writes::claims`); each leader indexes older records once per
//!   tenure before it registers a node.
//! - A node leaves for good: decommissioning takes it out of consensus (quorum-checked
//!   up front), revokes its certificates and marks it DECOMMISSIONED, a state no event
//!   leads out of; deleting leaves a tombstone. RegisterNode refuses both keys.
//! - Node health is judged by the leader from heartbeats with hysteresis (`health`,
//!   pure); the verdict is written into the record only when it changes, and a new
//!   leader reports the stored verdict until it has watched for one timeout itself.
//! - A curator whose own etcd member has no leader refuses every call that needs the
//!   cluster at once (`service::quorum`), instead of letting it wait out etcd's bounds.
//! - etcd upkeep is the leader's (`service::upkeep`): it defragments one member at a
//!   time through that member's own curator (each curator reaches only its own etcd),
//!   the etcd leader last, never while a member catches up (`upkeep`, pure); under
//!   NOSPACE it compacts, defragments, then disarms the alarm by itself.
//! - Every call of an audited RPC (`rpc::authz::audited`) this curator handles is
//!   written under `audit/` before its result reaches the client
//!   (`service::audit_writer`), but refusals of anyone other than the owner, which are
//!   counted per caller, RPC and code in 10 s windows (`audit::tally`). Entries are cut
//!   to 4 KiB; past the count or byte bound the oldest entry of the account with the
//!   largest share goes, the owner keeping up to half (`audit::bounds`).
//! - Prefixes that grow (node records, claims, tickets, the audit log) are read in
//!   pages at one revision (`consensus::pages`), never in one etcd answer.

pub mod audit;
mod bootstrap;
pub mod chunkmap;
pub mod election;
pub mod epochs;
pub mod error;
pub mod health;
pub mod layout;
pub mod lifecycle;
mod operators;
mod owner;
pub mod pause;
pub mod records;
mod schedule;
pub mod service;
pub mod snapshots;
pub mod templates;
mod ticket;
pub mod upkeep;
pub mod writes;

pub use bootstrap::{BootstrapRecords, create_bootstrap_records};
pub use error::CuratorError;
pub use layout::cluster_pki;
pub use records::load_node;
