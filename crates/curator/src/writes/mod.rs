//! Every change of a node record, made by the leader: a change decided on the current
//! record ([`modify_node`]) and the named changes built on it (labels, lifecycle events),
//! and the deletion that leaves a tombstone ([`delete_node`]).
//!
//! ```text
//!   handlers, runnables ──▶ modify_node / apply_event / update_node_labels
//!                                │ change(current record) → new record | nothing | refusal
//!                                ▼
//!                           batch::attempt ── one guarded CAS per batch ──▶ etcd nodes/<id>
//!   DeleteNode ──────────▶ delete_node ── guarded CAS: delete + tombstone ──▶ deleted/<id>
//!   RegisterNode ────────▶ create_node ── one txn: record created if absent and not
//!                                          tombstoned, its claims (address, data join
//!                                          key: `claims`) taken in the index, + the
//!                                          caller's extra guarded writes (a ticket's use)
//! ```
//! A write made for an audited call carries the call's audit entry in its own
//! transaction (`carried`): the first change a call commits is recorded with it.
//!
//! Every write here is guarded by leadership (`election::guard`) and by the record's
//! revision. A record's address and data join key are unique among records: the
//! `claims` index entries are taken in the transaction creating the record, guarded by
//! their revisions (see `claims`), so two registrations cannot both take one, on one
//! leader or across a leader change. May import only `error`, `layout`, `lifecycle`,
//! `records`, `election` and `audit` (through `carried`): nothing here knows of the
//! curator's services.

mod batch;
pub mod carried;
pub mod claims;

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use prost::Message;
use proto::state::{Node, NodeState};

pub use batch::written_by;

use crate::election::{self, Leadership};
use crate::error::{CuratorError, NodeUpdateError};
use crate::layout::{node_key, tombstone_key};
use crate::lifecycle::{Event, Outcome, transition};
use crate::records::{decode_node, node_state};
use carried::Carried;

/// How many times a change of a node record is attempted before giving up. With writes
/// combined per record inside the leader (`batch`), an attempt fails only when someone
/// else wrote the record in between or etcd failed.
const CAS_ATTEMPTS: u32 = 20;

/// Reads a node record, lets `change` decide its new value from the current one
/// (`None`: no record), and writes it in one transaction guarded by leadership and by
/// the record's revision; repeats (with a short randomized backoff) when the record
/// changed in between or etcd failed. `change` returning `Ok(None)` writes nothing.
/// Returns the record as written or as found. Concurrent changes of one record on this
/// leader are applied in turn and written together (see `batch`), so they do not make
/// each other retry.
pub async fn modify_node(
    curator: &Namespaced,
    leadership: &Leadership,
    id: &str,
    change: impl FnMut(Option<&Node>) -> Result<Option<Node>, NodeUpdateError>,
) -> Result<Option<Node>, NodeUpdateError> {
    modify_known_node(curator, leadership, id, None, change).await
}

/// A record as the curator last saw it (its watched snapshot), with its mod revision:
/// a change may start from it instead of reading etcd. A stale one costs a failed
/// comparison and a read; a decision to write nothing is never taken on it.
#[derive(Debug, Clone)]
pub struct Known {
    pub node: Node,
    pub revision: i64,
}

/// [`modify_node`], starting from `known` (when this leader holds no fresher copy of
/// the record) instead of an etcd read.
pub async fn modify_known_node(
    curator: &Namespaced,
    leadership: &Leadership,
    id: &str,
    mut known: Option<Known>,
    mut change: impl FnMut(Option<&Node>) -> Result<Option<Node>, NodeUpdateError>,
) -> Result<Option<Node>, NodeUpdateError> {
    let key = curator.key(&node_key(id));
    let carried = Carried::take(curator);
    for attempt in 0..CAS_ATTEMPTS {
        // The first retry is immediate: it usually only re-reads a cached record.
        if attempt > 1 {
            let jitter = u64::from(random_u16() % 8);
            tokio::time::sleep(std::time::Duration::from_millis(
                u64::from(attempt) + jitter,
            ))
            .await;
        }
        // Only the first attempt may start from `known`: a retry follows a failed
        // comparison, which it may have caused.
        let start = known.take();
        match batch::attempt(
            curator,
            leadership,
            &key,
            id,
            &mut change,
            carried.as_ref(),
            start,
        )
        .await?
        {
            batch::Attempt::Done { node, wrote } => {
                if wrote {
                    carried::commit(carried);
                }
                return Ok(node);
            }
            batch::Attempt::Retry => continue,
        }
    }
    Err(CuratorError::Protocol("node record kept changing").into())
}

fn random_u16() -> u16 {
    let mut b = [0u8; 2];
    // A failed random source only makes the backoff less random.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u16::from_le_bytes(b)
}

/// Applies a label change to a node (see [`modify_node`]).
pub async fn update_node_labels(
    curator: &Namespaced,
    leadership: &Leadership,
    id: &str,
    upsert: &std::collections::BTreeMap<String, String>,
    delete: &[String],
) -> Result<Node, NodeUpdateError> {
    modify_node(curator, leadership, id, |current| {
        let current = current.ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        proto::labels::validate_change(upsert, delete)?;
        if !proto::labels::changes(&current.labels, upsert, delete) {
            // Nothing changes: nothing is written (nor recorded as a change).
            return Ok(None);
        }
        let mut next = current.clone();
        proto::labels::apply_validated(&mut next.labels, upsert, delete)?;
        Ok(Some(next))
    })
    .await?
    .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))
}

/// Applies a lifecycle `event` to the record of `id` (see [`crate::lifecycle`]):
/// `create` builds the record when the event creates one. Returns the record after the
/// event (unchanged when the event had already happened). `known`: see
/// [`modify_known_node`].
pub async fn apply_event(
    curator: &Namespaced,
    leadership: &Leadership,
    id: &str,
    public_key: Option<&[u8]>,
    event: Event,
    create: impl Fn() -> Node,
    known: Option<Known>,
) -> Result<Node, NodeUpdateError> {
    let transition_error = |source| NodeUpdateError::Transition {
        id: id.to_string(),
        source,
    };
    modify_known_node(curator, leadership, id, known, |current| {
        if let (Some(node), Some(key)) = (current, public_key)
            && node.public_key != key
        {
            return Err(NodeUpdateError::KeyMismatch(id.to_string()));
        }
        match transition(current.map(node_state), event).map_err(transition_error)? {
            Outcome::Unchanged => Ok(None),
            Outcome::Remove => Err(CuratorError::Protocol(
                "a removal is written by delete_node, not as a state change",
            )
            .into()),
            Outcome::Enter(state) => {
                let mut node = current.cloned().unwrap_or_else(&create);
                node.state = state as i32;
                if erases_data_key(state) {
                    // Issue 18: the cluster half of the node's data key goes in the
                    // same write that starts its end: a copy of its disk never unlocks.
                    node.data_cluster_half.clear();
                }
                Ok(Some(node))
            }
        }
    })
    .await?
    .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))
}

/// How [`create_node`] ended.
#[derive(Debug)]
pub enum Created {
    /// The record was created (with the extra write).
    New(Box<Node>),
    /// A record of this id exists already: nothing was written.
    Exists,
    /// Another live record holds `what` (see `claims`): nothing was written.
    Taken { what: String, holder: String },
    /// An extra comparison or a claim's guard failed (changed since read): nothing was
    /// written; read again.
    GuardFailed,
}

/// Creates `node` (state NEW, as `Event::Register` leads to) in one transaction with
/// its claims' index entries (see `claims`) and `also` (e.g. one use of a register
/// ticket), guarded by leadership, by the record and its tombstone being absent, by
/// each claim's entry (first assumed absent, which needs no read; when that fails, as
/// read), and by `guard`. The leader's batched writes of this record (`batch`) find it
/// by their own CAS failing and re-read it.
pub async fn create_node(
    curator: &Namespaced,
    leadership: &Leadership,
    mut node: Node,
    guard: Vec<Compare>,
    also: Vec<TxnOp>,
) -> Result<Created, NodeUpdateError> {
    let id = node.id.clone();
    match transition(None, Event::Register).map_err(|source| NodeUpdateError::Transition {
        id: id.clone(),
        source,
    })? {
        Outcome::Enter(state) => node.state = state as i32,
        _ => return Err(CuratorError::Protocol("registration does not create a record").into()),
    }
    let key = curator.key(&node_key(&id));
    let tombstone = curator.key(&tombstone_key(&id));
    let carried = Carried::take(curator);
    let claims = claims::claims(&node);
    // First as if every claim were free (a new address: the common case), without a
    // read: the comparisons fail the transaction if one is not, and the second attempt
    // decides on the claims as read.
    for assume_free in [true, false] {
        let mut compares = vec![
            election::guard(leadership),
            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            Compare::create_revision(tombstone.clone(), CompareOp::Equal, 0),
        ];
        compares.extend(guard.iter().cloned());
        let mut ops = vec![TxnOp::put(key.clone(), node.encode_to_vec(), None)];
        for claim in &claims {
            let read = if assume_free {
                claims::Read {
                    claim: claim.clone(),
                    entry_revision: 0,
                    stale_holder: None,
                }
            } else {
                match claims::read(curator, claim, &id).await? {
                    Ok(read) => read,
                    Err(holder) => {
                        return Ok(Created::Taken {
                            what: claim.what.clone(),
                            holder,
                        });
                    }
                }
            };
            compares.extend(read.compares(curator));
            ops.push(read.take(curator, &id));
        }
        ops.extend(also.iter().cloned());
        ops.extend(carried.as_ref().map(Carried::op));
        let txn = Txn::new().when(compares).and_then(ops).or_else([
            TxnOp::get(leadership.key.clone(), None),
            TxnOp::get(tombstone.clone(), Some(GetOptions::new().with_count_only())),
            TxnOp::get(key.clone(), Some(GetOptions::new().with_count_only())),
        ]);
        let response = curator.kv().txn(txn).await.map_err(CuratorError::from)?;
        if response.succeeded() {
            committed(leadership, &response, carried);
            return Ok(Created::New(Box::new(node)));
        }
        if !election::still_leads(&response, leadership) {
            return Err(CuratorError::NotLeader.into());
        }
        let count = |i: usize| match response.op_responses().get(i) {
            Some(etcd_client::TxnOpResponse::Get(g)) => g.count(),
            _ => 0,
        };
        if count(1) > 0 {
            return Err(NodeUpdateError::Deleted(id));
        }
        if count(2) > 0 {
            return Ok(Created::Exists);
        }
        if claims.is_empty() {
            break;
        }
    }
    Ok(Created::GuardFailed)
}

/// After a transaction of this module committed: the call's entry it carried is
/// recorded, and reads served from the snapshot wait until it shows this write.
fn committed(
    leadership: &Leadership,
    response: &etcd_client::TxnResponse,
    carried: Option<Carried>,
) {
    carried::commit(carried);
    if let Some(header) = response.header() {
        batch::record_written(leadership, header.revision());
    }
}

/// Whether entering `state` erases the cluster half of the node's data key.
fn erases_data_key(state: NodeState) -> bool {
    matches!(
        state,
        NodeState::Decommissioning | NodeState::Decommissioned
    )
}

/// Deletes the record of `id` as the lifecycle allows (`Event::Delete`), leaving the
/// record as it was under [`tombstone_key`] and dropping the index entries naming it
/// (`claims::release`): one transaction guarded by leadership and
/// by the record's revision, repeated when the record changed in between. Returns the
/// deleted record.
pub async fn delete_node(
    curator: &Namespaced,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, NodeUpdateError> {
    let key = curator.key(&node_key(id));
    let carried = Carried::take(curator);
    for _ in 0..CAS_ATTEMPTS {
        let response = curator
            .kv()
            .get(key.clone(), None)
            .await
            .map_err(CuratorError::from)?;
        let Some(kv) = response.kvs().first() else {
            return Err(NodeUpdateError::NotFound(id.to_string()));
        };
        let node = decode_node(id, kv.value())?;
        // The tombstone keeps the record without the cluster half of its data key.
        let tombstone = Node {
            data_cluster_half: Vec::new(),
            ..node.clone()
        }
        .encode_to_vec();
        match transition(Some(node_state(&node)), Event::Delete).map_err(|source| {
            NodeUpdateError::Transition {
                id: id.to_string(),
                source,
            }
        })? {
            Outcome::Remove => {}
            Outcome::Unchanged | Outcome::Enter(_) => {
                return Err(CuratorError::Protocol("delete without removal").into());
            }
        }
        let txn = Txn::new()
            .when([
                election::guard(leadership),
                Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()),
            ])
            .and_then(
                [
                    TxnOp::delete(key.clone(), None),
                    TxnOp::put(curator.key(&tombstone_key(id)), tombstone.clone(), None),
                ]
                .into_iter()
                .chain(claims::release(curator, &node))
                .chain(carried.as_ref().map(Carried::op))
                .collect::<Vec<_>>(),
            )
            .or_else([TxnOp::get(leadership.key.clone(), None)]);
        let response = curator.kv().txn(txn).await.map_err(CuratorError::from)?;
        if response.succeeded() {
            committed(leadership, &response, carried);
            return Ok(node);
        }
        if !election::still_leads(&response, leadership) {
            return Err(CuratorError::NotLeader.into());
        }
    }
    Err(CuratorError::Protocol("node record kept changing").into())
}
