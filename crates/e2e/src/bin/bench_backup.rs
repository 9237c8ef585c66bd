//! Benchmark: `polisctl cluster backup` against `etcdctl snapshot save` of the same etcd.
//! A one-node cluster is bootstrapped (release build) and its etcd filled to at least
//! 100 MB directly through its unix socket (keys under `bench-fill/`, outside every
//! Polis namespace: the curator's API would take far too long). Then, alternately in one
//! run, both tools save the whole database as a process each (start-up included): polisctl
//! over mutual TLS through the node's curator (which streams its etcd member's snapshot),
//! etcdctl on etcd's unix socket. Throughput is the file written over the wall time;
//! medians and their ratio (goal ≥ 0.8). The last line printed is one JSON object.
//!
//! Usage: bench-backup [ROUNDS] [MIN_MB]   (default 3 and 100)

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use e2e::{Cluster, median};

/// One value of the fill: incompressible enough, well under etcd's request limit.
const VALUE_BYTES: usize = 512 * 1024;

/// Puts values until etcd's database is at least `min_bytes`; returns its size.
async fn fill(socket: &Path, min_bytes: u64) -> Result<u64> {
    let mut client = consensus::connect_unix(socket).await?;
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut i = 0u64;
    loop {
        let size = client.status().await?.db_size() as u64;
        if size >= min_bytes {
            return Ok(size);
        }
        for _ in 0..16 {
            let value: Vec<u8> = (0..VALUE_BYTES)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            client
                .put(format!("bench-fill/{i:08}"), value, None)
                .await?;
            i += 1;
        }
    }
}

/// Runs a command, returning its wall time in seconds.
fn timed(mut command: Command) -> Result<f64> {
    let started = Instant::now();
    let out = command.output().context("running a backup tool")?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(secs)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(3), |a| a.parse()).context("ROUNDS")?;
    let min_mb: u64 = args
        .next()
        .map_or(Ok(100), |a| a.parse())
        .context("MIN_MB")?;
    ensure!(rounds > 0, "need at least one round");
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let node = &cluster.first;
    let runtime = tokio::runtime::Runtime::new()?;
    let db = runtime.block_on(fill(&node.socket(), min_mb * 1_000_000))?;
    let mb = db as f64 / 1e6;
    println!("etcd database: {mb:.1} MB");
    let polis_out = dir.path().join("polis.backup");
    let etcd_out = dir.path().join("etcd.snapshot");
    let (mut polis, mut etcd) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let _ = std::fs::remove_file(&polis_out);
        let _ = std::fs::remove_file(&etcd_out);
        let mut ctl = Command::new(e2e::bin("polisctl"));
        ctl.arg("--config")
            .arg(&cluster.config)
            .args(["--endpoints", &node.address.to_string()])
            .args(["cluster", "backup", "-o", "json", "--out"])
            .arg(&polis_out);
        let p = timed(ctl)?;
        let mut etcdctl = Command::new("etcdctl");
        etcdctl
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=unix://{}", node.socket().display()))
            .args(["snapshot", "save"])
            .arg(&etcd_out);
        let e = timed(etcdctl)?;
        // Each tool's own output: the snapshot (plus, for polisctl, < 1 KiB of framing).
        let written = |path: &Path| std::fs::metadata(path).map(|m| m.len() as f64 / 1e6);
        let (p_rate, e_rate) = (written(&polis_out)? / p, written(&etcd_out)? / e);
        println!(
            "round {round}: polisctl cluster backup {p:.2} s ({p_rate:.0} MB/s), \
             etcdctl snapshot save {e:.2} s ({e_rate:.0} MB/s)"
        );
        polis.push(p_rate);
        etcd.push(e_rate);
    }
    let backup_size = std::fs::metadata(&polis_out)?.len();
    let snapshot_size = std::fs::metadata(&etcd_out)?.len();
    println!("files: backup {backup_size} bytes, etcd snapshot {snapshot_size} bytes");
    let (p, e) = (median(polis), median(etcd));
    let ratio = p / e;
    println!(
        "median over {rounds}: polisctl {p:.0} MB/s, etcdctl {e:.0} MB/s, ratio {ratio:.2} (goal ≥ 0.8)"
    );
    let round1 = |x: f64| (x * 10.0).round() / 10.0;
    println!(
        "{}",
        serde_json::json!({
            "bench": "backup",
            "db_mb": round1(mb),
            "polisctl_mb_s": round1(p),
            "etcdctl_mb_s": round1(e),
            "ratio": (ratio * 100.0).round() / 100.0,
        })
    );
    Ok(())
}
