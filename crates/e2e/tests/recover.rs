//! Quorum loss and `polis-node recover`, with real polis-node processes and real etcd:
//! 3 consensus members and 2 workers; acknowledged label writes kept in a ledger while
//! two members are killed (one loses its root, the other is kept); `recover` on the
//! survivor: it serves, both workers come back Home by themselves, every acknowledged
//! write is there; the kept former member started again with its old root rejoins by
//! itself (learner, then voter); a fresh node given the role makes 3 voters again; a
//! former member whose role went while it was down comes back as a worker.
//! Before that, on the healthy cluster, each refusal: a running root, a worker, another
//! member answering that it serves a cluster, a root without etcd data — exit 1, one
//! line saying why, root unchanged.
//!
//! One cluster for the whole file: the phases build on each other.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, Proc, TIMEOUT, bin, endpoints, pem_der, wait_until};
use proto::api;

/// Fast heartbeats (the same on every node), so that workers go Split during the outage
/// and their return to Home shows.
const NODE_ARGS: [&str; 2] = ["--heartbeat-period-ms=300", "--heartbeat-timeout-ms=1500"];

/// Every file under `root` but the lock file (which a start that locks the root rewrites
/// with its PID): path → (size, modification time, mode).
fn tree(root: &Path) -> Result<BTreeMap<PathBuf, (u64, std::time::SystemTime, u32)>> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let path = entry.path();
            if path == root.join("lock") {
                continue;
            }
            if meta.is_dir() {
                dirs.push(path.clone());
            }
            found.insert(
                path,
                (meta.len(), meta.modified()?, meta.permissions().mode()),
            );
        }
    }
    Ok(found)
}

/// Runs `polis-node recover --root ROOT` (plus `extra`) to its end; (success, output).
fn recover_refused(dir: &Path, root: &Path, extra: &[&str]) -> Result<(bool, String)> {
    let mut cmd = Command::new(bin("polis-node"));
    cmd.arg("recover")
        .arg("--root")
        .arg(root)
        .args(NODE_ARGS)
        .args(extra);
    let mut proc = Proc::spawn("polis-node recover", cmd, &dir.join("recover-refused.log"))?;
    let status = proc.wait_exit(TIMEOUT)?;
    Ok((status.success(), proc.output()))
}

/// Checks a refusal: exit 1, a `polis-node:` line naming `why`, and (for a stopped
/// root) nothing changed in it.
fn check_refusal(dir: &Path, root: &Path, why: &str, stopped: bool) -> Result<()> {
    let before = if stopped { Some(tree(root)?) } else { None };
    let (ok, output) = recover_refused(dir, root, &[])?;
    assert!(
        !ok,
        "recover on {} must be refused: {output}",
        root.display()
    );
    let line = output
        .lines()
        .find(|l| l.starts_with("polis-node: "))
        .with_context(|| format!("no error line in: {output}"))?;
    assert!(line.contains(why), "expected {why:?} in {line:?}");
    if let Some(before) = before {
        assert_eq!(
            tree(root)?,
            before,
            "recover refused but changed {}",
            root.display()
        );
    }
    println!("refused as expected: {line}");
    Ok(())
}

/// Waits until the node's output after its first `skip` lines holds a line matching
/// `pred`.
fn wait_new_line(
    node: &mut Node,
    skip: usize,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> Result<()> {
    let proc = node.proc();
    wait_until(what, TIMEOUT, || {
        proc.output().lines().skip(skip).any(&pred)
    })
}

fn state_line(state: &'static str) -> impl Fn(&str) -> bool {
    move |l: &str| {
        serde_json::from_str::<serde_json::Value>(l)
            .is_ok_and(|v| v["fields"]["cluster_state"] == state)
    }
}

fn line_count(node: &mut Node) -> usize {
    node.proc().output().lines().count()
}

/// A leader-following owner client over the given curators.
fn owner_client(cluster: &Cluster, nodes: &[&Node]) -> Result<rpc::CuratorClient> {
    let key = identity::NodeKey::from_pkcs8(&pem_der(&cluster.config.join("owner-key.pem"))?)?;
    Ok(rpc::CuratorClient::new(
        nodes
            .iter()
            .map(|n| SocketAddr::new(n.address, rpc::CURATOR_PORT))
            .collect(),
        rpc::ServerTrust::PinnedCa(pem_der(&cluster.config.join("ca.pem"))?),
        Some(rpc::Credentials {
            certificate: pem_der(&cluster.config.join("owner.pem"))?,
            key_pkcs8: key.pkcs8_der().to_vec(),
        }),
    )?)
}

/// The ledger: label writes on node `target`, one key per write; the keys of the
/// acknowledged ones are recorded. Bounded (at most `max` writes, each bounded in time).
struct Writer {
    acked: Arc<Mutex<Vec<String>>>,
    attempts: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<()>>,
}

fn start_writer(client: rpc::CuratorClient, target: String, max: usize) -> Writer {
    let acked = Arc::new(Mutex::new(Vec::new()));
    let attempts = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (a, n, s) = (acked.clone(), attempts.clone(), stop.clone());
    let thread = std::thread::spawn(move || -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        for i in 0..max {
            if s.load(Ordering::SeqCst) {
                break;
            }
            let key = format!("ledger-{i}");
            let request = api::UpdateNodeLabelsRequest {
                id: target.clone(),
                upsert: [(key.clone(), "acked".to_string())].into(),
                delete: vec![],
            };
            let call = client.call(|channel| {
                let request = request.clone();
                async move {
                    api::management_client::ManagementClient::new(channel)
                        .update_node_labels(request)
                        .await
                }
            });
            let answer = runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(3), call).await });
            if let Ok(Ok(_)) = answer {
                a.lock().expect("ledger lock").push(key);
            }
            n.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    });
    Writer {
        acked,
        attempts,
        stop,
        thread,
    }
}

#[test]
fn a_lost_majority_is_recovered_and_former_members_return_by_themselves() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap_with(dir.path(), &[], &NODE_ARGS)?;
    let params = cluster.register_params("nodes")?;
    let (mut m1, id1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id2) = cluster.add_worker("m2", &params)?;
    let (mut w1, wid1) = cluster.add_worker("w1", &params)?;
    let (mut w2, _wid2) = cluster.add_worker("w2", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    // The first node leaves the harness's hands: the test kills and restarts members.
    let placeholder = Node::new(&dir.path().join("unused"));
    let mut n0 = std::mem::replace(&mut cluster.first, placeholder);
    cluster.wait_members(&endpoints(&[&n0, &m1, &m2]), 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;

    // Refusals, on the healthy cluster.
    check_refusal(
        dir.path(),
        &n0.root,
        "is in use by another polis-node",
        false,
    )?;
    assert!(
        e2e::process_alive(n0.proc().pid()),
        "a refused recover leaves the node running"
    );

    w2.proc().signal(libc::SIGTERM);
    w2.proc().wait_exit(TIMEOUT)?;
    check_refusal(dir.path(), &w2.root, "is a worker", true)?;
    w2.start(&[])?;
    w2.wait_home()?;

    m2.proc().signal(libc::SIGTERM);
    m2.proc().wait_exit(TIMEOUT)?;
    check_refusal(
        dir.path(),
        &m2.root,
        "serves a cluster: its etcd member follows leader",
        true,
    )?;
    // A member's root whose etcd data is gone (a copy, so that m2 stays whole).
    let copy = dir.path().join("no-etcd-data");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&m2.root)
        .arg(&copy)
        .status()?;
    assert!(copied.success());
    std::fs::remove_dir_all(copy.join("data/etcd/data"))?;
    check_refusal(dir.path(), &copy, "has no etcd data", true)?;
    m2.start(&[])?;
    m2.wait_for_curator()?;
    cluster.wait_members(&endpoints(&[&n0, &m1, &m2]), 3, 0)?;

    // The ledger runs while two members are killed. The survivor is the etcd leader:
    // every write etcd acknowledged is in its log.
    let client = owner_client(&cluster, &[&n0, &m1, &m2])?;
    let writer = start_writer(client, wid1.clone(), 120);
    wait_until("20 acknowledged writes", TIMEOUT, || {
        writer.acked.lock().expect("ledger lock").len() >= 20
    })?;
    let (_, status) = cluster.status(&endpoints(&[&n0, &m1, &m2]))?;
    let leader = status["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["leader"] == true))
        .and_then(|m| m["node"].as_str())
        .context("cluster status names the etcd leader")?
        .to_string();
    let mut ids = [n0.key_node_id()?, id1.clone(), id2.clone()];
    let at = ids
        .iter()
        .position(|i| *i == leader)
        .context("leader is a member")?;
    let mut members = [n0, m1, m2];
    members.rotate_left(at);
    ids.rotate_left(at);
    let gone_id = ids[1].clone();
    let [mut survivor, mut gone, mut kept] = members;
    let w_lines = [line_count(&mut w1), line_count(&mut w2)];
    for node in [&mut gone, &mut kept] {
        node.proc().signal(libc::SIGKILL);
        node.proc().wait_exit(TIMEOUT)?;
    }
    let killed_at = Instant::now();
    std::fs::remove_dir_all(&gone.root)?;
    let after_kill = writer.attempts.load(Ordering::SeqCst);
    wait_until("3 writes tried after the kill", TIMEOUT, || {
        writer.attempts.load(Ordering::SeqCst) >= after_kill + 3 || writer.thread.is_finished()
    })?;
    writer.stop.store(true, Ordering::SeqCst);
    writer.thread.join().expect("writer thread")?;
    let acked = writer.acked.lock().expect("ledger lock").clone();
    println!(
        "{} acknowledged writes, {:?} since the kill",
        acked.len(),
        killed_at.elapsed()
    );
    // recover on the (stopped) survivor. Meanwhile nothing is served: the workers fall
    // Split.
    survivor.proc().signal(libc::SIGTERM);
    survivor.proc().wait_exit(TIMEOUT)?;
    wait_new_line(&mut w1, w_lines[0], "w1 Split", state_line("Split"))?;
    wait_new_line(&mut w2, w_lines[1], "w2 Split", state_line("Split"))?;
    let w_lines = [line_count(&mut w1), line_count(&mut w2)];
    let mut cmd = Command::new(bin("polis-node"));
    cmd.arg("recover")
        .arg("--root")
        .arg(&survivor.root)
        .arg("--log-format=json")
        .args(NODE_ARGS);
    let started = Instant::now();
    survivor.proc = Some(Proc::spawn(
        "polis-node recover",
        cmd,
        &survivor.dir.join("recover.log"),
    )?);
    survivor.wait_for_curator()?;
    let survivor_at = survivor.address.to_string();
    cluster.ctl_retry(&[
        "--endpoints",
        &survivor_at,
        "node",
        "label",
        &wid1,
        "recovered=yes",
    ])?;
    println!(
        "recovered: a label write served {:?} after recover started",
        started.elapsed()
    );
    cluster.wait_members(&survivor_at, 1, 0)?;
    wait_new_line(&mut w1, w_lines[0], "w1 Home again", state_line("Home"))?;
    wait_new_line(&mut w2, w_lines[1], "w2 Home again", state_line("Home"))?;
    let labels = cluster.node(&wid1)?.context("w1 is listed")?["labels"].clone();
    for key in &acked {
        assert_eq!(
            labels[key], "acked",
            "acknowledged write {key} lost: {labels}"
        );
    }
    assert_eq!(labels["recovered"], "yes");

    // The kept former member, started with its old root: the survivor answers a newer
    // epoch whose history holds all of the kept member's data (the survivor led), so it
    // drops its stale etcd data and rejoins.
    let old_member = std::fs::read(kept.root.join("data/etcd/member.pb")).ok();
    kept.start(&[])?;
    kept.proc().wait_for_line(TIMEOUT, |l| {
        l.contains("holds nothing the cluster lacks") && l.contains("rejoins as a learner")
    })?;
    kept.wait_for_curator()?;
    cluster.wait_members(&endpoints(&[&survivor, &kept]), 2, 0)?;
    let new_member = std::fs::read(kept.root.join("data/etcd/member.pb"))?;
    assert_ne!(
        Some(new_member),
        old_member,
        "rejoined as a new etcd member"
    );

    // A fresh node given the role: three voters again.
    let params = cluster.register_params("after-recovery")?;
    let (mut fresh, fresh_id) = cluster.add_worker("fresh", &params)?;
    cluster.ctl_retry(&[
        "--endpoints",
        &survivor_at,
        "node",
        "add-role",
        &fresh_id,
        "ConsensusMember",
    ])?;
    fresh.wait_for_curator()?;
    cluster.wait_members(&endpoints(&[&survivor, &kept, &fresh]), 3, 0)?;
    // The recovered node restarts as an ordinary member (recovery was for one start).
    survivor.proc().signal(libc::SIGTERM);
    survivor.proc().wait_exit(TIMEOUT)?;
    survivor.start(&[])?;
    survivor.wait_for_curator()?;
    cluster.wait_members(&endpoints(&[&survivor, &kept, &fresh]), 3, 0)?;
    // The member lost for good is decommissioned by the cluster alone (it is no etcd
    // member any more, so no quorum is at stake).
    cluster.ctl_retry(&[
        "--endpoints",
        &survivor_at,
        "node",
        "decommission",
        &gone_id,
    ])?;
    cluster.wait_node(&gone_id, "DECOMMISSIONED", None)?;
    if gone.root.exists() {
        bail!("the lost member's root must stay deleted");
    }

    // A former member whose role went while it was down comes back as a worker: its
    // etcd is refused, the cluster's record has no role for it, its etcd data goes.
    kept.proc().signal(libc::SIGTERM);
    kept.proc().wait_exit(TIMEOUT)?;
    let kept_id = kept.key_node_id()?;
    cluster.ctl_retry(&[
        "--endpoints",
        &survivor_at,
        "node",
        "remove-role",
        &kept_id,
        "ConsensusMember",
    ])?;
    cluster.wait_members(&endpoints(&[&survivor, &fresh]), 2, 0)?;
    assert!(kept.root.join("data/etcd/data/member").is_dir());
    kept.start(&[])?;
    kept.proc().wait_for_line(TIMEOUT, |l| {
        l.contains("left consensus: etcd data and peer credentials removed")
    })?;
    kept.wait_home()?;
    assert!(!kept.root.join("data/etcd/data").exists());
    cluster.wait_members(&endpoints(&[&survivor, &fresh]), 2, 0)?;
    Ok(())
}
