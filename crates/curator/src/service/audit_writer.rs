//! The audit log's writer, behind the listener's `rpc::AuditLayer` and the AuthLayer's
//! denial hook: entries cut to size, refused calls counted, every other entry
//! committed before its call's result leaves, and the log held to its budget.
//!
//! ```text
//!   AuditLayer / denials ─▶ entry (crate::audit::bounds::clip: ≤ 4 KiB)
//!     ├─ refused, not the owner (audit::tally::counted) ─▶ Tally window; answered at
//!     │    once ─▶ every 1 s the windows open 10 s ─▶ one entry each, with its count
//!     └─ else ─(entry, ack)─▶ mpsc(1024) ─▶ writer task: ≤ 100 queued entries in ONE
//!          │                                etcd txn (≤ 100 × 4 KiB: under etcd's
//!          └─ holds the call's status until ack ◀─  1.5 MiB request limit)
//!   writer task: Ledger (every stored entry: key, account, bytes) from a paged read of
//!     audit/, kept current by one etcd watch (every curator's writes and drops) ─▶
//!     after each step, written or not: over the budget? ─▶ Ledger::evict_next (the
//!     share rule, crate::audit::bounds) ─▶ deletes, ≤ 100 per txn (allowed under NOSPACE)
//! ```
//! Why the call waits: a result the client saw must be in the log even if this node
//! dies right after, so the status leaves only once etcd has committed the entry; the
//! group commit keeps that to about one etcd round trip per call under load. Counted
//! (refused) calls changed nothing: their entry is written when their window closes,
//! off the path of every call, and a crash loses at most a window's counts. Any
//! curator writes the calls it handles itself (the leader nearly all; a follower its
//! own backups and defragmentations); keys sort by time (`crate::audit::entry_key`).
//! Writes are not guarded by leadership: a deposed leader's refused call is recorded
//! too. Every curator bounds the log from its own ledger; two doing so at once drop
//! the same oldest entries (a lagging one may drop a few more than needed).
//!
//! May not change anything but `audit/` keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{Txn, TxnOp, WatchOptions};
use prost::Message;
use proto::api::AuditEntry;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::shared::Shared;
use crate::audit;
use crate::audit::bounds::{self, Budget, Ledger};
use crate::audit::tally::{self, Tally};

/// Entries waiting for the writer; a full queue makes calls wait (never grows).
const QUEUE: usize = 1024;
/// Most entries written in one transaction: puts only (etcd's default limit is 128
/// operations per txn, `--max-txn-ops`), and at most BATCH × MAX_ENTRY_BYTES bytes,
/// well under etcd's request limit ([`ETCD_MAX_REQUEST_BYTES`]).
const BATCH: usize = 100;
/// etcd's default `--max-request-bytes` (Polis does not change it).
const ETCD_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// Most entries dropped in one transaction.
const DROPS_PER_TXN: usize = 100;
/// Most entries dropped before the writer looks at its queue again.
const DROPS_PER_ROUND: usize = 1000;
/// Bound on each etcd call of the writer.
const ETCD_CALL: Duration = Duration::from_secs(5);
/// How soon a writer whose ledger failed (etcd away) reads the log again.
const LEDGER_RETRY: Duration = Duration::from_secs(5);
/// How often closed tally windows are written.
const TALLY_TICK: Duration = Duration::from_secs(1);

// A batch of the largest entries passes etcd's request limit, so an oversized entry
// can never take honest ones down with its batch (per put: the entry, its key again,
// namespace included, and a few bytes of framing); transactions stay within etcd's
// `--max-txn-ops` (128); windows are flushed more often than they last.
const _: () = {
    assert!(
        BATCH * (bounds::MAX_ENTRY_BYTES + 2 * bounds::MAX_TEXT_BYTES + 64)
            < ETCD_MAX_REQUEST_BYTES
    );
    assert!(BATCH <= 128 && DROPS_PER_TXN <= 128);
    assert!(tally::WINDOW_MICROS > TALLY_TICK.as_micros() as u64);
};

type Ack = oneshot::Sender<Result<(), String>>;
/// An entry and, when a call waits for it, its acknowledgement.
type Queued = (AuditEntry, Option<Ack>);

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The sink for `rpc::AuditLayer`: starts the writer and the tally's flusher (both end
/// once the sink is dropped, i.e. when the server stops).
pub(super) fn sink(shared: Arc<Shared>) -> rpc::server::AuditSink {
    let (tx, rx) = mpsc::channel::<Queued>(QUEUE);
    let tally = Arc::new(Mutex::new(Tally::default()));
    tokio::spawn(writer(shared.clone(), rx).instrument(tracing::Span::current()));
    tokio::spawn(flush_windows(tally.clone(), tx.downgrade()).instrument(tracing::Span::current()));
    Arc::new(move |call: rpc::server::AuditCall| {
        let entry = entry_for(&shared.config.node_id, &call);
        // An entry with its call's key replaces what a change wrote under it: never
        // folded into a count.
        if entry.key.is_empty() && tally::counted(&entry) {
            tally.lock().expect("audit tally lock").add(entry);
            return Box::pin(async { Ok(()) });
        }
        let tx = tx.clone();
        Box::pin(async move {
            let (ack, acked) = oneshot::channel();
            tx.send((entry, Some(ack)))
                .await
                .map_err(|_| "the audit writer stopped".to_string())?;
            acked
                .await
                .map_err(|_| "the audit writer stopped".to_string())?
        })
    })
}

/// The entry of `call` as curator `node_id` writes it: under the key a change of the
/// call already used, when one did (see `crate::writes::carried`), else keyless (the
/// writer assigns one).
fn entry_for(node_id: &str, call: &rpc::server::AuditCall) -> AuditEntry {
    let mut entry = audit::entry_of(node_id, call, call.code, &call.message);
    if let Some(key) = &call.entry_key {
        entry.key = key.clone();
    }
    entry
}

/// The hook for `rpc::AuthLayer::with_denials`: a refused call of a node or owner is
/// recorded through `sink` like any other (a node's counted, the owner's one by one).
pub(super) fn denials(sink: rpc::server::AuditSink) -> rpc::server::DenialHook {
    Arc::new(move |method, identity, peer, status| {
        let recorded = sink(rpc::server::AuditCall {
            method: method.to_string(),
            identity: Some(identity.clone()),
            certificate: None,
            peer,
            request: Default::default(),
            code: status.code() as i32,
            message: status.message().to_string(),
            entry_key: None,
        });
        Box::pin(async move {
            if let Err(e) = recorded.await {
                tracing::warn!("audit entry of a refused call not written: {e}");
            }
        })
    })
}

/// Queues the entries of closed tally windows, every [`TALLY_TICK`], until the sink is
/// gone.
async fn flush_windows(tally: Arc<Mutex<Tally>>, queue: mpsc::WeakSender<Queued>) {
    let mut tick = tokio::time::interval(TALLY_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(queue) = queue.upgrade() else {
            return;
        };
        let due = tally.lock().expect("audit tally lock").due(now_micros());
        for entry in due {
            if queue.send((entry, None)).await.is_err() {
                return;
            }
        }
    }
}

/// The stored log as this writer knows it: the ledger and the watch keeping it current.
struct Mirror {
    ledger: Ledger,
    events: etcd_client::WatchStream,
    /// Entries this writer dropped, with the revision of the drop, until the watch
    /// brings the drop: the watch may still bring an older put of one (an entry
    /// written just before), which must not count again (it would make the writer drop
    /// one more entry than needed).
    dropped: HashMap<String, i64>,
}

/// Records a stored entry in the ledger.
fn note(ledger: &mut Ledger, key: &[u8], value: &[u8]) {
    let (account, source) = match AuditEntry::decode(value) {
        Ok(entry) => bounds::account(&entry),
        // Unreadable: nobody's but the strangers', so it goes early.
        Err(_) => (bounds::Account::Strangers, "(corrupt)".to_string()),
    };
    ledger.insert(
        String::from_utf8_lossy(key).into_owned(),
        account,
        source,
        (key.len() + value.len()) as u64,
    );
}

/// Reads the whole log (in pages) into a ledger, and watches it from there.
async fn load(shared: &Shared) -> Result<Mirror, String> {
    let configuration = crate::records::cluster_configuration(&shared.curator)
        .await
        .map_err(|e| format!("reading the cluster configuration: {e}"))?;
    let mut ledger = Ledger::new(Budget::of(configuration.as_ref()));
    let client = shared.curator.client();
    let prefix = shared.curator.key(audit::PREFIX);
    let mut pages = consensus::pages::Pages::prefix(&client, prefix.clone());
    while let Some(page) = pages
        .next_page()
        .await
        .map_err(|e| format!("reading the audit log: {}", supervisor::error_chain(&e)))?
    {
        for kv in page {
            note(&mut ledger, kv.key(), kv.value());
        }
    }
    let events = consensus::bounded(
        "watching the audit log",
        ETCD_CALL,
        consensus::pages::watch_client(&client).watch(
            prefix,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(pages.revision() + 1),
            ),
        ),
    )
    .await
    .map_err(|e| supervisor::error_chain(&e))?;
    tracing::debug!(
        entries = ledger.len(),
        bytes = ledger.bytes(),
        "audit log measured"
    );
    Ok(Mirror {
        ledger,
        events,
        dropped: HashMap::new(),
    })
}

/// Applies one watch answer to the ledger; an error once the watch ended.
fn apply(
    mirror: &mut Mirror,
    message: Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
) -> Result<(), String> {
    let response = match message {
        Ok(Some(r)) if !r.canceled() => r,
        Ok(Some(r)) => return Err(format!("etcd cancelled the watch: {}", r.cancel_reason())),
        Ok(None) => return Err("the etcd watch ended".into()),
        Err(e) => return Err(supervisor::error_chain(&e)),
    };
    let mut last = 0;
    for event in response.events() {
        let Some(kv) = event.kv() else { continue };
        last = kv.mod_revision();
        let key = String::from_utf8_lossy(kv.key());
        match event.event_type() {
            etcd_client::EventType::Put => {
                let dropped_at = mirror.dropped.get(key.as_ref()).copied();
                if dropped_at.is_none_or(|at| kv.mod_revision() > at) {
                    note(&mut mirror.ledger, kv.key(), kv.value());
                }
            }
            etcd_client::EventType::Delete => {
                mirror.dropped.remove(key.as_ref());
                mirror.ledger.remove(&key);
            }
        }
    }
    // Events come in revision order: past a drop's revision, no older put of it can
    // come any more (also when another curator had dropped it first, and no delete of
    // ours shows).
    mirror.dropped.retain(|_, at| *at > last);
    Ok(())
}

async fn writer(shared: Arc<Shared>, mut rx: mpsc::Receiver<Queued>) {
    let mut mirror: Option<Mirror> = None;
    let mut next_load = Instant::now();
    loop {
        if mirror.is_none() && Instant::now() >= next_load {
            match load(&shared).await {
                Ok(m) => mirror = Some(m),
                Err(e) => {
                    tracing::warn!("audit log: cannot measure it ({e}); its bound waits");
                    next_load = Instant::now() + LEDGER_RETRY;
                }
            }
        }
        enum Step {
            Queued(Queued),
            Watched(Result<Option<etcd_client::WatchResponse>, etcd_client::Error>),
            Retry,
        }
        let watching = mirror.is_some();
        let step = tokio::select! {
            queued = rx.recv() => match queued {
                Some(q) => Step::Queued(q),
                None => return,
            },
            message = async {
                match mirror.as_mut() {
                    Some(m) => m.events.message().await,
                    None => std::future::pending().await,
                }
            }, if watching => Step::Watched(message),
            _ = tokio::time::sleep_until(next_load.into()), if !watching => Step::Retry,
        };
        match step {
            Step::Queued(first) => {
                let mut batch = vec![first];
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(q) => batch.push(q),
                        Err(_) => break,
                    }
                }
                write(&shared, batch, mirror.as_mut().map(|m| &mut m.ledger)).await;
            }
            Step::Watched(message) => {
                if let Some(m) = mirror.as_mut()
                    && let Err(e) = apply(m, message)
                {
                    tracing::info!("audit log: its watch ended ({e}); measuring it again");
                    mirror = None;
                }
            }
            Step::Retry => {}
        }
        // Also after a failed write: under NOSPACE the drops still go through, and they
        // are what lets etcd's space be reclaimed.
        if let Some(m) = mirror.as_mut()
            && let Err(e) = drop_excess(&shared, m).await
        {
            tracing::warn!("audit log: dropping entries over its bound failed: {e}");
            mirror = None;
            next_load = Instant::now() + LEDGER_RETRY;
        }
    }
}

/// Writes a batch in one transaction and answers every waiting call.
async fn write(shared: &Shared, mut batch: Vec<Queued>, ledger: Option<&mut Ledger>) {
    let mut ops = Vec::with_capacity(batch.len());
    let mut stored = Vec::with_capacity(batch.len());
    for (entry, _) in batch.iter_mut() {
        if entry.key.is_empty() {
            audit::assign_key(entry);
        }
        let key = shared.curator.key(&entry.key);
        let value = entry.encode_to_vec();
        let (account, source) = bounds::account(entry);
        stored.push((
            key.clone(),
            account,
            source,
            (key.len() + value.len()) as u64,
        ));
        ops.push(TxnOp::put(key, value, None));
    }
    let written = consensus::bounded(
        "writing audit entries",
        ETCD_CALL,
        shared.curator.kv().txn(Txn::new().and_then(ops)),
    )
    .await
    .map(|_| ())
    .map_err(|e| e.to_string());
    if let Err(e) = &written {
        tracing::warn!(entries = batch.len(), "audit entries not written: {e}");
    }
    for (entry, ack) in batch {
        match ack {
            Some(ack) => {
                let _ = ack.send(written.clone());
            }
            // A window's count: nobody waits, so it is logged here.
            None if written.is_err() => tracing::warn!(
                method = entry.method,
                count = entry.count,
                "refused calls not written to the audit log"
            ),
            None => {}
        }
    }
    if let (Ok(()), Some(ledger)) = (&written, ledger) {
        for (key, account, source, bytes) in stored {
            ledger.insert(key, account, source, bytes);
        }
    }
}

/// Drops entries while the log is over its budget (at most [`DROPS_PER_ROUND`] now;
/// the watch's echo of the drops brings the writer back for the rest).
async fn drop_excess(shared: &Shared, mirror: &mut Mirror) -> Result<(), String> {
    let ledger = &mut mirror.ledger;
    let doomed: Vec<String> = std::iter::from_fn(|| ledger.evict_next())
        .take(DROPS_PER_ROUND)
        .collect();
    if doomed.is_empty() {
        return Ok(());
    }
    let mut client = shared.curator.client();
    for chunk in doomed.chunks(DROPS_PER_TXN) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|key| TxnOp::delete(key.as_bytes(), None))
            .collect();
        let dropped = consensus::bounded(
            "dropping audit entries",
            ETCD_CALL,
            client.txn(Txn::new().and_then(ops)),
        )
        .await
        .map_err(|e| supervisor::error_chain(&e))?;
        let at = dropped.header().map_or(i64::MAX, |h| h.revision());
        for key in chunk {
            mirror.dropped.insert(key.clone(), at);
        }
    }
    tracing::debug!(
        dropped = doomed.len(),
        entries = mirror.ledger.len(),
        bytes = mirror.ledger.bytes(),
        "audit log held to its bound"
    );
    Ok(())
}
