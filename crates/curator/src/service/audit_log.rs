//! The Audit service: AuditLog, the stored entries (read in pages at one revision, each
//! page sent as it is read), then, when following, new ones from one etcd watch per
//! reader that continues from that revision. The writer is `audit_writer`.
//!
//! ```text
//!   AuditLog ─▶ Pages(audit/, after the reader's last key) ─▶ page ─▶ mpsc(64) ─▶ client
//!                 … next page only once the reader took the last one in …
//!              (follow) watch from the pages' revision + 1 ─▶ mpsc(64) ─▶ client
//! ```
//! Why pages: the log is up to its budget (8 MiB by default) and etcd answers a range
//! in one message, which etcd-client refuses past 4 MiB; and a reader that stops
//! reading holds back one page, never the whole log in this process.
//!
//! A caller holds at most `follows::PER_CALLER` follows open, and the curator
//! `follows::IN_ALL`: a follow holds a watch and a task here, and a forwarded one a
//! connection of its own from the follower that forwarded it.
//!
//! A follower's stream ends when its caller is revoked: on each new CRL, its
//! certificate is looked for in it, or (forwarded: no certificate here) the operator
//! record or owner key it proved is read again (`still_holds`).
//!
//! Reads only.

use std::pin::Pin;

use etcd_client::WatchOptions;
use prost::Message;
use proto::api::{self, AuditEntry};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::shared::Services;
use super::status::etcd_status;
use crate::audit::{self, Filter};

type EntryStream = Pin<Box<dyn Stream<Item = Result<AuditEntry, Status>> + Send>>;

fn decode(value: &[u8]) -> Result<AuditEntry, Status> {
    AuditEntry::decode(value).map_err(|e| Status::internal(format!("corrupt audit entry: {e}")))
}

/// Whether a follower of the audit log may go on after the CRL changed to `crl`: its
/// certificate (served here) is not listed; or, forwarded (no certificate here), the
/// operator record or owner key it proved still holds. An etcd read that fails keeps
/// the stream (the next CRL checks again).
async fn still_holds(
    shared: &super::shared::Shared,
    certificate: Option<&rpc::server::ClientCertificate>,
    caller: &rpc::Identity,
    crl: &[u8],
) -> bool {
    if let Some(certificate) = certificate {
        return !certificate.listed_in(crl);
    }
    match caller {
        rpc::Identity::Operator {
            name,
            role,
            public_key,
        } => match crate::operators::holder_of(&shared.curator, public_key).await {
            Ok(Some((record, _))) => record.name == *name && record.role == role.name(),
            Ok(None) => false,
            Err(_) => true,
        },
        rpc::Identity::User { public_key, .. } => {
            match crate::owner::read_owner_key(&shared.curator).await {
                Ok(Some((key, _))) => crate::operators::same_key(&key, public_key),
                Ok(None) => false,
                Err(_) => true,
            }
        }
        _ => true,
    }
}

#[tonic::async_trait]
impl api::audit_server::Audit for Services {
    type AuditLogStream = EntryStream;

    async fn audit_log(
        &self,
        request: Request<api::AuditLogRequest>,
    ) -> Result<Response<EntryStream>, Status> {
        // Who follows: its certificate (served here), or the identity a follower
        // forwarded (no certificate here): what a revocation is checked against.
        let certificate = request
            .extensions()
            .get::<rpc::server::ClientCertificate>()
            .cloned();
        let caller = super::status::identity(&request);
        let certificate_here = certificate.clone();
        let request = request.into_inner();
        let filter = Filter {
            node_id: request.node_id,
            since_unix_micros: request.since_unix_micros,
        };
        let shared = self.0.clone();
        // A follow holds a seat of its caller's until its stream ends (`follows`).
        let seat = if request.follow {
            let seat = shared
                .follows
                .take(&super::follows::account(&caller))
                .map_err(|refused| {
                    // The caller hears why; a line per refusal would let it fill the log.
                    tracing::debug!(%caller, "a followed audit log refused: {refused}");
                    Status::resource_exhausted(refused.to_string())
                })?;
            Some(seat)
        } else {
            None
        };
        let prefix = shared.curator.key(audit::PREFIX);
        let client = shared.curator.client();
        let mut pages = consensus::pages::Pages::prefix(&client, prefix.clone());
        if !request.after_key.is_empty() {
            pages = pages.after(shared.curator.key(&request.after_key).as_bytes());
        }
        // The first page now: an etcd that does not answer is this call's answer.
        let first = pages
            .next_page()
            .await
            .map_err(|e| etcd_status("reading the audit log", e))?
            .unwrap_or_default();
        // A small queue: a reader that stops reading holds the watch back (etcd buffers
        // for a slow watcher and cancels it past its own bound), never this process.
        let (tx, rx) = mpsc::channel::<Result<AuditEntry, Status>>(64);
        let follow = request.follow;
        let task = async move {
            let _seat = seat;
            let mut page = first;
            loop {
                for kv in &page {
                    let entry = decode(kv.value());
                    if entry.as_ref().is_ok_and(|e| !filter.matches(e)) {
                        continue;
                    }
                    if tx.send(entry).await.is_err() {
                        return;
                    }
                }
                page = match pages.next_page().await {
                    Ok(Some(next)) => next,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(etcd_status("reading the audit log", e))).await;
                        return;
                    }
                };
            }
            if !follow {
                return;
            }
            let watched = consensus::pages::watch_client(&client)
                .watch(
                    prefix,
                    Some(
                        WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(pages.revision() + 1),
                    ),
                )
                .await;
            let mut crls = shared.crl.watch();
            let mut events = match watched {
                Ok(events) => events,
                Err(e) => {
                    let _ = tx.send(Err(etcd_status("watching the audit log", e))).await;
                    return;
                }
            };
            loop {
                let message = tokio::select! {
                    _ = tx.closed() => break,
                    m = events.message() => m,
                    crl = crls.get() => {
                        let Ok(crl) = crl else { break };
                        if !still_holds(&shared, certificate.as_ref(), &caller, &crl).await {
                            tracing::info!(%caller, "a followed audit log ends: the caller was revoked");
                            let _ = tx
                                .send(Err(Status::permission_denied(rpc::server::STREAM_REVOKED)))
                                .await;
                            break;
                        }
                        continue;
                    }
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
        Ok(Response::new(Box::pin(rpc::server::ending_at_expiry(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            certificate_here.as_ref(),
        ))))
    }
}
