//! etcd upkeep across a curator failover, with real polis-node processes and real etcd
//! on 127.x addresses: a 3-member cluster with a 2 MiB backend quota is filled until
//! NOSPACE while one member is paused (so the alarm cannot clear yet); then the
//! curator leader's polis-node is killed (SIGKILL: its etcd dies with it) and comes
//! back. Under NOSPACE no curator can be elected (a campaign needs a lease grant), so
//! the alarm is cleared by the no-leader path of the upkeep (the curator of etcd's
//! leader member); afterwards a curator leads again and writes work, with no operator
//! action.
//!
//! Under NOSPACE the upkeep passes over a minority silent for upkeep::SILENT_GRACE (60 s),
//! so the alarm clears while the killed node is still down (it might be gone for good: removing it needs a curator
//! leader, which cannot be elected before the alarm clears); the killed node is started
//! again afterwards and rejoins.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, TIMEOUT, endpoints, wait_until};

/// 128 labels with 63-character values that differ per round: one node record of about
/// 10 KiB, a new revision on every write.
fn label_args(round: usize) -> Vec<String> {
    (0..proto::labels::MAX_LABELS)
        .map(|j| format!("k{j}={:0>63}", format!("{round}x{j}")))
        .collect()
}

fn alarms(status: &serde_json::Value) -> Vec<String> {
    status["alarms"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["alarm"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Every log line under `dir` containing `text`.
fn log_lines(dir: &std::path::Path, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                let content = std::fs::read_to_string(&path).unwrap_or_default();
                found.extend(
                    content
                        .lines()
                        .filter(|l| l.contains(text))
                        .map(String::from),
                );
            }
        }
    }
    found
}

#[test]
fn nospace_clears_after_the_curator_leader_is_killed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap_with(
        dir.path(),
        &["--etcd-quota", "2MiB"],
        &[
            "--etcd-upkeep-period-ms",
            "500",
            "--etcd-defrag-floor-bytes",
            "1048576",
        ],
    )?;
    let params = cluster.register_params("workers")?;
    let (w1, id1) = cluster.add_worker("w1", &params)?;
    let (w2, id2) = cluster.add_worker("w2", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let n0_id = cluster.first.key_node_id()?;
    let all = endpoints(&[&cluster.first, &w1, &w2]);
    cluster.wait_members(&all, 3, 0)?;
    let mut others = vec![w1, w2];
    for node in &mut others {
        node.wait_for_curator()?;
    }

    // Which node's curator leads; the first node among the others is paused.
    let leader_address = cluster.first.curator_leader_address()?;
    let leader_is_first = cluster.first.address == leader_address;
    let (killed_index, paused_index) = if leader_is_first {
        (None, 0)
    } else {
        let k = others
            .iter()
            .position(|n| n.address == leader_address)
            .context("the curator leader is a member")?;
        (Some(k), 1 - k)
    };
    others[paused_index].proc().signal(libc::SIGSTOP);
    let leader_endpoint = leader_address.to_string();

    // Fill etcd through the leader until a write is refused.
    let mut writes = 0;
    let refusal = loop {
        let mut args = vec!["--endpoints", &leader_endpoint, "node", "label", &n0_id];
        let labels = label_args(writes);
        args.extend(labels.iter().map(String::as_str));
        let (ok, _, err) = cluster.ctl(&args)?;
        if !ok {
            break err;
        }
        writes += 1;
        if writes > 2000 {
            bail!("2000 label writes of ~10 KiB never hit a 2 MiB quota");
        }
    };
    assert!(refusal.contains("out of space"), "{refusal}");
    // Logged by a curator before it asks etcd to disarm (the answer may never be
    // logged: the task can be cancelled once the disarm lets a curator be elected).
    const DISARMING: &str = "disarming etcd's NOSPACE alarm";
    let disarms_before = log_lines(dir.path(), DISARMING).len();

    // Kill the curator leader, resume the paused member; the killed one stays down.
    let killed_at = Instant::now();
    let killed: &mut Node = match killed_index {
        None => &mut cluster.first,
        Some(k) => &mut others[k],
    };
    killed.proc = None; // SIGKILL; etcd follows (PDEATHSIG)
    others[paused_index].proc().signal(libc::SIGCONT);

    // The alarm clears by itself, and writes work again through any curator.
    let mut last = serde_json::Value::Null;
    wait_until(
        "the NOSPACE alarm to clear after the failover",
        Duration::from_secs(180),
        || match cluster.status(&all) {
            Ok((true, s)) => {
                let clear = alarms(&s).is_empty();
                last = s;
                clear
            }
            _ => false,
        },
    )
    .with_context(|| format!("last status: {last}"))?;
    println!("alarm cleared {:?} after the kill", killed_at.elapsed());
    assert!(
        log_lines(dir.path(), DISARMING).len() > disarms_before,
        "the alarm cleared without a curator disarming it"
    );
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut args = vec!["--endpoints", &all, "node", "label", &n0_id];
        let labels = label_args(writes + 1);
        args.extend(labels.iter().map(String::as_str));
        let (ok, _, err) = cluster.ctl(&args)?;
        if ok {
            break;
        }
        if Instant::now() > deadline {
            bail!("writes never worked again: {err}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The killed node comes back; a curator leads, and all three members answer.
    let killed: &mut Node = match killed_index {
        None => &mut cluster.first,
        Some(k) => &mut others[k],
    };
    killed.start(&[])?;
    killed.wait_home()?;
    cluster.wait_members(&all, 3, 0)?;
    let mut leader = None;
    wait_until("a curator leader named by n0", TIMEOUT, || {
        leader = cluster.first.curator_leader_address().ok();
        leader.is_some()
    })?;
    println!("curator leader after the failover: {leader:?}");
    Ok(())
}
