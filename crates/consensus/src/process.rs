//! The etcd child process: start, readiness, log forwarding, stop.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tracing::Instrument;

use crate::client::connect_unix;
use crate::config::{EtcdConfig, MAX_SOCKET_PATH, Readiness};
use crate::{ConsensusError, Status};

/// How long etcd gets to come up before the start counts as failed.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Per-probe timeout: a socket can accept connections while requests hang.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Grace period between SIGTERM and SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks what can be checked before spawning, so that failures name their cause.
pub fn preflight(config: &EtcdConfig) -> Result<(), ConsensusError> {
    // etcd runs in `run_dir`: a relative path would be resolved from there.
    let tls = &config.peer_tls;
    for path in [
        &config.data_dir,
        &config.run_dir,
        &tls.cert,
        &tls.key,
        &tls.ca,
        &tls.crl,
    ] {
        if !path.is_absolute() {
            return Err(ConsensusError::RelativePath { path: path.clone() });
        }
    }
    let binary = &config.binary;
    match std::fs::metadata(binary) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
        _ => {
            return Err(ConsensusError::BinaryMissing {
                path: binary.clone(),
            });
        }
    }
    // The metrics socket's name is the longer one (see `selfreport`).
    let socket = config.run_dir.join(crate::selfreport::METRICS_SOCKET_NAME);
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(ConsensusError::SocketPathTooLong { path: socket });
    }
    if !config.peer_tls.crl.is_file() {
        return Err(ConsensusError::MissingFile {
            what: "peer CRL",
            path: config.peer_tls.crl.clone(),
        });
    }
    Ok(())
}

/// Runs etcd until `ctx` is cancelled (then stops it cleanly) or etcd exits (an error,
/// so that the supervisor restarts this runnable with backoff).
pub async fn run(
    ctx: &supervisor::Context,
    config: &EtcdConfig,
    status: &event::Value<Status>,
) -> Result<(), ConsensusError> {
    run_restartable(ctx, config, status, &tokio::sync::Notify::new()).await
}

/// [`run`], and each time `restart` is notified: stops etcd (SIGTERM; a leader hands
/// its leadership over first) and starts it again, so that it reads again what etcd
/// 3.4 reads only at start (the peer trust file). The status goes Stopped in between.
/// `--force-new-cluster` applies to the first start only.
pub async fn run_restartable(
    ctx: &supervisor::Context,
    config: &EtcdConfig,
    status: &event::Value<Status>,
    restart: &tokio::sync::Notify,
) -> Result<(), ConsensusError> {
    preflight(config)?;
    let mut config = config.clone();
    loop {
        prepare_run_dir(&config.run_dir)?;
        let peer_trust =
            std::fs::read(&config.peer_tls.ca).map_err(|source| ConsensusError::Io {
                context: format!("reading {}", config.peer_tls.ca.display()),
                source,
            })?;
        let started = Instant::now();
        let mut child = spawn(&config)?;
        tracing::info!(pid = child.id(), "started etcd");

        let ready = tokio::select! {
            r = wait_ready(&config, &mut child) => r,
            _ = ctx.cancelled() => {
                stop(&mut child).await;
                return Ok(());
            }
        };
        let mut running = match ready {
            Ok(r) => r,
            Err(e) => {
                stop(&mut child).await;
                return Err(e);
            }
        };
        running.peer_trust_loaded = peer_trust;
        config.force_new_cluster = false;
        tracing::info!(
            cluster_id = format!("{:x}", running.cluster_id),
            member_id = format!("{:x}", running.member_id),
            ms = started.elapsed().as_millis() as u64,
            "etcd is ready"
        );
        status.set(Status::Running(Box::new(running)));
        ctx.signal_healthy();

        tokio::select! {
            exit = child.wait() => {
                status.set(Status::Stopped);
                return Err(match exit {
                    Ok(status) => ConsensusError::Exited { status },
                    Err(source) => ConsensusError::Io { context: "waiting for etcd".into(), source },
                });
            }
            _ = ctx.cancelled() => {
                stop(&mut child).await;
                status.set(Status::Stopped);
                return Ok(());
            }
            _ = restart.notified() => {}
        }
        tracing::info!("restarting etcd: it reads its peer trust file only at start");
        status.set(Status::Stopped);
        stop(&mut child).await;
    }
}

fn prepare_run_dir(run_dir: &Path) -> Result<(), ConsensusError> {
    let io = |context: String| move |source| ConsensusError::Io { context, source };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(run_dir)
        .map_err(io(format!("creating {}", run_dir.display())))?;
    std::fs::set_permissions(run_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io(format!("setting permissions of {}", run_dir.display())))?;
    // A socket left behind by a killed etcd makes the next one fail to bind.
    for name in [
        crate::config::CLIENT_SOCKET_NAME,
        crate::selfreport::METRICS_SOCKET_NAME,
    ] {
        let socket = run_dir.join(name);
        match std::fs::remove_file(&socket) {
            Ok(()) => tracing::info!("removed stale etcd socket {}", socket.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("removing stale socket {}", socket.display()))(e)),
        }
    }
    Ok(())
}

fn spawn(config: &EtcdConfig) -> Result<Child, ConsensusError> {
    let parent_pid = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(&config.binary);
    cmd.args(config.args())
        .current_dir(&config.run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // Own process group: a terminal's Ctrl-C reaches only polis-node, which then
        // stops etcd in order.
        .process_group(0);
    // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid, kill).
    unsafe {
        cmd.pre_exec(move || {
            // etcd must not outlive polis-node, even after SIGKILL.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent_pid {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| ConsensusError::Spawn {
        path: config.binary.clone(),
        source,
    })?;
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(forward_logs(stderr).in_current_span());
    }
    if let Some(stdout) = child.stdout.take() {
        tokio::spawn(forward_logs(stdout).in_current_span());
    }
    Ok(child)
}

/// Re-emits etcd's zap JSON lines as our own log events, under the runnable's name.
async fn forward_logs(pipe: impl tokio::io::AsyncRead + Unpin) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let parsed = serde_json::from_str::<serde_json::Value>(&line).ok();
        let (level, msg) = match &parsed {
            Some(v) => (
                v.get("level").and_then(|l| l.as_str()).unwrap_or("info"),
                v.get("msg").and_then(|m| m.as_str()).unwrap_or(&line),
            ),
            None => ("info", line.as_str()),
        };
        let fields = parsed
            .as_ref()
            .and_then(|v| v.as_object())
            .map(|o| {
                o.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "level" | "msg" | "ts" | "caller"))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        match level {
            "debug" => tracing::debug!(target: "etcd", "{msg} {fields}"),
            "warn" => tracing::warn!(target: "etcd", "{msg} {fields}"),
            "error" | "dpanic" | "panic" | "fatal" => {
                tracing::error!(target: "etcd", "{msg} {fields}")
            }
            _ => tracing::info!(target: "etcd", "{msg} {fields}"),
        }
    }
}

/// Polls etcd through the socket until a read of the configured kind succeeds.
async fn wait_ready(
    config: &EtcdConfig,
    child: &mut Child,
) -> Result<crate::Running, ConsensusError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let socket = config.socket_path();
    let mut last_error = String::from("no attempt yet");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(ConsensusError::Exited { status });
        }
        if Instant::now() > deadline {
            return Err(ConsensusError::NotReady {
                after: READY_TIMEOUT,
                last_error,
            });
        }
        if socket.exists() {
            match tokio::time::timeout(PROBE_TIMEOUT, probe(&socket, config.readiness)).await {
                Ok(Ok(running)) => return Ok(running),
                Ok(Err(e)) => last_error = e.to_string(),
                Err(_) => last_error = "probe timed out".to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn probe(socket: &Path, readiness: Readiness) -> Result<crate::Running, ConsensusError> {
    let mut client = connect_unix(socket).await?;
    // A linearizable read needs a leader and a quorum: etcd is really serving. A
    // serializable one only that the member runs (all a learner can answer).
    let options = match readiness {
        Readiness::Linearizable => None,
        Readiness::Serializable => Some(etcd_client::GetOptions::new().with_serializable()),
    };
    let response = client.get("\0polis-readiness-probe", options).await?;
    let header = response
        .header()
        .ok_or(ConsensusError::Protocol("etcd response without header"))?;
    Ok(crate::Running {
        cluster_id: header.cluster_id(),
        member_id: header.member_id(),
        client,
        peer_trust_loaded: Vec::new(),
    })
}

/// SIGTERM, then SIGKILL if etcd has not exited within [`STOP_TIMEOUT`].
async fn stop(child: &mut Child) {
    let Some(pid) = child.id() else {
        return;
    };
    // SAFETY: plain syscall on a pid we own and have not reaped yet.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
    match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
        Ok(Ok(status)) => tracing::info!(%status, "etcd stopped"),
        Ok(Err(e)) => tracing::warn!("waiting for etcd to stop: {e}"),
        Err(_) => {
            tracing::warn!("etcd did not stop within {STOP_TIMEOUT:?}; killing it");
            let _ = child.kill().await;
        }
    }
}

/// `ExitStatus` with the signal spelled out, for error messages.
pub fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => status.to_string(),
    }
}
