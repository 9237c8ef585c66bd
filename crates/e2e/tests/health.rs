//! Node health, status and Split with real polis-node processes on 127.x addresses: a
//! 3-member control plane and a worker, heartbeating every second with a 5 s timeout
//! (the hidden timing flags).
//!
//! - `node describe` shows what each node reports (version, services, start time);
//! - a worker stopped (SIGSTOP) for three timeouts shows HEARTBEAT_TIMEOUT once, sampled
//!   repeatedly never alternating, also while it gets one heartbeat through now and
//!   then; each transition is persisted (and logged) once, and it is HEALTHY again
//!   after it continues;
//! - a worker whose curators all stop answering logs Split after the timeout, and Home
//!   when they answer again;
//! - a curator leader failover (kill -9 of the leader's node) flips none of the healthy
//!   nodes.
//!
//! One cluster for the whole file: the cases run in turn on it.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use e2e::{Cluster, Node, TIMEOUT, endpoints};
use serde_json::Value;

const PERIOD_MS: u64 = 1000;
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// Health of every listed node, by ID, asked through `endpoints`.
fn health(cluster: &Cluster, endpoints: &str) -> Result<HashMap<String, String>> {
    let out = cluster.ctl_retry(&["--endpoints", endpoints, "node", "list", "-o", "json"])?;
    let nodes: Value = serde_json::from_str(&out)?;
    Ok(nodes
        .as_array()
        .context("a JSON list")?
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap_or_default().to_string(),
                n["health"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// `node describe ID -o json`.
fn describe(cluster: &Cluster, id: &str) -> Result<Value> {
    Ok(serde_json::from_str(
        &cluster.ctl_retry(&["node", "describe", id, "-o", "json"])?,
    )?)
}

/// Waits until `node describe` shows a status for which `check` holds.
fn wait_status(cluster: &Cluster, id: &str, check: impl Fn(&Value) -> bool) -> Result<Value> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let node = describe(cluster, id)?;
        if check(&node["status"]) {
            return Ok(node["status"].clone());
        }
        if Instant::now() > deadline {
            bail!("node {id} never showed the expected status; last: {node}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Lines of `proc`'s output from line `from` on.
fn lines_after(node: &mut Node, from: usize) -> Vec<String> {
    node.proc()
        .output()
        .lines()
        .skip(from)
        .map(str::to_string)
        .collect()
}

fn line_count(node: &mut Node) -> usize {
    node.proc().output().lines().count()
}

fn is_state_line(line: &str, state: &str) -> bool {
    serde_json::from_str::<Value>(line).is_ok_and(|v| v["fields"]["cluster_state"] == state)
}

/// Waits until `node` logs cluster state `state` after line `from`; returns its index.
fn wait_state_after(node: &mut Node, from: usize, state: &str) -> Result<usize> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(i) = lines_after(node, from)
            .iter()
            .position(|l| is_state_line(l, state))
        {
            return Ok(from + i);
        }
        if Instant::now() > deadline {
            bail!("no cluster state {state} logged after line {from}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Log lines, across `nodes`, saying that node `id`'s health was recorded as `verdict`
/// coming from `from`.
fn recorded_transitions(nodes: &mut [&mut Node], id: &str, from: &str, verdict: &str) -> usize {
    let message = format!("node health: {verdict}");
    let from = format!("\"from\":\"{from}\"");
    nodes
        .iter_mut()
        .map(|n| {
            n.proc()
                .output()
                .lines()
                .filter(|l| l.contains(&message) && l.contains(id) && l.contains(&from))
                .count()
        })
        .sum()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

#[test]
fn health_status_split_and_failover() -> Result<()> {
    let test_start_ms = unix_ms();
    let dir = tempfile::tempdir()?;
    let period = format!("--heartbeat-period-ms={PERIOD_MS}");
    let timeout = format!("--heartbeat-timeout-ms={}", HEARTBEAT_TIMEOUT.as_millis());
    let mut cluster = Cluster::bootstrap_with(dir.path(), &[], &[&period, &timeout])?;
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
    let ids = [&id_n0, &id_m1, &id_m2, &id_w];
    for id in ids {
        cluster.wait_node(id, "UP", Some("HEALTHY"))?;
    }

    // Status: what each node reports with its heartbeats.
    let version = env!("CARGO_PKG_VERSION");
    let member = wait_status(&cluster, &id_m1, |s| {
        s["services"] == serde_json::json!(["etcd-member", "curator"])
    })?;
    let worker = wait_status(&cluster, &id_w, |s| s["version"] == version)?;
    assert_eq!(worker["services"], serde_json::json!([]), "{worker}");
    assert_eq!(worker["address"], w.address.to_string(), "{worker}");
    assert_eq!(member["version"], version, "{member}");
    for status in [&member, &worker] {
        let started = status["started_at_unix_ms"]
            .as_u64()
            .context("start time")?;
        assert!(
            (test_start_ms..=unix_ms()).contains(&started),
            "start time {started} outside this test's run: {status}"
        );
    }
    let text = cluster.ctl_retry(&["node", "describe", &id_m1])?;
    for expected in [
        format!("Version:   {version}"),
        "Services:  etcd-member, curator".to_string(),
        "Started:   20".to_string(),
    ] {
        assert!(text.contains(&expected), "no {expected:?} in:\n{text}");
    }
    println!("status: {member}");

    // A worker stopped for three timeouts: HEARTBEAT_TIMEOUT once, never alternating.
    w.proc().signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let mut seen = Vec::new();
    while stopped.elapsed() < 3 * HEARTBEAT_TIMEOUT {
        let h = health(&cluster, &all)?;
        seen.push((stopped.elapsed(), h[&id_w].clone()));
        for id in [&id_n0, &id_m1, &id_m2] {
            assert_eq!(h[id], "HEALTHY", "node {id} while the worker is stopped");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let first_timeout = seen
        .iter()
        .position(|(_, h)| h == "HEARTBEAT_TIMEOUT")
        .with_context(|| format!("never HEARTBEAT_TIMEOUT: {seen:?}"))?;
    // Its last heartbeat came at most one period before it stopped.
    assert!(
        seen[first_timeout].0 >= HEARTBEAT_TIMEOUT - Duration::from_millis(PERIOD_MS),
        "timed out before the timeout: {seen:?}"
    );
    assert!(
        seen[..first_timeout].iter().all(|(_, h)| h == "HEALTHY"),
        "{seen:?}"
    );
    assert!(
        seen[first_timeout..]
            .iter()
            .all(|(_, h)| h == "HEARTBEAT_TIMEOUT"),
        "alternated: {seen:?}"
    );
    // Back for a moment now and then (one heartbeat each time, more than a timeout
    // apart): without hysteresis it would flip to HEALTHY each time; it stays.
    for _ in 0..3 {
        w.proc().signal(libc::SIGCONT);
        let continued = Instant::now();
        // Stopped again once its heartbeat arrived, well within one period.
        loop {
            let since = describe(&cluster, &id_w)?["time_since_heartbeat_ms"].as_u64();
            if since.is_some_and(|ms| Duration::from_millis(ms) < continued.elapsed()) {
                break;
            }
            ensure!(
                continued.elapsed() < Duration::from_millis(PERIOD_MS * 9 / 10),
                "no heartbeat within 0.9 periods of SIGCONT"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        w.proc().signal(libc::SIGSTOP);
        let flicker = Instant::now();
        while flicker.elapsed() < HEARTBEAT_TIMEOUT + Duration::from_secs(1) {
            let h = health(&cluster, &all)?[&id_w].clone();
            ensure!(
                h == "HEARTBEAT_TIMEOUT",
                "alternated to {h} after a flicker"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    w.proc().signal(libc::SIGCONT);
    let resumed = Instant::now();
    let mut after = Vec::new();
    loop {
        let h = health(&cluster, &all)?[&id_w].clone();
        after.push((resumed.elapsed(), h.clone()));
        if h == "HEALTHY" {
            break;
        }
        ensure!(
            resumed.elapsed() < TIMEOUT,
            "never HEALTHY again: {after:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let healthy_again = Instant::now();
    while healthy_again.elapsed() < HEARTBEAT_TIMEOUT {
        let h = health(&cluster, &all)?[&id_w].clone();
        ensure!(h == "HEALTHY", "flipped after recovering: {h} {after:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    {
        let mut nodes = [&mut cluster.first, &mut m1, &mut m2];
        let recorded =
            |nodes: &mut [&mut Node], from, to| recorded_transitions(nodes, &id_w, from, to);
        assert_eq!(recorded(&mut nodes, "HEALTHY", "HEARTBEAT_TIMEOUT"), 1);
        assert_eq!(recorded(&mut nodes, "HEARTBEAT_TIMEOUT", "HEALTHY"), 1);
    }
    println!(
        "stopped worker: HEARTBEAT_TIMEOUT after {:?} ({} samples), HEALTHY {:?} after SIGCONT",
        seen[first_timeout].0,
        seen.len(),
        after.last().map(|a| a.0)
    );

    // Every curator stops answering: the worker is Split after the timeout, Home again
    // once they answer.
    let mark = line_count(&mut w);
    for node in [&mut cluster.first, &mut m1, &mut m2] {
        node.proc().signal(libc::SIGSTOP);
    }
    let cut = Instant::now();
    let split_line = wait_state_after(&mut w, mark, "Split");
    let split_after = cut.elapsed();
    for node in [&mut cluster.first, &mut m1, &mut m2] {
        node.proc().signal(libc::SIGCONT);
    }
    let split_line = split_line?;
    assert!(
        split_after >= HEARTBEAT_TIMEOUT,
        "Split after only {split_after:?}"
    );
    let home_line = wait_state_after(&mut w, split_line + 1, "Home")?;
    let between = lines_after(&mut w, split_line + 1);
    assert!(
        !between[..home_line - split_line - 1]
            .iter()
            .any(|l| is_state_line(l, "Split")),
        "Split twice before Home"
    );
    println!("split: Split {split_after:?} after the curators stopped, then Home");
    for id in ids {
        cluster.wait_node(id, "UP", Some("HEALTHY"))?;
    }

    // Failover: kill -9 the curator leader's node; nobody else flips.
    let leader = cluster.first.curator_leader_address()?;
    let mut members = [&mut cluster.first, &mut m1, &mut m2];
    let leader_node = members
        .iter_mut()
        .find(|n| n.address == leader)
        .context("the leader is a member")?;
    let leader_id = leader_node.key_node_id()?;
    leader_node.proc().signal(libc::SIGKILL);
    leader_node.proc().wait_exit(TIMEOUT)?;
    let killed = Instant::now();
    let survivors: Vec<&Node> = [&cluster.first, &m1, &m2]
        .into_iter()
        .filter(|n| n.address != leader)
        .collect();
    let survivors = endpoints(&survivors);
    let mut samples = 0;
    let mut leader_timed_out = None;
    while killed.elapsed() < 3 * HEARTBEAT_TIMEOUT || leader_timed_out.is_none() {
        ensure!(
            killed.elapsed() < TIMEOUT,
            "the dead leader's node never timed out"
        );
        let h = health(&cluster, &survivors)?;
        samples += 1;
        for id in ids.iter().filter(|id| ***id != leader_id) {
            assert_eq!(
                h[*id],
                "HEALTHY",
                "node {id} flipped {:?} after the failover",
                killed.elapsed()
            );
        }
        if h[&leader_id] == "HEARTBEAT_TIMEOUT" && leader_timed_out.is_none() {
            leader_timed_out = Some(killed.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "failover: {samples} samples over {:?}, every live node HEALTHY; the dead leader HEARTBEAT_TIMEOUT after {:?}",
        killed.elapsed(),
        leader_timed_out
    );
    Ok(())
}
