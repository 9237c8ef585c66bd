//! `scripts/bench rotate-ca [WORKERS] [ROUNDS]`: cluster CA rotations on a cluster of 3
//! consensus members and WORKERS (default 4) workers, all real polis-node processes,
//! under continuous label writes (polisctl, one after another, following the rotation
//! as any operator's configuration does).
//!
//! `scripts/bench rotate-ca --simulated NODES [ROUNDS]`: the same with NODES simulated
//! nodes instead of workers (each its own key and source address, enrolled through the
//! real flow): each holds a WatchNode stream, trusts the CAs it names (an
//! `rpc::TrustSlot`, as a node does), heartbeats every 5 s reporting them and the CA of
//! its certificate, and renews a certificate the signing CA did not issue — what a
//! polis-node does in a rotation, without a process per node.
//!
//! Per round: the time from `cluster rotate-ca` to the new CA signing and to the old
//! one retired, the writes acknowledged meanwhile and any that failed, and the longest
//! gap between two acknowledged writes. Rounds follow each other on the same cluster
//! (each rotates away from the CA the previous one introduced). The last line is one
//! JSON object.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, median};
use proto::api;

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

/// A simulated node following rotations (see the module documentation).
struct Simulated {
    address: String,
    credentials: rpc::CredentialSlot,
    /// The CAs it trusts and their CRLs, as its WatchNode updates name them.
    trust: rpc::TrustSlot,
    preference: Vec<SocketAddr>,
}

/// What the simulated nodes did, for the summary.
#[derive(Default)]
struct SimCounts {
    renewals: AtomicUsize,
    sessions: AtomicUsize,
    failed_heartbeats: AtomicUsize,
}

/// Its heartbeat status: the CAs it trusts and the one that issued its certificate.
fn sim_status(node: &Simulated) -> proto::state::NodeStatus {
    let cas = node.trust.cas();
    let certificate = node.credentials.credentials().certificate;
    proto::state::NodeStatus {
        address: node.address.clone(),
        version: "bench".into(),
        trusted_ca_fingerprints: cas.iter().map(|c| rpc::fingerprint(c)).collect(),
        certificate_ca_fingerprint: cas
            .iter()
            .find(|ca| pki::issued_by(&certificate, ca))
            .map(|ca| rpc::fingerprint(ca))
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// One session at `endpoint` until `stop` or a failure: WatchNode (trust what it
/// names), a heartbeat every `period`, a renewal when the signing CA did not issue the
/// certificate.
async fn sim_session(
    node: &Simulated,
    endpoint: SocketAddr,
    period: Duration,
    stop: &AtomicBool,
    counts: &SimCounts,
) -> Result<()> {
    let trust = rpc::ServerTrust::ClusterCa {
        trust: node.trust.clone(),
    };
    let channel = rpc::connect_from(
        endpoint,
        &trust,
        Some(&node.credentials),
        node.address.parse().ok(),
    )
    .await?;
    let mut curator = api::curator_client::CuratorClient::new(channel);
    let mut updates = curator
        .watch_node(api::WatchNodeRequest {})
        .await?
        .into_inner();
    counts.sessions.fetch_add(1, Ordering::Relaxed);
    let mut next_beat = tokio::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        tokio::select! {
            _ = tokio::time::sleep_until(next_beat) => {
                next_beat += period;
                let beat = curator.heartbeat(api::HeartbeatRequest { status: Some(sim_status(node)) });
                if let Err(e) = tokio::time::timeout(Duration::from_secs(10), beat).await? {
                    counts.failed_heartbeats.fetch_add(1, Ordering::Relaxed);
                    return Err(e.into());
                }
            }
            update = updates.message() => {
                let update = update?.context("WatchNode ended")?;
                if !update.cluster_cas.is_empty() {
                    node.trust.trust(update.cluster_cas.iter().map(|c| c.to_vec()).collect())?;
                }
                for crl in &update.cluster_crls {
                    node.trust.offer(crl)?;
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        let signing = node.trust.cas().first().cloned().unwrap_or_default();
        let credentials = node.credentials.credentials();
        if !pki::issued_by(&credentials.certificate, &signing) {
            let renewed = curator
                .renew_certificates(api::RenewCertificatesRequest { peer: false })
                .await?
                .into_inner();
            node.credentials.replace(rpc::Credentials {
                certificate: renewed.node_certificate,
                key_pkcs8: credentials.key_pkcs8,
            })?;
            counts.renewals.fetch_add(1, Ordering::Relaxed);
            // The connection keeps the old certificate: the next one presents the new.
            return Ok(());
        }
    }
    Ok(())
}

/// A simulated node's life until `stop`: sessions down its list of curators, a short
/// pause after a round where none held.
async fn sim_node(
    node: Arc<Simulated>,
    period: Duration,
    stop: Arc<AtomicBool>,
    counts: Arc<SimCounts>,
) {
    while !stop.load(Ordering::Relaxed) {
        for endpoint in node.preference.clone() {
            if sim_session(&node, endpoint, period, &stop, &counts)
                .await
                .is_ok()
            {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Enrols `count` simulated nodes into `cluster` (the members at `curators`) and starts
/// them on `runtime`; returns once each has had a heartbeat answered that reports the
/// CAs it trusts (rotate-ca waits for that).
fn start_simulated(
    cluster: &Cluster,
    curators: &[SocketAddr],
    count: usize,
    runtime: &tokio::runtime::Runtime,
    stop: &Arc<AtomicBool>,
    counts: &Arc<SimCounts>,
) -> Result<()> {
    let owner = cluster.owner_client()?;
    owner.set_endpoints(curators.to_vec());
    let ca = e2e::pem_der(&cluster.config.join("ca.pem"))?;
    let crl = e2e::pem_der(&cluster.config.join("crl.pem"))?;
    let period = curator::health::Timing::DEFAULT.period();
    runtime.block_on(async {
        let ticket = e2e::register_ticket(&owner).await?;
        let pinned = rpc::ServerTrust::PinnedCa(ca.clone());
        let enrolment = e2e::Enrolment {
            trust: &pinned,
            owner: &owner,
            ticket: &ticket,
        };
        for n in 0..count {
            let key = identity::NodeKey::generate()?;
            let address = e2e::sim_address(n);
            let preference = rpc::spread::by_preference(address.as_bytes(), curators);
            let (certificate, _) = e2e::enrol_at(&enrolment, preference[0], &key, &address)
                .await
                .with_context(|| format!("enrolling simulated node {n}"))?;
            let trust = rpc::TrustSlot::new(ca.clone());
            trust.offer(&crl)?;
            let node = Arc::new(Simulated {
                address,
                credentials: rpc::CredentialSlot::new(rpc::Credentials {
                    certificate,
                    key_pkcs8: key.pkcs8_der().to_vec(),
                })?,
                trust,
                preference,
            });
            tokio::spawn(sim_node(node, period, stop.clone(), counts.clone()));
        }
        anyhow::Ok(())
    })?;
    // Every node's first heartbeat (at its session's start) reports its trust.
    e2e::wait_until(
        "every simulated node to hold a session",
        e2e::TIMEOUT,
        || counts.sessions.load(Ordering::Relaxed) >= count,
    )
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    let simulated = args.next_if(|a| a == "--simulated").is_some();
    let first: Option<usize> = args.next().map(|a| a.parse()).transpose()?;
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3);
    let (workers, simulated) = if simulated {
        (0, first.context("--simulated needs a number of nodes")?)
    } else {
        (first.unwrap_or(4), 0)
    };
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
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(SimCounts::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if simulated > 0 {
        let curators: Vec<SocketAddr> = [&cluster.first, &nodes[0].0, &nodes[1].0]
            .iter()
            .map(|n| SocketAddr::new(n.address, rpc::CURATOR_PORT))
            .collect();
        start_simulated(&cluster, &curators, simulated, &runtime, &stop, &counts)?;
    }
    println!(
        "cluster: 3 members, {workers} workers, {simulated} simulated nodes; {rounds} \
         rotations under polisctl label writes"
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
        "simulated_nodes": simulated,
        "simulated_renewals": counts.renewals.load(Ordering::Relaxed),
        "simulated_failed_heartbeats": counts.failed_heartbeats.load(Ordering::Relaxed),
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
    stop.store(true, Ordering::Relaxed);
    drop(nodes);
    println!("{summary}");
    Ok(())
}
