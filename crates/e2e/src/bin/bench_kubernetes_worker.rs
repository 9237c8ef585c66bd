//! `bench-kubernetes-worker [SAMPLES]`: a Kubernetes worker on Polis (real polis-node,
//! etcd, upstream's kubelet and kube-apiserver from POLIS_KUBERNETES_BINARIES,
//! containerd and runc from POLIS_RUNTIME_BINARIES, the pause image from
//! POLIS_KUBERNETES_IMAGES; `scripts/bench kubernetes-worker` builds or finds them).
//! One controller (the bootstrap node) and one worker, on loopback addresses.
//!
//! Per sample:
//! - `ready`: KubernetesWorker added → the Node named after the worker is Ready (goal
//!   ≤ 15 s with the images imported at containerd's start);
//! - `running`: a pod of the local pause image (hostNetwork, `imagePullPolicy: Never`)
//!   applied → Running (goal ≤ 2 s);
//! - then the pod is deleted and the role removed (Node gone, programs stopped) before
//!   the next sample.
//!
//! Last, with the role on and the node idle for 10 s: the resident memory of the
//! worker's polis-node, kubelet and containerd (VmRSS). Prints one line per sample and,
//! last, `{"bench":"kubernetes-worker","ready_ms","running_ms","rss_kib":{…},…}`
//! (medians).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, TIMEOUT, median, wait_until};

fn folder(var: &str, program: &str) -> Result<PathBuf> {
    e2e::program_folder(var, program, "scripts/bench kubernetes-worker")
}

fn ms_since(t: Instant) -> f64 {
    (t.elapsed().as_secs_f64() * 10_000.0).round() / 10.0
}

/// The resident memory (KiB) of the process whose command line starts with a path
/// ending in `program` and mentions `needle`.
fn rss_kib(program: &str, needle: &str) -> Option<u64> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline);
        let mut args = text.split('\0');
        let first = args.next().unwrap_or_default();
        if first.rsplit('/').next() == Some(program) && text.contains(needle) {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            return status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok());
        }
    }
    None
}

fn main() -> Result<()> {
    let samples: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()
        .context("SAMPLES must be a number")?
        .unwrap_or(5);
    let binaries = folder("POLIS_KUBERNETES_BINARIES", "kubelet")?;
    let runtime = folder("POLIS_RUNTIME_BINARIES", "containerd")?;
    let images = folder("POLIS_KUBERNETES_IMAGES", "pause.tar")?;
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let id0 = cluster.first.key_node_id()?;
    cluster.ctl_retry(&["node", "add-role", &id0, "KubernetesController"])?;
    let params = cluster.register_params("w")?;
    let (mut worker, worker_id) = cluster.add_worker_with(
        "w",
        &params,
        &[
            "--runtime-binaries",
            runtime.to_str().context("utf-8")?,
            "--kubernetes-images",
            images.to_str().context("utf-8")?,
        ],
    )?;
    let owner = dir.path().join("owner.kubeconfig");
    e2e::kubernetes_credentials(&cluster, &owner, None)?;
    let kubectl = |args: &[&str]| e2e::kubectl(&binaries, &owner, args);
    wait_until("the apiserver is ready", TIMEOUT, || {
        kubectl(&["get", "--raw", "/readyz"]).is_ok_and(|(ok, ..)| ok)
    })?;
    let node_ready = || {
        kubectl(&[
            "get",
            "node",
            &worker_id,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])
        .is_ok_and(|(ok, out, _)| ok && out.trim() == "True")
    };
    let manifest = dir.path().join("pod.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: bench, namespace: default}}\nspec:\n  \
             hostNetwork: true\n  nodeName: {worker_id}\n  terminationGracePeriodSeconds: 1\n  \
             containers:\n  - name: pause\n    image: registry.k8s.io/pause:3.10.2\n    \
             imagePullPolicy: Never\n"
        ),
    )?;
    let manifest = manifest.to_str().context("utf-8")?.to_string();

    let (mut ready_ms, mut running_ms): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let asked = Instant::now();
        cluster.ctl_retry(&["node", "add-role", &worker_id, "KubernetesWorker"])?;
        wait_until("the worker's Node is Ready", TIMEOUT, node_ready)?;
        let ready = ms_since(asked);
        // The namespace's service account may not exist yet on the first sample.
        wait_until("the pod is accepted", TIMEOUT, || {
            kubectl(&["apply", "-f", &manifest]).is_ok_and(|(ok, ..)| ok)
        })?;
        let applied = Instant::now();
        wait_until("the pod runs", TIMEOUT, || {
            kubectl(&["get", "pod", "bench", "-o", "jsonpath={.status.phase}"])
                .is_ok_and(|(ok, out, _)| ok && out.trim() == "Running")
        })?;
        let running = ms_since(applied);
        println!(
            "sample {i}: role added → Node Ready {ready:.0} ms; pod applied → Running {running:.0} ms"
        );
        ready_ms.push(ready);
        running_ms.push(running);
        let (ok, _, err) = kubectl(&["delete", "pod", "bench", "--wait=true", "--timeout=60s"])?;
        ensure!(ok, "deleting the pod: {err}");
        if i + 1 < samples {
            cluster.ctl_retry(&["node", "remove-role", &worker_id, "KubernetesWorker"])?;
            wait_until("the Node is deleted", TIMEOUT, || {
                kubectl(&["get", "node", &worker_id])
                    .is_ok_and(|(ok, _, err)| !ok && err.contains("NotFound"))
            })?;
            let folder = worker.root.join("data/kubernetes-worker");
            wait_until("the worker's folder is removed", TIMEOUT, || {
                !folder.exists()
            })?;
        }
    }

    // Idle: the role on, nothing scheduled, 10 s.
    std::thread::sleep(Duration::from_secs(10));
    let worker_folder = worker.root.join("data/kubernetes-worker");
    let needle = worker_folder.display().to_string();
    let node_rss = rss_of_pid(worker.proc().pid());
    let kubelet_rss = rss_kib("kubelet", &needle);
    let containerd_rss = rss_kib("containerd", &needle);
    let report = serde_json::json!({
        "bench": "kubernetes-worker",
        "samples": samples,
        "ready_ms": median(ready_ms.clone()),
        "ready_ms_max": ready_ms.iter().copied().fold(0.0, f64::max),
        "running_ms": median(running_ms.clone()),
        "running_ms_max": running_ms.iter().copied().fold(0.0, f64::max),
        "rss_kib": {
            "polis_node": node_rss,
            "kubelet": kubelet_rss,
            "containerd": containerd_rss,
        },
    });
    // The worker's containers outlive polis-node: stop them with the role.
    cluster.ctl_retry(&["node", "remove-role", &worker_id, "KubernetesWorker"])?;
    wait_until("the worker's folder is removed", TIMEOUT, || {
        !Path::new(&worker_folder).exists()
    })?;
    println!("{report}");
    Ok(())
}

fn rss_of_pid(pid: i32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}
