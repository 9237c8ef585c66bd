//! `polisctl cluster launch`: a local 3-node development cluster of real polis-node
//! processes, launched while both cores are kept busy (the status read right after it
//! returns shows three voters, all answering), stopped, launched again, destroyed.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use e2e::{TIMEOUT, polisctl, process_alive, wait_until};

/// Kills whatever the launched cluster left running when the test ends, also on failure.
struct Launched(PathBuf);

impl Launched {
    fn pids(&self) -> Vec<i32> {
        (1..=3)
            .filter_map(|k| {
                std::fs::read_to_string(self.0.join(format!("node{k}/pid")))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect()
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        for pid in self.pids() {
            if process_alive(pid) {
                // SAFETY: kill(2) on a polis-node this test launched.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// Three consecutive loopback addresses whose node ports are free.
fn three_free_addresses() -> Ipv4Addr {
    loop {
        let IpAddr::V4(base) = e2e::unique_loopback() else {
            unreachable!("unique_loopback is IPv4")
        };
        let [a, b, c, d] = base.octets();
        if d > 250 {
            continue;
        }
        let free = (0..3).all(|i| {
            let ip = Ipv4Addr::new(a, b, c, d + i);
            [7834u16, 7835]
                .iter()
                .all(|p| std::net::TcpListener::bind((ip, *p)).is_ok())
        });
        if free {
            return base;
        }
    }
}

fn ctl(args: &[&str]) -> Result<String> {
    let (status, out, err) = polisctl(args)?;
    anyhow::ensure!(status.success(), "polisctl {args:?}: {err}");
    Ok(out)
}

fn nodes(config: &Path) -> Result<Vec<serde_json::Value>> {
    let out = ctl(&[
        "--config",
        config.to_str().context("utf-8")?,
        "node",
        "list",
        "-o",
        "json",
    ])?;
    Ok(serde_json::from_str::<serde_json::Value>(&out)?
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Keeps every core busy until dropped (or for at most `LOAD_AT_MOST`): a build beside a
/// launch is how a member once was declared ready while it still saw itself a learner.
struct BusyCores {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

const LOAD_AT_MOST: std::time::Duration = std::time::Duration::from_secs(600);

impl BusyCores {
    fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let started = std::time::Instant::now();
                    let mut x: u64 = 1;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed)
                        && started.elapsed() < LOAD_AT_MOST
                    {
                        for _ in 0..100_000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6364136223846793005).wrapping_add(1),
                            );
                        }
                    }
                })
            })
            .collect();
        BusyCores { stop, threads }
    }
}

impl Drop for BusyCores {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[test]
fn launch_stop_relaunch_destroy() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("cluster");
    let guard = Launched(dir.clone());
    let first = three_free_addresses().to_string();
    let d = dir.to_str().context("utf-8")?;
    let node_binary = e2e::bin("polis-node");
    let busy = BusyCores::start();
    let out = ctl(&[
        "cluster",
        "launch",
        d,
        "--nodes",
        "3",
        "--first-address",
        &first,
        "--node-binary",
        node_binary.to_str().context("utf-8")?,
    ])?;
    // What scripts/local-cluster prints next, read at once and still under load: three
    // voters, every one answering through its own curator.
    let config = dir.join("config");
    let status = ctl(&[
        "--config",
        config.to_str().context("utf-8")?,
        "cluster",
        "status",
        "-o",
        "json",
    ])?;
    drop(busy);
    let status: serde_json::Value = serde_json::from_str(&status)?;
    assert_eq!(status["quorum"], true, "{status}");
    assert_eq!(status["unreachable"], serde_json::json!([]), "{status}");
    let members = status["members"].as_array().context("members")?;
    assert_eq!(members.len(), 3, "{status}");
    assert!(members.iter().all(|m| m["role"] == "voter"), "{status}");
    assert!(out.contains("ConsensusMember"), "{out}");
    let targets = out
        .lines()
        .find_map(|l| l.strip_prefix("Prometheus scrape targets (http, /metrics): "))
        .with_context(|| format!("no scrape targets printed:\n{out}"))?;
    assert_eq!(targets.matches(":7839'").count(), 3, "{targets}");
    for target in targets.split('\'').skip(1).step_by(2) {
        let (status, body) = e2e::http_get(target.parse()?, "/metrics")?;
        assert!(
            status == 200 && body.contains("polis_curator_leader"),
            "{target}: {status}"
        );
    }
    let listed = nodes(&config)?;
    assert_eq!(listed.len(), 3, "{listed:?}");
    for n in &listed {
        assert_eq!(n["state"], "UP", "{n}");
        assert_eq!(n["roles"], serde_json::json!(["ConsensusMember"]), "{n}");
    }
    let status = ctl(&[
        "--config",
        config.to_str().context("utf-8")?,
        "cluster",
        "status",
        "-o",
        "json",
    ])?;
    let status: serde_json::Value = serde_json::from_str(&status)?;
    assert_eq!(status["quorum"], true);
    assert_eq!(status["members"].as_array().map(|m| m.len()), Some(3));

    let before = guard.pids();
    ctl(&["cluster", "launch", d, "--stop"])?;
    for pid in &before {
        assert!(!process_alive(*pid), "node {pid} still runs after --stop");
    }
    ctl(&[
        "cluster",
        "launch",
        d,
        "--node-binary",
        node_binary.to_str().context("utf-8")?,
    ])?;
    let after = guard.pids();
    assert!(after.iter().all(|p| !before.contains(p)), "new processes");
    wait_until("the same three nodes UP again", TIMEOUT, || {
        nodes(&config).is_ok_and(|n| {
            n.len() == 3
                && n.iter().all(|n| n["state"] == "UP")
                && listed
                    .iter()
                    .all(|old| n.iter().any(|x| x["id"] == old["id"]))
        })
    })?;
    ctl(&["cluster", "destroy", d])?;
    assert!(!dir.exists());
    for pid in after {
        assert!(!process_alive(pid));
    }
    Ok(())
}
