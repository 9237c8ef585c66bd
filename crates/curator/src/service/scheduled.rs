//! Scheduled snapshots (`root.role.controlplane.curator.snapshots`, on every curator):
//! this member's etcd, snapshotted into its own root on the cluster's schedule, the
//! oldest pruned past the count kept; and the local listing and reading of those files.
//!
//! ```text
//!   every POLL: schedule from the cluster configuration (local read; a change applies
//!   at once) ─▶ files in DIR (crate::snapshots names only) ─▶ prune past `keep`
//!   ─▶ due (newest + interval; after a failure, no sooner than RETRY)? ─▶ snapshot:
//!   header as `cluster backup` writes it ─▶ etcd Maintenance.Snapshot ─▶ a blocking
//!   writer (mpsc(4): bounded memory) ─▶ backup::create_file (hidden temporary file,
//!   renamed into place only once etcd's own SHA-256 checked) ─▶ the outcome recorded
//!   in Shared::scheduled (GetConsensusStatus reports it, `cluster status` warns)
//! ```
//! A crash mid-snapshot leaves at most a hidden temporary file, never listed, removed
//! when the runnable starts. May write only under its directory; no etcd writes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::GetOptions;
use ring::digest::{Context, SHA256};
use tonic::Status;

use super::shared::{ScheduledOutcome, Shared};
use crate::snapshots::{SnapshotName, due_in, to_prune};

/// How often the schedule and the directory are looked at.
const POLL: Duration = Duration::from_secs(2);
/// After a failure, the next attempt comes no sooner than this (or the interval).
const RETRY: Duration = Duration::from_secs(60);
/// How long etcd's snapshot stream may pause.
const STALL: Duration = Duration::from_secs(30);
/// Length of etcd's SHA-256 at the end of its snapshot stream.
const ETCD_HASH_LEN: usize = 32;
/// How long the revision read may wait for the quorum before the local state is used.
const QUORUM_READ: Duration = Duration::from_secs(5);

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The snapshot files in `dir`, oldest first, with their sizes. A missing directory
/// holds none; anything that is not a regular file with a snapshot name is ignored.
pub(super) fn list_local(dir: &Path) -> std::io::Result<Vec<(SnapshotName, u64)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().and_then(SnapshotName::parse) else {
            continue;
        };
        let meta = entry.metadata()?;
        if meta.is_file() {
            found.push((name, meta.len()));
        }
    }
    found.sort();
    Ok(found)
}

/// The path of a snapshot this member holds, named as given: refused unless the name
/// is a snapshot name (never a path) and the file is in the listing.
pub(super) fn local_path(dir: Option<&Path>, name: &str) -> Result<PathBuf, Status> {
    let parsed = SnapshotName::parse(name).ok_or_else(|| bad_name(name))?;
    let dir = dir.ok_or_else(|| Status::not_found("this node keeps no snapshots"))?;
    let listing =
        list_local(dir).map_err(|e| Status::unavailable(format!("{}: {e}", dir.display())))?;
    if !listing.iter().any(|(n, _)| *n == parsed) {
        return Err(Status::not_found(format!(
            "no snapshot {name} on this node"
        )));
    }
    Ok(dir.join(parsed.file_name()))
}

/// The refusal of a name that is not a snapshot name.
pub(super) fn bad_name(name: &str) -> Status {
    Status::invalid_argument(format!(
        "{:?} is not a snapshot name (snapshot-<16 digits>-r<revision>.polisbak)",
        name.chars().take(80).collect::<String>()
    ))
}

pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let Some(dir) = shared.config.snapshots.dir.clone() else {
        ctx.cancelled().await;
        return Ok(());
    };
    remove_leftovers(&dir);
    let bounds = shared.config.snapshots.bounds;
    let mut schedule = proto::snapshots::effective(0, 0, bounds);
    let mut last_failure: Option<u64> = None;
    if let Ok(files) = list_local(&dir)
        && let Some((newest, _)) = files.last()
    {
        record(&shared, |o| {
            o.last_success_unix_ms = newest.taken_at_unix_ms
        });
    }
    loop {
        match crate::schedule::local_configuration(&shared.curator).await {
            Ok(Some(c)) => {
                let now = proto::snapshots::effective(
                    c.snapshot_interval_seconds,
                    c.snapshot_keep,
                    bounds,
                );
                if now != schedule {
                    tracing::info!(
                        interval = proto::snapshots::show(now.interval.as_secs()),
                        keep = now.keep,
                        "scheduled snapshots: schedule"
                    );
                    schedule = now;
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!("scheduled snapshots: reading the schedule: {e}"),
        }
        let newest = match list_local(&dir) {
            Ok(files) => {
                prune(
                    &dir,
                    files.iter().map(|(n, _)| n.clone()).collect(),
                    schedule.keep,
                );
                files.last().map(|(n, _)| n.taken_at_unix_ms)
            }
            Err(_) => None,
        };
        let wait = due_in(now_ms(), newest, last_failure, schedule.interval, RETRY);
        if wait.is_zero() {
            let outcome = tokio::select! {
                o = take(&shared, &dir) => o,
                _ = ctx.cancelled() => return Ok(()),
            };
            match outcome {
                Ok(name) => {
                    tracing::info!(name = name.file_name(), "scheduled snapshot taken");
                    last_failure = None;
                    record(&shared, |o| {
                        o.last_success_unix_ms = name.taken_at_unix_ms;
                        o.last_error.clear();
                    });
                }
                Err(e) => {
                    tracing::warn!("scheduled snapshot failed: {e}");
                    last_failure = Some(now_ms());
                    record(&shared, |o| o.last_error = e);
                }
            }
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait.min(POLL)) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

fn record(shared: &Shared, change: impl FnOnce(&mut ScheduledOutcome)) {
    change(&mut shared.scheduled.lock().expect("scheduled outcome lock"));
}

/// Removes the hidden temporary files an interrupted snapshot left.
fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(".snapshot-") && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn prune(dir: &Path, names: Vec<SnapshotName>, keep: u32) {
    for name in to_prune(names, keep) {
        let file = name.file_name();
        match std::fs::remove_file(dir.join(&file)) {
            Ok(()) => tracing::info!(name = file, "scheduled snapshot pruned"),
            Err(e) => tracing::warn!("pruning scheduled snapshot {file}: {e}"),
        }
    }
}

/// The revision a backup (or a scheduled snapshot) holds at least: read through the
/// quorum (5 s), else from the member's local state (`false`).
pub(super) async fn read_revision(shared: &Shared) -> Result<(i64, bool), Status> {
    let mut client = shared.curator.client();
    let key = shared.curator.key("");
    // A member that knows it has no leader (the quorum runnable) is not asked through
    // the quorum: the answer would only come after QUORUM_READ, as a timeout.
    let linearizable = match shared.etcd_leader.current() {
        Some(false) => None,
        _ => tokio::time::timeout(
            QUORUM_READ,
            client.get(key.clone(), Some(GetOptions::new().with_count_only())),
        )
        .await
        .ok()
        .and_then(Result::ok),
    };
    Ok(match linearizable {
        Some(r) => (r.header().map(|h| h.revision()).unwrap_or_default(), true),
        None => {
            let r = client
                .get(
                    key,
                    Some(GetOptions::new().with_count_only().with_serializable()),
                )
                .await
                .map_err(|e| {
                    Status::unavailable(format!("the local etcd member does not answer: {e}"))
                })?;
            tracing::warn!("backup without a quorum: taken from this member's local state");
            (r.header().map(|h| h.revision()).unwrap_or_default(), false)
        }
    })
}

enum Piece {
    Data(Vec<u8>),
    Commit,
}

/// Takes one snapshot of this member's etcd into `dir`.
async fn take(shared: &Shared, dir: &Path) -> Result<SnapshotName, String> {
    privatefs::ensure_private_dir(dir).map_err(|e| e.to_string())?;
    let mut client = shared.curator.client();
    let status = client
        .status()
        .await
        .map_err(|e| format!("the local etcd member does not answer: {e}"))?;
    let (revision, quorum_read) = read_revision(shared)
        .await
        .map_err(|s| s.message().to_string())?;
    let taken_at_unix_ms = now_ms();
    let name = SnapshotName {
        taken_at_unix_ms,
        revision,
    };
    let etcd = status.header();
    let trusted: Vec<String> = shared
        .trusted_cas()
        .iter()
        .map(|c| rpc::fingerprint(c))
        .collect();
    let header = backup::Header {
        ca_fingerprint: trusted[0].clone(),
        trusted_ca_fingerprints: trusted,
        revision,
        quorum_read,
        taken_at_unix_ms,
        node_id: shared.config.node_id.clone(),
        etcd_cluster_id: format!("{:x}", etcd.map(|h| h.cluster_id()).unwrap_or_default()),
        etcd_member_id: format!("{:x}", etcd.map(|h| h.member_id()).unwrap_or_default()),
        polis_version: env!("CARGO_PKG_VERSION").to_string(),
        etcd_version: status.version().to_string(),
    };
    let path = dir.join(name.file_name());
    let mut writer = backup::create_file(&path, &header).map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Piece>(4);
    let written = tokio::task::spawn_blocking(move || -> Result<bool, String> {
        while let Some(piece) = rx.blocking_recv() {
            match piece {
                Piece::Data(d) => writer.write_snapshot(&d).map_err(|e| e.to_string())?,
                Piece::Commit => {
                    let (file, _) = writer.finish().map_err(|e| e.to_string())?;
                    file.commit().map_err(|e| e.to_string())?;
                    return Ok(true);
                }
            }
        }
        Ok(false)
    });
    let streamed = stream(&mut client, &tx).await;
    if streamed.is_ok() {
        let _ = tx.send(Piece::Commit).await;
    }
    drop(tx);
    let committed = written
        .await
        .map_err(|e| format!("the snapshot writer failed: {e}"))?;
    match (streamed, committed) {
        (_, Err(e)) => Err(format!("{}: {e}", path.display())),
        (Err(e), _) => Err(e),
        (Ok(()), Ok(true)) => Ok(name),
        (Ok(()), Ok(false)) => Err("the snapshot writer stopped".to_string()),
    }
}

/// Streams etcd's snapshot to the writer, checking etcd's own SHA-256 at its end.
async fn stream(
    client: &mut etcd_client::Client,
    tx: &tokio::sync::mpsc::Sender<Piece>,
) -> Result<(), String> {
    let mut snapshot = client
        .maintenance_client()
        .snapshot()
        .await
        .map_err(|e| format!("etcd refused a snapshot: {e}"))?;
    let mut of_database = Context::new(&SHA256);
    let mut database: Option<u64> = None;
    let mut size: u64 = 0;
    let mut tail: Vec<u8> = Vec::with_capacity(ETCD_HASH_LEN + 1);
    loop {
        let message = tokio::time::timeout(STALL, snapshot.message())
            .await
            .map_err(|_| format!("etcd's snapshot stream stalled for {STALL:?}"))?
            .map_err(|e| format!("etcd snapshot: {e}"))?;
        let Some(message) = message else { break };
        let blob = message.blob();
        let db = *database.get_or_insert(message.remaining_bytes() + blob.len() as u64);
        let in_db = db.saturating_sub(size).min(blob.len() as u64) as usize;
        of_database.update(&blob[..in_db]);
        let room = (ETCD_HASH_LEN + 1).saturating_sub(tail.len());
        tail.extend_from_slice(&blob[in_db..][..room.min(blob.len() - in_db)]);
        size += blob.len() as u64;
        if tx.send(Piece::Data(blob.to_vec())).await.is_err() {
            return Err("the snapshot writer stopped".to_string());
        }
    }
    let db = database.unwrap_or_default();
    if size != db + ETCD_HASH_LEN as u64 || tail.as_slice() != of_database.finish().as_ref() {
        return Err(format!(
            "etcd's snapshot failed its own check ({size} bytes for a {db}-byte database \
             and its SHA-256)"
        ));
    }
    Ok(())
}
