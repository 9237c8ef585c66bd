//! Benchmark: what metrics cost the curator. A one-node cluster is bootstrapped (release
//! build); then, alternately in one run, its polis-node is restarted with metrics on
//! (the default: every call counted and timed by the RPC layer, `/metrics` served and
//! scraped once a second as Prometheus would) and with `--no-metrics`, and each time 16
//! owner clients call ListNodes and DescribeNode for a fixed time, each over its own
//! mutual-TLS connection:
//!
//! ```text
//!   round r: on → off (odd rounds: off → on)   each: restart, warm up, measure
//! ```
//! One JSON line per measurement; the last line printed is one JSON object: calls/s with
//! metrics on and off (summed over rounds) and their ratio (target ≥ 0.97).
//!
//! Usage: bench-api-metrics [SECONDS_PER_MEASUREMENT] [ROUNDS]   (default 5 and 3)

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::{Cluster, METRICS_PORT, TIMEOUT, http_get, seconds_and_rounds, timed_calls};
use proto::api;
use serde_json::json;

const CLIENTS: usize = 16;
/// Calls per client and measurement, at most (a bound on a runaway loop).
const MAX_CALLS: usize = 1_000_000;

/// Calls made by every client in `duration` (failed calls are counted apart): ListNodes
/// and DescribeNode in turn.
async fn measure(
    clients: &[Arc<rpc::CuratorClient>],
    id: &str,
    duration: Duration,
) -> (usize, usize) {
    let id = id.to_string();
    let calls = timed_calls(clients, duration, MAX_CALLS, move |c, _, i| {
        let id = id.clone();
        async move {
            c.call(|ch| {
                let id = id.clone();
                async move {
                    let mut m = api::management_client::ManagementClient::new(ch);
                    if i % 2 == 0 {
                        m.list_nodes(api::ListNodesRequest::default())
                            .await
                            .map(|r| r.map(drop))
                    } else {
                        m.describe_node(api::DescribeNodeRequest { id })
                            .await
                            .map(|r| r.map(drop))
                    }
                }
            })
            .await
            .map(drop)
        }
    })
    .await;
    (calls.ok, calls.failed)
}

fn main() -> Result<()> {
    let (seconds, rounds) = seconds_and_rounds(std::env::args().skip(1), 5.0, 3)?;
    let duration = Duration::from_secs_f64(seconds.clamp(0.5, 60.0));
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap(dir.path())?;
    let id = cluster.first.key_node_id()?;
    let metrics_at = SocketAddr::new(cluster.first.address, METRICS_PORT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (mut on, mut off) = ((0usize, 0usize), (0usize, 0usize));
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for metrics in order {
            // Restart the node in this mode.
            if let Some(proc) = cluster.first.proc.as_mut() {
                proc.signal(libc::SIGTERM);
                proc.wait_exit(TIMEOUT)?;
            }
            cluster.first.proc = None;
            cluster
                .first
                .start(if metrics { &[] } else { &["--no-metrics"] })?;
            cluster.first.wait_for_curator()?;
            let (calls, failed) = runtime.block_on(async {
                let clients: Vec<_> = (0..CLIENTS)
                    .map(|_| cluster.owner_client().map(Arc::new))
                    .collect::<Result<_>>()?;
                // Connections up and the leader known before the clock runs.
                let warm = measure(&clients, &id, Duration::from_millis(500)).await;
                anyhow::ensure!(warm.0 > 0, "no call succeeded while warming up");
                // A scraper as Prometheus would run one, while metrics are on.
                let scraping = Arc::new(AtomicBool::new(metrics));
                let scraper = {
                    let scraping = scraping.clone();
                    std::thread::spawn(move || {
                        let mut scrapes = 0usize;
                        let deadline = Instant::now() + duration + Duration::from_secs(5);
                        while scraping.load(Ordering::Relaxed) && Instant::now() < deadline {
                            if http_get(metrics_at, "/metrics").is_ok_and(|(s, _)| s == 200) {
                                scrapes += 1;
                            }
                            std::thread::sleep(Duration::from_secs(1));
                        }
                        scrapes
                    })
                };
                let result = measure(&clients, &id, duration).await;
                scraping.store(false, Ordering::Relaxed);
                let scrapes = scraper.join().expect("scraper panicked");
                anyhow::ensure!(!metrics || scrapes > 0, "/metrics never answered");
                anyhow::Ok(result)
            })?;
            println!(
                "{}",
                json!({
                    "bench": "api_metrics_step",
                    "round": round,
                    "metrics": metrics,
                    "calls_per_s": (calls as f64 / duration.as_secs_f64()).round(),
                    "failed": failed,
                })
            );
            let t = if metrics { &mut on } else { &mut off };
            *t = (t.0 + calls, t.1 + failed);
        }
    }
    let per_s = |calls: usize| (calls as f64 / (rounds as f64 * duration.as_secs_f64())).round();
    println!(
        "{}",
        json!({
            "bench": "api_metrics",
            "clients": CLIENTS,
            "calls": "ListNodes + DescribeNode",
            "on_per_s": per_s(on.0),
            "off_per_s": per_s(off.0),
            "ratio": ((on.0 as f64 / off.0.max(1) as f64) * 1000.0).round() / 1000.0,
            "failed": on.1 + off.1,
            "target_ratio": 0.97,
        })
    );
    Ok(())
}
