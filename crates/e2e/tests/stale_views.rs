//! Stale views never destroy data (issue 16), with real polis-node and etcd processes on
//! 127.x addresses: a 3-member control plane and a worker.
//!
//! - A member cut off from the others (here: the other two members' polis-node and etcd
//!   frozen with SIGSTOP, so that its etcd member loses its leader) learns it: its etcd
//!   watch is cancelled ("no leader") and its curator stops serving its snapshot as
//!   current, within a bound. The worker keeps its state and roles meanwhile, and
//!   everything is HEALTHY again once the others continue.
//! - Every WatchNode update names its record's etcd revision: the worker records the
//!   newest one it applied next to its cluster directory, and it only grows.
//! - A voter fed an older update saying "no role" (the test hook of `crash-points`
//!   builds) refuses it: it keeps its role and its etcd data.
//!
//! One cluster for the whole file: the cases run in turn on it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, TIMEOUT, endpoints};
use prost::Message as _;
use proto::api;

/// How long a member without a leader may keep its etcd watch (etcd cancels
/// require-leader streams after three election timeouts without a leader; generous for
/// a loaded machine).
const NO_LEADER_BOUND: Duration = Duration::from_secs(30);

/// Freezes processes (SIGSTOP) and lets them continue (SIGCONT) when dropped, also when
/// the test fails: declared after the nodes, it is dropped before them.
struct Frozen(Vec<i32>);

impl Frozen {
    fn freeze(pids: Vec<i32>) -> Frozen {
        for &pid in &pids {
            // SAFETY: kill(2) on processes this test started.
            unsafe {
                libc::kill(pid, libc::SIGSTOP);
            }
        }
        Frozen(pids)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: as above.
            unsafe {
                libc::kill(pid, libc::SIGCONT);
            }
        }
    }
}

/// The newest applied record revision the node keeps in its cluster directory.
fn applied_revision(node: &Node) -> Result<i64> {
    let path = node.root.join("esp").join("directory.pb");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(proto::config::ClusterDirectory::decode(bytes.as_slice())?.applied_record_revision)
}

fn lines_after(node: &mut Node, from: usize) -> Vec<String> {
    node.proc()
        .output()
        .lines()
        .skip(from)
        .map(str::to_string)
        .collect()
}

#[test]
fn stale_views() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("nodes")?;
    let (mut m1, id_m1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id_m2) = cluster.add_worker("m2", &params)?;
    let (mut w, id_w) = cluster.add_worker("w", &params)?;
    for id in [&id_m1, &id_m2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let all = endpoints(&[&cluster.first, &m1, &m2]);
    cluster.wait_members(&all, 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;
    let id_n0 = cluster.first.key_node_id()?;
    for id in [&id_n0, &id_m1, &id_m2, &id_w] {
        cluster.wait_node(id, "UP", Some("HEALTHY"))?;
    }

    // The worker applied its record at some revision and keeps it.
    // Before: no revision was sent; the directory held none (0).
    let deadline = Instant::now() + TIMEOUT;
    let before = loop {
        let revision = applied_revision(&w)?;
        if revision > 0 {
            break revision;
        }
        if Instant::now() > deadline {
            bail!("the worker never recorded an applied record revision");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("worker applied its record at revision {before}");

    // A WatchNode stream on n0 with the worker's certificate, as the worker would hold.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let node_dir = w.root.join("data").join("node");
    let credentials = rpc::Credentials {
        certificate: std::fs::read(node_dir.join("cert.der"))?,
        key_pkcs8: std::fs::read(node_dir.join("key.der"))?,
    };
    let trust = rpc::ServerTrust::PinnedCa(std::fs::read(node_dir.join("ca.der"))?);
    let n0_endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let watch_n0 = |runtime: &tokio::runtime::Runtime| {
        runtime.block_on(async {
            let channel = rpc::connect(n0_endpoint, &trust, Some(&credentials)).await?;
            anyhow::Ok(
                api::curator_client::CuratorClient::new(channel)
                    .watch_node(api::WatchNodeRequest {})
                    .await,
            )
        })
    };
    let mut stream = watch_n0(&runtime)?
        .context("WatchNode on n0 before the cut")?
        .into_inner();
    let first = runtime
        .block_on(stream.message())?
        .context("a first WatchNode update")?;
    assert!(first.record_revision > 0, "no record revision: {first:?}");

    // Cut n0 off: freeze the other two members (polis-node and etcd).
    let pids = vec![
        m1.proc().pid(),
        m1.etcd_pid()?,
        m2.proc().pid(),
        m2.etcd_pid()?,
    ];
    let first_lines = cluster.first.proc().output().lines().count();
    let worker_lines = w.proc().output().lines().count();
    let frozen = Frozen::freeze(pids);
    let cut = Instant::now();
    // Before: the watch was opened without require-leader and stayed open on a member
    // without a leader; no "no leader" ever came (this wait timed out).
    loop {
        if let Some(line) = lines_after(&mut cluster.first, first_lines)
            .into_iter()
            .find(|l| l.contains("etcdserver: no leader") && l.contains("nodes"))
        {
            println!("n0: {line}");
            break;
        }
        if cut.elapsed() > NO_LEADER_BOUND {
            bail!("n0's node watch did not end within {NO_LEADER_BOUND:?} of losing its leader");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "n0's watch ended {:?} after the other members froze",
        cut.elapsed()
    );
    // The worker's stream on n0 ends with Unavailable, and a new one is refused.
    let ended = runtime.block_on(async {
        tokio::time::timeout(NO_LEADER_BOUND, async {
            loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return None,
                    Err(status) => return Some(status),
                }
            }
        })
        .await
    });
    let status = ended
        .context("the WatchNode stream on n0 stayed open")?
        .context("the WatchNode stream on n0 ended without saying why")?;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    println!(
        "n0's WatchNode stream ended {:?} after the cut: {}",
        cut.elapsed(),
        status.message()
    );
    let refused = watch_n0(&runtime)?.expect_err("n0 opened a WatchNode stream without a leader");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");

    // The worker kept its state and roles: nothing it heard meanwhile took them.
    for line in lines_after(&mut w, worker_lines) {
        assert!(
            !line.contains("roles changed") && !line.contains("decommission"),
            "the worker acted on a cut-off curator: {line}"
        );
    }
    assert!(w.proc().output().lines().count() >= worker_lines);
    assert!(e2e::process_alive(w.proc().pid()), "the worker exited");

    drop(frozen);
    cluster.wait_members(&all, 3, 0)?;
    for id in [&id_n0, &id_m1, &id_m2, &id_w] {
        cluster.wait_node(id, "UP", Some("HEALTHY"))?;
    }
    let worker = cluster.node(&id_w)?.context("the worker's record")?;
    assert!(
        worker["roles"].as_array().is_none_or(|r| r.is_empty()),
        "{worker}"
    );
    let after = applied_revision(&w)?;
    assert!(
        after >= before,
        "the applied revision went back: {before} → {after}"
    );

    // A voter told "no role" by a stale curator keeps its role and its etcd data: m1
    // restarted with the test hook that feeds it such an update first on every watch.
    // Without the revision check (checked by making `staleview::is_stale` answer false)
    // m1 applied it: "left consensus: etcd data and peer credentials removed".
    m1.proc().signal(libc::SIGTERM);
    m1.proc().wait_exit(TIMEOUT)?;
    let m1_root = m1.root.clone();
    m1.start_with_env(&[], &[("POLIS_TEST_STALE_NO_ROLE", "1")])?;
    m1.proc()
        .wait_for_line(TIMEOUT, |l| l.contains("stale-update hook armed"))?;
    let verdict = m1.proc().wait_for_line(TIMEOUT, |l| {
        l.contains("refused a stale update") || l.contains("left consensus")
    })?;
    assert!(
        verdict.contains("refused a stale update"),
        "m1 applied a stale 'no role': {verdict}"
    );
    cluster.wait_members(&all, 3, 0)?;
    m1.wait_for_curator()?;
    cluster.wait_node(&id_m1, "UP", Some("HEALTHY"))?;
    let output = m1.proc().output();
    for line in output.lines() {
        assert!(
            !line.contains("left consensus") && !line.contains("roles changed"),
            "m1 acted on a stale update: {line}"
        );
    }
    let etcd_data = m1_root.join("data").join("etcd").join("data");
    assert!(
        std::fs::read_dir(&etcd_data)?.next().is_some(),
        "m1's etcd data is gone"
    );
    Ok(())
}

/// A voter told "no role" in an update the revision check cannot order (the test hook's
/// `unordered` mode names another etcd cluster, and rolefetch holds it for a few
/// seconds) does not wipe its etcd data on that word alone: etcd's member list, read with
/// a quorum through the curators, still lists its member, so it keeps etcd running and
/// its data, and keeps consensus when the role comes back with the next update.
/// Before (the role server wiped on the role's going): m1 logged "left consensus: etcd
/// data and peer credentials removed" within the hold.
#[test]
fn a_curators_word_alone_wipes_no_etcd_data() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("nodes")?;
    let (mut m1, id_m1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id_m2) = cluster.add_worker("m2", &params)?;
    for id in [&id_m1, &id_m2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let all = endpoints(&[&cluster.first, &m1, &m2]);
    cluster.wait_members(&all, 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;

    m1.proc().signal(libc::SIGTERM);
    m1.proc().wait_exit(TIMEOUT)?;
    let m1_root = m1.root.clone();
    m1.start_with_env(&[], &[("POLIS_TEST_STALE_NO_ROLE", "unordered")])?;
    m1.proc()
        .wait_for_line(TIMEOUT, |l| l.contains("stale-update hook armed"))?;
    let verdict = m1.proc().wait_for_line(TIMEOUT, |l| {
        l.contains("etcd still lists this node's member") || l.contains("left consensus")
    })?;
    println!("m1: {verdict}");
    assert!(
        verdict.contains("etcd still lists"),
        "m1 wiped its etcd data on a curator's word: {verdict}"
    );
    m1.proc()
        .wait_for_line(TIMEOUT, |l| l.contains("the ConsensusMember role is back"))?;
    cluster.wait_members(&all, 3, 0)?;
    m1.wait_for_curator()?;
    cluster.wait_node(&id_m1, "UP", Some("HEALTHY"))?;
    for line in m1.proc().output().lines() {
        assert!(
            !line.contains("left consensus") && !line.contains("stopping etcd and the curator"),
            "m1 acted on an unconfirmed 'no role': {line}"
        );
    }
    let etcd_data = m1_root.join("data").join("etcd").join("data");
    assert!(
        std::fs::read_dir(&etcd_data)?.next().is_some(),
        "m1's etcd data is gone"
    );
    Ok(())
}
