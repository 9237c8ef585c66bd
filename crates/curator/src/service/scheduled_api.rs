//! Scheduled snapshots, the calls: the owner's listing of every member's snapshots and
//! fetch of one (Backup.ListSnapshots / FetchSnapshot, answered by the curator called),
//! the same for this curator's own files when another curator relays an owner's call
//! (CuratorLocal.SnapshotsListLocal / SnapshotsFetchLocal, UP consensus members only),
//! and the owner's change of the schedule (Management.SetSnapshotSchedule, leader).
//!
//! ```text
//!   owner ─ ListSnapshots ─▶ curator: own files + each other etcd member's curator
//!                            (SnapshotsListLocal, node certificate, 5 s)
//!   owner ─ FetchSnapshot(node, name) ─▶ curator: name checked (strict pattern) ─▶
//!       own node: the file, in 256 KiB chunks (mpsc(4))
//!       another:  its curator's SnapshotsFetchLocal stream, relayed as it comes
//! ```
//! A name is checked against the strict pattern and the member's listing before any
//! path is made of it (`scheduled::local_path`). May not write: not to etcd (but the
//! schedule through `crate::schedule`), not to disk.

use std::pin::Pin;
use std::time::Duration;

use proto::api;
use tokio::io::AsyncReadExt;
use tokio_stream::Stream;
use tonic::{Request, Status};

use super::scheduled::{bad_name, list_local, local_path};
use super::shared::Shared;
use super::status::{etcd_status, identity, status_from};
use super::upkeep::channel_to;

/// Size of the chunks a snapshot file is sent in.
const CHUNK: usize = 256 * 1024;
/// How long a member's curator gets to list its snapshots.
const LIST_ANSWER: Duration = Duration::from_secs(5);
/// How long a reader may stop reading before a fetch is given up.
const STALL: Duration = Duration::from_secs(30);

pub(super) type FileStream =
    Pin<Box<dyn Stream<Item = Result<api::SnapshotFileChunk, Status>> + Send>>;

/// This curator's own snapshots, as the API describes them.
fn own_files(shared: &Shared) -> Result<Vec<api::SnapshotFile>, Status> {
    let Some(dir) = shared.config.snapshots.dir.as_deref() else {
        return Ok(Vec::new());
    };
    let files =
        list_local(dir).map_err(|e| Status::unavailable(format!("{}: {e}", dir.display())))?;
    Ok(files
        .into_iter()
        .map(|(n, size)| api::SnapshotFile {
            node_id: shared.config.node_id.clone(),
            name: n.file_name(),
            revision: n.revision,
            taken_at_unix_ms: n.taken_at_unix_ms,
            size,
        })
        .collect())
}

/// Refuses callers that are not UP consensus members (the relaying curators).
fn curator_caller<T>(shared: &Shared, request: &Request<T>) -> Result<(), Status> {
    match identity(request) {
        rpc::Identity::Node { id, .. } if shared.is_curator_node(&id) => Ok(()),
        other => Err(Status::permission_denied(format!(
            "only curators relay snapshot calls; caller is {other}"
        ))),
    }
}

/// CuratorLocal.SnapshotsListLocal.
pub(super) fn list_local_call(
    shared: &Shared,
    request: &Request<api::SnapshotsListLocalRequest>,
) -> Result<api::SnapshotsListLocalResponse, Status> {
    curator_caller(shared, request)?;
    Ok(api::SnapshotsListLocalResponse {
        node_id: shared.config.node_id.clone(),
        snapshots: own_files(shared)?,
    })
}

/// CuratorLocal.SnapshotsFetchLocal.
pub(super) async fn fetch_local_call(
    shared: &Shared,
    request: &Request<api::SnapshotsFetchLocalRequest>,
) -> Result<FileStream, Status> {
    curator_caller(shared, request)?;
    send_file(shared, &request.get_ref().name).await
}

/// Streams one of this curator's own snapshot files.
async fn send_file(shared: &Shared, name: &str) -> Result<FileStream, Status> {
    let path = local_path(shared.config.snapshots.dir.as_deref(), name)?;
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| Status::not_found(format!("{}: {e}", path.display())))?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            let mut buf = vec![0u8; CHUNK];
            let item = match file.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(api::SnapshotFileChunk { data: buf })
                }
                Err(e) => Err(Status::internal(format!("{}: {e}", path.display()))),
            };
            let failed = item.is_err();
            match tokio::time::timeout(STALL, tx.send(item)).await {
                Ok(Ok(())) if !failed => {}
                _ => return,
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// Backup.ListSnapshots: every member's snapshots.
pub(super) async fn list_all(shared: &Shared) -> Result<api::ListSnapshotsResponse, Status> {
    let mut answer = api::ListSnapshotsResponse {
        snapshots: own_files(shared)?,
        unreachable: Vec::new(),
    };
    let mut client = shared.curator.client();
    let members = consensus::membership::members(&mut client)
        .await
        .map_err(|e| etcd_status("listing etcd members", e))?;
    let mut asks = tokio::task::JoinSet::new();
    for m in members {
        if m.name == shared.config.node_id {
            continue;
        }
        let channel = channel_to(shared, &m).await;
        asks.spawn(async move {
            let who = if m.name.is_empty() {
                format!("member {:x}", m.id)
            } else {
                m.name.clone()
            };
            let Some(channel) = channel else {
                return Err(format!("{who}: its curator does not answer"));
            };
            let mut local = api::curator_local_client::CuratorLocalClient::new(channel);
            let call = local.snapshots_list_local(api::SnapshotsListLocalRequest {});
            match tokio::time::timeout(LIST_ANSWER, call).await {
                Ok(Ok(r)) => Ok(r.into_inner().snapshots),
                Ok(Err(s)) => Err(format!("{who}: {}", s.message())),
                Err(_) => Err(format!("{who}: no answer within {LIST_ANSWER:?}")),
            }
        });
    }
    while let Some(done) = asks.join_next().await {
        match done {
            Ok(Ok(files)) => answer.snapshots.extend(files),
            Ok(Err(why)) => answer.unreachable.push(why),
            Err(e) => answer.unreachable.push(e.to_string()),
        }
    }
    answer
        .snapshots
        .sort_by(|a, b| (&a.node_id, &a.name).cmp(&(&b.node_id, &b.name)));
    answer.unreachable.sort();
    Ok(answer)
}

/// Backup.FetchSnapshot: one member's snapshot, from this curator or relayed from the
/// member's own.
pub(super) async fn fetch(
    shared: &Shared,
    request: &api::FetchSnapshotRequest,
) -> Result<FileStream, Status> {
    if crate::snapshots::SnapshotName::parse(&request.name).is_none() {
        // Checked here too, so a bad name never travels to another curator.
        return Err(bad_name(&request.name));
    }
    if request.node_id == shared.config.node_id {
        return send_file(shared, &request.name).await;
    }
    let mut client = shared.curator.client();
    let members = consensus::membership::members(&mut client)
        .await
        .map_err(|e| etcd_status("listing etcd members", e))?;
    let member = members
        .into_iter()
        .find(|m| !request.node_id.is_empty() && m.name == request.node_id)
        .ok_or_else(|| {
            Status::not_found(format!(
                "node {:?} is not a consensus member (only consensus members keep snapshots)",
                request.node_id.chars().take(80).collect::<String>()
            ))
        })?;
    let channel = channel_to(shared, &member).await.ok_or_else(|| {
        Status::unavailable(format!("the curator of {} does not answer", member.name))
    })?;
    let stream = api::curator_local_client::CuratorLocalClient::new(channel)
        .snapshots_fetch_local(api::SnapshotsFetchLocalRequest {
            name: request.name.clone(),
        })
        .await?
        .into_inner();
    Ok(Box::pin(stream))
}

/// Management.SetSnapshotSchedule (leader): checks the values against this node's
/// bounds, records them in the cluster configuration.
pub(super) async fn set_schedule(
    shared: &Shared,
    request: &api::SetSnapshotScheduleRequest,
) -> Result<api::SetSnapshotScheduleResponse, Status> {
    let bounds = shared.config.snapshots.bounds;
    if request.snapshot_interval_seconds == 0 && request.snapshot_keep == 0 {
        return Err(Status::invalid_argument(
            "nothing to change: give an interval, a count kept, or both",
        ));
    }
    if request.snapshot_interval_seconds != 0 {
        proto::snapshots::check_interval(request.snapshot_interval_seconds, bounds)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    if request.snapshot_keep != 0 {
        proto::snapshots::check_keep(request.snapshot_keep)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    let leadership = shared.leadership().await?;
    let config = crate::schedule::set_snapshot_schedule(
        &shared.curator,
        &leadership,
        request.snapshot_interval_seconds,
        request.snapshot_keep,
    )
    .await
    .map_err(status_from)?;
    tracing::info!(
        interval = config.snapshot_interval_seconds,
        keep = config.snapshot_keep,
        "snapshot schedule changed"
    );
    Ok(api::SetSnapshotScheduleResponse {
        cluster_configuration: Some(config),
    })
}
