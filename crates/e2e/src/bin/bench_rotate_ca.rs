//! `scripts/bench rotate-ca [WORKERS] [ROUNDS]`: cluster CA rotations on a cluster of 3
//! consensus members and WORKERS (default 4) workers, all real polis-node processes,
//! under continuous label writes (polisctl, one after another, following the rotation
//! as any operator's configuration does).
//!
//! Per round: the time from `cluster rotate-ca` to the new CA signing and to the old
//! one retired, the writes acknowledged meanwhile and any that failed, and the longest
//! gap between two acknowledged writes. Rounds follow each other on the same cluster
//! (each rotates away from the CA the previous one introduced). The last line is one
//! JSON object.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, median};

/// How long one rotation may take before the bench gives up.
const ROTATION_BOUND: Duration = Duration::from_secs(300);

fn ctl(config: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    let mut all = vec!["--config", config.to_str().context("utf-8 path")?];
    all.extend_from_slice(args);
    let (status, out, err) = e2e::polisctl(&all)?;
    Ok((status.success(), out, err))
}

/// Label writes one after another until `stop`: when each was acknowledged, and the
/// failures.
fn writer(config: PathBuf, node: String, stop: Arc<AtomicBool>) -> (Vec<Instant>, Vec<String>) {
    let mut acked = Vec::new();
    let mut failed = Vec::new();
    let mut n = 0u64;
    // Bounded in count as well as by `stop`.
    while !stop.load(Ordering::Relaxed) && n < 100_000 {
        n += 1;
        match ctl(
            &config,
            &["node", "label", &node, &format!("bench-rotation={n}")],
        ) {
            Ok((true, _, _)) => acked.push(Instant::now()),
            Ok((false, _, err)) => failed.push(err.trim().to_string()),
            Err(e) => failed.push(format!("{e:#}")),
        }
    }
    (acked, failed)
}

struct Round {
    signing_ms: f64,
    retired_ms: f64,
    writes: usize,
    failed: Vec<String>,
    longest_gap_ms: f64,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

fn round(config: &Path, target: &str) -> Result<Round> {
    let stop = Arc::new(AtomicBool::new(false));
    let writing = {
        let (config, target, stop) = (config.to_path_buf(), target.to_string(), stop.clone());
        std::thread::spawn(move || writer(config, target, stop))
    };
    // A first acknowledged write before the rotation: gaps are measured from there.
    std::thread::sleep(Duration::from_millis(500));
    // Refused until every node reported the CAs it trusts (its first heartbeat status).
    let asked = Instant::now();
    let (started, (ok, _, err)) = loop {
        let started = Instant::now();
        let answer = ctl(config, &["cluster", "rotate-ca"])?;
        if answer.0 || !answer.2.contains("has not reported") || asked.elapsed() > ROTATION_BOUND {
            break (started, answer);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !ok {
        stop.store(true, Ordering::Relaxed);
        bail!("rotate-ca: {err}");
    }
    let mut signing = None;
    let retired = loop {
        if started.elapsed() > ROTATION_BOUND {
            stop.store(true, Ordering::Relaxed);
            bail!("the rotation did not finish within {ROTATION_BOUND:?}");
        }
        let (ok, out, _) = ctl(config, &["cluster", "ca", "-o", "json"])?;
        if ok {
            let state: serde_json::Value = serde_json::from_str(&out)?;
            match state["phase"].as_str() {
                Some("reissuing") if signing.is_none() => signing = Some(started.elapsed()),
                Some("settled") => break started.elapsed(),
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Writes go on a little past the retirement: the gap across it counts too.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (acked, failed) = writing
        .join()
        .map_err(|_| anyhow::anyhow!("the writer panicked"))?;
    let during: Vec<Instant> = acked
        .iter()
        .copied()
        .filter(|at| *at >= started && at.duration_since(started) <= retired)
        .collect();
    let longest_gap = acked
        .windows(2)
        .filter(|w| w[1] >= started)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap_or_default();
    Ok(Round {
        signing_ms: ms(signing.unwrap_or(retired)),
        retired_ms: ms(retired),
        writes: during.len(),
        failed,
        longest_gap_ms: ms(longest_gap),
    })
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let workers: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3);
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("nodes")?;
    let mut nodes = Vec::new();
    for i in 1..=2 + workers {
        nodes.push(cluster.add_worker(&format!("n{i}"), &params)?);
    }
    for (_, id) in nodes.iter().take(2) {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let members = e2e::endpoints(&[&cluster.first, &nodes[0].0, &nodes[1].0]);
    cluster.wait_members(&members, 3, 0)?;
    cluster.ctl_retry(&["cluster", "info"])?;
    let target = nodes.last().context("a worker")?.1.clone();
    println!(
        "cluster: 3 members, {workers} workers; {rounds} rotations under polisctl label writes"
    );
    let mut results = Vec::new();
    for i in 1..=rounds {
        let r = round(&cluster.config, &target)?;
        println!(
            "  rotation {i}: new CA signing after {:.0} ms, old CA retired after {:.0} ms; \
             {} writes acknowledged meanwhile, {} failed, longest gap {:.0} ms",
            r.signing_ms,
            r.retired_ms,
            r.writes,
            r.failed.len(),
            r.longest_gap_ms
        );
        for f in r.failed.iter().take(3) {
            println!("    failed: {f}");
        }
        results.push(r);
    }
    let retired: Vec<f64> = results.iter().map(|r| r.retired_ms).collect();
    let gaps: Vec<f64> = results.iter().map(|r| r.longest_gap_ms).collect();
    let summary = serde_json::json!({
        "bench": "rotate-ca",
        "members": 3,
        "workers": workers,
        "rounds": rounds,
        "signing_ms": results.iter().map(|r| r.signing_ms).collect::<Vec<_>>(),
        "retired_ms": retired,
        "retired_ms_median": median(retired.clone()),
        "longest_gap_ms": gaps.iter().copied().fold(0.0, f64::max),
        "writes": results.iter().map(|r| r.writes).sum::<usize>(),
        "failed_writes": results.iter().map(|r| r.failed.len()).sum::<usize>(),
        "load_average": std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string(),
    });
    drop(nodes);
    println!("{summary}");
    Ok(())
}
