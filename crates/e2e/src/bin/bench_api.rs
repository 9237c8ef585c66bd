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
//! for N = 1 and 16. Writes are also measured as a raw etcd transaction of the
//! curator's write shape (guard, record, audit entry: `etcd_txn_*`) and through the
//! floor server (`floor_*`, [`e2e::Floor`]): that transaction behind the curator's own
//! mTLS transport and nothing else. For one client that is the least any curator
//! carrying the entry in the change's transaction can cost here; with many, group
//! commit may fold transactions, which the floor does not. Every line has the etcd KV
//! calls the member served per successful curator call (`kv_calls_per_call`, from
//! etcd's own metrics) and the CPU time (user + system, from /proc) per successful call
//! of the node's polis-node and of its etcd while the curator calls ran, and of etcd
//! while the raw calls ran (`curator_cpu_ms_per_call`, `etcd_cpu_ms_per_call`,
//! `raw_etcd_cpu_ms_per_call`): on this machine's two shared cores the call rates move
//! ±20 % between runs, the CPU a call costs much less. Every client has its own
//! connection. One JSON line per call kind and N (the last line printed is one JSON
//! object); a failed curator call is counted, never retried.
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

fn mean_ms(latencies: &[Duration]) -> f64 {
    let total: Duration = latencies.iter().sum();
    total.as_secs_f64() * 1000.0 / latencies.len().max(1) as f64
}

/// Milliseconds of `cpu` per one of `calls`, to 3 digits.
fn per_call_ms(cpu: Duration, calls: usize) -> f64 {
    round(cpu.as_secs_f64() * 1000.0 / calls.max(1) as f64, 3)
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The key standing for the curator's election key in [`e2e::curator_shaped_txn`].
const GUARD_KEY: &str = "bench/guard";
/// About the size of a label write's audit entry as stored.
const AUDIT_ENTRY_BYTES: usize = 400;

#[derive(Default)]
struct Totals {
    curator: Calls,
    etcd: Calls,
    /// Writes only: raw etcd transactions of the curator's write shape
    /// ([`e2e::curator_shaped_txn`]).
    etcd_txn: Calls,
    /// Writes only: the same transactions made by the floor server ([`e2e::Floor`])
    /// for calls over the curator's transport.
    floor: Calls,
    /// etcd KV calls made while the curator calls ran (every KV call of the member,
    /// background work included).
    kv_calls: u64,
    /// CPU time of polis-node and of etcd while the curator calls ran, and of etcd
    /// while the raw calls ran.
    curator_cpu: Duration,
    etcd_cpu_under_curator: Duration,
    etcd_cpu_raw: Duration,
    /// CPU time of etcd while the floor's calls ran.
    etcd_cpu_floor: Duration,
    /// Seconds the curator's handlers took (its RPC histogram: sum, count) while the
    /// curator calls ran.
    server_seconds: f64,
    server_calls: f64,
}

/// (sum, count) of the curator's RPC latency histogram for `method` on `node`.
fn server_latency(node: std::net::IpAddr, method: &str) -> Result<(f64, f64)> {
    let text = e2e::scrape(node)?;
    let series = format!("{{service=\"polis.api.Management\",method=\"{method}\"}} ");
    let value = |family: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "polis_curator_rpc_duration_seconds_{family}{series}"
                ))
            })
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_default()
    };
    Ok((value("sum"), value("count")))
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
    let record = cluster
        .first
        .etcd_get(&record_key)?
        .context("the node record")?;
    // Started before the bench's runtime: the floor has a runtime of its own.
    let floor = kinds
        .contains(&"UpdateNodeLabels")
        .then(|| {
            e2e::Floor::start(
                &cluster.first.socket(),
                e2e::unique_loopback(),
                record.clone(),
                vec![b'e'; AUDIT_ENTRY_BYTES],
            )
        })
        .transpose()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let guard_revision = {
            let mut c = consensus::client::connect_unix(&cluster.first.socket()).await?;
            c.put(GUARD_KEY, "leader", None).await?.header().map_or(0, |h| h.revision())
        };
        let mut results: HashMap<(usize, &str), Totals> = HashMap::new();
        for clients in [1usize, 16] {
            let curators: Vec<_> = (0..clients)
                .map(|_| cluster.owner_client().map(std::sync::Arc::new))
                .collect::<Result<_>>()?;
            let floors: Vec<_> = match &floor {
                Some(f) => (0..clients)
                    .map(|_| f.client().map(std::sync::Arc::new))
                    .collect::<Result<_>>()?,
                None => Vec::new(),
            };
            for f in &floors {
                e2e::floor_write(f).await.context("a first call to the floor")?;
            }
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
                    let server_before = server_latency(cluster.first.address, kind)?;
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
                    let server_after = server_latency(cluster.first.address, kind)?;
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
                    let etcd_txn = if kind == "UpdateNodeLabels" {
                        let (value, entry) = (record.clone(), vec![b'e'; AUDIT_ENTRY_BYTES]);
                        let guard = guard_revision;
                        timed_calls(&etcds, duration, MAX_CALLS, move |mut c, w, i| {
                            let record_key = format!("bench/txn-record/{w}");
                            let txn = e2e::curator_shaped_txn(
                                (GUARD_KEY, guard),
                                (&record_key, &value),
                                (format!("bench/audit/{w}-{i}"), &entry),
                            );
                            async move {
                                match c.txn(txn).await {
                                    Ok(r) if r.succeeded() => Ok(()),
                                    Ok(_) => Err("the transaction's guard failed".to_string()),
                                    Err(e) => Err(e.to_string()),
                                }
                            }
                        })
                        .await
                    } else {
                        Calls::default()
                    };
                    let before_floor = cpu_pair(pids)?;
                    let floor = if kind == "UpdateNodeLabels" {
                        timed_calls(&floors, duration, MAX_CALLS, |c, _, _| async move {
                            e2e::floor_write(&c).await
                        })
                        .await
                    } else {
                        Calls::default()
                    };
                    let totals = results.entry((clients, kind)).or_default();
                    totals.etcd_txn.merge(etcd_txn);
                    totals.floor.merge(floor);
                    totals.etcd_cpu_floor += cpu_pair(pids)?.1 - before_floor.1;
                    totals.server_seconds += server_after.0 - server_before.0;
                    totals.server_calls += server_after.1 - server_before.1;
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
                    "curator_server_mean_ms": round(t.server_seconds * 1000.0 / t.server_calls.max(1.0), 3),
                    "curator_client_mean_ms": round(mean_ms(&t.curator.latencies), 3),
                    "target_ratio": match (bench, clients) {
                        ("api_write", 1) => 0.7,
                        ("api_write", _) => 1.0,
                        _ => 1.1,
                    },
                });
                if kind == "UpdateNodeLabels" {
                    let txn = per_s(&t.etcd_txn);
                    line["etcd_txn_per_s"] = txn.round().into();
                    line["etcd_txn_ratio"] = round(txn / e.max(1e-9), 2).into();
                    line["ratio_to_txn"] = round(c / txn.max(1e-9), 2).into();
                    line["etcd_txn_failed"] = t.etcd_txn.failed.into();
                    let floor = per_s(&t.floor);
                    line["floor_per_s"] = floor.round().into();
                    line["floor_ratio"] = round(floor / e.max(1e-9), 2).into();
                    line["ratio_to_floor"] = round(c / floor.max(1e-9), 2).into();
                    line["floor_mean_ms"] = round(mean_ms(&t.floor.latencies), 3).into();
                    line["floor_failed"] = t.floor.failed.into();
                    line["floor_etcd_cpu_ms_per_call"] =
                        per_call_ms(t.etcd_cpu_floor, t.floor.ok).into();
                    if let Some(e) = &t.floor.first_error {
                        line["floor_first_error"] = e.clone().into();
                    }
                }
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
