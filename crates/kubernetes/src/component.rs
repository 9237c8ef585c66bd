//! One upstream Kubernetes program as a child of polis-node: started with its flags,
//! its output re-emitted as polis-node's own log lines (klog's level letter read), tied
//! to polis-node's life (PR_SET_PDEATHSIG: never outlives it, even after SIGKILL), and
//! stopped with SIGTERM, then SIGKILL after a grace period.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tracing::Instrument;

/// Grace period between SIGTERM and SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    #[error(
        "{program} is missing at {path}: build the Kubernetes binaries with \
         scripts/kubernetes-binaries and pass the folder it prints as \
         --kubernetes-binaries (or install the polis-kubernetes package)"
    )]
    Missing { program: &'static str, path: String },
    #[error("starting {program} ({path}): {source}")]
    Spawn {
        program: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{program} exited ({status})")]
    Exited {
        program: &'static str,
        status: String,
    },
}

/// Whether `dir/program` is an executable file; the error names what is missing.
pub fn check_binary(dir: &Path, program: &'static str) -> Result<(), ComponentError> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(program);
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        _ => Err(ComponentError::Missing {
            program,
            path: path.display().to_string(),
        }),
    }
}

/// Runs `dir/program args` until it exits (an error: components run for ever) or
/// `cancelled` completes (then it is stopped).
pub async fn run(
    dir: &Path,
    program: &'static str,
    args: &[String],
    cancelled: impl std::future::Future<Output = ()>,
) -> Result<(), ComponentError> {
    check_binary(dir, program)?;
    let mut child = spawn(&dir.join(program), program, args)?;
    tracing::info!(program, pid = child.id(), "started");
    tokio::select! {
        status = child.wait() => Err(ComponentError::Exited {
            program,
            status: status.map(|s| describe(&s)).unwrap_or_else(|e| e.to_string()),
        }),
        () = cancelled => {
            stop(&mut child, program).await;
            Ok(())
        }
    }
}

fn spawn(path: &Path, program: &'static str, args: &[String]) -> Result<Child, ComponentError> {
    let parent_pid = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(path);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid, kill).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent_pid {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| ComponentError::Spawn {
        program,
        path: path.display().to_string(),
        source,
    })?;
    for pipe in [
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
    ]
    .into_iter()
    .flatten()
    {
        tokio::spawn(forward_logs(pipe, program).in_current_span());
    }
    Ok(child)
}

/// klog's level of a line: its first letter (I, W, E, F).
pub fn klog_level(line: &str) -> tracing::Level {
    match line.as_bytes().first() {
        Some(b'W') => tracing::Level::WARN,
        Some(b'E') | Some(b'F') => tracing::Level::ERROR,
        _ => tracing::Level::INFO,
    }
}

async fn forward_logs(pipe: impl tokio::io::AsyncRead + Unpin, program: &'static str) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match klog_level(&line) {
            tracing::Level::WARN => tracing::warn!(program, "{line}"),
            tracing::Level::ERROR => tracing::error!(program, "{line}"),
            _ => tracing::info!(program, "{line}"),
        }
    }
}

async fn stop(child: &mut Child, program: &str) {
    let Some(pid) = child.id() else {
        return;
    };
    // SAFETY: plain syscall on a pid we own and have not reaped yet.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
    match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
        Ok(Ok(status)) => tracing::info!(program, status = describe(&status), "stopped"),
        Ok(Err(e)) => tracing::warn!(program, "waiting for it to stop: {e}"),
        Err(_) => {
            tracing::warn!(program, "did not stop within {STOP_TIMEOUT:?}; killing it");
            let _ = child.kill().await;
        }
    }
}

fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_levels_are_read_from_the_first_letter() {
        assert_eq!(
            klog_level("I1205 18:00:00.1 1 x.go:1] ok"),
            tracing::Level::INFO
        );
        assert_eq!(klog_level("W1205 ..."), tracing::Level::WARN);
        assert_eq!(klog_level("E1205 ..."), tracing::Level::ERROR);
        assert_eq!(klog_level("F1205 ..."), tracing::Level::ERROR);
        assert_eq!(klog_level(""), tracing::Level::INFO);
    }

    #[test]
    fn a_missing_program_names_its_path_and_the_script() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_binary(dir.path(), "kube-apiserver")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kube-apiserver") && e.contains("scripts/kubernetes-binaries"),
            "{e}"
        );
    }
}
