//! Benchmark: polis-node start → cluster state Home, against bare etcd (same flags)
//! start → first successful put. Runs both alternately, prints each sample, the medians
//! and their ratio; the last line is one JSON object.
//!
//! Usage: bench-bootstrap [REPETITIONS]   (default 7)

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::{BareEtcd, Node, TIMEOUT, is_home_line, median, unique_loopback};

fn polis_once() -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    let params = node.bootstrap_params()?;
    let params = params.to_str().context("utf-8 path")?.to_string();
    let proc = node.start(&["--params", &params])?;
    proc.wait_for_line(TIMEOUT, is_home_line)?;
    let ms = proc.started.elapsed().as_secs_f64() * 1000.0;
    proc.signal(libc::SIGTERM);
    proc.wait_exit(TIMEOUT)?;
    Ok(ms)
}

async fn etcd_once() -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let etcd = BareEtcd::spawn(
        dir.path(),
        unique_loopback(),
        consensus::RaftTiming::default(),
    )?;
    let started = etcd.proc.started;
    let deadline = Instant::now() + TIMEOUT;
    let mut client = etcd.client(TIMEOUT).await?;
    loop {
        let put =
            tokio::time::timeout(Duration::from_secs(2), client.put("bench", "1", None)).await;
        if let Ok(Ok(_)) = put {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "etcd never accepted a put");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

fn main() -> Result<()> {
    let reps: usize = match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .with_context(|| format!("repetitions {a:?} is not a number"))?,
        None => 7,
    };
    anyhow::ensure!(reps > 0, "need at least one repetition");
    let rt = tokio::runtime::Runtime::new()?;
    let (mut polis, mut etcd) = (Vec::new(), Vec::new());
    for i in 0..reps {
        let p = polis_once().context("polis-node sample")?;
        let e = rt.block_on(etcd_once()).context("bare etcd sample")?;
        println!("rep {i}: polis-node start→Home {p:.1} ms, bare etcd start→first put {e:.1} ms");
        polis.push(p);
        etcd.push(e);
    }
    let (p, e) = (median(polis), median(etcd));
    let ratio = p / e;
    println!(
        "median over {reps}: polis {p:.1} ms, etcd {e:.1} ms, ratio {ratio:.2} (target ≤ 1.5)"
    );
    println!(
        "{}",
        serde_json::json!({"bench": "bootstrap", "polis_ms": (p * 10.0).round() / 10.0, "etcd_ms": (e * 10.0).round() / 10.0, "ratio": (ratio * 100.0).round() / 100.0})
    );
    Ok(())
}
