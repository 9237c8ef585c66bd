//! etcd upkeep with real polis-node processes and real etcd on 127.x addresses: a
//! 3-member cluster bootstrapped with a small backend quota (2 MiB) is filled by label
//! writes until etcd refuses them (NOSPACE); polisctl says so clearly; `cluster status`
//! shows the alarm; without operator action the curator compacts, defragments each
//! member and disarms the alarm; writes work again and every member's database shrank.
//!
//! To see the alarm for sure before it clears, one member's polis-node is paused
//! (SIGSTOP) before the fill: the upkeep never defragments while a member does not
//! answer, so the alarm stays until it is resumed.

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

/// The node whose curator leads, asked of `at`.
fn curator_leader<'a>(at: &Node, candidates: &[&'a Node]) -> Result<&'a Node> {
    let leader = at.curator_leader_address()?;
    candidates
        .iter()
        .find(|n| n.address == leader)
        .copied()
        .context("the curator leader is one of the members")
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

/// (node, db size) of every member that answered.
fn db_sizes(status: &serde_json::Value) -> Vec<(String, u64)> {
    status["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter_map(|m| Some((m["node"].as_str()?.to_string(), m["db_size"].as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn nospace_is_reported_and_cleared_by_the_curator() -> Result<()> {
    let dir = tempfile::tempdir()?;

    // A quota below the floor is refused up front, and no parameters are written.
    let refused = Node::new(&dir.path().join("refused"));
    std::fs::create_dir_all(&refused.dir)?;
    let err = refused
        .bootstrap_params_with(&["--etcd-quota", "1MiB"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("too small"), "{err}");
    assert!(!refused.dir.join("params.pb").exists());
    let err = refused
        .bootstrap_params_with(&["--etcd-quota", "lots"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a size"), "{err}");

    let quota: u64 = 2 << 20;
    let cluster = Cluster::bootstrap_with(
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
    let (mut w1, id1) = cluster.add_worker("w1", &params)?;
    let (mut w2, id2) = cluster.add_worker("w2", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let n0 = &cluster.first;
    let all = endpoints(&[n0, &w1, &w2]);
    cluster.wait_members(&all, 3, 0)?;
    for node in [&mut w1, &mut w2] {
        node.wait_for_curator()?;
    }
    // Every member's etcd runs with the cluster's quota, the joined ones included.
    for node in [n0, &w1, &w2] {
        let recorded = std::fs::read(node.root.join("data/etcd/quota.pb"))?;
        let recorded: proto::config::EtcdQuota = prost::Message::decode(recorded.as_slice())?;
        assert_eq!(recorded.quota_backend_bytes, quota);
    }
    let n0_id = n0.key_node_id()?;

    // Pause a member that does not lead the curators: the alarm cannot clear meanwhile.
    let leader = curator_leader(n0, &[n0, &w1, &w2])?;
    let leader_endpoint = leader.address.to_string();
    let leader_address = leader.address;
    let paused: &mut Node = if w1.address != leader_address {
        &mut w1
    } else {
        &mut w2
    };
    paused.proc().signal(libc::SIGSTOP);
    let paused_address = paused.address;

    // Fill etcd through the leader until a write is refused.
    let started = Instant::now();
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
    println!(
        "NOSPACE after {writes} writes in {:?}: {refusal}",
        started.elapsed()
    );
    assert!(refusal.contains("out of space"), "{refusal}");
    assert!(refusal.contains("clears by itself"), "{refusal}");
    assert!(!refusal.to_lowercase().contains("internal"), "{refusal}");

    // `cluster status` (from the members that answer) shows the alarm and the sizes.
    let running = endpoints(&[
        n0,
        if w1.address == paused_address {
            &w2
        } else {
            &w1
        },
    ]);
    let (_, full) = cluster.status(&running)?;
    assert!(alarms(&full).iter().any(|a| a == "NOSPACE"), "{full}");
    let full_sizes = db_sizes(&full);
    assert!(full_sizes.len() >= 2, "{full}");
    // Still refused while the paused member keeps the upkeep from defragmenting.
    let mut args = vec!["--endpoints", &leader_endpoint, "node", "label", &n0_id];
    let labels = label_args(writes + 1);
    args.extend(labels.iter().map(String::as_str));
    let (ok, _, err) = cluster.ctl(&args)?;
    assert!(!ok && err.contains("out of space"), "{err}");
    let (ok, out, err) = cluster.ctl(&["--endpoints", &running, "cluster", "status"])?;
    assert!(ok, "{err}");
    assert!(out.contains("alarm: etcd NOSPACE"), "{out}");
    assert!(out.contains("DB SIZE") && out.contains("IN USE"), "{out}");

    // Nothing was defragmented while a member did not answer.
    assert!(defragmentations(dir.path())?.is_empty());

    // Resume it: the alarm clears by itself, and writes work again.
    if w1.address == paused_address {
        w1.proc().signal(libc::SIGCONT);
    } else {
        w2.proc().signal(libc::SIGCONT);
    }
    let resumed = Instant::now();
    let mut last = serde_json::Value::Null;
    wait_until(
        "the NOSPACE alarm to clear by itself",
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
    println!("alarm cleared {:?} after resuming", resumed.elapsed());
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut args = vec!["node", "label", &n0_id];
        let labels = label_args(writes + 2);
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

    // Every member answered with its sizes; each shrank below what it was when full.
    let status = cluster.wait_members(&all, 3, 0)?;
    let sizes = db_sizes(&status);
    assert_eq!(sizes.len(), 3, "{status}");
    for m in status["members"].as_array().context("members")? {
        let (size, in_use) = (m["db_size"].as_u64(), m["db_size_in_use"].as_u64());
        assert!(size.is_some() && in_use.is_some(), "{m}");
        assert!(in_use <= size, "{m}");
    }
    for (node, before) in &full_sizes {
        let after = sizes
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, s)| *s)
            .context("member still listed")?;
        println!("member {node}: db {before} → {after} bytes");
        assert!(after < before / 2, "member {node}: {before} → {after}");
    }
    for (_, size) in &sizes {
        assert!(*size < quota * 3 / 4, "{status}");
    }
    // The curator leader defragmented each of the three members, the etcd leader
    // last.
    let order = defragmentations(dir.path())?;
    let distinct: std::collections::BTreeSet<_> = order.iter().collect();
    assert_eq!(distinct.len(), 3, "defragmented members: {order:?}");
    let etcd_leader = status["members"]
        .as_array()
        .context("members")?
        .iter()
        .find(|m| m["leader"] == true)
        .and_then(|m| m["member_id"].as_str())
        .context("an etcd leader")?;
    assert_eq!(
        order.last().map(String::as_str),
        Some(etcd_leader),
        "{order:?}"
    );
    Ok(())
}

/// The members the curators logged defragmenting (hex IDs), in the order of each log.
fn defragmentations(dir: &std::path::Path) -> Result<Vec<String>> {
    let mut members = Vec::new();
    for entry in walk(dir)? {
        if entry.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&entry).unwrap_or_default();
            for line in text
                .lines()
                .filter(|l| l.contains("defragmented etcd member"))
            {
                let value: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
                if let Some(m) = value["fields"]["member"].as_str() {
                    members.push(m.to_string());
                }
            }
        }
    }
    Ok(members)
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                files.push(path);
            }
        }
    }
    Ok(files)
}
