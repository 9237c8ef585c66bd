//! No fork, ever: the sequences that used to leave two live clusters under one identity,
//! with real polis-node processes and real etcd, each on its own 3-member cluster (each
//! sequence ends the cluster it ran on):
//! - a second `recover` on another survivor while the first serves: refused;
//! - two `recover`s started at the same moment: one cluster results;
//! - a restore, then two former members started together: they hold back (their data
//!   holds a write the backup lacks) and serve nothing;
//! - a recover on a machine whose clock ran an hour fast, then a restore with a correct
//!   clock: the restore's epoch is still the later one (epochs follow the chain, not the
//!   clock), so the two former members of the fast epoch that hold newer writes hold
//!   back instead of dropping them;
//! - a recover interrupted (SIGKILL) after each of its steps: the next plain start rolls
//!   it back (etcd never forced) or completes it (forced: the claim recorded, CRLs signed
//!   again), and the cluster that results holds every acknowledged write.
//!
//! After each: every write acknowledged before the fault is in the one cluster that
//! acknowledges writes, `cluster status` over every member shows no second cluster, and
//! no member's data was dropped while it held writes the survivor lacked.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, Proc, TIMEOUT, bin, endpoints, wait_until};

/// Fast heartbeats, as in the recover tests.
const NODE_ARGS: [&str; 2] = ["--heartbeat-period-ms=300", "--heartbeat-timeout-ms=1500"];

/// A cluster of three consensus members: the first node taken out of the harness's
/// hands (the tests stop and restart members), with the node IDs in the same order.
struct Three {
    cluster: Cluster,
    nodes: Vec<Node>,
    ids: Vec<String>,
}

fn three_members(dir: &Path) -> Result<Three> {
    let mut cluster = Cluster::bootstrap_with(dir, &[], &NODE_ARGS)?;
    let params = cluster.register_params("nodes")?;
    let (mut m1, id1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id2) = cluster.add_worker("m2", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let placeholder = Node::new(&dir.join("unused"));
    let n0 = std::mem::replace(&mut cluster.first, placeholder);
    cluster.wait_members(&endpoints(&[&n0, &m1, &m2]), 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;
    let ids = vec![n0.key_node_id()?, id1, id2];
    Ok(Three {
        cluster,
        nodes: vec![n0, m1, m2],
        ids,
    })
}

/// `polis-node recover` on `node`'s root (stopped), its output in `node.dir`.
fn recover(node: &Node, name: &str, extra: &[&str]) -> Result<Proc> {
    recover_with_env(node, name, extra, &[])
}

/// `recover` with extra environment variables (a test build's crash point or clock).
fn recover_with_env(node: &Node, name: &str, extra: &[&str], env: &[(&str, &str)]) -> Result<Proc> {
    let mut cmd = Command::new(bin("polis-node"));
    cmd.envs(env.iter().copied());
    cmd.arg("recover")
        .arg("--root")
        .arg(&node.root)
        .arg("--log-format=json")
        .args(NODE_ARGS)
        .args(extra);
    Proc::spawn(
        "polis-node recover",
        cmd,
        &node.dir.join(format!("{name}.log")),
    )
}

/// `polis-node restore` of backup `file` into `root` at `node`'s address; `node` runs
/// it from then on, its curator answering.
fn restore_into(node: &mut Node, root: std::path::PathBuf, file: &Path) -> Result<()> {
    let mut cmd = Command::new(bin("polis-node"));
    cmd.arg("restore")
        .arg("--root")
        .arg(&root)
        .arg("--address")
        .arg(node.address.to_string())
        .arg("--backup")
        .arg(file)
        .arg("--log-format=json")
        .args(NODE_ARGS);
    node.root = root;
    node.proc = Some(Proc::spawn(
        "polis-node restore",
        cmd,
        &node.dir.join("restore.log"),
    )?);
    node.wait_for_curator()
}

fn stop(node: &mut Node) -> Result<()> {
    node.proc().signal(libc::SIGTERM);
    node.proc().wait_exit(TIMEOUT)?;
    Ok(())
}

/// A label `before=yes` on node `id` written through all three; then member 2 lost for
/// good (killed, its root removed) and members 0 and 1 stopped: no quorum anywhere.
fn lose_the_majority(cluster: &Cluster, nodes: &mut [Node], id: &str) -> Result<()> {
    let all = endpoints(&[&nodes[0], &nodes[1], &nodes[2]]);
    cluster.ctl_retry(&["--endpoints", &all, "node", "label", id, "before=yes"])?;
    nodes[2].proc().signal(libc::SIGKILL);
    nodes[2].proc().wait_exit(TIMEOUT)?;
    std::fs::remove_dir_all(&nodes[2].root)?;
    stop(&mut nodes[0])?;
    stop(&mut nodes[1])
}

/// One label write through `endpoint` only: whether it was acknowledged.
fn label_via(cluster: &Cluster, endpoint: &str, id: &str, key: &str) -> Result<bool> {
    let (ok, _, _) = cluster.ctl(&[
        "--endpoints",
        endpoint,
        "node",
        "label",
        id,
        &format!("{key}=yes"),
    ])?;
    Ok(ok)
}

/// The labels of node `id` as the cluster behind `endpoint` has them.
fn labels_via(cluster: &Cluster, endpoint: &str, id: &str) -> Result<serde_json::Value> {
    let out = cluster.ctl_retry(&["--endpoints", endpoint, "node", "list", "-o", "json"])?;
    let nodes: serde_json::Value = serde_json::from_str(&out)?;
    nodes
        .as_array()
        .and_then(|n| n.iter().find(|n| n["id"] == id))
        .map(|n| n["labels"].clone())
        .with_context(|| format!("node {id} not listed through {endpoint}"))
}

/// `cluster status` over `endpoints` never says TWO CLUSTERS; returns its JSON.
fn one_cluster(cluster: &Cluster, endpoints: &str) -> Result<serde_json::Value> {
    let (_, status) = cluster.status(endpoints)?;
    let warnings = status["warnings"].to_string();
    if warnings.contains("TWO CLUSTERS") {
        bail!("two clusters answer: {status}");
    }
    Ok(status)
}

/// How many voters answered in a `cluster status` JSON.
fn voters_answering(status: &serde_json::Value) -> usize {
    status["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "voter" && m["answered"] == true)
                .count()
        })
        .unwrap_or_default()
}

/// The polis-node error line of a refused command.
fn refusal_line(output: &str) -> Result<String> {
    output
        .lines()
        .find(|l| l.starts_with("polis-node: "))
        .map(str::to_string)
        .with_context(|| format!("no error line in: {output}"))
}

#[test]
fn a_second_recover_is_refused_while_the_first_serves() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Three {
        cluster,
        mut nodes,
        ids,
    } = three_members(dir.path())?;
    lose_the_majority(&cluster, &mut nodes, &ids[0])?;

    nodes[0].proc = Some(recover(&nodes[0], "recover", &[])?);
    nodes[0].wait_for_curator()?;
    let first = nodes[0].address.to_string();
    cluster.ctl_retry(&["--endpoints", &first, "node", "label", &ids[0], "one=yes"])?;

    // The second recover, with and without --force: member 0 answers that it serves.
    let epoch_file = nodes[1].root.join("data/etcd/epoch.pb");
    for extra in [&[][..], &["--force"][..]] {
        let mut second = recover(&nodes[1], "second-recover", extra)?;
        let status = second.wait_exit(TIMEOUT)?;
        let output = second.output();
        assert!(
            !status.success(),
            "a second recover must be refused: {output}"
        );
        let line = refusal_line(&output)?;
        assert!(
            line.contains(&ids[0]) && line.contains("newer epoch"),
            "the refusal names the member and its epoch: {line}"
        );
        println!("refused as expected ({extra:?}): {line}");
        assert!(!epoch_file.exists(), "a refused recover claims no epoch");
    }

    // Member 1 started as usual joins the recovered cluster (or keeps what it alone
    // holds): one cluster either way, and every acknowledged write is in it.
    nodes[1].start(&[])?;
    let both = endpoints(&[&nodes[0], &nodes[1]]);
    wait_until("member 1 rejoined or holds back", TIMEOUT, || {
        cluster.status(&both).is_ok_and(|(ok, s)| {
            let voters = voters_answering(&s);
            ok && (voters == 2 || s["warnings"].to_string().contains("holding back"))
        })
    })?;
    one_cluster(&cluster, &both)?;
    let labels = labels_via(&cluster, &first, &ids[0])?;
    assert_eq!(labels["before"], "yes", "{labels}");
    assert_eq!(labels["one"], "yes", "{labels}");
    Ok(())
}

#[test]
fn two_recovers_at_the_same_moment_leave_one_cluster() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Three {
        cluster,
        mut nodes,
        ids,
    } = three_members(dir.path())?;
    lose_the_majority(&cluster, &mut nodes, &ids[0])?;

    let a = recover(&nodes[0], "recover", &[])?;
    let b = recover(&nodes[1], "recover", &[])?;
    nodes[0].proc = Some(a);
    nodes[1].proc = Some(b);
    let both = endpoints(&[&nodes[0], &nodes[1]]);
    // Settled: a quorum, and the other member either a voter again, holding back, or
    // refused outright (its recover saw the first one's claim: exit 1).
    let mut refused = None;
    wait_until("one cluster after two recovers", TIMEOUT, || {
        for (i, node) in nodes.iter_mut().take(2).enumerate() {
            if refused.is_none()
                && let Ok(Some(status)) = node.proc().child.try_wait()
            {
                refused = Some((i, status, node.proc().output()));
            }
        }
        cluster.status(&both).is_ok_and(|(ok, s)| {
            let voters = voters_answering(&s);
            ok && (voters == 2
                || s["warnings"].to_string().contains("holding back")
                || (voters == 1 && refused.is_some()))
        })
    })?;
    if let Some((i, status, output)) = &refused {
        assert!(!status.success(), "member {i}'s recover exited: {output}");
        let line = refusal_line(output)?;
        assert!(line.contains("newer epoch"), "{line}");
        println!("member {i}'s recover was refused: {line}");
    }
    let status = one_cluster(&cluster, &both)?;
    println!("after two recovers: {status}");

    // A write through each member: every one acknowledged is in the cluster that
    // answers through either endpoint.
    let mut acked = Vec::new();
    for (i, node) in nodes.iter().take(2).enumerate() {
        let key = format!("through-{i}");
        if label_via(&cluster, &node.address.to_string(), &ids[0], &key)? {
            acked.push(key);
        }
    }
    assert!(!acked.is_empty(), "the surviving cluster takes writes");
    for node in nodes.iter().take(2) {
        let endpoint = node.address.to_string();
        let (ok, _, _) = cluster.ctl(&["--endpoints", &endpoint, "node", "list"])?;
        if !ok {
            continue; // the member that holds back serves nothing
        }
        let labels = labels_via(&cluster, &endpoint, &ids[0])?;
        assert_eq!(labels["before"], "yes", "{labels}");
        for key in &acked {
            assert_eq!(
                labels[key], "yes",
                "write {key} missing through {endpoint}: {labels}"
            );
        }
    }
    Ok(())
}

#[test]
fn a_restore_then_two_former_members_together_leave_one_cluster() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Three {
        cluster,
        mut nodes,
        ids,
    } = three_members(dir.path())?;
    let all = endpoints(&[&nodes[0], &nodes[1], &nodes[2]]);
    cluster.ctl_retry(&["--endpoints", &all, "node", "label", &ids[1], "before=yes"])?;
    let file = dir.path().join("cluster.polisbackup");
    let file_str = file.to_str().context("utf-8")?;
    cluster.ctl_retry(&["--endpoints", &all, "cluster", "backup", "--out", file_str])?;
    cluster.ctl_retry(&["--endpoints", &all, "node", "label", &ids[1], "after=yes"])?;
    for node in nodes.iter_mut() {
        stop(node)?;
    }

    // The restore on member 0's address, into a new root.
    let address = nodes[0].address.to_string();
    let new_root = dir.path().join("restored-root");
    restore_into(&mut nodes[0], new_root, &file)?;

    // Members 1 and 2 started together with their old roots.
    let kept: Vec<Vec<u8>> = [1, 2]
        .iter()
        .map(|i| std::fs::read(nodes[*i].root.join("data/etcd/member.pb")))
        .collect::<Result<_, _>>()?;
    nodes[1].start(&[])?;
    nodes[2].start(&[])?;
    for i in [1, 2] {
        nodes[i]
            .proc()
            .wait_for_line(TIMEOUT, |l| l.contains("holding back"))
            .with_context(|| format!("member {i} holds back"))?;
    }
    let everyone = endpoints(&[&nodes[0], &nodes[1], &nodes[2]]);
    let status = one_cluster(&cluster, &everyone)?;
    assert_eq!(status["quorum"], true, "{status}");
    println!("after the restore: {status}");

    // Nothing is served through the old members; the restored cluster takes writes and
    // holds the backup's state.
    let old = endpoints(&[&nodes[1], &nodes[2]]);
    for attempt in 0..5 {
        assert!(
            !label_via(&cluster, &old, &ids[1], &format!("old-{attempt}"))?,
            "a write acknowledged by a former member of the old epoch"
        );
    }
    assert!(label_via(&cluster, &address, &ids[1], "restored")?);
    let labels = labels_via(&cluster, &address, &ids[1])?;
    assert_eq!(labels["before"], "yes", "{labels}");
    assert_eq!(labels["restored"], "yes", "{labels}");
    assert!(labels.get("after").is_none(), "{labels}");
    // Their data was kept.
    for (i, member) in [1, 2].iter().zip(kept) {
        let root = &nodes[*i].root;
        assert!(
            root.join("data/etcd/data/member").is_dir(),
            "member {i}'s data kept"
        );
        assert_eq!(std::fs::read(root.join("data/etcd/member.pb"))?, member);
    }
    Ok(())
}

#[test]
fn polisctl_refuses_curators_of_an_older_epoch_than_it_has_seen() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Three {
        cluster,
        mut nodes,
        ids,
    } = three_members(dir.path())?;
    for node in nodes.iter_mut() {
        stop(node)?;
    }
    // Copies of the three roots as they are now: the old epoch, kept aside.
    let copies: Vec<std::path::PathBuf> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let copy = dir.path().join(format!("old-root-{i}"));
            let status = Command::new("cp")
                .arg("-a")
                .arg(&n.root)
                .arg(&copy)
                .status()?;
            anyhow::ensure!(status.success(), "copying {}", n.root.display());
            Ok(copy)
        })
        .collect::<Result<_>>()?;
    // Member 0 recovered: polisctl talks to it and sees its newer epoch.
    nodes[0].proc = Some(recover(&nodes[0], "recover", &[])?);
    nodes[0].wait_for_curator()?;
    let first = nodes[0].address.to_string();
    cluster.ctl_retry(&["--endpoints", &first, "node", "label", &ids[0], "seen=yes"])?;
    let saved = std::fs::read_to_string(cluster.config.join("epoch"))?;
    assert!(
        saved.starts_with("1-"),
        "polisctl saved the epoch it saw: {saved}"
    );
    stop(&mut nodes[0])?;

    // The old roots brought back (as an old disk image would be): the old epoch's
    // members see no newer epoch (member 0's recovered root is away) and serve.
    for (node, copy) in nodes.iter_mut().zip(&copies) {
        let recovered = node.dir.join("recovered-root");
        std::fs::rename(&node.root, &recovered)?;
        std::fs::rename(copy, &node.root)?;
        node.start(&[])?;
    }
    for node in nodes.iter_mut() {
        node.wait_for_curator()?;
    }
    let all = endpoints(&[&nodes[0], &nodes[1], &nodes[2]]);
    let (ok, _, err) = cluster.ctl(&["--endpoints", &all, "node", "list"])?;
    assert!(!ok, "polisctl took an answer from an older epoch");
    assert!(
        err.contains("epoch 0") && err.contains("epoch 1") && err.contains("older than"),
        "the refusal names both epochs: {err}"
    );
    println!("refused as expected: {err}");
    Ok(())
}

/// The epoch number member `node` reports in a `cluster status` JSON.
fn epoch_number(status: &serde_json::Value, node: &str) -> Option<u64> {
    status["members"]
        .as_array()?
        .iter()
        .find(|m| m["node"] == node)?["epoch"]["number"]
        .as_u64()
}

#[test]
fn an_epoch_made_on_a_fast_clock_never_outranks_the_epochs_after_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Three {
        cluster,
        mut nodes,
        ids,
    } = three_members(dir.path())?;
    lose_the_majority(&cluster, &mut nodes, &ids[0])?;

    // Member 0 recovered on a machine whose clock runs an hour fast.
    nodes[0].proc = Some(recover_with_env(
        &nodes[0],
        "recover",
        &[],
        &[("POLIS_TEST_CLOCK_OFFSET_MS", "3600000")],
    )?);
    nodes[0].wait_for_curator()?;
    let first = nodes[0].address.to_string();
    // A second member of the fast epoch: a new node made a consensus member.
    let params = cluster.register_params("more")?;
    let (mut m3, id3) = cluster.add_worker("m3", &params)?;
    cluster.ctl_retry(&[
        "--endpoints",
        &first,
        "node",
        "add-role",
        &id3,
        "ConsensusMember",
    ])?;
    cluster.wait_members(&endpoints(&[&nodes[0], &m3]), 2, 0)?;
    m3.wait_for_curator()?;
    let fast = endpoints(&[&nodes[0], &m3]);

    // A backup, then a write only the two members of the fast epoch hold.
    cluster.ctl_retry(&[
        "--endpoints",
        &fast,
        "node",
        "label",
        &ids[0],
        "backed-up=yes",
    ])?;
    let file = dir.path().join("cluster.polisbackup");
    let file_str = file.to_str().context("utf-8")?;
    cluster.ctl_retry(&["--endpoints", &fast, "cluster", "backup", "--out", file_str])?;
    cluster.ctl_retry(&["--endpoints", &fast, "node", "label", &ids[0], "newer=yes"])?;
    stop(&mut nodes[0])?;
    stop(&mut m3)?;

    // The restore, with a correct clock, at member 2's old address (its root is gone).
    let address = nodes[2].address.to_string();
    let restored_root = dir.path().join("restored-root");
    restore_into(&mut nodes[2], restored_root, &file)?;

    // The two former members of the fast epoch come back together: their epoch is the
    // restore's parent, so they hold back, keeping the write the backup lacks.
    let kept: Vec<Vec<u8>> = [&nodes[0], &m3]
        .iter()
        .map(|n| std::fs::read(n.root.join("data/etcd/epoch.pb")))
        .collect::<Result<_, _>>()?;
    nodes[0].start(&[])?;
    m3.start(&[])?;
    for (name, node) in [("member 0", &mut nodes[0]), ("m3", &mut m3)] {
        node.proc()
            .wait_for_line(TIMEOUT, |l| l.contains("holding back"))
            .with_context(|| format!("{name} holds back"))?;
    }
    let everyone = endpoints(&[&nodes[0], &m3, &nodes[2]]);
    let status = one_cluster(&cluster, &everyone)?;
    println!("after the restore: {status}");
    let restorer = nodes[2].key_node_id()?;
    assert_eq!(
        epoch_number(&status, &restorer),
        Some(2),
        "the restore continues the fast epoch: {status}"
    );
    for attempt in 0..3 {
        assert!(
            !label_via(&cluster, &fast, &ids[0], &format!("old-{attempt}"))?,
            "a write acknowledged by a member of the superseded epoch"
        );
    }
    let labels = labels_via(&cluster, &address, &ids[0])?;
    assert_eq!(labels["backed-up"], "yes", "{labels}");
    assert!(labels.get("newer").is_none(), "{labels}");
    for (node, member) in [&nodes[0], &m3].iter().zip(kept) {
        assert!(
            node.root.join("data/etcd/data/member").is_dir(),
            "{}: the data holding the newer write was dropped",
            node.root.display()
        );
        assert_eq!(std::fs::read(node.root.join("data/etcd/epoch.pb"))?, member);
    }
    Ok(())
}

#[test]
fn a_recover_interrupted_after_any_step_is_rolled_back_or_completed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Three {
        cluster,
        mut nodes,
        ids,
    } = three_members(dir.path())?;
    lose_the_majority(&cluster, &mut nodes, &ids[0])?;
    let first = nodes[0].address.to_string();
    let progress = nodes[0].root.join("data/etcd/recover.pb");

    // Killed right after the claim: etcd never forced, so the next plain start rolls the
    // claim back (it never advertises an epoch nobody recorded) and serves nothing.
    let mut killed = recover_with_env(
        &nodes[0],
        "recover-claimed",
        &[],
        &[("POLIS_CRASH_AFTER", "recover-claimed")],
    )?;
    let status = killed.wait_exit(TIMEOUT)?;
    assert!(
        !status.success(),
        "the crash point killed recover: {}",
        killed.output()
    );
    assert!(progress.exists(), "the recover's progress is on disk");
    nodes[0].start(&[])?;
    nodes[0]
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("rolled back"))
        .context("the unforced claim is rolled back")?;
    assert!(!progress.exists());
    stop(&mut nodes[0])?;

    // Killed after each later step: the next plain start completes the recover.
    let mut acked = vec!["before".to_string()];
    for (number, step) in [
        "recover-forcing",
        "recover-forced",
        "recover-recorded",
        "recover-crls",
    ]
    .iter()
    .enumerate()
    {
        let mut killed = recover_with_env(&nodes[0], step, &[], &[("POLIS_CRASH_AFTER", step)])?;
        let status = killed.wait_exit(TIMEOUT)?;
        let output = killed.output();
        assert!(
            !status.success(),
            "{step}: the crash point killed recover: {output}"
        );
        assert!(
            output.contains("killing this process"),
            "{step}: recover died elsewhere: {output}"
        );
        assert!(
            progress.exists(),
            "{step}: the recover's progress is on disk"
        );
        nodes[0].start(&[])?;
        nodes[0]
            .proc()
            .wait_for_line(TIMEOUT, |l| l.contains("completing it"))
            .with_context(|| format!("{step}: the plain start completes the recover"))?;
        nodes[0].wait_for_curator()?;
        nodes[0]
            .proc()
            .wait_for_line(TIMEOUT, |l| l.contains("new epoch is recorded"))
            .with_context(|| format!("{step}: the claim is recorded"))?;
        assert!(
            nodes[0].proc().output().contains("CRL signed again"),
            "{step}: the CRLs are signed again"
        );
        wait_until("the recover's progress removed", TIMEOUT, || {
            !progress.exists()
        })?;
        let (_, status) = cluster.status(&first)?;
        assert_eq!(
            epoch_number(&status, &ids[0]),
            Some(number as u64 + 1),
            "{step}: {status}"
        );
        let key = format!("after-{step}");
        cluster.ctl_retry(&[
            "--endpoints",
            &first,
            "node",
            "label",
            &ids[0],
            &format!("{key}=yes"),
        ])?;
        acked.push(key);
        stop(&mut nodes[0])?;
    }

    // The recovered member, then the former member 1: one cluster, every write in it.
    nodes[0].start(&[])?;
    nodes[0].wait_for_curator()?;
    nodes[1].start(&[])?;
    let both = endpoints(&[&nodes[0], &nodes[1]]);
    wait_until("member 1 rejoined or holds back", TIMEOUT, || {
        cluster.status(&both).is_ok_and(|(ok, s)| {
            ok && (voters_answering(&s) == 2 || s["warnings"].to_string().contains("holding back"))
        })
    })?;
    one_cluster(&cluster, &both)?;
    let labels = labels_via(&cluster, &first, &ids[0])?;
    for key in &acked {
        assert_eq!(labels[key.as_str()], "yes", "{key} missing: {labels}");
    }
    Ok(())
}
