//! Node record writes of the leader, combined per record (group commit): the one place
//! that puts a node record into etcd (`writes` decides what; this writes it).
//!
//! ```text
//!   caller A ─┐ change(working copy) ─▶ accepted #1 ─┐
//!   caller B ─┤ change(working copy) ─▶ accepted #2 ─┼─▶ flusher: one guarded CAS put of
//!   caller C ─┘ change(working copy) ─▶ accepted #3 ─┘   the working copy ─▶ #1..#3 written
//! ```
//! The leader is the only writer of node records, so concurrent changes of one record
//! need not race each other through etcd: each caller applies its change, in turn, to an
//! in-memory working copy of the record (a short critical section, no I/O), and one
//! flusher task writes the working copy with a compare-and-swap on the revision it last
//! wrote or read, then answers every caller whose change that write included. Sixteen
//! concurrent writers cost one etcd transaction per batch instead of sixteen racing
//! transactions with retries (which used to run out: "node record kept changing").
//!
//! Invariants:
//! - A caller is answered only once its change is in etcd (or failed): nothing is
//!   acknowledged from memory alone.
//! - Every write is a CAS guarded by leadership (`election::guard`) and the record's
//!   mod revision: a write by
//!   anyone else in between fails the CAS, and every change of that batch is retried
//!   from a fresh read by its own caller; nothing is lost or applied twice.
//! - A decision that writes nothing (unchanged, or refused) is taken on a record read
//!   from etcd in that call, not on a cached one (nor on a `Known` one from the
//!   curator's snapshot, which a write may start from: its CAS checks it).
//! - The flusher is a task of its own: a caller that goes away (client disconnect) does
//!   not stop the write others wait for.
//! - Slots are per record and per leadership tenure; idle ones are dropped once more
//!   than [`IDLE_SLOTS`] exist.
//! - A record is created only while its key has no tombstone, checked inside the
//!   creating transaction: a deletion racing a registration can never be undone by it.
//! - A change that carries its call's audit entry (`carried`) has the entry in the very
//!   transaction that writes it: a batch puts the record and the entries of every
//!   change it includes, at most [`MAX_BATCH`] of them (etcd's `--max-txn-ops` is 128).
//!
//! May import only `error`, `layout` (the tombstone's key), `records` (decoding),
//! `election` (the guard) and `carried` (the entries).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use prost::Message;
use proto::state::Node;
use tokio::sync::oneshot;

use super::carried::Carried;
use crate::election::{self, Leadership};
use crate::error::{CuratorError, NodeUpdateError};
use crate::layout::tombstone_key;

/// The highest node-record revision each leadership tenure wrote, by election key and
/// revision: reads served from the watched snapshot wait until it shows these writes.
static WRITTEN: LazyLock<Mutex<HashMap<Tenure, i64>>> = LazyLock::new(Default::default);

/// A leadership tenure: the election key and its create revision.
type Tenure = (Vec<u8>, i64);

pub(crate) fn record_written(leadership: &Leadership, revision: i64) {
    let mut written = WRITTEN.lock().expect("written lock poisoned");
    // Tenures rarely change: forget old ones instead of tracking their end.
    if written.len() > 64 {
        written.clear();
    }
    let entry = written
        .entry((leadership.key.clone(), leadership.revision))
        .or_default();
    *entry = (*entry).max(revision);
}

/// The revision of the last node-record write of this leadership tenure (0: none).
pub fn written_by(leadership: &Leadership) -> i64 {
    WRITTEN
        .lock()
        .expect("written lock poisoned")
        .get(&(leadership.key.clone(), leadership.revision))
        .copied()
        .unwrap_or_default()
}

/// Idle slots kept (each holds one decoded record) before they are cleaned up.
const IDLE_SLOTS: usize = 256;

/// Most changes of one record waiting for (or in) a write: with one audit entry each
/// and the record, a batch's transaction stays under etcd's default 128 operations, and
/// at 4 KiB per entry (`audit::bounds`) well under its 1.5 MiB request limit.
const MAX_BATCH: u64 = 100;

/// The record as etcd last confirmed it to this leader.
#[derive(Clone)]
struct Base {
    node: Option<Node>,
    /// Mod revision of the record; 0: no record.
    revision: i64,
}

/// How a batch write ended, for every caller it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Written,
    /// The record changed behind the working copy (CAS failed) or etcd failed: the
    /// caller starts over from a fresh read.
    Retry,
    NotLeader,
    /// The record would have been created, but its key was deleted (tombstone).
    Deleted,
    /// etcd refused the write under its NOSPACE alarm: no retry helps until the upkeep
    /// freed space and disarmed it.
    NoSpace,
}

#[derive(Default)]
struct SlotState {
    /// `None`: unknown, read before the next change.
    base: Option<Base>,
    /// The base with every accepted change applied.
    working: Option<Node>,
    /// Generation of the last accepted change / of the last one settled (written or
    /// failed).
    accepted: u64,
    settled: u64,
    flushing: bool,
    waiters: Vec<(u64, oneshot::Sender<Outcome>)>,
    /// The audit entries (puts) of accepted changes, by generation, until written.
    entries: Vec<(u64, TxnOp)>,
}

#[derive(Default)]
struct Slot {
    /// Held across the read of the base (so one caller reads, the others wait for it),
    /// never across the flusher's write.
    state: tokio::sync::Mutex<SlotState>,
}

type SlotKey = (String, Vec<u8>, i64);

static SLOTS: LazyLock<Mutex<HashMap<SlotKey, Arc<Slot>>>> = LazyLock::new(Default::default);

fn slot(key: &str, leadership: &Leadership) -> Arc<Slot> {
    let mut slots = SLOTS.lock().expect("slot map poisoned");
    if slots.len() > IDLE_SLOTS {
        // Only the map holds an idle slot (callers and the flusher hold clones).
        slots.retain(|_, s| Arc::strong_count(s) > 1);
    }
    slots
        .entry((key.to_string(), leadership.key.clone(), leadership.revision))
        .or_default()
        .clone()
}

async fn read(curator: &Namespaced, key: &str, id: &str) -> Result<Base, NodeUpdateError> {
    let response = curator
        .kv()
        .get(key, None)
        .await
        .map_err(CuratorError::from)?;
    Ok(match response.kvs().first() {
        Some(kv) => Base {
            node: Some(crate::records::decode_node(id, kv.value())?),
            revision: kv.mod_revision(),
        },
        None => Base {
            node: None,
            revision: 0,
        },
    })
}

/// What one attempt ended with.
// Short-lived, one per attempt: boxing the record would cost an allocation per write.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Attempt {
    /// The record as written or found; `wrote`: this change was written (with its
    /// audit entry, if it carried one).
    Done {
        node: Option<Node>,
        wrote: bool,
    },
    Retry,
}

/// One attempt to apply `change` to the record at `key` through its slot (see the
/// module documentation).
pub(crate) async fn attempt(
    curator: &Namespaced,
    leadership: &Leadership,
    key: &str,
    id: &str,
    change: &mut impl FnMut(Option<&Node>) -> Result<Option<Node>, NodeUpdateError>,
    carried: Option<&Carried>,
    known: Option<super::Known>,
) -> Result<Attempt, NodeUpdateError> {
    let slot = slot(key, leadership);
    let mut state = slot.state.lock().await;
    while state.accepted - state.settled >= MAX_BATCH {
        // A full batch: this change goes into a later one.
        wait_settled(state).await;
        state = slot.state.lock().await;
    }
    // `fresh`: the base was read from etcd in this call.
    let mut fresh = false;
    if state.base.is_none() {
        let base = match known {
            Some(known) => Base {
                node: Some(known.node),
                revision: known.revision,
            },
            None => {
                fresh = true;
                read(curator, key, id).await?
            }
        };
        state.working = base.node.clone();
        state.base = Some(base);
    }
    let decided = change(state.working.as_ref());
    let next = match decided {
        Ok(Some(next)) => next,
        other => {
            let pending = state.settled < state.accepted;
            if !fresh && !pending {
                // A decision without a write must rest on what etcd holds now, not on
                // what this leader last wrote.
                state.base = None;
                return Ok(Attempt::Retry);
            }
            let found = state.working.clone();
            // Decided on changes not yet written: they must be, for the decision to hold.
            let outcome = if pending {
                wait_settled(state).await
            } else {
                Outcome::Written
            };
            return match outcome {
                Outcome::Written => other.map(|_| Attempt::Done {
                    node: found,
                    wrote: false,
                }),
                Outcome::Retry => Ok(Attempt::Retry),
                Outcome::NotLeader => Err(CuratorError::NotLeader.into()),
                Outcome::Deleted => Err(NodeUpdateError::Deleted(id.to_string())),
                Outcome::NoSpace => Err(CuratorError::NoSpace.into()),
            };
        }
    };
    state.accepted += 1;
    let generation = state.accepted;
    state.working = Some(next.clone());
    let (tx, rx) = oneshot::channel();
    state.waiters.push((generation, tx));
    if let Some(carried) = carried {
        state.entries.push((generation, carried.op()));
    }
    if !state.flushing {
        state.flushing = true;
        tokio::spawn(flush(
            slot.clone(),
            curator.clone(),
            leadership.clone(),
            key.to_string(),
            curator.key(&tombstone_key(id)),
        ));
    }
    drop(state);
    match rx.await.unwrap_or(Outcome::Retry) {
        Outcome::Written => Ok(Attempt::Done {
            node: Some(next),
            wrote: true,
        }),
        Outcome::Retry => Ok(Attempt::Retry),
        Outcome::NotLeader => Err(CuratorError::NotLeader.into()),
        Outcome::Deleted => Err(NodeUpdateError::Deleted(id.to_string())),
        Outcome::NoSpace => Err(CuratorError::NoSpace.into()),
    }
}

/// Waits until every change accepted so far is settled; its outcome.
async fn wait_settled(mut state: tokio::sync::MutexGuard<'_, SlotState>) -> Outcome {
    let (tx, rx) = oneshot::channel();
    let generation = state.accepted;
    state.waiters.push((generation, tx));
    drop(state);
    rx.await.unwrap_or(Outcome::Retry)
}

/// Whether a failed creating transaction found the record's tombstone (its second
/// `or_else` read).
fn tombstoned(failed: &etcd_client::TxnResponse) -> bool {
    matches!(
        failed.op_responses().get(1),
        Some(etcd_client::TxnOpResponse::Get(g)) if g.count() > 0
    )
}

/// Writes the working copy until it is written as of the last accepted change.
async fn flush(
    slot: Arc<Slot>,
    curator: Namespaced,
    leadership: Leadership,
    key: String,
    tombstone: String,
) {
    loop {
        let (generation, node, revision, entries) = {
            let mut state = slot.state.lock().await;
            let base = state.base.as_ref().map(|b| b.revision);
            match (state.settled < state.accepted, &state.working, base) {
                (true, Some(node), Some(revision)) => (
                    state.accepted,
                    node.clone(),
                    revision,
                    state
                        .entries
                        .iter()
                        .map(|(_, op)| op.clone())
                        .collect::<Vec<_>>(),
                ),
                _ => {
                    state.flushing = false;
                    return;
                }
            }
        };
        let mut compare = vec![election::guard(&leadership)];
        if revision == 0 {
            compare.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
            compare.push(Compare::create_revision(
                tombstone.clone(),
                CompareOp::Equal,
                0,
            ));
        } else {
            compare.push(Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            ));
        }
        // Guarded like `election::leader_txn`, but flat: a nested transaction's response
        // carries no revision, and the revision written is the next write's CAS base.
        let txn = Txn::new()
            .when(compare)
            .and_then(
                std::iter::once(TxnOp::put(key.clone(), node.encode_to_vec(), None))
                    .chain(entries)
                    .collect::<Vec<_>>(),
            )
            .or_else([
                TxnOp::get(leadership.key.clone(), None),
                TxnOp::get(tombstone.clone(), Some(GetOptions::new().with_count_only())),
            ]);
        let outcome = match curator.kv().txn(txn).await {
            Ok(r) if r.succeeded() => match r.header().map(|h| h.revision()) {
                Some(written) if written > 0 => Ok(written),
                _ => Err(Outcome::Retry),
            },
            Ok(r) => {
                if revision == 0 && tombstoned(&r) {
                    tracing::warn!("node record {key} not created: the node was deleted");
                    Err(Outcome::Deleted)
                } else if election::still_leads(&r, &leadership) {
                    tracing::info!("node record {key} was changed by another writer; retrying");
                    Err(Outcome::Retry)
                } else {
                    Err(Outcome::NotLeader)
                }
            }
            Err(e) if consensus::maintenance::is_no_space(&e) => Err(Outcome::NoSpace),
            Err(e) => {
                tracing::warn!("writing node record {key}: {}", supervisor::error_chain(&e));
                Err(Outcome::Retry)
            }
        };
        let mut state = slot.state.lock().await;
        let (settled_upto, answer) = match outcome {
            Ok(written) => {
                state.entries.retain(|(g, _)| *g > generation);
                record_written(&leadership, written);
                state.base = Some(Base {
                    node: Some(node),
                    revision: written,
                });
                (generation, Outcome::Written)
            }
            Err(failure) => {
                // Every accepted change was applied on top of the failed base: all of
                // them start over.
                state.base = None;
                state.working = None;
                state.entries.clear();
                (state.accepted, failure)
            }
        };
        state.settled = settled_upto;
        let (done, pending): (Vec<_>, Vec<_>) = std::mem::take(&mut state.waiters)
            .into_iter()
            .partition(|(g, _)| *g <= settled_upto);
        state.waiters = pending;
        drop(state);
        for (_, tx) in done {
            let _ = tx.send(answer);
        }
    }
}
