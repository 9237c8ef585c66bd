//! A rolling upgrade (issue 27, docs/upgrades.md): a cluster of 3 members and 2
//! workers started from the binaries of an older commit (built from git by
//! `scripts/old-binaries`, which `scripts/test` runs; never committed binaries) is
//! upgraded node by node to this build's polis-node while an owner writes labels
//! without pause, following the documented sequence:
//!
//! ```text
//!   members one at a time, the curator leader last; then the workers:
//!     `cluster versions` says the step may start, `node upgrade-check ID` agrees (it
//!     refuses a member while another is down) ─▶ SIGTERM ─▶ start this build's
//!     polis-node on the same root ─▶ wait: UP, HEALTHY, this build's version (and for
//!     a member: every member a voter and answering)
//! ```
//! Shown: every acknowledged write is kept (each label's last acknowledged value is
//! what the cluster holds at the end), acknowledged writes never pause longer than
//! [`MAX_PAUSE`] (a curator leader's failover), every node comes back UP and HEALTHY on
//! the new version from the root the old one wrote, and a skew the policy forbids (a
//! node two minor versions ahead) is refused with both versions named.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, Node, TIMEOUT, endpoints, wait_until};

/// The commit whose binaries the cluster starts from (where issue 27 started).
const FROM: &str = "1f5e003";
/// The longest acknowledged writes may pause: a curator leader's failover.
const MAX_PAUSE: Duration = Duration::from_secs(3);
/// Every node: heartbeats often enough that health follows a restart quickly.
const NODE_ARGS: [&str; 2] = ["--heartbeat-period-ms=300", "--heartbeat-timeout-ms=1500"];
/// Distinct label keys the writer cycles through.
const KEYS: u64 = 32;

/// The older polis-node, as `scripts/old-binaries` left it.
fn old_polis_node() -> Result<PathBuf> {
    let dir = match std::env::var_os("POLIS_OLD_BINARIES") {
        Some(dir) => PathBuf::from(dir),
        None => e2e::bin_dir()
            .parent()
            .context("the target directory")?
            .join("old-binaries")
            .join(FROM),
    };
    let binary = dir.join("polis-node");
    ensure!(
        binary.exists(),
        "{} is missing: run `scripts/old-binaries {FROM}` first (scripts/test does)",
        binary.display()
    );
    Ok(binary)
}

/// Acknowledged label writes: each key's last acknowledged value, the longest pause
/// between two acknowledgements, and how many there were.
#[derive(Default)]
struct Acks {
    last: BTreeMap<String, u64>,
    longest_pause: Duration,
    count: u64,
    failures: Vec<String>,
}

/// Writes `upgrade-kN = sequence` on node `target` until `stop`, through a client that
/// knows every member.
fn writer(
    client: rpc::CuratorClient,
    target: String,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Acks>>,
) -> std::thread::JoinHandle<Result<()>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new()?;
        runtime.block_on(async {
            let mut last_ack = Instant::now();
            let started = Instant::now();
            let mut sequence = 0u64;
            while !stop.load(Ordering::SeqCst) {
                ensure!(
                    started.elapsed() < Duration::from_secs(900),
                    "the writer ran 900 s"
                );
                sequence += 1;
                let key = format!("upgrade-k{}", sequence % KEYS);
                let value = sequence.to_string();
                let outcome = tokio::time::timeout(
                    Duration::from_secs(10),
                    e2e::write_label(&client, &target, &key, &value),
                )
                .await;
                {
                    let mut acks = acks.lock().expect("acks lock");
                    match outcome {
                        Ok(Ok(())) => {
                            let now = Instant::now();
                            acks.longest_pause = acks.longest_pause.max(now - last_ack);
                            last_ack = now;
                            acks.last.insert(key, sequence);
                            acks.count += 1;
                        }
                        Ok(Err(e)) => acks.failures.push(format!("{key}={value}: {e}")),
                        Err(_) => acks.failures.push(format!("{key}={value}: timed out")),
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(())
        })
    })
}

/// `cluster versions -o json`, asked of every member (exit status aside).
fn versions(cluster: &Cluster, members: &str) -> Result<serde_json::Value> {
    let (_, out, err) =
        cluster.ctl(&["--endpoints", members, "cluster", "versions", "-o", "json"])?;
    serde_json::from_str(&out).with_context(|| format!("cluster versions: {out} {err}"))
}

/// Waits until node `id` is UP, HEALTHY and reports `version`.
fn wait_on_version(cluster: &Cluster, members: &str, id: &str, version: &str) -> Result<()> {
    let mut last = serde_json::Value::Null;
    wait_until(
        &format!("node {id} UP, HEALTHY, on {version}"),
        TIMEOUT * 2,
        || {
            let Ok(json) = versions(cluster, members) else {
                return false;
            };
            last = json.clone();
            json["nodes"].as_array().is_some_and(|nodes| {
                nodes.iter().any(|n| {
                    n["id"] == id
                        && n["state"] == "UP"
                        && n["health"] == "HEALTHY"
                        && n["version"] == version
                })
            })
        },
    )
    .with_context(|| format!("last versions: {last}"))
}

/// Waits until `cluster versions` lets the next step start.
fn wait_step_may_start(cluster: &Cluster, members: &str) -> Result<()> {
    let mut last = serde_json::Value::Null;
    wait_until("the next upgrade step may start", TIMEOUT * 2, || {
        let Ok(json) = versions(cluster, members) else {
            return false;
        };
        last = json.clone();
        json["upgrade_can_proceed"] == true
    })
    .with_context(|| format!("last versions: {last}"))
}

/// Restarts `node` on this build's polis-node (same root, no parameters).
fn restart_on_new(node: &mut Node) -> Result<()> {
    node.stop_cleanly()?;
    node.binary = None;
    node.start(&[])?;
    node.wait_home()
}

#[test]
fn rolling_upgrade_from_an_older_commit_under_writes() -> Result<()> {
    let old = old_polis_node()?;
    let new_version = env!("CARGO_PKG_VERSION");
    let dir = tempfile::tempdir()?;
    let mut first = Node::new(&dir.path().join("n0"));
    first.binary = Some(old.clone());
    first.extra_args = NODE_ARGS.iter().map(|a| a.to_string()).collect();
    std::fs::create_dir_all(&first.dir)?;
    let mut cluster = Cluster::bootstrap_from(dir.path(), first, &[])?;
    let first_id = cluster.first.key_node_id()?;
    let mut others = Vec::new();
    for name in ["m1", "m2", "w1", "w2"] {
        let params = cluster.register_params(name)?;
        others.push(cluster.add_worker_running(name, &params, Some(&old), &[])?);
    }
    for (_, id) in &others[..2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let member_addresses: Vec<IpAddr> = std::iter::once(cluster.first.address)
        .chain(others[..2].iter().map(|(n, _)| n.address))
        .collect();
    let members = member_addresses
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(",");
    cluster.wait_members(&members, 3, 0)?;
    let old_version = {
        let json = versions(&cluster, &members)?;
        json["newest"].as_str().context("a version")?.to_string()
    };
    println!("cluster of 3 members and 2 workers on {FROM} (version {old_version})");

    // A member's step is refused while another member is down: the quorum would go.
    let (m1_id, m2_id) = (others[0].1.clone(), others[1].1.clone());
    others[0].0.proc().signal(libc::SIGSTOP);
    let mut refusal = String::new();
    wait_until(
        "upgrade-check to refuse a member while another is down",
        TIMEOUT,
        || match cluster.ctl(&["--endpoints", &members, "node", "upgrade-check", &m2_id]) {
            Ok((false, _, err)) if err.contains("short of the 2 a quorum needs") => {
                refusal = err;
                true
            }
            _ => false,
        },
    )?;
    println!("while {m1_id} is stopped: {}", refusal.trim());
    others[0].0.proc().signal(libc::SIGCONT);

    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(Mutex::new(Acks::default()));
    let writing = writer(
        cluster.owner_client_to(&member_addresses)?,
        first_id.clone(),
        stop.clone(),
        acks.clone(),
    );
    wait_until("writes acknowledged", TIMEOUT, || {
        acks.lock().expect("acks lock").count >= 20
    })?;

    // Members one at a time, the curator leader last; then the workers.
    let leader = cluster.first.curator_leader_address()?;
    let mut order: Vec<usize> = (0..3).collect();
    order.sort_by_key(|i| member_addresses[*i] == leader);
    order.extend([3, 4]);
    for i in order {
        wait_step_may_start(&cluster, &members)?;
        let id = if i == 0 {
            first_id.clone()
        } else {
            others[i - 1].1.clone()
        };
        cluster.ctl_retry(&["--endpoints", &members, "node", "upgrade-check", &id])?;
        let (node, id) = match i {
            0 => (&mut cluster.first, first_id.clone()),
            _ => {
                let (node, id) = &mut others[i - 1];
                (node, id.clone())
            }
        };
        let step = Instant::now();
        restart_on_new(node)?;
        wait_on_version(&cluster, &members, &id, new_version)?;
        if i < 3 {
            cluster.wait_members(&members, 3, 0)?;
        }
        println!("node {id} upgraded in {:?}", step.elapsed());
    }
    wait_step_may_start(&cluster, &members)?;

    // A little more writing on the upgraded cluster, then the writer stops.
    let count = acks.lock().expect("acks lock").count;
    wait_until("writes acknowledged after the upgrade", TIMEOUT, || {
        acks.lock().expect("acks lock").count >= count + 20
    })?;
    stop.store(true, Ordering::SeqCst);
    writing
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    let acks = acks.lock().expect("acks lock");
    println!(
        "{} writes acknowledged, {} failed, longest pause {:?}",
        acks.count,
        acks.failures.len(),
        acks.longest_pause
    );
    ensure!(
        acks.longest_pause <= MAX_PAUSE,
        "acknowledged writes paused {:?} (at most {MAX_PAUSE:?})",
        acks.longest_pause
    );
    // Every acknowledged write is kept: each key holds its last acknowledged value.
    let record = cluster
        .node(&first_id)?
        .context("the written node is listed")?;
    for (key, sequence) in &acks.last {
        ensure!(
            record["labels"][key].as_str() == Some(sequence.to_string().as_str()),
            "label {key}: acknowledged {sequence}, the cluster holds {}",
            record["labels"][key]
        );
    }

    // A skew the policy forbids: a node two minor versions ahead is refused.
    let own = proto::version::parse(new_version).context("own version")?;
    let far = format!("{}.{}.0", own.major, own.minor + 2);
    let (worker, worker_id) = &mut others[3];
    worker.stop_cleanly()?;
    worker.start_with_env(&[], &[("POLIS_TEST_REPORTED_VERSION", &far)])?;
    let refusal = format!("node version {far} and curator version {new_version}");
    worker
        .proc()
        .wait_for_line(TIMEOUT, |l| {
            l.contains(&refusal) && l.contains("outside the version-skew policy")
        })
        .with_context(|| format!("worker {worker_id} refused"))?;
    let all = endpoints(&[&cluster.first]);
    wait_until(
        "cluster versions to refuse the next step while a node is refused",
        TIMEOUT,
        || {
            matches!(
                cluster.ctl(&["--endpoints", &all, "cluster", "versions"]),
                Ok((false, _, _))
            )
        },
    )?;
    Ok(())
}
