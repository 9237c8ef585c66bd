//! The audit log in etcd: the writer behind the listener's `rpc::AuditLayer`, and the
//! Audit service (AuditLog: the stored entries, then, when following, new ones from
//! one etcd watch per reader).
//!
//! ```text
//!   AuditLayer ──(entry, ack)──▶ mpsc(1024) ──▶ writer task: up to 256 queued entries
//!     │                                          in ONE etcd txn, then the bound: the
//!     └─ holds the call's status until ack ◀──── oldest past max_entries deleted
//! ```
//! Why the call waits: a result the client saw must be in the log even if this node
//! dies right after, so the status leaves only once etcd has committed the entry; the
//! group commit keeps that to about one etcd round trip per call under load. Any
//! curator writes the calls it handles itself (the leader nearly all; a follower its
//! own backups and defragmentations); keys sort by time (`crate::audit::entry_key`).
//! Writes are not guarded by leadership: a deposed leader's refused call is recorded too.
//!
//! May not change anything but `audit/` keys.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{DeleteOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions};
use prost::Message;
use proto::api::{self, AuditEntry};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::shared::{Services, Shared};
use super::status::etcd_status;
use crate::audit::{self, Filter};

/// Entries waiting for the writer; a full queue makes calls wait (never grows).
const QUEUE: usize = 1024;
/// Most entries written in one transaction (etcd's default limit is 128 operations per
/// txn; see `--max-txn-ops`): puts only, the bound is applied separately.
const BATCH: usize = 100;
/// Bound on each etcd call of the writer.
const ETCD_CALL: Duration = Duration::from_secs(5);

type Queued = (AuditEntry, oneshot::Sender<Result<(), String>>);

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The sink for `rpc::AuditLayer`: starts the writer (it ends once the sink is
/// dropped, i.e. when the server stops).
pub(super) fn sink(shared: Arc<Shared>) -> rpc::server::AuditSink {
    let (tx, rx) = mpsc::channel::<Queued>(QUEUE);
    tokio::spawn(writer(shared.clone(), rx).instrument(tracing::Span::current()));
    Arc::new(move |call: rpc::server::AuditCall| {
        let tx = tx.clone();
        let curator = shared.config.node_id.clone();
        Box::pin(async move {
            let serial = call
                .certificate
                .as_ref()
                .and_then(|c| c.leaf())
                .and_then(|der| x509_parser::parse_x509_certificate(der).ok())
                .map(|(_, cert)| cert.tbs_certificate.raw_serial().to_vec());
            let (identity_kind, identity) = audit::who(call.identity.as_ref(), serial.as_deref());
            let target = audit::target(&call.method, &call.request, &identity_kind, &identity);
            let entry = AuditEntry {
                key: String::new(),
                time_unix_micros: now_micros(),
                identity_kind,
                identity,
                source_address: call.peer.map(|p| p.to_string()).unwrap_or_default(),
                curator,
                method: call.method,
                target,
                code: call.code,
                code_name: format!("{:?}", tonic::Code::from_i32(call.code)),
                message: call.message,
            };
            let (ack, acked) = oneshot::channel();
            tx.send((entry, ack))
                .await
                .map_err(|_| "the audit writer stopped".to_string())?;
            acked
                .await
                .map_err(|_| "the audit writer stopped".to_string())?
        })
    })
}

/// The hook for `rpc::AuthLayer::with_denials`: a refused call of a node or owner is
/// recorded through `sink` like any other.
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
        });
        Box::pin(async move {
            if let Err(e) = recorded.await {
                tracing::warn!("audit entry of a refused call not written: {e}");
            }
        })
    })
}

async fn writer(shared: Arc<Shared>, mut rx: mpsc::Receiver<Queued>) {
    let mut sequence = 0u64;
    let mut max = None;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(q) => batch.push(q),
                Err(_) => break,
            }
        }
        let mut ops = Vec::with_capacity(batch.len());
        for (entry, _) in batch.iter_mut() {
            sequence += 1;
            // Strictly increasing within this curator even if the clock steps back.
            entry.key = audit::entry_key(entry.time_unix_micros, sequence, &entry.curator);
            ops.push(TxnOp::put(
                shared.curator.key(&entry.key),
                entry.encode_to_vec(),
                None,
            ));
        }
        let written = consensus::bounded(
            "writing audit entries",
            ETCD_CALL,
            shared.curator.client().txn(Txn::new().and_then(ops)),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
        if let Err(e) = &written {
            tracing::warn!(entries = batch.len(), "audit entries not written: {e}");
        }
        for (_, ack) in batch {
            let _ = ack.send(written.clone());
        }
        if written.is_err() {
            continue;
        }
        if max.is_none() {
            max = crate::records::cluster_configuration(&shared.curator)
                .await
                .ok()
                .map(|c| audit::max_entries(c.as_ref()));
        }
        if let Some(max) = max
            && let Err(e) = bound(&shared, max).await
        {
            tracing::warn!("audit log: dropping the oldest entries failed: {e}");
        }
    }
}

/// Drops the oldest entries past `max`.
async fn bound(shared: &Shared, max: u64) -> Result<(), String> {
    let prefix = shared.curator.key(audit::PREFIX);
    let mut client = shared.curator.client();
    let counted = consensus::bounded(
        "counting audit entries",
        ETCD_CALL,
        client.get(
            prefix.clone(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        ),
    )
    .await
    .map_err(|e| e.to_string())?;
    let excess = audit::excess(counted.count().max(0) as u64, max);
    if excess == 0 {
        return Ok(());
    }
    let oldest = consensus::bounded(
        "listing the oldest audit entries",
        ETCD_CALL,
        client.get(
            prefix.clone(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_sort(SortTarget::Key, SortOrder::Ascend)
                    .with_limit(excess as i64),
            ),
        ),
    )
    .await
    .map_err(|e| e.to_string())?;
    let Some(last) = oldest.kvs().last() else {
        return Ok(());
    };
    let mut end = last.key().to_vec();
    end.push(0);
    consensus::bounded(
        "dropping the oldest audit entries",
        ETCD_CALL,
        client.delete(prefix, Some(DeleteOptions::new().with_range(end))),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(())
}

type EntryStream = Pin<Box<dyn Stream<Item = Result<AuditEntry, Status>> + Send>>;

fn decode(value: &[u8]) -> Result<AuditEntry, Status> {
    AuditEntry::decode(value).map_err(|e| Status::internal(format!("corrupt audit entry: {e}")))
}

#[tonic::async_trait]
impl api::audit_server::Audit for Services {
    type AuditLogStream = EntryStream;

    async fn audit_log(
        &self,
        request: Request<api::AuditLogRequest>,
    ) -> Result<Response<EntryStream>, Status> {
        let request = request.into_inner();
        let filter = Filter {
            node_id: request.node_id,
            since_unix_micros: request.since_unix_micros,
        };
        let shared = self.0.clone();
        let prefix = shared.curator.key(audit::PREFIX);
        let mut client = shared.curator.client();
        let stored = client
            .get(
                prefix.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Key, SortOrder::Ascend),
                ),
            )
            .await
            .map_err(|e| etcd_status("reading the audit log", e))?;
        let revision = stored.header().map(|h| h.revision()).unwrap_or(0);
        let mut entries = Vec::new();
        for kv in stored.kvs() {
            let entry = decode(kv.value())?;
            if filter.matches(&entry) {
                entries.push(Ok(entry));
            }
        }
        if !request.follow {
            return Ok(Response::new(Box::pin(tokio_stream::iter(entries))));
        }
        let mut events = client
            .watch(
                prefix,
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1),
                ),
            )
            .await
            .map_err(|e| etcd_status("watching the audit log", e))?;
        // A small queue: a reader that stops reading holds the watch back (etcd buffers
        // for a slow watcher and cancels it past its own bound), never this process.
        let (tx, rx) = mpsc::channel::<Result<AuditEntry, Status>>(64);
        let task = async move {
            for entry in entries {
                if tx.send(entry).await.is_err() {
                    return;
                }
            }
            loop {
                let message = tokio::select! {
                    _ = tx.closed() => break,
                    m = events.message() => m,
                };
                let response = match message {
                    Ok(Some(r)) if !r.canceled() => r,
                    Ok(_) => {
                        let _ = tx
                            .send(Err(Status::unavailable("the audit watch ended")))
                            .await;
                        break;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(etcd_status("watching the audit log", e))).await;
                        break;
                    }
                };
                for event in response.events() {
                    if event.event_type() != etcd_client::EventType::Put {
                        continue;
                    }
                    let Some(kv) = event.kv() else { continue };
                    let entry = decode(kv.value());
                    if entry.as_ref().is_ok_and(|e| !filter.matches(e)) {
                        continue;
                    }
                    if tx.send(entry).await.is_err() {
                        return;
                    }
                }
            }
        };
        tokio::spawn(task.instrument(tracing::Span::current()));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
