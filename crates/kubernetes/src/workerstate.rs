//! A worker's Node as the apiserver sees it (for the node's status), and the worker's
//! end when its role goes: pods stopped, folder removed.
//!
//! ```text
//!   nodestate  every 10 s: kubectl (the kubelet's own token) get node ID ─▶ board:
//!              "Ready" | "NotReady: REASON" | "not registered" | "unknown: ERROR"
//!   leaving    kubelet stopped ─▶ every task SIGTERM ─▶ ≤ 30 s ─▶ SIGKILL, tasks and
//!              containers deleted (containerd still up) ─▶ containerd stopped ─▶
//!              mounts under the folder detached ─▶ folder removed
//!   leftovers  (a start finds a worker's folder but no role) containers killed through
//!              runc, processes naming the folder killed, folder removed
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::board::ComponentBoard;
use crate::workerconfig::WorkerLayout;

/// How often the Node's state is read.
const REPORT_EVERY: Duration = Duration::from_secs(10);
/// How long pods get between SIGTERM and SIGKILL when the role goes.
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// The Node's state for the status, from `kubectl get node -o json` (pure).
pub fn node_state(json: &str) -> String {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
        return "unknown: kubectl's answer is not JSON".into();
    };
    let ready = value["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    match ready {
        None => "NotReady: no Ready condition yet".into(),
        Some(c) if c["status"] == "True" => "Ready".into(),
        Some(c) => format!(
            "NotReady: {}",
            c["reason"]
                .as_str()
                .filter(|r| !r.is_empty())
                .unwrap_or("no reason given")
        ),
    }
}

/// The `nodestate` runnable: the worker's Node state on the board, every 10 s.
pub async fn report(
    ctx: supervisor::Context,
    binaries: PathBuf,
    layout: WorkerLayout,
    board: ComponentBoard,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let kubeconfig = layout.path("kubelet.kubeconfig");
    let args = ["get", "node", layout.node_id.as_str(), "-o", "json"];
    loop {
        let asked = crate::kubectl::kubectl_as(&binaries, &kubeconfig, &args, None);
        let answer = tokio::select! {
            answer = asked => answer,
            () = ctx.cancelled() => return Ok(()),
        };
        let state = match answer {
            Ok(json) => node_state(&json),
            Err(e) if e.contains("NotFound") || e.contains("not found") => {
                "not registered".to_string()
            }
            Err(e) => format!("unknown: {}", e.lines().last().unwrap_or_default()),
        };
        board.set_kubernetes_node(&state);
        tokio::select! {
            _ = tokio::time::sleep(REPORT_EVERY) => {}
            () = ctx.cancelled() => return Ok(()),
        }
    }
}

/// `ctr` against this worker's containerd, in the Kubernetes namespace.
async fn ctr(runtime: &Path, layout: &WorkerLayout, args: &[&str]) -> Result<String, String> {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(runtime.join("ctr"))
            .arg(format!(
                "--address={}",
                layout.containerd_socket().display()
            ))
            .args(["-n", "k8s.io"])
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("ctr {} took over 20 s", args.join(" ")))?
    .map_err(|e| format!("running ctr: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ctr {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The running tasks of `ctr tasks ls` (pure): their container IDs.
pub fn running_tasks(listing: &str) -> Vec<String> {
    listing
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?;
            (fields.nth(1)? == "RUNNING").then(|| id.to_string())
        })
        .collect()
}

/// Stops every pod of the worker through containerd (which must be running): SIGTERM,
/// up to [`STOP_GRACE`], SIGKILL; then deletes every task and container. Failures are
/// logged: the folder's removal follows anyway.
pub async fn stop_pods(runtime: &Path, layout: &WorkerLayout) {
    let tasks = |args: &'static [&'static str]| ctr(runtime, layout, args);
    let running = match tasks(&["tasks", "ls"]).await {
        Ok(listing) => running_tasks(&listing),
        Err(e) => {
            tracing::warn!("listing the worker's containers: {e}");
            return;
        }
    };
    tracing::info!(containers = running.len(), "stopping the worker's pods");
    for id in &running {
        if let Err(e) = ctr(runtime, layout, &["tasks", "kill", "-s", "SIGTERM", id]).await {
            tracing::debug!("{e}");
        }
    }
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    while tokio::time::Instant::now() < deadline {
        match tasks(&["tasks", "ls"]).await {
            Ok(listing) if running_tasks(&listing).is_empty() => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(e) => {
                tracing::debug!("{e}");
                break;
            }
        }
    }
    let all_tasks: Vec<String> = tasks(&["tasks", "ls", "-q"])
        .await
        .map(|l| l.lines().map(str::to_string).collect())
        .unwrap_or_default();
    for id in &all_tasks {
        if let Err(e) = ctr(runtime, layout, &["tasks", "delete", "-f", id]).await {
            tracing::warn!("{e}");
        }
    }
    let containers: Vec<String> = tasks(&["containers", "ls", "-q"])
        .await
        .map(|l| l.lines().map(str::to_string).collect())
        .unwrap_or_default();
    for id in &containers {
        if let Err(e) = ctr(runtime, layout, &["containers", "delete", id]).await {
            tracing::warn!("{e}");
        }
    }
}

/// The mount points of `mountinfo` under `dir` (pure), deepest first; octal escapes
/// (`\040` for a space) decoded.
pub fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if bytes[i] == b'\\'
            && let Some(digits) = octal
        {
            out.push(
                digits
                    .iter()
                    .fold(0u8, |n, d| n.wrapping_mul(8).wrapping_add(d - b'0')),
            );
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a worker left when its role went while polis-node was not running (or a
/// removal was cut short): its containers killed through runc (every runc root under
/// the folder), every process that names the folder (shims, a stray kubelet or
/// containerd) killed, then the folder removed (`remove_folder`). No containerd is
/// started for it: nothing of the worker is kept.
pub fn clean_up_leftovers(runc: &Path, dir: &Path) {
    tracing::info!(dir = %dir.display(), "this node is no worker: removing what a worker left");
    let roots = std::fs::read_dir(dir.join("containerd/runc"))
        .map(|entries| entries.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    let run = |root: &Path, args: &[&str]| {
        std::process::Command::new(runc)
            .arg("--root")
            .arg(root)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    for root in roots {
        let listed = match run(&root, &["list", "-q"]) {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!("running {}: {e}", runc.display());
                break;
            }
        };
        for id in listed.lines().filter(|l| !l.is_empty()) {
            let _ = run(&root, &["kill", "-a", id, "KILL"]);
            let _ = run(&root, &["delete", "-f", id]);
        }
    }
    let needle = dir.display().to_string();
    for pid in processes_naming(&needle) {
        // SAFETY: kill(2) of a process whose command line names the worker's folder.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    remove_folder(dir);
}

/// The processes (other than this one) whose command line contains `needle`.
fn processes_naming(needle: &str) -> Vec<i32> {
    let own = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            (pid != own && String::from_utf8_lossy(&cmdline).contains(needle)).then_some(pid)
        })
        .collect()
}

/// Detaches every mount under `dir` (the kubelet's volumes, containers' root file
/// systems) and removes it.
pub fn remove_folder(dir: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for mount in mounts_under(&mountinfo, dir) {
        let Ok(path) = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: umount2(2) with a NUL-terminated path; MNT_DETACH never blocks.
        if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
            tracing::warn!(
                mount = %mount.display(),
                "detaching a worker mount: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => tracing::info!(dir = %dir.display(), "the worker's folder removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), "removing the worker's folder: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_ready_condition_is_its_state() {
        let ready = r#"{"status":{"conditions":[{"type":"MemoryPressure","status":"False"},{"type":"Ready","status":"True","reason":"KubeletReady"}]}}"#;
        assert_eq!(node_state(ready), "Ready");
        let not = r#"{"status":{"conditions":[{"type":"Ready","status":"Unknown","reason":"NodeStatusUnknown"}]}}"#;
        assert_eq!(node_state(not), "NotReady: NodeStatusUnknown");
        assert_eq!(
            node_state(r#"{"status":{}}"#),
            "NotReady: no Ready condition yet"
        );
        assert!(node_state("<html>").starts_with("unknown"));
    }

    #[test]
    fn running_tasks_are_read_from_ctr() {
        let listing = "TASK    PID     STATUS\nabc     101     RUNNING\ndef     0       STOPPED\n";
        assert_eq!(running_tasks(listing), vec!["abc".to_string()]);
        assert!(running_tasks("TASK PID STATUS\n").is_empty());
    }

    #[test]
    fn mounts_under_the_folder_come_deepest_first() {
        let info = "22 1 0:21 / /proc rw - proc proc rw\n\
                    40 30 0:50 / /r/w/kubelet/pods/x/volumes/a rw - tmpfs tmpfs rw\n\
                    41 30 0:51 / /r/w/containerd/state/sandbox\\040one/shm rw - tmpfs shm rw\n\
                    42 30 0:52 / /r/w/kubelet rw - tmpfs t rw\n\
                    43 30 0:53 / /r/worker2 rw - tmpfs t rw\n";
        assert_eq!(
            mounts_under(info, Path::new("/r/w")),
            vec![
                PathBuf::from("/r/w/kubelet/pods/x/volumes/a"),
                PathBuf::from("/r/w/containerd/state/sandbox one/shm"),
                PathBuf::from("/r/w/kubelet"),
            ]
        );
    }
}
