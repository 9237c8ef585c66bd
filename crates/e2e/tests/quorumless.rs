//! A curator without quorum answers Unavailable fast (issue 16), with real polis-node
//! and etcd processes on 127.x addresses: a 3-member control plane.
//!
//! - n0's etcd member cut off from the others (their polis-node and etcd frozen with
//!   SIGSTOP): a call sent only to n0's curator is answered Unavailable, saying that its
//!   etcd member has no leader, within the curator lease TTL + 1 s (asserted with twice
//!   that; the figure is printed). Calls answered from the local member alone still
//!   are: GetCACertificate with the CA's handovers, at once.
//! - n0's etcd frozen while m1 and m2 keep a quorum: polisctl given [n0, m1] passes over
//!   n0 (Unavailable at once) and a write through the others succeeds.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::{Cluster, Node, TIMEOUT, endpoints};
use proto::api;

/// polis-node's default `--curator-lease-ttl` (these nodes run with it).
const LEASE_TTL: Duration = Duration::from_secs(3);
/// The goal: Unavailable within the lease TTL + 1 s.
const TARGET: Duration = Duration::from_secs(LEASE_TTL.as_secs() + 1);

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

/// A bootstrapped cluster with two more consensus members (3 voters).
fn three_members(dir: &std::path::Path) -> Result<(Cluster, Node, Node)> {
    let cluster = Cluster::bootstrap(dir)?;
    let params = cluster.register_params("nodes")?;
    let (mut m1, id_m1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id_m2) = cluster.add_worker("m2", &params)?;
    for id in [&id_m1, &id_m2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    cluster.wait_members(&endpoints(&[&cluster.first, &m1, &m2]), 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;
    Ok((cluster, m1, m2))
}

#[test]
fn a_curator_without_quorum_answers_unavailable_fast() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut cluster, mut m1, mut m2) = three_members(dir.path())?;
    let all = endpoints(&[&cluster.first, &m1, &m2]);
    let owner = cluster.owner_client()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let n0: SocketAddr = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    // One ListNodes call to n0 alone (no retry, no other curator), bounded by 30 s.
    let list_on_n0 = |runtime: &tokio::runtime::Runtime| {
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), async {
                let channel = rpc::connect(n0, owner.trust(), owner.credentials().as_ref())
                    .await
                    .context("connecting to n0's curator")?;
                anyhow::Ok(
                    api::management_client::ManagementClient::new(channel)
                        .list_nodes(api::ListNodesRequest::default())
                        .await,
                )
            })
            .await
        })
    };
    let served = list_on_n0(&runtime).context("ListNodes on n0 before the cut timed out")??;
    served.context("ListNodes on n0 before the cut")?;

    // Cut n0's etcd member off: freeze the other two members (polis-node and etcd).
    let frozen = Frozen::freeze(vec![
        m1.proc().pid(),
        m1.etcd_pid()?,
        m2.proc().pid(),
        m2.etcd_pid()?,
    ]);
    let cut = Instant::now();
    // Calls to n0 alone until it refuses (a leader may answer from memory while its
    // lease lasts). Before: once its lease was gone, every call waited out the 10 s etcd
    // bound in leader lookups (twice: forwarding, then the handler).
    let status = loop {
        let answer = list_on_n0(&runtime).context("a call to the isolated n0 hung for 30 s")??;
        match answer {
            Err(status) => break status,
            Ok(_) if cut.elapsed() > Duration::from_secs(60) => {
                anyhow::bail!("the isolated n0 kept serving ListNodes for a minute")
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let took = cut.elapsed();
    println!(
        "{{\"isolated_unavailable_ms\": {}, \"target_ms\": {}}}",
        took.as_millis(),
        TARGET.as_millis()
    );
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("etcd member has no leader"),
        "{}",
        status.message()
    );
    assert!(
        took <= 2 * TARGET,
        "Unavailable took {took:?} after the cut (target {TARGET:?})"
    );
    // QUORUM_FREE calls are still answered, from n0's own member alone: GetCACertificate
    // with its handovers too (nothing asked for them before, so nothing is cached).
    // Before: the handovers were read through the quorum, and the call waited out
    // etcd's bound, then failed.
    let asked = Instant::now();
    let ca = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let channel = rpc::connect(n0, owner.trust(), owner.credentials().as_ref())
                .await
                .context("connecting to n0's curator")?;
            anyhow::Ok(
                api::curator_local_client::CuratorLocalClient::new(channel)
                    .get_ca_certificate(api::GetCaCertificateRequest {
                        with_handovers: true,
                    })
                    .await,
            )
        })
        .await
    });
    let ca = ca.context("GetCACertificate on the isolated n0 hung for 30 s")??;
    println!(
        "isolated n0 answered GetCACertificate in {:?}",
        asked.elapsed()
    );
    let ca = ca.context("GetCACertificate with handovers on the isolated n0")?;
    assert!(!ca.get_ref().ca_certificate.is_empty());
    assert!(asked.elapsed() <= TARGET, "{:?}", asked.elapsed());
    // Once it knows, at once.
    let again = Instant::now();
    let status = list_on_n0(&runtime)??.expect_err("served without a quorum");
    println!("isolated n0 refused again in {:?}", again.elapsed());
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(again.elapsed() <= TARGET, "{:?}", again.elapsed());
    // polisctl given only n0 fails with the reason, within its retry rounds.
    let started = Instant::now();
    let n0_only = cluster.first.address.to_string();
    let (ok, _, err) = cluster.ctl(&["--endpoints", &n0_only, "node", "list"])?;
    println!(
        "polisctl with n0 alone failed in {:?}: {}",
        started.elapsed(),
        err.trim()
    );
    assert!(!ok);
    assert!(err.contains("no leader"), "{err}");
    assert!(started.elapsed() <= 3 * TARGET, "{:?}", started.elapsed());
    drop(frozen);
    cluster.wait_members(&all, 3, 0)?;

    // n0's etcd frozen; m1 and m2 keep a quorum: polisctl given [n0, m1] passes over n0.
    let frozen = Frozen::freeze(vec![cluster.first.etcd_pid()?]);
    // Once n0 refuses (not before: it might forward the call to a leader).
    let refused_at = Instant::now();
    loop {
        match list_on_n0(&runtime).context("a call to n0 hung for 30 s")?? {
            Err(s) if s.code() == tonic::Code::Unavailable => break,
            _ if refused_at.elapsed() > TIMEOUT => anyhow::bail!("n0 never refused"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    println!(
        "n0 with its etcd frozen refused after {:?}",
        refused_at.elapsed()
    );
    let cut = Instant::now();
    let id_m2 = m2.key_node_id()?;
    let both = endpoints(&[&cluster.first, &m1]);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (ok, _, err) = cluster.ctl(&[
            "--endpoints",
            &both,
            "node",
            "label",
            &id_m2,
            "quorumless=yes",
        ])?;
        if ok {
            break;
        }
        println!(
            "polisctl [n0, m1] after {:?}: {}",
            cut.elapsed(),
            err.trim()
        );
        anyhow::ensure!(Instant::now() < deadline, "never served by [n0, m1]: {err}");
    }
    let took = cut.elapsed();
    println!("{{\"write_through_others_ms\": {}}}", took.as_millis());
    assert!(
        took <= 4 * TARGET,
        "the write through [n0, m1] took {took:?}"
    );
    drop(frozen);
    cluster.wait_members(&all, 3, 0)?;
    let node = cluster.node(&id_m2)?.context("m2's record")?;
    assert!(node.to_string().contains("quorumless"), "{node}");
    Ok(())
}

/// How long a member started alone may take to answer `cluster status` about itself.
const ALONE_BOUND: Duration = Duration::from_secs(30);

/// After a full stop, one member of three started alone answers `cluster status` about
/// its own etcd member (committed raft index, no leader; the others listed as
/// unreachable) on its node's port, since its curator does not start without a quorum
/// (nor does etcd serve clients), with its own view of its peers: both others named
/// (recorded member list) and unreachable (etcd's metrics); polisctl shows it ("peers
/// reachable: 0 of 2; cannot reach: …", "quorum: NO") and exits 1. A second member
/// started: a quorum, normal status, and each of the two sees the other reachable.
/// Before: its curator port refused connections and `cluster status` listed no member;
/// then (before the peer view) no member said which peers it could reach.
#[test]
fn a_member_started_alone_answers_cluster_status() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut cluster, mut m1, mut m2) = three_members(dir.path())?;
    let all = endpoints(&[&cluster.first, &m1, &m2]);
    let id_n0 = cluster.first.key_node_id()?;
    let id_m1 = m1.key_node_id()?;
    let id_m2 = m2.key_node_id()?;
    // n0 keeps the member list it can name its peers by later (listed every 2 s).
    let book = cluster.first.root.join("data/etcd/members.pb");
    e2e::wait_until("n0 to record all three etcd members", TIMEOUT, || {
        std::fs::read(&book).is_ok_and(|b| {
            <proto::config::RecordedMembers as prost::Message>::decode(b.as_slice()).is_ok_and(
                |r| {
                    r.members.len() == 3
                        && r.members
                            .iter()
                            .all(|m| !m.name.is_empty() && !m.is_learner)
                },
            )
        })
    })?;
    for node in [&mut cluster.first, &mut m1, &mut m2] {
        node.proc().signal(libc::SIGTERM);
        node.proc().wait_exit(TIMEOUT)?;
    }
    cluster.first.start(&[])?;
    let started = Instant::now();
    let answered = |status: &serde_json::Value, id: &str| {
        status["members"]
            .as_array()
            .is_some_and(|ms| ms.iter().any(|m| m["node"] == id && m["answered"] == true))
    };
    // A member's own view of its peers: (node, reachable) as it reports them.
    let seen_by = |status: &serde_json::Value, id: &str| -> Option<Vec<(String, bool)>> {
        let member = status["members"]
            .as_array()?
            .iter()
            .find(|m| m["node"] == id && m["answered"] == true)?;
        let peers = member["peers"]["members"].as_array()?;
        Some(
            peers
                .iter()
                .map(|p| {
                    (
                        p["node"].as_str().unwrap_or_default().to_string(),
                        p["reachable"] == true,
                    )
                })
                .collect(),
        )
    };
    let status = loop {
        let (ok, status) = cluster.status(&all)?;
        if answered(&status, &id_n0) && seen_by(&status, &id_n0).is_some() {
            assert!(!ok, "cluster status succeeded without a quorum: {status}");
            break status;
        }
        anyhow::ensure!(
            started.elapsed() < ALONE_BOUND,
            "n0 alone never answered cluster status: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "{{\"alone_status_ms\": {}}}\n{status}",
        started.elapsed().as_millis()
    );
    assert_eq!(status["quorum"], false, "{status}");
    let members = status["members"].as_array().context("members")?;
    assert!(members.iter().all(|m| m["leader"] == false), "{status}");
    // The other two: their curators and node ports do not answer.
    let unreachable = status["unreachable"].as_array().context("unreachable")?;
    for node in [&m1, &m2] {
        let address = format!("{}:", node.address);
        assert!(
            unreachable
                .iter()
                .any(|u| u.as_str().is_some_and(|u| u.starts_with(&address))),
            "{status}"
        );
    }
    let n0 = members
        .iter()
        .find(|m| m["node"] == id_n0.as_str())
        .context("n0 in the member list")?;
    assert!(n0["raft_index"].as_u64().unwrap_or(0) > 0, "{status}");
    // Its own view: both other members named, neither reachable; no raft term (etcd's
    // metrics do not hold it).
    assert_eq!(n0["from_metrics"], true, "{status}");
    assert_eq!(n0["raft_term"], serde_json::Value::Null, "{status}");
    let mut seen = seen_by(&status, &id_n0).context("n0's peer view")?;
    seen.sort();
    let mut expected = vec![(id_m1.clone(), false), (id_m2.clone(), false)];
    expected.sort();
    assert_eq!(seen, expected, "{status}");
    assert_eq!(n0["peers"]["reachable"], 0, "{status}");
    for node in [&m1, &m2] {
        let address = node.address.to_string();
        assert!(
            n0["peers"]["cannot_reach"].as_array().is_some_and(|c| c
                .iter()
                .any(|c| c.as_str().is_some_and(|c| c.contains(&address)))),
            "{status}"
        );
    }
    // The table says so, and polisctl exits 1 naming why.
    let (ok, out, err) = cluster.ctl(&["--endpoints", &all, "cluster", "status"])?;
    println!("{out}{err}");
    assert!(!ok);
    assert!(out.contains("quorum: NO"), "{out}");
    assert!(err.contains("no etcd quorum"), "{err}");
    assert!(
        out.contains("peers reachable: 0 of 2; cannot reach: "),
        "{out}"
    );
    assert!(out.contains(&format!("{id_m1} ({})", m1.address)), "{out}");
    assert!(out.contains(&format!("{id_m2} ({})", m2.address)), "{out}");

    // A second member: a quorum again, normal status; each of the two sees the other
    // reachable and m2 not.
    m1.start(&[])?;
    let deadline = Instant::now() + TIMEOUT;
    let sees = |status: &serde_json::Value, by: &str, peer: &str, reachable: bool| {
        seen_by(status, by).is_some_and(|s| s.contains(&(peer.to_string(), reachable)))
    };
    loop {
        let (ok, status) = cluster.status(&all)?;
        if ok
            && status["quorum"] == true
            && answered(&status, &id_n0)
            && answered(&status, &id_m1)
            && sees(&status, &id_n0, &id_m1, true)
            && sees(&status, &id_n0, &id_m2, false)
            && sees(&status, &id_m1, &id_n0, true)
        {
            println!("{status}");
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no quorum with n0 and m1: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}
