//! `bench-kubernetes [SAMPLES] [SECONDS]`: Kubernetes controllers on Polis (real
//! polis-node, etcd and upstream's binaries from POLIS_KUBERNETES_BINARIES, which
//! `scripts/bench kubernetes` builds or finds). One cluster of three consensus members.
//!
//! - `ready`: per sample, KubernetesController added to a member that does not hold it
//!   (its apiserver down) → `kubectl --server https://ADDR:6443 get --raw /readyz` is ok
//!   (goal ≤ 10 s).
//! - `failover`: the role on all three, kubectl through `polisctl kubernetes proxy`;
//!   per sample kill -9 the node whose apiserver the proxy uses → kubectl through the
//!   proxy answers again (goal ≤ 5 s). The node is started again before the next one.
//! - `writes`: curator label writes/s (8 clients, SECONDS each round) alternately with
//!   Kubernetes idle on every member and with no member holding the role, SAMPLES
//!   rounds each (goal: within 10 %).
//!
//! Prints one line per sample and, last, `{"bench":"kubernetes","ready_ms",
//! "failover_ms","writes_per_s_idle_kubernetes","writes_per_s_without","ratio",…}`
//! (medians).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::{Cluster, Node, TIMEOUT, endpoints, median, timed_calls, wait_until};

const ROLE: &str = "KubernetesController";
const WRITERS: usize = 8;
const MAX_CALLS: usize = 1_000_000;

fn binaries() -> Result<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("POLIS_KUBERNETES_BINARIES").context(
        "POLIS_KUBERNETES_BINARIES is not set: run scripts/bench kubernetes (it builds them)",
    )?);
    ensure!(
        dir.join("kube-apiserver").is_file() && dir.join("kubectl").is_file(),
        "{} holds no kube-apiserver and kubectl",
        dir.display()
    );
    Ok(dir)
}

/// Whether kubectl with `kubeconfig` (against `server` when given) gets `/readyz` ok.
fn ready(kubeconfig: &Path, server: Option<IpAddr>) -> bool {
    let mut cmd = Command::new(binaries().expect("checked at start").join("kubectl"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=2s");
    if let Some(address) = server {
        cmd.arg(format!(
            "--server=https://{}",
            SocketAddr::new(address, 6443)
        ));
    }
    cmd.args(["get", "--raw", "/readyz"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ok")
}

fn apiserver_listens(address: IpAddr) -> bool {
    std::net::TcpStream::connect_timeout(
        &SocketAddr::new(address, 6443),
        Duration::from_millis(300),
    )
    .is_ok()
}

fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Label writes per second through `clients` for `duration`.
fn writes_per_second(
    runtime: &tokio::runtime::Runtime,
    clients: &[Arc<rpc::CuratorClient>],
    id: &str,
    duration: Duration,
) -> Result<f64> {
    let id = id.to_string();
    let calls = runtime.block_on(timed_calls(clients, duration, MAX_CALLS, move |c, w, i| {
        let id = id.clone();
        async move { e2e::write_label(&c, &id, &format!("bench-{w}"), &i.to_string()).await }
    }));
    if calls.failed > 0 {
        bail!(
            "{} of {} writes failed: {:?}",
            calls.failed,
            calls.total(),
            calls.first_error
        );
    }
    Ok(calls.ok as f64 / duration.as_secs_f64())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let samples: usize = args
        .first()
        .map_or(Ok(3), |a| a.parse())
        .context("SAMPLES")?;
    let seconds: u64 = args
        .get(1)
        .map_or(Ok(10), |a| a.parse())
        .context("SECONDS")?;
    ensure!(
        samples > 0 && seconds > 0,
        "SAMPLES and SECONDS must be positive"
    );
    binaries()?;
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("members")?;
    let (m1, id1) = cluster.add_worker("m1", &params)?;
    let (m2, id2) = cluster.add_worker("m2", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let placeholder = Node::new(&dir.path().join("unused"));
    let n0 = std::mem::replace(&mut cluster.first, placeholder);
    let id0 = n0.key_node_id()?;
    cluster.wait_members(&endpoints(&[&n0, &m1, &m2]), 3, 0)?;
    let mut members = [(n0, id0), (m1, id1), (m2, id2)];
    members.sort_by_key(|(n, _)| n.address);
    let addresses: Vec<IpAddr> = members.iter().map(|(n, _)| n.address).collect();
    let owner = dir.path().join("owner.kubeconfig");

    // Role added → apiserver ready, on the last member by address (the others keep the
    // API up meanwhile from the second sample on).
    let mut ready_ms = Vec::new();
    let (target, target_id) = (addresses[2], members[2].1.clone());
    for i in 0..samples {
        if i > 0 {
            cluster.ctl_retry(&["node", "remove-role", &target_id, ROLE])?;
            wait_until("the apiserver stops with the role", TIMEOUT, || {
                !apiserver_listens(target)
            })?;
        }
        let asked = Instant::now();
        cluster.ctl_retry(&["node", "add-role", &target_id, ROLE])?;
        if i == 0 {
            e2e::kubernetes_credentials(&cluster, &owner, None)?;
        }
        wait_until("the new apiserver is ready", TIMEOUT, || {
            ready(&owner, Some(target))
        })?;
        let ms = ms_since(asked);
        println!("ready {i}: role added → /readyz ok on {target} in {ms:.0} ms");
        ready_ms.push(ms);
    }

    // A controller lost → the API served again through the proxy.
    for (_, id) in &members[..2] {
        cluster.ctl_retry(&["node", "add-role", id, ROLE])?;
    }
    for address in &addresses {
        wait_until("every apiserver ready", TIMEOUT, || {
            ready(&owner, Some(*address))
        })?;
    }
    let (proxy, via) = e2e::kubernetes_proxy(&cluster, dir.path())?;
    wait_until("kubectl through the proxy", TIMEOUT, || ready(&via, None))?;
    let mut failover_ms = Vec::new();
    for i in 0..samples {
        // The proxy prefers the first apiserver by address.
        let victim = &mut members[0].0;
        victim.proc().signal(libc::SIGKILL);
        let killed = Instant::now();
        wait_until("kubectl works again after a kill -9", TIMEOUT, || {
            ready(&via, None)
        })?;
        let ms = ms_since(killed);
        println!(
            "failover {i}: kill -9 of {} → API served in {ms:.0} ms",
            victim.address
        );
        failover_ms.push(ms);
        victim.proc().wait_exit(TIMEOUT)?;
        victim.start(&[])?;
        let address = victim.address;
        wait_until(
            "the killed node's apiserver is ready again",
            TIMEOUT,
            || ready(&owner, Some(address)),
        )?;
    }
    drop(proxy);

    // Curator writes with Kubernetes idle on every member vs with none holding the role.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let clients: Vec<Arc<rpc::CuratorClient>> = (0..WRITERS)
        .map(|_| cluster.owner_client_to(&addresses).map(Arc::new))
        .collect::<Result<_>>()?;
    let labelled = members[1].1.clone();
    let duration = Duration::from_secs(seconds);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    writes_per_second(&runtime, &clients, &labelled, Duration::from_secs(1))?;
    for i in 0..samples {
        let idle = writes_per_second(&runtime, &clients, &labelled, duration)?;
        for (_, id) in &members {
            cluster.ctl_retry(&["node", "remove-role", id, ROLE])?;
        }
        for address in &addresses {
            wait_until("every apiserver stopped", TIMEOUT, || {
                !apiserver_listens(*address)
            })?;
        }
        let none = writes_per_second(&runtime, &clients, &labelled, duration)?;
        println!("writes {i}: {idle:.0}/s with Kubernetes idle, {none:.0}/s without");
        with.push(idle);
        without.push(none);
        if i + 1 < samples {
            for (_, id) in &members {
                cluster.ctl_retry(&["node", "add-role", id, ROLE])?;
            }
            for address in &addresses {
                wait_until("every apiserver ready", TIMEOUT, || {
                    ready(&owner, Some(*address))
                })?;
            }
        }
    }
    let (with, without) = (median(with), median(without));
    println!(
        "{}",
        serde_json::json!({
            "bench": "kubernetes",
            "ready_ms": round(median(ready_ms.clone())),
            "ready_max_ms": round(ready_ms.iter().copied().fold(0.0, f64::max)),
            "failover_ms": round(median(failover_ms.clone())),
            "failover_max_ms": round(failover_ms.iter().copied().fold(0.0, f64::max)),
            "writes_per_s_idle_kubernetes": round(with),
            "writes_per_s_without": round(without),
            "ratio": round(with / without * 100.0) / 100.0,
            "writers": WRITERS,
            "seconds": seconds,
            "samples": samples,
        })
    );
    Ok(())
}
