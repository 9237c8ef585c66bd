//! Benchmark: how many nodes one curator takes heartbeats from. A one-node cluster is
//! bootstrapped (release build, production heartbeat timing); then N simulated nodes in
//! this process, each a real node — its own key, registered with the ticket
//! (RegisterNode), approved by the owner (ApproveNode), committed (CommitNode) and so
//! holding its own node certificate — heartbeat the curator at the production period,
//! staggered over it, each over its own mutual-TLS connection:
//!
//! ```text
//!   step N (100, 250, 500, 1000, 2000, …): enrol nodes up to N (16 at a time; each
//!     heartbeats once right away, its status is written then, and from then on every
//!     period at its own phase, as a node does — also while later nodes enrol)
//!     → one period to settle
//!     → ROUNDS periods measured: per-heartbeat latency; the curator's (polis-node's) and
//!       etcd's CPU from /proc/PID/stat over them
//! ```
//! One JSON line per step; the last line is the summary: the largest N whose p99 stays
//! at or under 50 ms, and the curator's CPU per 1000 heartbeats/s there. Stepping stops
//! at the first step over 50 ms or with failed heartbeats. A heartbeat is never
//! retried; each is bounded at 10 s.
//!
//! Usage: bench-heartbeats [MAX_NODES] [ROUNDS]   (default 2000 and 3)
//!
//! `bench-heartbeats --scrape [NODES] [SCRAPES]` (`scripts/bench metrics`; default 1000
//! and 200): NODES simulated nodes enrolled and heartbeating as above, then the curator
//! node's `/metrics` (which then carries a heartbeat age per node) fetched SCRAPES times
//! in a row, one at a time; the last line: p50/p99/max of a scrape, its size and series
//! (target p99 ≤ 10 ms).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::Cluster;
use proto::api;
use serde_json::json;
use tonic::transport::Channel;

const STEPS: [usize; 8] = [100, 250, 500, 1000, 2000, 4000, 8000, 16000];
const P99_TARGET_MS: f64 = 50.0;
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Enrolments at once.
const ENROLLING: usize = 16;

/// One simulated node: its ID and its connection with its node certificate.
struct SimNode {
    address: String,
    channel: Channel,
    /// Reported in every status (so that the status stays the same, as a node's does).
    started_at_unix_ms: u64,
}

struct Setup {
    endpoint: SocketAddr,
    trust: rpc::ServerTrust,
    ticket: Vec<u8>,
    owner: rpc::CuratorClient,
    period: Duration,
}

fn pem_der(path: &std::path::Path) -> Result<Vec<u8>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path:?}"))?;
    Ok(pem::parse(text)?.into_contents())
}

/// Registers, approves and commits a new node with a fresh key; returns it connected
/// with its node certificate.
async fn enrol(setup: &Setup, n: usize) -> Result<SimNode> {
    let key = identity::NodeKey::generate()?;
    let id = key.node_id();
    let address = format!("127.{}.{}.{}", 100 + n / 65_536, (n / 256) % 256, n % 256);
    let self_signed = rpc::self_signed(&key)?;
    let channel = rpc::connect(setup.endpoint, &setup.trust, Some(&self_signed)).await?;
    let mut curator = api::curator_client::CuratorClient::new(channel);
    let mut updates = curator
        .register_node(api::RegisterNodeRequest {
            register_ticket: setup.ticket.clone(),
            address: address.clone(),
            labels: Default::default(),
            ..Default::default()
        })
        .await
        .context("RegisterNode")?
        .into_inner();
    updates.message().await.context("RegisterNode stream")?;
    drop(updates);
    setup
        .owner
        .call(|c| {
            let id = id.clone();
            async move {
                api::management_client::ManagementClient::new(c)
                    .approve_node(api::ApproveNodeRequest { id })
                    .await
            }
        })
        .await
        .context("ApproveNode")?;
    let committed = curator
        .commit_node(api::CommitNodeRequest {})
        .await
        .context("CommitNode")?
        .into_inner();
    let credentials = rpc::Credentials {
        certificate: committed.node_certificate,
        key_pkcs8: key.pkcs8_der().to_vec(),
    };
    let channel = rpc::connect(setup.endpoint, &setup.trust, Some(&credentials)).await?;
    let node = SimNode {
        address,
        channel,
        started_at_unix_ms: unix_ms(),
    };
    // Like a node, heartbeat (with the status, written once) right after joining; the
    // curator also closes a connection that makes no call for 10 s.
    let mut curator = api::curator_client::CuratorClient::new(node.channel.clone());
    tokio::time::timeout(CALL_TIMEOUT, curator.heartbeat(heartbeat_request(&node)))
        .await
        .context("the first heartbeat timed out")?
        .context("the first heartbeat")?;
    Ok(node)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn heartbeat_request(node: &SimNode) -> api::HeartbeatRequest {
    api::HeartbeatRequest {
        status: Some(proto::state::NodeStatus {
            address: node.address.clone(),
            version: "bench".into(),
            etcd_member_running: false,
            curator_running: false,
            started_at_unix_ms: node.started_at_unix_ms,
        }),
    }
}

/// Enrols nodes until there are `target`; each starts its heartbeat loop at once (a
/// node enrolled early in a long step must not time out waiting for the others).
async fn enrol_up_to(
    setup: &Arc<Setup>,
    nodes: &mut Vec<Arc<SimNode>>,
    target: usize,
    heartbeats: &mut tokio::task::JoinSet<()>,
    recorder: &Recorder,
) -> Result<()> {
    let mut next = nodes.len();
    let mut running = tokio::task::JoinSet::new();
    while nodes.len() < target {
        while running.len() < ENROLLING && next < target {
            let setup = setup.clone();
            let n = next;
            running.spawn(async move { enrol(&setup, n).await });
            next += 1;
        }
        let enrolled = Arc::new(running.join_next().await.context("an enrolment runs")???);
        spawn_heartbeats(
            heartbeats,
            enrolled.clone(),
            nodes.len(),
            setup.period,
            recorder.clone(),
        );
        nodes.push(enrolled);
    }
    Ok(())
}

/// Heartbeat outcomes while a measurement window is open.
#[derive(Default)]
struct Window {
    open: bool,
    latencies: Vec<Duration>,
    failed: usize,
    first_error: Option<String>,
}

type Recorder = Arc<std::sync::Mutex<Window>>;

/// Heartbeats made per node at most (a bound on a runaway loop: hours at the period).
const MAX_HEARTBEATS: u32 = 10_000;

/// The node's heartbeat loop, for as long as the benchmark runs: every period, at its
/// own phase (spread over the period by its number), like a real node's.
fn spawn_heartbeats(
    tasks: &mut tokio::task::JoinSet<()>,
    node: Arc<SimNode>,
    n: usize,
    period: Duration,
    recorder: Recorder,
) {
    tasks.spawn(async move {
        let phase = period * ((n as u32).wrapping_mul(7919) % 1000) / 1000;
        let start = tokio::time::Instant::now() + phase;
        for beat in 0..MAX_HEARTBEATS {
            tokio::time::sleep_until(start + period * beat).await;
            let t = Instant::now();
            let mut curator = api::curator_client::CuratorClient::new(node.channel.clone());
            let outcome =
                tokio::time::timeout(CALL_TIMEOUT, curator.heartbeat(heartbeat_request(&node)))
                    .await;
            let latency = t.elapsed();
            let error = match outcome {
                Ok(Ok(_)) => None,
                Ok(Err(status)) => Some(status.to_string()),
                Err(_) => Some(format!("no answer within {CALL_TIMEOUT:?}")),
            };
            let mut window = recorder.lock().expect("recorder lock");
            if window.open {
                window.latencies.push(latency);
                if let Some(e) = error {
                    window.failed += 1;
                    window.first_error.get_or_insert(e);
                }
            }
        }
    });
}

/// Opens the window, waits `length`, closes it: what was recorded meanwhile.
async fn measure(recorder: &Recorder, length: Duration) -> Window {
    *recorder.lock().expect("recorder lock") = Window {
        open: true,
        ..Window::default()
    };
    tokio::time::sleep(length).await;
    std::mem::take(&mut *recorder.lock().expect("recorder lock"))
}

/// CPU time (user + system) of process `pid` so far.
fn cpu_time(pid: i32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let (_, rest) = stat.rsplit_once(") ").context("stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; `rest` starts at field 3.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn raise_open_files_limit() {
    // SAFETY: getrlimit/setrlimit on our own process with a valid struct.
    unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The scrape benchmark: waits until the curator exports every node's heartbeat age,
/// then times `scrapes` sequential GETs of `/metrics`.
async fn scrape_metrics(
    node: std::net::IpAddr,
    nodes: usize,
    scrapes: usize,
    period: Duration,
) -> Result<serde_json::Value> {
    let at = SocketAddr::new(node, e2e::METRICS_PORT);
    let ages = |body: &str| body.matches("polis_node_heartbeat_age_seconds{").count();
    let deadline = Instant::now() + period * 6;
    loop {
        let body = e2e::http_get(at, "/metrics")?.1;
        if ages(&body) > nodes {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the curator exports {} heartbeat ages, not {}",
                ages(&body),
                nodes + 1
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut latencies = Vec::with_capacity(scrapes);
    let (mut bytes, mut series) = (0, 0);
    for _ in 0..scrapes {
        let t = Instant::now();
        let (status, body) =
            tokio::task::spawn_blocking(move || e2e::http_get(at, "/metrics")).await??;
        latencies.push(t.elapsed());
        anyhow::ensure!(status == 200, "/metrics answered {status}");
        bytes = body.len();
        series = body.lines().filter(|l| !l.starts_with('#')).count();
    }
    latencies.sort();
    Ok(json!({
        "bench": "metrics",
        "nodes": nodes,
        "scrapes": scrapes,
        "p50_ms": round2(percentile_ms(&latencies, 0.5)),
        "p99_ms": round2(percentile_ms(&latencies, 0.99)),
        "max_ms": round2(percentile_ms(&latencies, 1.0)),
        "bytes": bytes,
        "series": series,
        "target_p99_ms": 10.0,
    }))
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    let scrape = args.next_if(|a| a == "--scrape").is_some();
    let max_nodes: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()
        .context("MAX_NODES must be a number")?
        .unwrap_or(if scrape { 1000 } else { 2000 });
    let rounds: u32 = args
        .next()
        .map(|a| a.parse())
        .transpose()
        .context("ROUNDS must be a number")?
        .unwrap_or(if scrape { 200 } else { 3 })
        .clamp(1, if scrape { 10_000 } else { 20 });
    raise_open_files_limit();
    let period = curator::health::Timing::DEFAULT.period();
    let dir = tempfile::tempdir()?;
    // Every node registers from this process's one address: no per-source limit.
    let mut cluster = Cluster::bootstrap_with(dir.path(), &[], &["--entry-rate-per-second", "0"])?;
    let curator_pid = cluster.first.proc().pid();
    let etcd_pid = cluster.first.etcd_pid()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let owner = cluster.owner_client()?;
    let trust = rpc::ServerTrust::PinnedCa(pem_der(&cluster.config.join("ca.pem"))?);
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    runtime.block_on(async {
        let ticket = owner
            .call(|c| async move {
                api::management_client::ManagementClient::new(c)
                    .get_register_ticket(api::GetRegisterTicketRequest {})
                    .await
            })
            .await?
            .ticket;
        let setup = Arc::new(Setup {
            endpoint,
            trust,
            ticket,
            owner,
            period,
        });
        let mut nodes = Vec::new();
        let recorder = Recorder::default();
        let mut heartbeats = tokio::task::JoinSet::new();
        let mut best: Option<serde_json::Value> = None;
        if scrape {
            enrol_up_to(&setup, &mut nodes, max_nodes, &mut heartbeats, &recorder).await?;
            let line = scrape_metrics(endpoint.ip(), max_nodes, rounds as usize, period).await;
            heartbeats.abort_all();
            println!("{}", line?);
            return anyhow::Ok(());
        }
        let mut steps = Vec::new();
        for &n in STEPS.iter().filter(|n| **n <= max_nodes) {
            let enrolling = Instant::now();
            enrol_up_to(&setup, &mut nodes, n, &mut heartbeats, &recorder).await?;
            let enrol_s = enrolling.elapsed().as_secs_f64();
            // One period for the new nodes' loops to settle (and their verdicts).
            let warmup = measure(&recorder, period).await;
            let (curator_before, etcd_before) = (cpu_time(curator_pid)?, cpu_time(etcd_pid)?);
            let measuring = Instant::now();
            let mut measured = measure(&recorder, period * rounds).await;
            let elapsed = measuring.elapsed().as_secs_f64();
            let curator_cpu = (cpu_time(curator_pid)? - curator_before).as_secs_f64();
            let etcd_cpu = (cpu_time(etcd_pid)? - etcd_before).as_secs_f64();
            measured.latencies.sort();
            let rate = measured.latencies.len() as f64 / elapsed;
            let p99 = percentile_ms(&measured.latencies, 0.99);
            let mut line = json!({
                "bench": "heartbeats_step",
                "nodes": n,
                "heartbeats": measured.latencies.len(),
                "failed": measured.failed,
                "warmup_failed": warmup.failed,
                "heartbeats_per_s": round2(rate),
                "p50_ms": round2(percentile_ms(&measured.latencies, 0.5)),
                "p99_ms": round2(p99),
                "max_ms": round2(percentile_ms(&measured.latencies, 1.0)),
                "curator_cpu_pct": round2(100.0 * curator_cpu / elapsed),
                "curator_cpu_pct_per_1000_per_s": round2(100.0 * curator_cpu / elapsed / (rate / 1000.0)),
                "etcd_cpu_pct": round2(100.0 * etcd_cpu / elapsed),
                "enrol_s": round2(enrol_s),
            });
            if let Some(e) = measured.first_error.or(warmup.first_error) {
                line["first_error"] = e.into();
            }
            println!("{line}");
            let ok = measured.failed == 0 && p99 <= P99_TARGET_MS;
            steps.push(line.clone());
            if !ok {
                break;
            }
            best = Some(line);
        }
        heartbeats.abort_all();
        let Some(best) = best else {
            bail!("not even {} nodes heartbeat within {P99_TARGET_MS} ms at p99", STEPS[0]);
        };
        println!(
            "{}",
            json!({
                "bench": "heartbeats",
                "nodes": best["nodes"],
                "p99_ms": best["p99_ms"],
                "p50_ms": best["p50_ms"],
                "heartbeats_per_s": best["heartbeats_per_s"],
                "curator_cpu_pct_per_1000_per_s": best["curator_cpu_pct_per_1000_per_s"],
                "curator_cpu_pct": best["curator_cpu_pct"],
                "period_s": period.as_secs_f64(),
                "max_nodes_tried": steps.last().map(|s| s["nodes"].clone()),
                "target_nodes": 1000,
                "target_p99_ms": P99_TARGET_MS,
            })
        );
        anyhow::Ok(())
    })
}
