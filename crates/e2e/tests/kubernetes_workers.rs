//! Kubernetes on Polis, part 2, first stage: the KubernetesWorker role runs containerd
//! (built by `scripts/runtime-binaries`) and upstream's kubelet on a Polis node, with a
//! kubelet identity the curator issues (system:node:<id>) and the project's own pause
//! image (`scripts/kubernetes-images`); `scripts/test` passes the three folders in
//! POLIS_KUBERNETES_BINARIES, POLIS_RUNTIME_BINARIES and POLIS_KUBERNETES_IMAGES.
//! One controller (bootstrap node) and one worker, on loopback addresses:
//! - the role is added live: the Node named after the Polis node ID becomes Ready,
//!   running containerd 2.3.7, and `node describe` names kubelet and containerd running;
//! - a pod (hostNetwork, the sandbox image, `imagePullPolicy: Never`) runs on it;
//! - kill -9 of polis-node on the worker: kubelet and containerd die with it, the pod's
//!   processes do not; restarted, the Node is Ready again with the same container;
//! - a Polis label shows on the Node as polis.dev/KEY and goes with it; `node
//!   describe` shows the Node Ready;
//! - the kubelet holds a token, not a client certificate: it reads its Node; a made-up
//!   token is refused;
//! - the role is removed live: the token is refused, the Node deleted, kubelet and
//!   containerd stop, the worker's folder is removed;
//! - the role comes back, a pod runs, polis-node stops and the role is removed while it
//!   is down: the next start kills the pod's processes and removes the worker's folder;
//! - the role comes back (Ready again, the old token stays refused), then the worker is
//!   decommissioned: its newest token is refused within 60 s and its Node deleted.
//!
//! Not yet (issue 37's later stages): a pod network across workers, Services, logs and
//! exec (the kubelet refuses a loopback node IP: workers need addresses of their own,
//! network namespaces in the test).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::{Cluster, TIMEOUT, wait_until};

/// Kills what a worker leaves when the test ends early: its containers (through runc,
/// by the worker's runc root) and every process of the test's folder (containerd's
/// shims among them).
struct Leftovers {
    dir: PathBuf,
    runc: PathBuf,
    runc_root: PathBuf,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let runc = |args: &[&str]| {
            Command::new(&self.runc)
                .arg("--root")
                .arg(&self.runc_root)
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        if self.runc_root.exists() {
            for id in runc(&["list", "-q"]).lines().filter(|l| !l.is_empty()) {
                runc(&["kill", "-a", id, "KILL"]);
                runc(&["delete", "-f", id]);
            }
        }
        let needle = self.dir.display().to_string();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if pid != std::process::id() as i32
                && String::from_utf8_lossy(&cmdline).contains(&needle)
            {
                // SAFETY: kill(2) on a process of this test's folder.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// The processes of the worker's containers (every runc root under `runc_root`, one
/// per containerd namespace).
fn container_pids(runc: &Path, runc_root: &Path) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(runc_root)? {
        let root = entry?.path();
        let out = Command::new(runc)
            .arg("--root")
            .arg(&root)
            .args(["list", "-f", "json"])
            .output()?;
        let listed: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        for container in listed.as_array().into_iter().flatten() {
            if container["status"] == "running"
                && let Some(pid) = container["pid"].as_i64()
            {
                pids.push(i32::try_from(pid)?);
            }
        }
    }
    Ok(pids)
}

/// The command lines of the processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

/// The worker's last log lines of its Kubernetes programs and its errors.
fn worker_log(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("kubeworker") || l.contains("ERROR"))
        .filter(|l| !l.contains("skip loading plugin"))
        .collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Whether `node describe` names a kubelet running since `since_unix_ms` or later.
fn kubelet_started_since(cluster: &Cluster, id: &str, since_unix_ms: u64) -> bool {
    cluster
        .ctl(&["node", "describe", id, "-o", "json"])
        .is_ok_and(|(ok, out, _)| {
            ok && serde_json::from_str::<serde_json::Value>(&out).is_ok_and(|v| {
                v["status"]["programs"].as_array().is_some_and(|p| {
                    p.iter().any(|p| {
                        p["name"] == "kubelet"
                            && p["running"] == true
                            && p["since_unix_ms"]
                                .as_u64()
                                .is_some_and(|s| s >= since_unix_ms)
                    })
                })
            })
        })
}

/// A field of `node describe -o json`'s status, when it is a string.
fn describe_field(cluster: &Cluster, id: &str, field: &str) -> Option<String> {
    let (ok, out, _) = cluster.ctl(&["node", "describe", id, "-o", "json"]).ok()?;
    let value: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
    value["status"][field].as_str().map(str::to_string)
}

fn program_running(cluster: &Cluster, id: &str, name: &str) -> bool {
    cluster
        .ctl(&["node", "describe", id, "-o", "json"])
        .is_ok_and(|(ok, out, _)| {
            ok && serde_json::from_str::<serde_json::Value>(&out).is_ok_and(|v| {
                v["status"]["programs"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["name"] == name && p["running"] == true))
            })
        })
}

#[test]
fn a_worker_runs_the_kubelet_and_a_pod() -> Result<()> {
    let binaries = e2e::program_folder(
        "POLIS_KUBERNETES_BINARIES",
        "kubelet",
        "scripts/kubernetes-binaries",
    )?;
    let runtime = e2e::program_folder(
        "POLIS_RUNTIME_BINARIES",
        "containerd",
        "scripts/runtime-binaries",
    )?;
    let images = e2e::program_folder(
        "POLIS_KUBERNETES_IMAGES",
        "pause.tar",
        "scripts/kubernetes-images",
    )?;
    let dir = tempfile::tempdir()?;
    let runc_root = dir
        .path()
        .join("w/root/data/kubernetes-worker/containerd/runc");
    let _leftovers = Leftovers {
        dir: dir.path().to_path_buf(),
        runc: runtime.join("runc"),
        runc_root: runc_root.clone(),
    };
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
    wait_until("the controller's apiserver is ready", TIMEOUT, || {
        e2e::kubectl(&binaries, &owner, &["get", "--raw", "/readyz"]).is_ok_and(|(ok, ..)| ok)
    })?;

    // A field of the worker's Node (a kubectl JSONPath), trimmed.
    let node_field = |path: &str| -> Result<String> {
        let (ok, out, err) = e2e::kubectl(
            &binaries,
            &owner,
            &["get", "node", &worker_id, "-o", &format!("jsonpath={path}")],
        )?;
        ensure!(ok, "kubectl get node: {err}");
        Ok(out.trim().to_string())
    };

    // The role, live: the Node named after the Polis node becomes Ready.
    let asked = Instant::now();
    cluster.ctl_retry(&["node", "add-role", &worker_id, "KubernetesWorker"])?;
    let ready = wait_until("the worker's Node is Ready", TIMEOUT, || {
        node_field("{.status.conditions[?(@.type==\"Ready\")].status}")
            .is_ok_and(|status| status == "True")
    });
    if let Err(e) = ready {
        let log = worker.proc().output();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("kubelet") || l.contains("containerd") || l.contains("ERROR"))
            .collect();
        bail!(
            "{e}: {}",
            lines[lines.len().saturating_sub(40)..].join("\n")
        );
    }
    println!("role added -> Node Ready: {:?}", asked.elapsed());
    let runtime_version = node_field("{.status.nodeInfo.containerRuntimeVersion}")?;
    ensure!(
        runtime_version.trim() == "containerd://2.3.7",
        "{runtime_version}"
    );
    for program in ["kubelet", "containerd"] {
        wait_until(
            &format!("node describe names {program} running"),
            TIMEOUT,
            || program_running(&cluster, &worker_id, program),
        )?;
    }

    // A pod of the node's own image runs on it.
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: sleeper, namespace: default}}\nspec:\n  \
         hostNetwork: true\n  nodeName: {worker_id}\n  terminationGracePeriodSeconds: 1\n  \
         containers:\n  - name: sleeper\n    image: registry.k8s.io/pause:3.10.2\n    \
         imagePullPolicy: Never\n"
    );
    let manifest = dir.path().join("pod.yaml");
    std::fs::write(&manifest, pod)?;
    // Refused until the controller-manager made the namespace's default service account.
    let path = manifest.to_str().context("utf-8")?;
    wait_until("the pod is accepted", TIMEOUT, || {
        e2e::kubectl(&binaries, &owner, &["apply", "-f", path]).is_ok_and(|(ok, ..)| ok)
    })?;
    let started = Instant::now();
    wait_until("the pod runs", TIMEOUT, || {
        e2e::kubectl(
            &binaries,
            &owner,
            &["get", "pod", "sleeper", "-o", "jsonpath={.status.phase}"],
        )
        .is_ok_and(|(ok, out, _)| ok && out.trim() == "Running")
    })?;
    println!("pod created -> Running: {:?}", started.elapsed());

    // kill -9 of polis-node on the worker: the kubelet and containerd die with it (their
    // parent-death signal), the pod's processes do not; started again, the node takes
    // the same containers back and its Node is Ready again.
    let pod_field = |path: &str| -> Result<String> {
        let (ok, out, err) = e2e::kubectl(
            &binaries,
            &owner,
            &["get", "pod", "sleeper", "-o", &format!("jsonpath={path}")],
        )?;
        ensure!(ok, "kubectl get pod: {err}");
        Ok(out.trim().to_string())
    };
    let container = pod_field("{.status.containerStatuses[0].containerID}")?;
    let pids = container_pids(&runtime.join("runc"), &runc_root)?;
    ensure!(!pids.is_empty(), "no container of the worker is running");
    worker.proc().signal(libc::SIGKILL);
    worker.proc().wait_exit(TIMEOUT)?;
    let worker_folder = worker
        .root
        .join("data/kubernetes-worker")
        .display()
        .to_string();
    wait_until(
        "kubelet and containerd die with polis-node",
        TIMEOUT,
        || {
            processes_mentioning(&worker_folder).iter().all(|cmdline| {
                !cmdline.contains("kubelet.yaml") && !cmdline.contains("containerd.toml")
            })
        },
    )?;
    for pid in &pids {
        ensure!(
            e2e::process_alive(*pid),
            "container process {pid} died with polis-node"
        );
    }
    let restarted = Instant::now();
    let restarted_unix_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;
    worker.start(&[
        "--runtime-binaries",
        runtime.to_str().context("utf-8")?,
        "--kubernetes-images",
        images.to_str().context("utf-8")?,
    ])?;
    worker.wait_home()?;
    // A kubelet started after the restart (the node's new status says so), and the
    // Node Ready with the pod running.
    let back = wait_until("a new kubelet runs and the Node is Ready", TIMEOUT, || {
        kubelet_started_since(&cluster, &worker_id, restarted_unix_ms)
            && node_field("{.status.conditions[?(@.type==\"Ready\")].status}")
                .is_ok_and(|status| status == "True")
            && pod_field("{.status.phase}").is_ok_and(|phase| phase == "Running")
    });
    if let Err(e) = back {
        bail!("{e}: {}", worker_log(&worker.proc().output()));
    }
    println!(
        "polis-node killed and restarted -> Node Ready: {:?}",
        restarted.elapsed()
    );
    ensure!(
        pod_field("{.status.containerStatuses[0].containerID}")? == container,
        "the pod's container was replaced"
    );
    ensure!(
        pod_field("{.status.containerStatuses[0].restartCount}")? == "0",
        "the pod's container restarted"
    );
    for pid in &pids {
        ensure!(e2e::process_alive(*pid), "container process {pid} ended");
    }
    let (ok, _, err) = e2e::kubectl(
        &binaries,
        &owner,
        &["delete", "pod", "sleeper", "--wait=true", "--timeout=60s"],
    )?;
    if !ok {
        bail!(
            "kubectl delete: {err}: {}",
            worker_log(&worker.proc().output())
        );
    }

    // Polis labels carried to the Node (polis.dev/), and the Node's readiness in
    // node describe.
    cluster.ctl_retry(&["node", "label", &worker_id, "zone=a"])?;
    wait_until("the Node carries the Polis label", TIMEOUT, || {
        node_field("{.metadata.labels.polis\\.dev/zone}").is_ok_and(|v| v == "a")
    })?;
    cluster.ctl_retry(&["node", "label", &worker_id, "zone-"])?;
    wait_until("the Polis label is gone from the Node", TIMEOUT, || {
        node_field("{.metadata.labels}").is_ok_and(|v| !v.contains("polis.dev/zone"))
    })?;
    wait_until("node describe shows the Node Ready", TIMEOUT, || {
        describe_field(&cluster, &worker_id, "kubernetes_node").is_some_and(|v| v == "Ready")
    })?;

    // The kubelet's credential is a token, refused once the role goes.
    let worker_dir = worker.root.join("data/kubernetes-worker");
    let ca = dir.path().join("kubernetes-ca.pem");
    std::fs::copy(worker_dir.join("ca.pem"), &ca)?;
    ensure!(
        !worker_dir.join("kubelet-client.key").exists(),
        "a kubelet holds no client certificate"
    );
    let token = std::fs::read_to_string(worker_dir.join("kubelet.token"))?;
    let apiserver = format!("https://{}:6443", cluster.first.address);
    let as_kubelet = |token: &str| -> Result<(bool, String)> {
        let (ok, _, err) = e2e::kubectl(
            &binaries,
            Path::new("/dev/null"),
            &[
                &format!("--server={apiserver}"),
                &format!("--certificate-authority={}", ca.display()),
                &format!("--token={}", token.trim()),
                "get",
                "node",
                &worker_id,
            ],
        )?;
        Ok((ok, err))
    };
    let (ok, err) = as_kubelet(&token)?;
    ensure!(ok, "the kubelet's token reads its own Node: {err}");
    let (ok, _) = as_kubelet(&format!("{worker_id}.{}", "00".repeat(32)))?;
    ensure!(!ok, "a made-up token is refused");

    // The role taken away: the Node is drained and deleted, the kubelet, its pods and
    // containerd stop, the worker's folder goes, its token is refused.
    let removed = Instant::now();
    cluster.ctl_retry(&["node", "remove-role", &worker_id, "KubernetesWorker"])?;
    wait_until("the worker's token is refused", TIMEOUT, || {
        as_kubelet(&token).is_ok_and(|(ok, err)| !ok && err.contains("Unauthorized"))
    })?;
    println!(
        "role removed -> kubelet token refused: {:?}",
        removed.elapsed()
    );
    wait_until("the Node is deleted", TIMEOUT, || {
        e2e::kubectl(&binaries, &owner, &["get", "node", &worker_id])
            .is_ok_and(|(ok, _, err)| !ok && err.contains("NotFound"))
    })?;
    wait_until("kubelet and containerd stop", TIMEOUT, || {
        !program_running(&cluster, &worker_id, "kubelet")
            && !program_running(&cluster, &worker_id, "containerd")
    })?;
    wait_until("the worker's folder is removed", TIMEOUT, || {
        !worker_dir.exists()
    })?;

    // The role taken away while polis-node is down: its pod outlives the stop; the
    // next start removes what the worker left (containers, processes, folder).
    let worker_args = [
        "--runtime-binaries",
        runtime.to_str().context("utf-8")?,
        "--kubernetes-images",
        images.to_str().context("utf-8")?,
    ];
    cluster.ctl_retry(&["node", "add-role", &worker_id, "KubernetesWorker"])?;
    wait_until("the pod runs on the worker again", TIMEOUT, || {
        e2e::kubectl(&binaries, &owner, &["apply", "-f", path]).is_ok_and(|(ok, ..)| ok)
            && pod_field("{.status.phase}").is_ok_and(|phase| phase == "Running")
    })?;
    worker.stop_cleanly()?;
    let pids = container_pids(&runtime.join("runc"), &runc_root)?;
    ensure!(
        !pids.is_empty(),
        "the pod's processes outlive a stopped polis-node"
    );
    cluster.ctl_retry(&["node", "remove-role", &worker_id, "KubernetesWorker"])?;
    worker.start(&worker_args)?;
    worker.wait_home()?;
    let cleaned = wait_until("the start removes what the worker left", TIMEOUT, || {
        !worker_dir.exists() && pids.iter().all(|pid| !e2e::process_alive(*pid))
    });
    if let Err(e) = cleaned {
        bail!("{e}: {}", worker_log(&worker.proc().output()));
    }
    e2e::kubectl(
        &binaries,
        &owner,
        &["delete", "pod", "sleeper", "--force", "--grace-period=0"],
    )?;

    // Back as a worker, then decommissioned: its newest token is refused within the
    // stated bound (the apiserver's webhook cache, 10 s, and a quorum read).
    cluster.ctl_retry(&["node", "add-role", &worker_id, "KubernetesWorker"])?;
    wait_until("the worker's Node is Ready again", TIMEOUT, || {
        node_field("{.status.conditions[?(@.type==\"Ready\")].status}")
            .is_ok_and(|status| status == "True")
    })?;
    let (ok, _) = as_kubelet(&token)?;
    ensure!(!ok, "the token of the worker's first term stays refused");
    let newest = std::fs::read_to_string(worker_dir.join("kubelet.token"))?;
    let (ok, err) = as_kubelet(&newest)?;
    ensure!(ok, "the newest token is the kubelet's: {err}");
    let decommissioned = Instant::now();
    cluster.ctl_retry(&["node", "decommission", &worker_id])?;
    wait_until(
        "the decommissioned worker's token is refused",
        TIMEOUT,
        || as_kubelet(&newest).is_ok_and(|(ok, err)| !ok && err.contains("Unauthorized")),
    )?;
    let refused_after = decommissioned.elapsed();
    println!("decommissioned -> kubelet token refused: {refused_after:?}");
    ensure!(
        refused_after < Duration::from_secs(60),
        "refused only after {refused_after:?} (bound: 60 s)"
    );
    wait_until(
        "the decommissioned worker's Node is deleted",
        TIMEOUT,
        || {
            e2e::kubectl(&binaries, &owner, &["get", "node", &worker_id])
                .is_ok_and(|(ok, _, err)| !ok && err.contains("NotFound"))
        },
    )?;
    Ok(())
}
