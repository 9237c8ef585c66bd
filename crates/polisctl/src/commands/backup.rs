//! `cluster backup --out FILE`: streams a snapshot of one curator's own etcd member into
//! a backup file (format: the `backup` crate); `cluster backup inspect FILE`: reads and
//! verifies one, offline.
//!
//! ```text
//!   endpoints in order ── Backup.TakeBackup (owner certificate; the first curator that
//!   does not answer Unavailable serves it from its own member, never the leader's)
//!     BackupStart → header (CA fingerprint checked against the pinned CA)
//!     data …      → FILE's temporary twin, hashed as it is written (bounded memory)
//!     BackupEnd   → size and SHA-256 must equal ours → trailer → fsync, rename
//! ```
//! Any failure (or Ctrl-C) before the rename leaves nothing behind.
//! May not format results itself (`render::backup`).

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use proto::api::{self, backup_chunk::Part};

use crate::output::{Format, escape};
use crate::render::backup::{print_inspected, print_saved};
use crate::session::{OwnerSession, call_error, owner_session};

/// How long the stream may pause before the backup is given up.
const STALL: Duration = Duration::from_secs(60);

/// `cluster backup inspect FILE`.
pub(crate) fn inspect(file: &Path, format: Format) -> Result<()> {
    let backup = backup::inspect_file(file).map_err(|e| anyhow!("{e}"))?;
    print_inspected(file, &backup, format);
    Ok(())
}

/// `cluster backup --out FILE`.
pub(crate) async fn save(
    config: &Path,
    raw_endpoints: &[String],
    out: &Path,
    format: Format,
) -> Result<()> {
    if out.is_dir() {
        bail!("{}: is a directory; name the backup file", out.display());
    }
    // Where it goes must be writable before the cluster is asked for anything.
    let file = privatefs::AtomicFile::create(out)
        .with_context(|| format!("{}: cannot write the backup", out.display()))?;
    let session = owner_session(config, raw_endpoints).await?;
    let mut stream = None;
    let mut failures = Vec::new();
    for endpoint in session.endpoints() {
        let channel =
            match rpc::connect(endpoint, session.trust(), Some(&session.credentials())).await {
                Ok(c) => c,
                Err(e) => {
                    failures.push(e.to_string());
                    continue;
                }
            };
        match api::backup_client::BackupClient::new(channel)
            .take_backup(api::TakeBackupRequest {})
            .await
        {
            Ok(s) => {
                stream = Some((endpoint, s.into_inner()));
                break;
            }
            Err(s) if s.code() == tonic::Code::Unavailable => {
                failures.push(format!("{endpoint}: {}", s.message()))
            }
            Err(s) => return Err(call_error(&format!("backup from {endpoint}"), s)),
        }
    }
    let Some((endpoint, mut stream)) = stream else {
        bail!("taking a backup: no curator could: {}", failures.join("; "));
    };
    let receive = async {
        tokio::time::timeout(STALL, stream.message())
            .await
            .map_err(|_| anyhow!("{endpoint} sent nothing for {STALL:?}"))?
            .map_err(|s| call_error(&format!("backup from {endpoint}"), s))
    };
    let start = match receive.await?.and_then(|c| c.part) {
        Some(Part::Start(start)) => start,
        _ => bail!("backup from {endpoint}: the stream did not begin with its header"),
    };
    let ca_fingerprint = rpc::fingerprint(&start.ca_certificate);
    check_cluster_ca(&session, &ca_fingerprint)
        .with_context(|| format!("backup from {endpoint}"))?;
    let header = backup::Header {
        ca_fingerprint,
        trusted_ca_fingerprints: start
            .trusted_cas
            .iter()
            .map(|c| rpc::fingerprint(c))
            .collect(),
        revision: start.revision,
        quorum_read: start.quorum_read,
        taken_at_unix_ms: start.taken_at_unix_ms,
        node_id: start.node_id,
        etcd_cluster_id: format!("{:x}", start.etcd_cluster_id),
        etcd_member_id: format!("{:x}", start.etcd_member_id),
        polis_version: start.polis_version,
        etcd_version: start.etcd_version,
    };
    let mut writer = backup::Writer::new(file, &header)
        .with_context(|| format!("{}: writing the backup", out.display()))?;
    let mut progress = Progress::new(start.expected_size);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let end = loop {
        let message = tokio::select! {
            m = tokio::time::timeout(STALL, stream.message()) => m,
            _ = &mut interrupted => bail!("interrupted; no backup written to {}", out.display()),
        };
        let chunk = message
            .map_err(|_| anyhow!("backup from {endpoint}: nothing received for {STALL:?}"))?
            .map_err(|s| call_error(&format!("backup from {endpoint}"), s))?;
        match chunk.and_then(|c| c.part) {
            Some(Part::Data(data)) => {
                writer
                    .write_snapshot(&data)
                    .with_context(|| format!("{}: writing the backup", out.display()))?;
                progress.show(writer.snapshot_size());
            }
            Some(Part::End(end)) => break end,
            Some(Part::Start(_)) => bail!("backup from {endpoint}: a second header"),
            None => {
                bail!("backup from {endpoint}: the stream ended before the backup was complete")
            }
        }
    };
    progress.done(writer.snapshot_size());
    if end.size != writer.snapshot_size() || end.sha256 != writer.snapshot_sha256() {
        bail!(
            "backup from {endpoint}: received {} bytes with SHA-256 {}, the curator sent {} bytes with {}; \
             nothing written",
            writer.snapshot_size(),
            hex_of(&writer.snapshot_sha256()),
            end.size,
            hex_of(&end.sha256)
        );
    }
    let (file, trailer) = writer
        .finish()
        .with_context(|| format!("{}: writing the backup", out.display()))?;
    file.commit()
        .with_context(|| format!("{}: saving the backup", out.display()))?;
    print_saved(out, &header, &trailer, format);
    if !header.quorum_read {
        eprintln!(
            "polisctl: warning: {} had no etcd quorum: the backup holds its local state, which may miss recent writes",
            escape(&header.node_id)
        );
    }
    Ok(())
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A progress line on stderr, only when stderr is a terminal.
struct Progress {
    expected: u64,
    terminal: bool,
    started: Instant,
    shown: Option<Instant>,
}

impl Progress {
    fn new(expected: u64) -> Progress {
        Progress {
            expected,
            terminal: std::io::stderr().is_terminal(),
            started: Instant::now(),
            shown: None,
        }
    }

    fn line(&self, done: u64) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let percent = if self.expected > 0 {
            format!(" ({:.0}%)", 100.0 * done as f64 / self.expected as f64)
        } else {
            String::new()
        };
        format!(
            "\rbackup: {:.1} of {:.1} MiB{percent}, {:.1} MiB/s ",
            mib(done),
            mib(self.expected),
            mib(done) / secs
        )
    }

    fn show(&mut self, done: u64) {
        if !self.terminal
            || self
                .shown
                .is_some_and(|t| t.elapsed() < Duration::from_millis(200))
        {
            return;
        }
        self.shown = Some(Instant::now());
        eprint!("{}", self.line(done));
    }

    fn done(&self, done: u64) {
        if self.terminal {
            eprintln!("{}", self.line(done));
        }
    }
}

/// Refuses a backup whose header names a signing CA this session does not trust: one of
/// another cluster, or of this one from before a CA rotation (restoring it would bring
/// back the retired CA, which the nodes no longer trust).
pub(crate) fn check_cluster_ca(session: &OwnerSession, ca_fingerprint: &str) -> Result<()> {
    let trusted: Vec<String> = session
        .cluster_cas()
        .iter()
        .map(|c| rpc::fingerprint(c))
        .collect();
    if !trusted.iter().any(|t| t == ca_fingerprint) {
        bail!(
            "its cluster CA SHA256:{} is none this configuration trusts ({}): a backup of \
             another cluster, or of this one from before a CA rotation",
            escape(ca_fingerprint),
            trusted
                .iter()
                .map(|t| format!("SHA256:{t}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}
