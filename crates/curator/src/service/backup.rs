//! Backup (TakeBackup): a snapshot of this curator's own etcd member, streamed to an
//! owner. Answered by the curator called, never forwarded (`listener`).
//!
//! ```text
//!   revision: count-only read, linearizable (5 s; else serializable, quorum_read=false)
//!   etcd Maintenance.Snapshot ──32 KiB blobs──▶ task: SHA-256, re-chunked to 256 KiB
//!     ──mpsc(4)──▶ BackupStart · data … · BackupEnd{size, sha256} ──▶ client
//! ```
//! Memory is bounded: at most a chunk being filled and the channel's four, whatever the
//! database's size; a slow client slows the etcd stream through HTTP/2 flow control.
//! etcd's own SHA-256 (its last 32 bytes) is checked against the bytes it sent before
//! the end is announced, so a stream cut or garbled on the way from etcd fails here.
//! May not write anything: not to etcd, not to disk.

use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proto::api::{self, backup_chunk::Part};
use ring::digest::{Context, SHA256};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::scheduled::read_revision;
use super::scheduled_api;
use super::shared::Services;

/// Size of the data chunks sent (etcd sends 32 KiB blobs).
const CHUNK: usize = 256 * 1024;
/// How long etcd may pause its snapshot stream, or the client stop reading it, before
/// the backup is given up (an open snapshot holds etcd's read transaction, which keeps
/// bbolt from reusing pages).
const STALL: Duration = Duration::from_secs(30);
/// Length of etcd's SHA-256 at the end of its snapshot stream.
const ETCD_HASH_LEN: usize = 32;

type ChunkStream = Pin<Box<dyn Stream<Item = Result<api::BackupChunk, Status>> + Send>>;
type Sender = tokio::sync::mpsc::Sender<Result<api::BackupChunk, Status>>;

/// Sends to the client; `Err(None)` when it went away or stopped reading for [`STALL`].
async fn send(tx: &Sender, part: Part) -> Result<(), Option<Status>> {
    match tokio::time::timeout(STALL, tx.send(Ok(chunk(part)))).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(None),
        Err(_) => {
            tracing::warn!("backup: the client read nothing for {STALL:?}; given up");
            Err(None)
        }
    }
}

fn chunk(part: Part) -> api::BackupChunk {
    api::BackupChunk { part: Some(part) }
}

/// Ends the client's stream with `status` (unless it stopped reading).
async fn fail(tx: &Sender, status: Status) {
    let _ = tokio::time::timeout(STALL, tx.send(Err(status))).await;
}

#[tonic::async_trait]
impl api::backup_server::Backup for Services {
    type TakeBackupStream = ChunkStream;
    type FetchSnapshotStream = scheduled_api::FileStream;

    async fn list_snapshots(
        &self,
        _: Request<api::ListSnapshotsRequest>,
    ) -> Result<Response<api::ListSnapshotsResponse>, Status> {
        Ok(Response::new(scheduled_api::list_all(&self.0).await?))
    }

    async fn fetch_snapshot(
        &self,
        request: Request<api::FetchSnapshotRequest>,
    ) -> Result<Response<Self::FetchSnapshotStream>, Status> {
        Ok(Response::new(
            scheduled_api::fetch(&self.0, request.get_ref()).await?,
        ))
    }

    async fn take_backup(
        &self,
        _: Request<api::TakeBackupRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let mut client = self.0.curator.client();
        let local = |e: etcd_client::Error| {
            Status::unavailable(format!("the local etcd member does not answer: {e}"))
        };
        let status = client.status().await.map_err(local)?;
        let (revision, quorum_read) = read_revision(&self.0).await?;
        let taken_at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let mut snapshot = client
            .maintenance_client()
            .snapshot()
            .await
            .map_err(|e| Status::unavailable(format!("etcd refused a snapshot: {e}")))?;
        let header = status.header();
        let trusted = self.0.trusted_cas();
        let mut start = api::BackupStart {
            node_id: self.0.config.node_id.clone(),
            revision,
            quorum_read,
            ca_certificate: trusted[0].clone(),
            trusted_cas: trusted,
            taken_at_unix_ms,
            polis_version: env!("CARGO_PKG_VERSION").to_string(),
            etcd_version: status.version().to_string(),
            etcd_cluster_id: header.map(|h| h.cluster_id()).unwrap_or_default(),
            etcd_member_id: header.map(|h| h.member_id()).unwrap_or_default(),
            expected_size: 0,
        };
        tracing::info!(revision, quorum_read, "backup: etcd snapshot started");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            // The first blob tells the database's size (etcd: remaining after it + it).
            let first = match tokio::time::timeout(STALL, snapshot.message()).await {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => {
                    fail(&tx, Status::unavailable(format!("etcd snapshot: {e}"))).await;
                    return;
                }
                Err(_) => {
                    fail(&tx, stalled()).await;
                    return;
                }
            };
            let database = first
                .as_ref()
                .map(|m| m.remaining_bytes() + m.blob().len() as u64)
                .unwrap_or_default();
            start.expected_size = database + ETCD_HASH_LEN as u64;
            if send(&tx, Part::Start(start)).await.is_err() {
                return;
            }
            let outcome = relay(first, &mut snapshot, database, &tx).await;
            match outcome {
                Ok(end) => {
                    tracing::info!(size = end.size, "backup: etcd snapshot sent");
                    let _ = send(&tx, Part::End(end)).await;
                }
                Err(Some(status)) => {
                    tracing::warn!("backup failed: {}", status.message());
                    fail(&tx, status).await;
                }
                Err(None) => tracing::info!("backup: the client went away"),
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

fn stalled() -> Status {
    Status::unavailable(format!("etcd's snapshot stream stalled for {STALL:?}"))
}

/// Sends etcd's snapshot on, re-chunked, hashing it; checks etcd's own hash of the first
/// `database` bytes (its last 32 bytes). `Err(None)`: the client went away.
async fn relay(
    first: Option<etcd_client::SnapshotResponse>,
    snapshot: &mut etcd_client::SnapshotStreaming,
    database: u64,
    tx: &Sender,
) -> Result<api::BackupEnd, Option<Status>> {
    let mut ours = Context::new(&SHA256);
    let mut of_database = Context::new(&SHA256);
    let mut size: u64 = 0;
    let mut tail: Vec<u8> = Vec::with_capacity(ETCD_HASH_LEN);
    let mut buffer: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut next = first;
    while let Some(message) = next {
        let blob = message.blob();
        // Bytes before `database` are the database; the rest is etcd's hash of it.
        let in_db = database.saturating_sub(size).min(blob.len() as u64) as usize;
        of_database.update(&blob[..in_db]);
        // At most one byte more than a hash: enough to tell it is not one.
        let room = (ETCD_HASH_LEN + 1).saturating_sub(tail.len());
        tail.extend_from_slice(&blob[in_db..][..room.min(blob.len() - in_db)]);
        ours.update(blob);
        size += blob.len() as u64;
        buffer.extend_from_slice(blob);
        if buffer.len() >= CHUNK {
            let full = std::mem::replace(&mut buffer, Vec::with_capacity(CHUNK));
            send(tx, Part::Data(full)).await?;
        }
        next = match tokio::time::timeout(STALL, snapshot.message()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => return Err(Some(Status::unavailable(format!("etcd snapshot: {e}")))),
            Err(_) => return Err(Some(stalled())),
        };
    }
    if size != database + ETCD_HASH_LEN as u64 || tail.as_slice() != of_database.finish().as_ref() {
        return Err(Some(Status::internal(format!(
            "etcd's snapshot failed its own check ({size} bytes for a {database}-byte \
             database and its SHA-256)"
        ))));
    }
    if !buffer.is_empty() {
        send(tx, Part::Data(buffer)).await?;
    }
    Ok(api::BackupEnd {
        size,
        sha256: ours.finish().as_ref().to_vec(),
    })
}
