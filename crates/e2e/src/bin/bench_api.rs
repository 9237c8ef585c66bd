//! Benchmark: the curator's API against the etcd under it. A one-node cluster is
//! bootstrapped (release build); then, alternately in one run, N clients call the curator
//! over mutual TLS with the owner certificate and N clients make the equivalent raw etcd
//! request on the same etcd through its unix socket, each for a fixed time:
//!
//! ```text
//!   api_read   ListNodes               vs  range read of the node prefix
//!              DescribeNode            vs  get of the node record
//!   api_write  UpdateNodeLabels        vs  put of a record-sized value
//!              (all on the one node)       (all on one key)
//! ```
//! for N = 1 and 16, with the etcd KV calls the member served per successful curator
//! call (`kv_calls_per_call`, from etcd's own metrics) and the CPU time (user + system,
//! from /proc) per successful call of the node's polis-node and of its etcd while the
//! curator calls ran, and of etcd while the raw calls ran (`curator_cpu_ms_per_call`,
//! `etcd_cpu_ms_per_call`, `raw_etcd_cpu_ms_per_call`): on this machine's two shared
//! cores the call rates move ±20 % between runs, the CPU a call costs much less. Every
//! client has its own connection. One JSON line per call kind and
//! N (the last line printed is one JSON object); a failed curator call is counted, never
//! retried.
//!
//! Usage: bench-api [SECONDS_PER_MEASUREMENT] [ROUNDS] [CALL,…]   (default 2, 2 and all
//! three calls; e.g. `UpdateNodeLabels` alone, to profile it)

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{Calls, Cluster, seconds_and_rounds, timed_calls, write_label};
use proto::api;

/// Calls per client and measurement, at most (a bound on a runaway loop).
const MAX_CALLS: usize = 1_000_000;

fn p99_ms(latencies: &mut [Duration]) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    latencies.sort();
    let i = ((latencies.len() as f64) * 0.99).ceil() as usize;
    latencies[i.clamp(1, latencies.len()) - 1].as_secs_f64() * 1000.0
}

/// Milliseconds of `cpu` per one of `calls`, to 3 digits.
fn per_call_ms(cpu: Duration, calls: usize) -> f64 {
    round(cpu.as_secs_f64() * 1000.0 / calls.max(1) as f64, 3)
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

#[derive(Default)]
struct Totals {
    curator: Calls,
    etcd: Calls,
    /// etcd KV calls made while the curator calls ran (every KV call of the member,
    /// background work included).
    kv_calls: u64,
    /// CPU time of polis-node and of etcd while the curator calls ran, and of etcd
    /// while the raw calls ran.
    curator_cpu: Duration,
    etcd_cpu_under_curator: Duration,
    etcd_cpu_raw: Duration,
}

/// CPU time of (polis-node, etcd) so far.
fn cpu_pair(pids: (i32, i32)) -> Result<(Duration, Duration)> {
    Ok((e2e::cpu_time(pids.0)?, e2e::cpu_time(pids.1)?))
}

fn main() -> Result<()> {
    let (seconds, rounds) = seconds_and_rounds(std::env::args().skip(1), 2.0, 2)?;
    let all = ["ListNodes", "DescribeNode", "UpdateNodeLabels"];
    let kinds: Vec<&str> = match std::env::args().nth(3) {
        None => all.to_vec(),
        Some(list) => list
            .split(',')
            .map(|k| {
                all.iter()
                    .find(|a| a.eq_ignore_ascii_case(k))
                    .copied()
                    .with_context(|| format!("unknown call {k:?}; the calls are {all:?}"))
            })
            .collect::<Result<_>>()?,
    };
    let duration = Duration::from_secs_f64(seconds.clamp(0.2, 60.0));
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap(dir.path())?;
    let id = cluster.first.key_node_id()?;
    let pids = (cluster.first.proc().pid(), cluster.first.etcd_pid()?);
    let record_key = format!("namespaced:curator/nodes/{id}");
    let node_prefix = "namespaced:curator/nodes/".to_string();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let record = cluster
            .first
            .etcd_get(&record_key)?
            .context("the node record")?;
        let mut results: HashMap<(usize, &str), Totals> = HashMap::new();
        for clients in [1usize, 16] {
            let curators: Vec<_> = (0..clients)
                .map(|_| cluster.owner_client().map(std::sync::Arc::new))
                .collect::<Result<_>>()?;
            let mut etcds = Vec::new();
            for _ in 0..clients {
                etcds.push(consensus::client::connect_unix(&cluster.first.socket()).await?);
            }
            // Connections up and the leader known before the clock runs.
            for c in &curators {
                c.call(|ch| async move {
                    api::management_client::ManagementClient::new(ch)
                        .list_nodes(api::ListNodesRequest::default())
                        .await
                })
                .await?;
            }
            for _ in 0..rounds {
                for &kind in &kinds {
                    let kv_before = cluster.first.etcd_kv_calls()?;
                    let cpu_before = cpu_pair(pids)?;
                    let curator = match kind {
                        "ListNodes" => {
                            timed_calls(&curators, duration, MAX_CALLS, |c, _, _| async move {
                                c.call(|ch| async move {
                                    api::management_client::ManagementClient::new(ch)
                                        .list_nodes(api::ListNodesRequest::default())
                                        .await
                                })
                                .await
                                .map(drop)
                            })
                            .await
                        }
                        "DescribeNode" => {
                            let id = id.clone();
                            timed_calls(&curators, duration, MAX_CALLS, move |c, _, _| {
                                let id = id.clone();
                                async move {
                                    c.call(|ch| {
                                        let id = id.clone();
                                        async move {
                                            api::management_client::ManagementClient::new(ch)
                                                .describe_node(api::DescribeNodeRequest { id })
                                                .await
                                        }
                                    })
                                    .await
                                    .map(drop)
                                }
                            })
                            .await
                        }
                        _ => {
                            let id = id.clone();
                            timed_calls(&curators, duration, MAX_CALLS, move |c, w, i| {
                                let id = id.clone();
                                async move {
                                    write_label(&c, &id, &format!("bench-{w}"), &i.to_string())
                                        .await
                                }
                            })
                            .await
                        }
                    };
                    let cpu_between = cpu_pair(pids)?;
                    let kv_calls = cluster.first.etcd_kv_calls()? - kv_before;
                    let etcd = match kind {
                        "ListNodes" => {
                            let prefix = node_prefix.clone();
                            timed_calls(&etcds, duration, MAX_CALLS, move |mut c, _, _| {
                                let prefix = prefix.clone();
                                async move {
                                    c.get(
                                        prefix,
                                        Some(etcd_client::GetOptions::new().with_prefix()),
                                    )
                                    .await
                                    .map(drop)
                                }
                            })
                            .await
                        }
                        "DescribeNode" => {
                            let key = record_key.clone();
                            timed_calls(&etcds, duration, MAX_CALLS, move |mut c, _, _| {
                                let key = key.clone();
                                async move { c.get(key, None).await.map(drop) }
                            })
                            .await
                        }
                        _ => {
                            let value = record.clone();
                            timed_calls(&etcds, duration, MAX_CALLS, move |mut c, _, _| {
                                let value = value.clone();
                                async move { c.put("bench/record", value, None).await.map(drop) }
                            })
                            .await
                        }
                    };
                    let cpu_after = cpu_pair(pids)?;
                    let totals = results.entry((clients, kind)).or_default();
                    totals.kv_calls += kv_calls;
                    totals.curator_cpu += cpu_between.0 - cpu_before.0;
                    totals.etcd_cpu_under_curator += cpu_between.1 - cpu_before.1;
                    totals.etcd_cpu_raw += cpu_after.1 - cpu_between.1;
                    totals.curator.merge(curator);
                    totals.etcd.merge(etcd);
                }
            }
            for &kind in &kinds {
                let t = results.get_mut(&(clients, kind)).expect("measured");
                let per_s = |s: &Calls| s.total() as f64 / (rounds as f64 * duration.as_secs_f64());
                let (c, e) = (per_s(&t.curator), per_s(&t.etcd));
                let (cp, ep) = (
                    p99_ms(&mut t.curator.latencies),
                    p99_ms(&mut t.etcd.latencies),
                );
                let bench = if kind == "UpdateNodeLabels" {
                    "api_write"
                } else {
                    "api_read"
                };
                let mut line = serde_json::json!({
                    "bench": bench,
                    "call": kind,
                    "clients": clients,
                    "curator_per_s": c.round(),
                    "etcd_per_s": e.round(),
                    "ratio": round(c / e.max(1e-9), 2),
                    "p99_ms": round(cp, 2),
                    "curator_p99_ms": round(cp, 2),
                    "etcd_p99_ms": round(ep, 2),
                    "p99_ratio": round(cp / ep.max(1e-9), 2),
                    "failed": t.curator.failed,
                    "etcd_failed": t.etcd.failed,
                    "kv_calls_per_call": round(t.kv_calls as f64 / (t.curator.ok.max(1) as f64), 2),
                    "curator_cpu_ms_per_call": per_call_ms(t.curator_cpu, t.curator.ok),
                    "etcd_cpu_ms_per_call": per_call_ms(t.etcd_cpu_under_curator, t.curator.ok),
                    "raw_etcd_cpu_ms_per_call": per_call_ms(t.etcd_cpu_raw, t.etcd.ok),
                    "target_ratio": match (bench, clients) {
                        ("api_write", 1) => 0.7,
                        ("api_write", _) => 1.0,
                        _ => 1.1,
                    },
                });
                if let Some(e) = &t.curator.first_error {
                    line["first_error"] = e.clone().into();
                }
                println!("{line}");
            }
        }
        anyhow::Ok(())
    })?;
    Ok(())
}
