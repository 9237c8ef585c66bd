//! Scheduled snapshots: `cluster backups` (every member's, through any curator),
//! `cluster backup --from-node ID --name NAME --out FILE` (one fetched, verified as a
//! `cluster backup` is), `cluster config` and `cluster config set` (the schedule).
//!
//! ```text
//!   endpoints in order ── Backup.FetchSnapshot(node, name) (the first curator that
//!   does not answer Unavailable relays it from the member's own curator)
//!     chunks → FILE's temporary twin (bounded memory) → backup::open + verify: intact,
//!     this cluster's CA, the node asked for → fsync, rename
//! ```
//! Any failure before the rename leaves nothing behind.
//! May not format results itself (`render::snapshots`, `render::backup`).

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use proto::api;
use tonic::transport::Channel;

use crate::output::Format;
use crate::render::backup::print_saved;
use crate::render::snapshots::{print_config, print_list};
use crate::session::{OwnerSession, call_error, owner_session};

/// How long a fetch's stream may pause before it is given up.
const STALL: Duration = Duration::from_secs(60);

/// A Backup client on the first curator that answers.
async fn backup_client(
    session: &OwnerSession,
) -> Result<(
    std::net::SocketAddr,
    api::backup_client::BackupClient<Channel>,
)> {
    let mut failures = Vec::new();
    for endpoint in session.endpoints() {
        match rpc::connect(endpoint, session.trust(), Some(&session.credentials())).await {
            Ok(c) => return Ok((endpoint, api::backup_client::BackupClient::new(c))),
            Err(e) => failures.push(format!("{endpoint}: {e}")),
        }
    }
    bail!("no curator answers: {}", failures.join("; "))
}

/// `cluster backups`.
pub(crate) async fn list(config: &Path, raw_endpoints: &[String], format: Format) -> Result<()> {
    let session = owner_session(config, raw_endpoints).await?;
    let (endpoint, mut client) = backup_client(&session).await?;
    let answer = client
        .list_snapshots(api::ListSnapshotsRequest {})
        .await
        .map_err(|s| call_error(&format!("listing snapshots through {endpoint}"), s))?
        .into_inner();
    print_list(&answer, format);
    Ok(())
}

/// `cluster backup --from-node ID --name NAME --out FILE`.
pub(crate) async fn fetch(
    config: &Path,
    raw_endpoints: &[String],
    node: &str,
    name: &str,
    out: &Path,
    format: Format,
) -> Result<()> {
    if out.is_dir() {
        bail!("{}: is a directory; name the backup file", out.display());
    }
    let mut file = privatefs::AtomicFile::create(out)
        .with_context(|| format!("{}: cannot write the backup", out.display()))?;
    let session = owner_session(config, raw_endpoints).await?;
    let request = api::FetchSnapshotRequest {
        node_id: node.to_string(),
        name: name.to_string(),
    };
    let mut failures = Vec::new();
    let mut stream = None;
    for endpoint in session.endpoints() {
        let channel =
            match rpc::connect(endpoint, session.trust(), Some(&session.credentials())).await {
                Ok(c) => c,
                Err(e) => {
                    failures.push(format!("{endpoint}: {e}"));
                    continue;
                }
            };
        match api::backup_client::BackupClient::new(channel)
            .fetch_snapshot(request.clone())
            .await
        {
            Ok(s) => {
                stream = Some((endpoint, s.into_inner()));
                break;
            }
            Err(s) if s.code() == tonic::Code::Unavailable => {
                failures.push(format!("{endpoint}: {}", s.message()))
            }
            Err(s) => {
                return Err(call_error(
                    &format!("fetching snapshot {name} of {node}"),
                    s,
                ));
            }
        }
    }
    let Some((endpoint, mut stream)) = stream else {
        bail!(
            "fetching snapshot {name} of {node}: {}",
            failures.join("; ")
        );
    };
    loop {
        let message = tokio::time::timeout(STALL, stream.message())
            .await
            .map_err(|_| anyhow!("{endpoint} sent nothing for {STALL:?}"))?
            .map_err(|s| call_error(&format!("fetching snapshot {name} of {node}"), s))?;
        let Some(chunk) = message else { break };
        file.write_all(&chunk.data)
            .with_context(|| format!("{}: writing the backup", out.display()))?;
    }
    file.flush()
        .with_context(|| format!("{}: writing the backup", out.display()))?;
    let received = std::fs::File::open(file.temporary_path())
        .with_context(|| format!("{}: reading the fetched snapshot", out.display()))?;
    let mut reader = std::io::BufReader::with_capacity(256 * 1024, received);
    let fetched = backup::open(&mut reader)
        .and_then(|b| backup::verify(&mut reader, &b).map(|()| b))
        .map_err(|e| anyhow!("snapshot {name} of {node} as received: {e}; nothing written"))?;
    if fetched.header.node_id != node {
        bail!(
            "snapshot {name}: its header names node {}, not {node}; nothing written",
            fetched.header.node_id
        );
    }
    crate::commands::backup::check_cluster_ca(&session, &fetched.header.ca_fingerprint)
        .with_context(|| format!("snapshot {name} of {node}: nothing written"))?;
    file.commit()
        .with_context(|| format!("{}: saving the backup", out.display()))?;
    print_saved(out, &fetched.header, &fetched.trailer, format);
    Ok(())
}

/// `cluster config`.
pub(crate) async fn show_config(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
) -> Result<()> {
    let info = owner_session(config, raw_endpoints)
        .await?
        .cluster_info()
        .await?;
    print_config(&info.cluster_configuration.unwrap_or_default(), format);
    Ok(())
}

/// `cluster config set`.
pub(crate) async fn set_schedule(
    config: &Path,
    raw_endpoints: &[String],
    interval: Option<u64>,
    keep: Option<u32>,
    format: Format,
) -> Result<()> {
    if interval.is_none() && keep.is_none() {
        bail!(
            "cluster config set: nothing to change (give --snapshot-interval, --snapshot-keep or both)"
        );
    }
    let request = api::SetSnapshotScheduleRequest {
        snapshot_interval_seconds: interval.unwrap_or(0),
        snapshot_keep: keep.unwrap_or(0),
    };
    let answer = owner_session(config, raw_endpoints)
        .await?
        .management("changing the snapshot schedule", |mut m| async move {
            m.set_snapshot_schedule(request).await
        })
        .await?;
    print_config(&answer.cluster_configuration.unwrap_or_default(), format);
    Ok(())
}
