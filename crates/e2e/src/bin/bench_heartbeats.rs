//! Benchmark: nodes holding their streams and heartbeating a control plane, spread as
//! real nodes spread. A cluster of MEMBERS (default 3) consensus members is started
//! (real polis-node processes, release build, production heartbeat timing); then N
//! simulated nodes in this process, each a real node — its own key, registered with
//! the ticket (RegisterNode), approved by the owner (ApproveNode), committed
//! (CommitNode) and so holding its own node certificate — each on its own mutual-TLS
//! connection to the curator it prefers (`rpc::spread::by_preference` of its address
//! over the members' endpoints, as a node orders its directory), holding its WatchNode
//! stream there and heartbeating at the production period at its own phase. A node
//! whose stream or heartbeat fails goes down its preference list, with a jittered
//! backoff after a round with none reachable, as a node does.
//!
//! ```text
//!   step N (100, 250, 500, 1000, 2000, …): enrol nodes up to N (ENROLLING at a time;
//!     each opens its stream and heartbeats right away, then every period — also while
//!     later nodes enrol)
//!     → one period to settle
//!     → ROUNDS periods measured: per-heartbeat latency; sessions per curator; each
//!       member's polis-node (curator) and etcd CPU over them, and polis-node's RSS
//!   --cold-start, after the last step: every member stopped (SIGTERM) and started again
//!     → time until every node streams and heartbeats again, and until the owner's
//!       ListNodes shows every node HEALTHY; nodes seen HEARTBEAT_TIMEOUT meanwhile
//! ```
//! One JSON line per step; the last line is the summary: the largest N whose p99 stays
//! at or under 50 ms with no failed heartbeat, the time to enrol up to it, sessions per
//! curator (goal: each within 2× of the mean), per-member CPU/RSS, and the cold start.
//! Stepping stops at the first step over 50 ms or with failed heartbeats. Each call is
//! bounded at 10 s.
//!
//! Usage: bench-heartbeats [--members M] [--cold-start] [MAX_NODES] [ROUNDS]
//!        (default 3 members, 1000 nodes, 3 rounds)
//!
//! `bench-heartbeats --enrolment [NODES]` (`scripts/bench enrol`; default 1000; 3
//! members): enrolment alone (no streams, no heartbeats), ENROLMENT_BATCH at a time, in
//! two steps, the first 100 and then up to NODES: per step its wall time and, per
//! enrolled node, the CPU of every member's polis-node and etcd together and the etcd KV
//! calls of every member together (targets: 1 000 in ≤ 5 s, ≤ 12 ms of CPU per node and
//! flat from the first step to the second).
//!
//! `bench-heartbeats --scrape [NODES] [SCRAPES]` (`scripts/bench metrics`; default 1000
//! and 200; 3 members): NODES simulated nodes enrolled and heartbeating as above, then
//! every member's `/metrics` (the leader's carries a heartbeat age per node) fetched
//! SCRAPES times, one at a time (`e2e::scrape_members`); the last line: per member
//! p50/p99/max of a scrape, its size and series, and the whole round's (target p99 ≤
//! 10 ms per member).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, cpu_time};
use proto::api;
use serde_json::json;
use tonic::transport::Channel;

const STEPS: [usize; 8] = [100, 250, 500, 1000, 2000, 4000, 8000, 16000];
const P99_TARGET_MS: f64 = 50.0;
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Enrolments at once.
const ENROLLING: usize = 32;
/// Enrolments at once in `--enrolment` (as the issue measuring it did).
const ENROLMENT_BATCH: usize = 50;
/// The first step of `--enrolment`.
const ENROLMENT_FIRST_STEP: usize = 100;
/// How long a cold start may take before the bench gives up on it.
const COLD_START_LIMIT: Duration = Duration::from_secs(120);

/// One simulated node.
struct SimNode {
    id: String,
    address: String,
    credentials: rpc::Credentials,
    /// The members' curator endpoints in this node's order of preference.
    preference: Vec<SocketAddr>,
    /// Reported in every status (so that the status stays the same, as a node's does).
    started_at_unix_ms: u64,
    /// When (ms since the bench's epoch) a heartbeat last succeeded, and a session last
    /// started (its stream open and its first heartbeat answered).
    beat_ok_ms: AtomicU64,
    session_ms: AtomicU64,
}

struct Setup {
    curators: Vec<SocketAddr>,
    trust: rpc::ServerTrust,
    ticket: Vec<u8>,
    owner: rpc::CuratorClient,
    period: Duration,
    epoch: Instant,
    /// Sessions (stream + heartbeats) open on each curator, by its index in `curators`.
    sessions: Vec<AtomicUsize>,
    /// Time spent in each enrolment call, summed (µs): register, approve, commit.
    enrol_us: [AtomicU64; 3],
}

impl Setup {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// Registers, approves and commits a new node with a fresh key, at its preferred
/// curator (the next one when that does not answer).
async fn enrol(setup: &Setup, n: usize) -> Result<SimNode> {
    let key = identity::NodeKey::generate()?;
    let id = key.node_id();
    let address = e2e::sim_address(n);
    let preference = rpc::spread::by_preference(address.as_bytes(), &setup.curators);
    let enrolment = e2e::Enrolment {
        trust: &setup.trust,
        owner: &setup.owner,
        ticket: &setup.ticket,
    };
    let mut last_error = None;
    for endpoint in &preference {
        match e2e::enrol_at(&enrolment, *endpoint, &key, &address).await {
            Ok((certificate, laps)) => {
                for (sum, lap) in setup.enrol_us.iter().zip(laps) {
                    sum.fetch_add(lap.as_micros() as u64, Ordering::Relaxed);
                }
                return Ok(SimNode {
                    id,
                    address,
                    credentials: rpc::Credentials {
                        certificate,
                        key_pkcs8: key.pkcs8_der().to_vec(),
                    },
                    preference,
                    started_at_unix_ms: unix_ms(),
                    beat_ok_ms: AtomicU64::new(0),
                    session_ms: AtomicU64::new(0),
                });
            }
            Err(e) => last_error = Some(e.context(format!("enrolling node {n} at {endpoint}"))),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no curators")))
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
            ..Default::default()
        }),
    }
}

/// Enrols nodes until there are `target`; each starts its session loop at once (a node
/// enrolled early in a long step must not time out waiting for the others). Returns
/// when every node enrolled has had its first heartbeat answered.
async fn enrol_up_to(
    setup: &Arc<Setup>,
    nodes: &mut Vec<Arc<SimNode>>,
    target: usize,
    tasks: &mut tokio::task::JoinSet<()>,
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
        let phase = setup.period * ((nodes.len() as u32).wrapping_mul(7919) % 1000) / 1000;
        tasks.spawn(run_node(
            enrolled.clone(),
            setup.clone(),
            phase,
            nodes.len() as u64,
            recorder.clone(),
        ));
        nodes.push(enrolled);
    }
    let deadline = Instant::now() + CALL_TIMEOUT * 3;
    while nodes
        .iter()
        .any(|n| n.beat_ok_ms.load(Ordering::Relaxed) == 0)
    {
        if Instant::now() > deadline {
            bail!(
                "enrolled nodes had no heartbeat answered within {:?}",
                CALL_TIMEOUT * 3
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The mean time (ms) of each enrolment call (register, approve, commit) since the sums
/// were `before`, over `enrolled` nodes.
fn mean_call_ms(setup: &Setup, before: &[u64], enrolled: f64) -> Vec<f64> {
    setup
        .enrol_us
        .iter()
        .zip(before)
        .map(|(a, b)| round2((a.load(Ordering::Relaxed) - b) as f64 / enrolled / 1000.0))
        .collect()
}

/// Enrols nodes `from..to`, `ENROLMENT_BATCH` at a time, and nothing more (no streams,
/// no heartbeats).
async fn enrol_range(setup: &Arc<Setup>, from: usize, to: usize) -> Result<()> {
    let mut running = tokio::task::JoinSet::new();
    let mut next = from;
    let mut done = from;
    while done < to {
        while running.len() < ENROLMENT_BATCH && next < to {
            let setup = setup.clone();
            let n = next;
            running.spawn(async move { enrol(&setup, n).await });
            next += 1;
        }
        running.join_next().await.context("an enrolment runs")???;
        done += 1;
    }
    Ok(())
}

/// `--enrolment`: see the module documentation. Returns the summary line.
async fn enrolment_steps(
    setup: &Arc<Setup>,
    max_nodes: usize,
    members: &[(i32, i32, std::path::PathBuf)],
    kv_calls: impl Fn() -> Result<u64>,
) -> Result<serde_json::Value> {
    let cpu = || -> Result<Duration> {
        members
            .iter()
            .try_fold(Duration::ZERO, |sum, (node, etcd, _)| {
                Ok(sum + cpu_time(*node)? + cpu_time(*etcd)?)
            })
    };
    let mut steps = Vec::new();
    let mut from = 0;
    let mut total_s = 0.0;
    for to in [ENROLMENT_FIRST_STEP.min(max_nodes), max_nodes] {
        if to <= from {
            continue;
        }
        let (cpu_before, kv_before, us_before) = (
            cpu()?,
            kv_calls()?,
            setup
                .enrol_us
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .collect::<Vec<_>>(),
        );
        let started = Instant::now();
        enrol_range(setup, from, to).await?;
        let seconds = started.elapsed().as_secs_f64();
        total_s += seconds;
        let enrolled = (to - from) as f64;
        let call_ms = mean_call_ms(setup, &us_before, enrolled);
        let line = json!({
            "bench": "enrolment_step",
            "from": from,
            "to": to,
            "seconds": round2(seconds),
            "nodes_per_s": round2(enrolled / seconds),
            "cpu_ms_per_node": round2((cpu()? - cpu_before).as_secs_f64() * 1000.0 / enrolled),
            "kv_calls_per_node": round2((kv_calls()? - kv_before) as f64 / enrolled),
            "call_ms": {"connect_register": call_ms[0], "approve": call_ms[1], "commit": call_ms[2]},
        });
        println!("{line}");
        steps.push(line);
        from = to;
    }
    let last = steps.last().cloned().unwrap_or_default();
    let first = steps.first().cloned().unwrap_or_default();
    Ok(json!({
        "bench": "enrolment",
        "members": members.len(),
        "nodes": max_nodes,
        "at_once": ENROLMENT_BATCH,
        "seconds": round2(total_s),
        "cpu_ms_per_node_first_step": first["cpu_ms_per_node"],
        "cpu_ms_per_node_last_step": last["cpu_ms_per_node"],
        "kv_calls_per_node_last_step": last["kv_calls_per_node"],
        "call_ms_last_step": last["call_ms"],
        "target_seconds": 5.0,
        "target_cpu_ms_per_node": 12.0,
    }))
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

fn record(recorder: &Recorder, latency: Duration, error: Option<String>) {
    let mut window = recorder.lock().expect("recorder lock");
    if window.open {
        window.latencies.push(latency);
        if let Some(e) = error {
            window.failed += 1;
            window.first_error.get_or_insert(e);
        }
    }
}

/// Sessions a node opens at most (a bound on a runaway loop).
const MAX_SESSIONS: u32 = 1_000;
/// Heartbeats per session at most (hours at the period).
const MAX_HEARTBEATS: u32 = 10_000;

/// Counts a session on a curator while it lives.
struct SessionGuard<'a>(&'a AtomicUsize);

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The node's life for as long as the benchmark runs: a session at the first curator
/// of its preference that takes it; when a session ends, the next round down the list;
/// after a round where none took it, a jittered, growing backoff (0.25 s … 4 s).
async fn run_node(
    node: Arc<SimNode>,
    setup: Arc<Setup>,
    phase: Duration,
    seed: u64,
    recorder: Recorder,
) {
    let mut idle_rounds = 0u32;
    let mut sessions = 0;
    while sessions < MAX_SESSIONS {
        let mut any = false;
        for endpoint in node.preference.clone() {
            sessions += 1;
            if session(&node, &setup, endpoint, phase, &recorder).await {
                any = true;
                idle_rounds = 0;
                break;
            }
        }
        if !any {
            let base = Duration::from_millis(250) * 2u32.pow(idle_rounds.min(4));
            // Jitter from the node's number and the round: [0.5, 1) × base.
            let x = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(sessions))
                .wrapping_mul(0xbf58_476d_1ce4_e5b9)
                >> 40;
            let fraction = 0.5 + (x % 1000) as f64 / 2000.0;
            tokio::time::sleep(base.mul_f64(fraction)).await;
            idle_rounds += 1;
        }
    }
}

/// One session at `endpoint`: connect with the node certificate, open WatchNode, then
/// heartbeat every period at the node's phase until a heartbeat fails or the stream
/// ends. Returns whether it got as far as an open stream and an answered heartbeat.
async fn session(
    node: &SimNode,
    setup: &Setup,
    endpoint: SocketAddr,
    phase: Duration,
    recorder: &Recorder,
) -> bool {
    let Some(index) = setup.curators.iter().position(|c| *c == endpoint) else {
        return false;
    };
    let opened = tokio::time::timeout(CALL_TIMEOUT, async {
        let slot = rpc::CredentialSlot::new(node.credentials.clone())?;
        let source = node.address.parse().ok();
        let channel: Channel =
            rpc::connect_from(endpoint, &setup.trust, Some(&slot), source).await?;
        let mut curator = api::curator_client::CuratorClient::new(channel);
        let mut stream = curator
            .watch_node(api::WatchNodeRequest {})
            .await?
            .into_inner();
        stream.message().await?.context("WatchNode ended at once")?;
        curator.heartbeat(heartbeat_request(node)).await?;
        anyhow::Ok((curator, stream))
    })
    .await;
    let Ok(Ok((mut curator, mut stream))) = opened else {
        return false;
    };
    setup.sessions[index].fetch_add(1, Ordering::Relaxed);
    let _counted = SessionGuard(&setup.sessions[index]);
    let now = setup.now_ms().max(1);
    node.session_ms.store(now, Ordering::Relaxed);
    node.beat_ok_ms.store(now, Ordering::Relaxed);
    // Beats at the node's phase of the period, from the next one on.
    let period = setup.period;
    let since_epoch = setup.epoch.elapsed();
    let periods = since_epoch.as_nanos() / period.as_nanos();
    let mut next_beat =
        tokio::time::Instant::from_std(setup.epoch) + period * (periods as u32 + 1) + phase;
    for _ in 0..MAX_HEARTBEATS {
        tokio::select! {
            _ = tokio::time::sleep_until(next_beat) => {}
            m = stream.message() => match m {
                Ok(Some(_)) => continue,
                _ => return true,
            },
        }
        next_beat += period;
        let t = Instant::now();
        let outcome =
            tokio::time::timeout(CALL_TIMEOUT, curator.heartbeat(heartbeat_request(node))).await;
        let error = match outcome {
            Ok(Ok(_)) => None,
            Ok(Err(status)) => Some(status.to_string()),
            Err(_) => Some(format!("no answer within {CALL_TIMEOUT:?}")),
        };
        let failed = error.is_some();
        record(recorder, t.elapsed(), error);
        if failed {
            return true;
        }
        node.beat_ok_ms
            .store(setup.now_ms().max(1), Ordering::Relaxed);
    }
    true
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

/// Resident set size of process `pid` in MiB.
fn rss_mib(pid: i32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib / 1024.0)
}

/// Sessions per curator now, and whether each is within 2× of the mean (and over half
/// of it).
fn spread(setup: &Setup) -> (Vec<usize>, bool) {
    let counts: Vec<usize> = setup
        .sessions
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let mean = counts.iter().sum::<usize>() as f64 / counts.len().max(1) as f64;
    let within = counts
        .iter()
        .all(|&c| (c as f64) <= 2.0 * mean && (c as f64) >= mean / 2.0);
    (counts, within)
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

/// Member `i` of the control plane (0: the bootstrap node).
fn member<'a>(cluster: &'a mut Cluster, others: &'a mut [Node], i: usize) -> &'a mut Node {
    if i == 0 {
        &mut cluster.first
    } else {
        &mut others[i - 1]
    }
}

/// Starts a cluster of `members` consensus members; returns the others than the first.
fn control_plane(cluster: &Cluster, members: usize) -> Result<Vec<Node>> {
    let mut others = Vec::new();
    if members > 1 {
        let params = cluster.register_params("members")?;
        for i in 1..members {
            let (mut node, id) = cluster.add_worker(&format!("m{i}"), &params)?;
            cluster.ctl_retry(&["node", "add-role", &id, "ConsensusMember"])?;
            node.wait_for_curator()?;
            others.push(node);
        }
        let mut all = vec![&cluster.first];
        all.extend(others.iter());
        cluster.wait_members(&e2e::endpoints(&all), members, 0)?;
    }
    Ok(others)
}

/// Each member's processes: (polis-node, etcd).
fn member_pids(
    cluster: &mut Cluster,
    others: &mut [Node],
    members: usize,
) -> Result<Vec<(i32, i32)>> {
    (0..members)
        .map(|i| {
            let node = member(cluster, others, i);
            Ok((node.proc().pid(), node.etcd_pid()?))
        })
        .collect()
}

/// The simulated nodes' health as the owner's ListNodes shows it: (healthy, the IDs
/// with HEARTBEAT_TIMEOUT).
async fn health(owner: &rpc::CuratorClient, ids: &HashSet<String>) -> Result<(usize, Vec<String>)> {
    let listed = tokio::time::timeout(
        CALL_TIMEOUT,
        owner.call(|c| async move {
            api::management_client::ManagementClient::new(c)
                .list_nodes(api::ListNodesRequest::default())
                .await
        }),
    )
    .await
    .context("ListNodes timed out")??;
    let ours = listed.nodes.iter().filter(|n| ids.contains(&n.id));
    let healthy = ours
        .clone()
        .filter(|n| n.health == api::NodeHealth::Healthy as i32)
        .count();
    let timeouts = ours
        .filter(|n| n.health == api::NodeHealth::HeartbeatTimeout as i32)
        .map(|n| n.id.clone())
        .collect();
    Ok((healthy, timeouts))
}

/// Stops every member (SIGTERM, all at once), starts them again, and follows the
/// simulated nodes back: the cold-start JSON line.
async fn cold_start(
    setup: &Setup,
    nodes: &[Arc<SimNode>],
    cluster: &mut Cluster,
    others: &mut [Node],
    members: usize,
    recorder: &Recorder,
) -> Result<serde_json::Value> {
    let ids: HashSet<String> = nodes.iter().map(|n| n.id.clone()).collect();
    let (healthy_before, timeouts_before) = health(&setup.owner, &ids).await?;
    let stopping = Instant::now();
    tokio::task::block_in_place(|| -> Result<()> {
        for i in 0..members {
            member(cluster, others, i).proc().signal(libc::SIGTERM);
        }
        for i in 0..members {
            member(cluster, others, i).proc().wait_exit(e2e::TIMEOUT)?;
        }
        Ok(())
    })?;
    let stop_s = stopping.elapsed().as_secs_f64();
    let started = Instant::now();
    let started_ms = setup.now_ms();
    for i in 0..members {
        member(cluster, others, i).start(&[])?;
    }
    let mut flipped: HashSet<String> = HashSet::new();
    let (mut streams_back_s, mut healthy_s) = (None, None);
    let mut last_health = (0, 0);
    let mut next_poll = Instant::now();
    while started.elapsed() < COLD_START_LIMIT {
        let back = nodes.iter().all(|n| {
            n.session_ms.load(Ordering::Relaxed) > started_ms
                && n.beat_ok_ms.load(Ordering::Relaxed) > started_ms
        });
        if back && streams_back_s.is_none() {
            streams_back_s = Some(started.elapsed().as_secs_f64());
        }
        if Instant::now() >= next_poll {
            next_poll = Instant::now() + Duration::from_millis(500);
            if let Ok((healthy, timeouts)) = health(&setup.owner, &ids).await {
                last_health = (healthy, timeouts.len());
                flipped.extend(timeouts);
                if healthy == ids.len() && back && healthy_s.is_none() {
                    healthy_s = Some(started.elapsed().as_secs_f64());
                }
            }
        }
        if streams_back_s.is_some() && healthy_s.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Two periods after: heartbeat latency once the fleet is back.
    let mut after = measure(recorder, setup.period * 2).await;
    after.latencies.sort();
    let (sessions, within) = spread(setup);
    let mut line = json!({
        "bench": "heartbeats_cold_start",
        "nodes": nodes.len(),
        "members": members,
        "healthy_before": healthy_before,
        "timeouts_before": timeouts_before.len(),
        "stop_s": round2(stop_s),
        "streams_back_s": streams_back_s.map(round2),
        "all_healthy_s": healthy_s.map(round2),
        "flipped_to_heartbeat_timeout": flipped.len(),
        "last_seen_healthy": last_health.0,
        "last_seen_timeouts": last_health.1,
        "p99_after_ms": round2(percentile_ms(&after.latencies, 0.99)),
        "failed_after": after.failed,
        "sessions_per_curator": sessions,
        "sessions_within_2x_of_mean": within,
        "target_s": 15.0,
    });
    if let Some(e) = after.first_error {
        line["first_error_after"] = e.into();
    }
    Ok(line)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    let (mut scrape, mut cold, mut members, mut enrolment) = (false, false, None, false);
    while let Some(flag) = args.next_if(|a| a.starts_with("--")) {
        match flag.as_str() {
            "--scrape" => scrape = true,
            "--enrolment" => enrolment = true,
            "--cold-start" => cold = true,
            "--members" => {
                let m: usize = args
                    .next()
                    .context("--members needs a number")?
                    .parse()
                    .context("--members must be a number")?;
                anyhow::ensure!((1..=5).contains(&m), "--members must be 1 to 5, not {m}");
                members = Some(m);
            }
            other => {
                bail!("unknown flag {other:?}: --members M, --cold-start, --scrape or --enrolment")
            }
        }
    }
    let members = members.unwrap_or(3);
    let max_nodes: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()
        .context("MAX_NODES must be a number")?
        .unwrap_or(1000);
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
    let mut others = control_plane(&cluster, members)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let owner = cluster.owner_client()?;
    let trust = rpc::ServerTrust::PinnedCa(e2e::pem_der(&cluster.config.join("ca.pem"))?);
    let curators: Vec<SocketAddr> = (0..members)
        .map(|i| {
            SocketAddr::new(
                member(&mut cluster, &mut others, i).address,
                rpc::CURATOR_PORT,
            )
        })
        .collect();
    owner.set_endpoints(curators.clone());
    runtime.block_on(async {
        let ticket = e2e::register_ticket(&owner).await?;
        let setup = Arc::new(Setup {
            sessions: curators.iter().map(|_| AtomicUsize::new(0)).collect(),
            curators: curators.clone(),
            trust,
            ticket,
            owner,
            period,
            epoch: Instant::now(),
            enrol_us: Default::default(),
        });
        let mut nodes = Vec::new();
        let recorder = Recorder::default();
        let mut tasks = tokio::task::JoinSet::new();
        if enrolment {
            let pids = tokio::task::block_in_place(|| member_pids(&mut cluster, &mut others, members))?;
            let described: Vec<_> = pids
                .iter()
                .enumerate()
                .map(|(i, (n, e))| (*n, *e, member(&mut cluster, &mut others, i).root.clone()))
                .collect();
            let roots: Vec<_> = described.iter().map(|(_, _, r)| r.clone()).collect();
            let kv_calls = || -> Result<u64> {
                roots
                    .iter()
                    .try_fold(0, |sum, r| Ok(sum + e2e::etcd_kv_calls_at(r)?))
            };
            let line = enrolment_steps(&setup, max_nodes, &described, kv_calls).await?;
            println!("{line}");
            return anyhow::Ok(());
        }
        if scrape {
            enrol_up_to(&setup, &mut nodes, max_nodes, &mut tasks, &recorder).await?;
            let ips: Vec<_> = curators.iter().map(|c| c.ip()).collect();
            let line = e2e::scrape_members(&ips, max_nodes, rounds as usize, period).await;
            tasks.abort_all();
            println!("{}", line?);
            return anyhow::Ok(());
        }
        let mut best: Option<serde_json::Value> = None;
        let mut steps = Vec::new();
        let mut enrol_total = 0.0;
        for &n in STEPS.iter().filter(|n| **n <= max_nodes) {
            let enrolling = Instant::now();
            let enrolled_before = nodes.len();
            let us_before: Vec<u64> =
                setup.enrol_us.iter().map(|a| a.load(Ordering::Relaxed)).collect();
            enrol_up_to(&setup, &mut nodes, n, &mut tasks, &recorder).await?;
            let enrol_s = enrolling.elapsed().as_secs_f64();
            enrol_total += enrol_s;
            // Mean time of each enrolment call in this step (ms): where enrolment goes.
            let enrolled = (nodes.len() - enrolled_before).max(1) as f64;
            let call_ms = mean_call_ms(&setup, &us_before, enrolled);
            // One period for the new nodes' loops to settle (and their verdicts).
            let warmup = measure(&recorder, period).await;
            let pids = tokio::task::block_in_place(|| member_pids(&mut cluster, &mut others, members))?;
            let before: Vec<(Duration, Duration)> = pids
                .iter()
                .map(|(node, etcd)| Ok((cpu_time(*node)?, cpu_time(*etcd)?)))
                .collect::<Result<_>>()?;
            let measuring = Instant::now();
            let mut measured = measure(&recorder, period * rounds).await;
            let elapsed = measuring.elapsed().as_secs_f64();
            let mut per_member = Vec::new();
            for ((node, etcd), (node_before, etcd_before)) in pids.iter().zip(&before) {
                per_member.push(json!({
                    "curator_cpu_pct": round2(100.0 * (cpu_time(*node)? - *node_before).as_secs_f64() / elapsed),
                    "etcd_cpu_pct": round2(100.0 * (cpu_time(*etcd)? - *etcd_before).as_secs_f64() / elapsed),
                    "curator_rss_mib": round2(rss_mib(*node)?),
                }));
            }
            measured.latencies.sort();
            let rate = measured.latencies.len() as f64 / elapsed;
            let p99 = percentile_ms(&measured.latencies, 0.99);
            let (sessions, within) = spread(&setup);
            let mut line = json!({
                "bench": "heartbeats_step",
                "nodes": n,
                "members": members,
                "heartbeats": measured.latencies.len(),
                "failed": measured.failed,
                "warmup_failed": warmup.failed,
                "heartbeats_per_s": round2(rate),
                "p50_ms": round2(percentile_ms(&measured.latencies, 0.5)),
                "p99_ms": round2(p99),
                "max_ms": round2(percentile_ms(&measured.latencies, 1.0)),
                "enrol_s": round2(enrol_s),
                "enrol_total_s": round2(enrol_total),
                "enrol_call_ms": {"connect_register": call_ms[0], "approve": call_ms[1], "commit": call_ms[2]},
                "sessions_per_curator": sessions,
                "sessions_within_2x_of_mean": within,
                "per_member": per_member,
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
        let cold_line = if cold {
            let line = cold_start(&setup, &nodes, &mut cluster, &mut others, members, &recorder).await?;
            println!("{line}");
            Some(line)
        } else {
            None
        };
        tasks.abort_all();
        let last = steps.last().cloned().unwrap_or_default();
        let mut summary = json!({
            "bench": "heartbeats",
            "members": members,
            "nodes": best.as_ref().map(|b| b["nodes"].clone()),
            "p99_ms": best.as_ref().map(|b| b["p99_ms"].clone()),
            "p50_ms": best.as_ref().map(|b| b["p50_ms"].clone()),
            "heartbeats_per_s": best.as_ref().map(|b| b["heartbeats_per_s"].clone()),
            "max_nodes_tried": last["nodes"],
            "p99_ms_at_max": last["p99_ms"],
            "enrol_s_to_max": last["enrol_total_s"],
            "sessions_per_curator": last["sessions_per_curator"],
            "sessions_within_2x_of_mean": last["sessions_within_2x_of_mean"],
            "per_member": last["per_member"],
            "period_s": period.as_secs_f64(),
            "target_nodes": 1000,
            "target_p99_ms": P99_TARGET_MS,
            "target_enrol_s": 10.0,
        });
        if let Some(c) = cold_line {
            summary["cold_start_all_healthy_s"] = c["all_healthy_s"].clone();
            summary["cold_start_streams_back_s"] = c["streams_back_s"].clone();
            summary["cold_start_flipped_to_heartbeat_timeout"] = c["flipped_to_heartbeat_timeout"].clone();
        }
        println!("{summary}");
        if best.is_none() {
            bail!("not even {} nodes heartbeat within {P99_TARGET_MS} ms at p99", STEPS[0]);
        }
        anyhow::Ok(())
    })
}
