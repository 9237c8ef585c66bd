//! Membership changes as durable intents (issue 16), with real polis-node and etcd
//! processes on 127.x addresses: four consensus members, every node
//! started with the curator's test hook `POLIS_PAUSE_AT=membership-etcd-change:<ms>`
//! (built with `--features node/crash-points`), which pauses a leader right after a
//! role removal's `member_remove` and right before a join's `member_add`.
//!
//! - The leader is killed (SIGKILL) right after it removed a member's etcd member, the
//!   polisctl that asked killed too: the next leader finishes the removal by itself
//!   (the role gone from the record, the node out of consensus, its data wiped, not
//!   crash-looping), two voters serving.
//! - A leader paused before adding a joining node's learner (the node played by the
//!   test, its JoinConsensus call kept open) is deposed (its polis-node frozen), the
//!   role is removed at the new leader, and the old leader continues: it refuses the
//!   join and no learner is left behind.
//!
//! One cluster for the whole file: the cases run in turn on it.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, Proc, TIMEOUT, endpoints, wait_until};
use proto::api;

/// Long enough to act on (the test acts at once on the pause line), short enough
/// that the joins of the members, each paused once, stay quick.
const PAUSE: (&str, &str) = ("POLIS_PAUSE_AT", "membership-etcd-change:5000");

/// Starts a node with `params` and the pause hook, approves it, waits until UP.
fn add_node(cluster: &Cluster, name: &str, params: &Path) -> Result<(Node, String)> {
    let mut node = cluster.new_node(name)?;
    node.start_with_env(
        &["--params", params.to_str().context("utf-8 path")?],
        &[PAUSE],
    )?;
    node.wait_state("Foreign")?;
    let id = node.key_node_id()?;
    cluster.ctl_retry(&["node", "approve", &id])?;
    node.wait_home()?;
    cluster.wait_node(&id, "UP", None)?;
    Ok((node, id))
}

/// Waits until `node` logs, after its first `seen` lines, that it paused at the pause
/// point for node `id`.
fn wait_for_pause(node: &mut Node, seen: usize, id: &str) -> Result<()> {
    wait_until("the pause point", TIMEOUT, || {
        node.proc()
            .output()
            .lines()
            .skip(seen)
            .any(|l| l.contains("pause point reached") && l.contains(id))
    })
}

/// Whether node `id`'s record holds the ConsensusMember role (asked at `at`).
fn holds_role(cluster: &Cluster, at: &str, id: &str) -> Result<bool> {
    let out = cluster.ctl_retry(&["--endpoints", at, "node", "list", "-o", "json"])?;
    let nodes: serde_json::Value = serde_json::from_str(&out)?;
    let node = nodes
        .as_array()
        .and_then(|a| a.iter().find(|n| n["id"] == id))
        .with_context(|| format!("node {id} is not listed"))?;
    Ok(node["roles"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r == "ConsensusMember")))
}

/// The (voters, learners) `cluster status` at `at` lists, with the nodes they belong to.
fn members(cluster: &Cluster, at: &str) -> Result<Vec<(String, String)>> {
    let (_, status) = cluster.status(at)?;
    Ok(status["members"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_string(),
                m["node"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

#[test]
fn membership_intents() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let first_dir = dir.path().join("n0");
    std::fs::create_dir_all(&first_dir)?;
    let mut first = Node::new(&first_dir);
    let bootstrap = first.bootstrap_params()?;
    first.start_with_env(
        &["--params", bootstrap.to_str().context("utf-8 path")?],
        &[PAUSE],
    )?;
    first.wait_home()?;
    let cluster = Cluster {
        dir: dir.path().to_path_buf(),
        config: first_dir.join("config"),
        first,
        node_args: Vec::new(),
    };
    let first_endpoint = cluster.first.address.to_string();
    cluster.ctl_retry(&[
        "--endpoints",
        &first_endpoint,
        "takeownership",
        "--accept-ca",
    ])?;
    let mut cluster = cluster;
    let params = cluster.register_params("nodes")?;
    // members[0] stands for cluster.first (moved back in at the end).
    let mut others = Vec::new();
    let mut ids = vec![cluster.first.key_node_id()?];
    for name in ["m1", "m2", "m3"] {
        let (node, id) = add_node(&cluster, name, &params)?;
        others.push(node);
        ids.push(id);
    }
    for id in &ids[1..] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let all = {
        let refs: Vec<&Node> = std::iter::once(&cluster.first)
            .chain(others.iter())
            .collect();
        endpoints(&refs)
    };
    cluster.wait_members(&all, 4, 0)?;
    let addresses: Vec<_> = std::iter::once(cluster.first.address)
        .chain(others.iter().map(|n| n.address))
        .collect();
    fn member<'a>(first: &'a mut Node, others: &'a mut [Node], i: usize) -> &'a mut Node {
        if i == 0 { first } else { &mut others[i - 1] }
    }

    // Case 1: the leader dies right after member_remove; the next one finishes.
    // Before: the removal ran inside the request only; the role stayed in the record
    // and the removed node crash-looped on its removed etcd member.
    let leader_address = cluster.first.curator_leader_address()?;
    let leader = addresses
        .iter()
        .position(|a| *a == leader_address)
        .context("the leader is one of the members")?;
    let victim = (leader + 1) % addresses.len();
    let survivors: Vec<usize> = (0..addresses.len())
        .filter(|i| *i != leader && *i != victim)
        .collect();
    let survivors_at = survivors
        .iter()
        .map(|i| addresses[*i].to_string())
        .collect::<Vec<_>>()
        .join(",");
    println!(
        "leader {}, removing {} ({})",
        ids[leader], ids[victim], addresses[victim]
    );
    let mut ctl = Command::new(e2e::bin("polisctl"));
    ctl.args([
        "--config",
        cluster.config.to_str().context("utf-8 path")?,
        "--endpoints",
        &addresses[leader].to_string(),
        "node",
        "remove-role",
        &ids[victim],
        "ConsensusMember",
    ]);
    let victim_id = ids[victim].clone();
    let seen = member(&mut cluster.first, &mut others, leader)
        .proc()
        .output()
        .lines()
        .count();
    let remove = Proc::spawn("polisctl", ctl, &dir.path().join("remove-role.log"))?;
    wait_for_pause(
        member(&mut cluster.first, &mut others, leader),
        seen,
        &victim_id,
    )
    .context("the leader to pause after removing the etcd member")?;
    drop(remove);
    let dead = member(&mut cluster.first, &mut others, leader);
    dead.proc().signal(libc::SIGKILL);
    dead.proc().wait_exit(TIMEOUT)?;
    wait_until("the next leader to finish the removal", TIMEOUT, || {
        holds_role(&cluster, &survivors_at, &victim_id).is_ok_and(|held| !held)
    })?;
    let removed = member(&mut cluster.first, &mut others, victim);
    removed
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("left consensus"))
        .context("the removed node to leave consensus")?;
    wait_until("the removed node's etcd data to be gone", TIMEOUT, || {
        !removed.root.join("data/etcd/data").exists()
    })?;
    assert!(
        removed.proc().child.try_wait()?.is_none(),
        "the removed node keeps running (as a worker)"
    );
    // The two survivors serve: a quorum of the three voters left, the victim none.
    wait_until("two answering voters of three", TIMEOUT, || {
        cluster.status(&survivors_at).is_ok_and(|(ok, status)| {
            let members = status["members"].as_array().cloned().unwrap_or_default();
            ok && members.len() == 3
                && members
                    .iter()
                    .all(|m| m["role"] == "voter" && m["node"] != victim_id.as_str())
                && members.iter().filter(|m| m["answered"] == true).count() == 2
        })
    })?;
    // The killed leader comes back (its etcd data is whole): three voters again.
    member(&mut cluster.first, &mut others, leader).start_with_env(&[], &[PAUSE])?;
    let voters: Vec<usize> = (0..addresses.len()).filter(|i| *i != victim).collect();
    let voters_at = voters
        .iter()
        .map(|i| addresses[*i].to_string())
        .collect::<Vec<_>>()
        .join(",");
    cluster.wait_members(&voters_at, 3, 0)?;

    // Case 2: a deposed leader's JoinConsensus, after the role was removed at the new
    // leader, leaves no learner.
    // Before: the join ignored its proof of leadership and added the learner anyway.
    // The restarted member's curator may not listen yet: ask until one answers.
    let mut leader_address = None;
    wait_until("a curator to name the leader", TIMEOUT, || {
        leader_address = voters.iter().find_map(|i| {
            member(&mut cluster.first, &mut others, *i)
                .curator_leader_address()
                .ok()
        });
        leader_address.is_some()
    })?;
    let leader_address = leader_address.context("a leader named")?;
    let deposed = addresses
        .iter()
        .position(|a| *a == leader_address)
        .context("the leader is one of the members")?;
    let rest_at = voters
        .iter()
        .filter(|i| **i != deposed)
        .map(|i| addresses[*i].to_string())
        .collect::<Vec<_>>()
        .join(",");
    // The joining node is played by this test (a registered, approved, committed key
    // that runs no etcd), so that its JoinConsensus call stays open while its leader
    // is frozen: the handler is not cancelled by a caller that gave up.
    let register = e2e::read_register_params(&params)?;
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let key = identity::NodeKey::generate()?;
    let id_j = key.node_id();
    let at_deposed = SocketAddr::new(addresses[deposed], rpc::CURATOR_PORT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let (_updates, certificate) = runtime.block_on(async {
        let channel = rpc::connect(at_deposed, &trust, Some(&rpc::self_signed(&key)?)).await?;
        let mut curator = api::curator_client::CuratorClient::new(channel);
        let mut updates = curator
            .register_node(api::RegisterNodeRequest {
                register_ticket: register.register_ticket.clone(),
                address: e2e::unique_loopback().to_string(),
                ..Default::default()
            })
            .await?
            .into_inner();
        updates.message().await?.context("NEW")?;
        tokio::task::block_in_place(|| cluster.ctl_retry(&["node", "approve", &id_j]))?;
        let certificate = curator
            .commit_node(api::CommitNodeRequest {})
            .await?
            .into_inner()
            .node_certificate;
        anyhow::Ok((updates, certificate))
    })?;
    cluster.ctl_retry(&[
        "--endpoints",
        &voters_at,
        "node",
        "add-role",
        &id_j,
        "ConsensusMember",
    ])?;
    let credentials = rpc::Credentials {
        certificate,
        key_pkcs8: key.pkcs8_der().to_vec(),
    };
    let channel = runtime.block_on(rpc::connect(at_deposed, &trust, Some(&credentials)))?;
    let seen = member(&mut cluster.first, &mut others, deposed)
        .proc()
        .output()
        .lines()
        .count();
    let join = runtime.spawn(async move {
        api::curator_client::CuratorClient::new(channel)
            .join_consensus(api::JoinConsensusRequest {})
            .await
    });
    let old_leader = member(&mut cluster.first, &mut others, deposed);
    wait_for_pause(old_leader, seen, &id_j)
        .context("the leader to pause before adding the joining node's learner")?;
    let pid = old_leader.proc().pid();
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let asked = member(
        &mut cluster.first,
        &mut others,
        *voters
            .iter()
            .find(|i| **i != deposed)
            .context("another voter")?,
    );
    let moved = wait_until("another curator to lead", TIMEOUT, || {
        asked
            .curator_leader_address()
            .is_ok_and(|a| a != addresses[deposed])
    });
    let removal = moved.and_then(|()| {
        cluster.ctl_retry(&[
            "--endpoints",
            &rest_at,
            "node",
            "remove-role",
            &id_j,
            "ConsensusMember",
        ])
    });
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    removal?;
    let answer = runtime.block_on(join)?;
    println!(
        "the deposed leader answered the join: {:?}",
        answer.as_ref().map(|r| r.get_ref().member_id)
    );
    wait_until("no learner left behind", TIMEOUT / 2, || {
        members(&cluster, &voters_at).is_ok_and(|m| {
            m.len() == 3
                && m.iter()
                    .all(|(role, node)| role == "voter" && node != &id_j)
        })
    })?;
    if holds_role(&cluster, &voters_at, &id_j)? {
        bail!("the joining node still holds the role");
    }
    cluster.wait_members(&voters_at, 3, 0)?;
    Ok(())
}
