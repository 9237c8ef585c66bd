//! Benchmark: what a stranger's worst sustained flood does to etcd's database. A
//! one-node cluster (release build, default limits) is flooded for SECONDS (600) by
//! strangers, each call from a fresh self-signed key and, every few calls, a fresh
//! 127.x source address (so that no per-source limit holds it back), FLOODERS at a time:
//!
//! ```text
//!   RegisterNode   bad ticket, one 60 000-byte label key of control characters
//!   CommitNode     a key that never registered
//!   UnlockData     a key that is no node
//! ```
//! Every 10 s etcd's database size and size in use are read (its own status), and one
//! JSON line per minute is printed; the last line is the summary:
//! `{"bench":"flood","seconds":…,"calls":…,"answered":…,"db_in_use_start":…,
//! "db_in_use_max":…,"db_in_use_end":…,"db_size_max":…,"growth_bound_bytes":…}`.
//! The bound holds by construction (docs/limits.md): the audit log's budget (8 MiB),
//! the history the upkeep lets etcd keep (16 MiB), and what refused calls can write
//! while history is too young to compact (30 s) plus one upkeep period (10 s): at most
//! 1 024 tally windows and one overflow window per audited RPC (20) and status code
//! (17) every 10 s, of at most 4 KiB each; ~47.5 MB in all ([`growth_bound`]).
//!
//! Usage: bench-flood [SECONDS] [FLOODERS]   (default 600 and 8)

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::{Cluster, unique_loopback};
use proto::api;
use serde_json::json;

/// Calls per flooder at most (a bound on the loop besides its time).
const MAX_CALLS_PER_FLOODER: u64 = 2_000_000;
/// Calls from one source address before a flooder moves to another.
const CALLS_PER_SOURCE: u64 = 10;
/// Each call's bound.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The growth etcd's database may show by construction, from the constants that set
/// it: the audit budget, the history bound of the upkeep, and the tally entries written
/// while history is too young to compact plus one upkeep period.
fn growth_bound() -> i64 {
    let upkeep = curator::upkeep::Settings::DEFAULT;
    let audited = rpc::authz::METHODS
        .iter()
        .filter(|(m, _)| rpc::authz::audited(m))
        .count();
    // gRPC status codes: 0 (never counted) to 16.
    let windows_per_window_length = curator::audit::tally::MAX_WINDOWS + audited * 17;
    let window_lengths = (upkeep.history_min_age + upkeep.period)
        .as_micros()
        .div_ceil(u128::from(curator::audit::tally::WINDOW_MICROS))
        as usize;
    let tally_bytes =
        windows_per_window_length * window_lengths * curator::audit::bounds::MAX_ENTRY_BYTES;
    (curator::audit::bounds::DEFAULT_MAX_BYTES + upkeep.history_bytes) as i64 + tally_bytes as i64
}

async fn db_sizes(cluster: &Cluster) -> Result<(i64, i64)> {
    let mut client = consensus::connect_unix(&cluster.first.socket()).await?;
    let status = consensus::maintenance::status(&mut client).await?;
    Ok((status.db_size, status.db_size_in_use))
}

/// One stranger's call, of kind `n % 3`, from `source` with a fresh key.
async fn stranger_call(
    endpoint: SocketAddr,
    trust: &rpc::ServerTrust,
    source: IpAddr,
    n: u64,
    label: &str,
) -> Result<()> {
    let key = identity::NodeKey::generate()?;
    let slot = rpc::CredentialSlot::new(rpc::self_signed(&key)?)?;
    let channel = rpc::connect_from(endpoint, trust, Some(&slot), Some(source)).await?;
    let answer = match n % 3 {
        0 => api::curator_client::CuratorClient::new(channel)
            .register_node(api::RegisterNodeRequest {
                register_ticket: b"not-a-ticket".to_vec(),
                address: source.to_string(),
                labels: [(label.to_string(), "v".to_string())].into(),
                ..Default::default()
            })
            .await
            .map(drop),
        1 => api::curator_client::CuratorClient::new(channel)
            .commit_node(api::CommitNodeRequest {})
            .await
            .map(drop),
        _ => api::data_unlock_client::DataUnlockClient::new(channel)
            .unlock_data(api::UnlockDataRequest::default())
            .await
            .map(drop),
    };
    // Refusals are what a stranger gets; either way the call was made.
    let _ = answer;
    Ok(())
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args
        .next()
        .map(|a| a.parse().context("SECONDS must be a number"))
        .transpose()?
        .unwrap_or(600)
        .clamp(10, 3600);
    let flooders: usize = args
        .next()
        .map(|a| a.parse().context("FLOODERS must be a number"))
        .transpose()?
        .unwrap_or(8)
        .clamp(1, 64);
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let ca = std::fs::read(cluster.first.root.join("data/node/ca.der"))?;
    let trust = rpc::ServerTrust::PinnedCa(ca);
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (size_start, in_use_start) = db_sizes(&cluster).await?;
        let calls = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let label = Arc::new("\u{1}".repeat(60_000));
        let mut tasks = tokio::task::JoinSet::new();
        for f in 0..flooders as u64 {
            let (calls, answered, trust, label) = (
                calls.clone(),
                answered.clone(),
                trust.clone(),
                label.clone(),
            );
            tasks.spawn(async move {
                let mut source = unique_loopback();
                for n in 0..MAX_CALLS_PER_FLOODER {
                    if Instant::now() >= deadline {
                        break;
                    }
                    if n % CALLS_PER_SOURCE == 0 {
                        source = unique_loopback();
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                    let call = stranger_call(endpoint, &trust, source, n + f, &label);
                    if let Ok(Ok(())) = tokio::time::timeout(CALL_TIMEOUT, call).await {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        let (mut size_max, mut in_use_max) = (size_start, in_use_start);
        let started = Instant::now();
        let mut next_line = Duration::from_secs(60);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(10).min(deadline - Instant::now())).await;
            let (size, in_use) = db_sizes(&cluster).await?;
            size_max = size_max.max(size);
            in_use_max = in_use_max.max(in_use);
            if started.elapsed() >= next_line {
                next_line += Duration::from_secs(60);
                println!(
                    "{}",
                    json!({
                        "bench": "flood_minute",
                        "elapsed_s": started.elapsed().as_secs(),
                        "calls": calls.load(Ordering::Relaxed),
                        "db_size": size,
                        "db_in_use": in_use,
                    })
                );
            }
        }
        while tasks.join_next().await.is_some() {}
        let (size_end, in_use_end) = db_sizes(&cluster).await?;
        size_max = size_max.max(size_end);
        in_use_max = in_use_max.max(in_use_end);
        println!(
            "{}",
            json!({
                "bench": "flood",
                "seconds": seconds,
                "flooders": flooders,
                "calls": calls.load(Ordering::Relaxed),
                "answered": answered.load(Ordering::Relaxed),
                "db_size_start": size_start,
                "db_in_use_start": in_use_start,
                "db_in_use_max": in_use_max,
                "db_in_use_end": in_use_end,
                "db_size_max": size_max,
                "db_in_use_growth_max": in_use_max - in_use_start,
                "growth_bound_bytes": growth_bound(),
                "within_bound": in_use_max - in_use_start <= growth_bound(),
            })
        );
        anyhow::Ok(())
    })
}
