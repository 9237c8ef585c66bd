//! Benchmark: `polisctl node logs -f` against a node that logs 10 000 lines a second.
//! A one-node cluster is bootstrapped (release build) with the hidden
//! `--log-test-lines-per-second` flag; one `node logs -f -o json --runnable
//! root.logtest` follows it for SECONDS while the node's RSS is sampled every 100 ms.
//! Reported: lines produced (by the test lines' own numbering) and received per
//! second, lines the reader was told it missed ("dropped" markers), the node's RSS when
//! the follow began and at its highest, and the ring's bound in lines. The last line
//! printed is one JSON object.
//!
//! Usage: bench-logs [SECONDS] [LINES_PER_SECOND]   (default 10 and 10000)

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::Cluster;

/// The node's resident set size, in KiB.
fn rss_kib(pid: i32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    let rate: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap_with(
        dir.path(),
        &[],
        &["--log-test-lines-per-second", &rate.to_string()],
    )?;
    let id = cluster.first.key_node_id()?;
    let pid = cluster.first.proc().pid();
    // The node serves its logs once it holds the cluster CRL.
    e2e::wait_until("the node to serve its logs", e2e::TIMEOUT, || {
        cluster
            .ctl(&["node", "logs", &id, "-n", "1"])
            .is_ok_and(|(ok, _, _)| ok)
    })?;

    let config = cluster.config.to_str().context("utf-8 path")?.to_string();
    let mut follow = Command::new(e2e::bin("polisctl"))
        .args([
            "--config",
            &config,
            "node",
            "logs",
            &id,
            "-f",
            "-n",
            "1",
            "--runnable",
            "root.logtest",
            "-o",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting polisctl node logs -f")?;
    let (received, dropped, first, last) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let reader = {
        let stdout = follow.stdout.take().context("piped stdout")?;
        let (received, dropped, first, last) = (
            received.clone(),
            dropped.clone(),
            first.clone(),
            last.clone(),
        );
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if let Some(n) = v["dropped"].as_u64() {
                    dropped.fetch_add(n, Ordering::Relaxed);
                    continue;
                }
                let number = v["text"]
                    .as_str()
                    .and_then(|t| t.strip_prefix("log test line "))
                    .and_then(|n| n.parse::<u64>().ok());
                if let Some(n) = number {
                    let _ = first.compare_exchange(0, n, Ordering::Relaxed, Ordering::Relaxed);
                    last.store(n, Ordering::Relaxed);
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let rss_start = rss_kib(pid)?;
    let mut rss_max = rss_start;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(100));
        rss_max = rss_max.max(rss_kib(pid)?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    follow.kill()?;
    follow.wait()?;
    reader.join().expect("reader thread");
    let (received, dropped) = (
        received.load(Ordering::Relaxed),
        dropped.load(Ordering::Relaxed),
    );
    let produced = last
        .load(Ordering::Relaxed)
        .saturating_sub(first.load(Ordering::Relaxed))
        + 1;
    let summary = serde_json::json!({
        "bench": "logs",
        "seconds": elapsed,
        "lines_per_second_asked": rate,
        "lines_produced_per_second": produced as f64 / elapsed,
        "lines_received_per_second": received as f64 / elapsed,
        "lines_produced": produced,
        "lines_received": received,
        "lines_dropped": dropped,
        "kept_up": dropped == 0 && received >= produced,
        "node_rss_mib_at_start": rss_start as f64 / 1024.0,
        "node_rss_mib_max": rss_max as f64 / 1024.0,
        "node_rss_growth_mib": (rss_max - rss_start) as f64 / 1024.0,
        "ring_lines": 10_000,
        "ring_bound_mib": 10_000.0 * 2048.0 / (1024.0 * 1024.0),
    });
    eprintln!(
        "node logs -f: {received} of {produced} lines in {elapsed:.1} s, {dropped} dropped; node RSS {:.1} → {:.1} MiB (max)",
        rss_start as f64 / 1024.0,
        rss_max as f64 / 1024.0
    );
    println!("{summary}");
    drop(cluster);
    Ok(())
}
