//! The role server: runs the services the node's roles call for.
//!
//! ```text
//!   cluster manager ──Membership──▶ role server
//!                                     │ while the roles hold ConsensusMember (see controlplane):
//!                                     ├─▶ controlplane ──▶ consensus (etcd: bootstrap, existing
//!                                     │                    member, or new learner), crlsync,
//!                                     │                    curator (election + gRPC :7835)
//!                                     ├─▶ rolefetch ── Curator.WatchNode (stream, node certificate):
//!                                     │                 own state and roles, curator list →
//!                                     │                 cluster directory (esp/directory.pb);
//!                                     │                 a worker is Home once a curator answers
//!                                     ├─▶ heartbeat ── waits for Home ── Curator.Heartbeat(status)
//!                                     │                 every period (5 s): address, version,
//!                                     │                 etcd member / curator running, start
//!                                     │                 time; no answer for longer than the
//!                                     │                 timeout (15 s) → Split, answered → Home
//!                                     └─▶ renew ── node (and etcd peer) certificate renewed at
//!                                                  2/3 of its lifetime, applied live (see renew)
//! ```
//! Every call to the cluster goes through one leader-aware `rpc::CuratorClient` over the
//! curators this node knows (`NodeValues::curators`: its own first, then the directory).
//! Roles are live: rolefetch saves the roles the cluster gives this node
//! (`data/node/roles.pb`) and publishes them (`NodeValues::roles`); the role server
//! starts the control plane when ConsensusMember appears and stops it — then wipes the
//! node's etcd data and peer credentials — when it goes (`supervisor::Stoppable`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use consensus::RaftTiming;
use proto::config::ClusterDirectory;
use proto::state::NodeStatus;

use crate::cluster::{NodeValues, apply_contact};
use crate::decision::{ClusterState, Contact};
use crate::register::{Backoff, ProblemLog, pause};
use crate::storage::{Root, read_file, write_atomic, write_proto};

/// Node settings the role server needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub root: Root,
    pub address: IpAddr,
    pub etcd_binary: PathBuf,
    pub raft_timing: RaftTiming,
    pub curator_lease_ttl: Duration,
    /// How often this node heartbeats; its curator's timeout (`curator::health`).
    pub heartbeat: curator::health::Timing,
    /// When this polis-node process started (reported in its status).
    pub started_at_unix_ms: u64,
}

/// Where a fatal (not retryable) error goes: main stops the node with it. A
/// [`LeftCluster`] error is the one good ending: main wipes the node's data and exits 0.
pub type FatalSender = tokio::sync::mpsc::UnboundedSender<anyhow::Error>;

/// The node was decommissioned: it has left its cluster for good.
#[derive(Debug, thiserror::Error)]
#[error("node {node_id} was decommissioned and left its cluster")]
pub struct LeftCluster {
    pub node_id: String,
}

pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
    fatal: FatalSender,
) -> supervisor::RunnableResult {
    // A registering node waits here until it belongs to the cluster.
    let mut membership_watcher = values.membership.watch();
    tokio::select! {
        m = membership_watcher.get() => { m?; }
        _ = ctx.cancelled() => return Ok(()),
    };
    let saved_crl = settings.root.cluster_crl();
    if saved_crl.exists() {
        let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
        let crl = read_file(&saved_crl, "cluster CRL")?;
        offer_crl(&settings, &values, &ca, &crl, false)?;
    }
    let (fetch_settings, fetch_values, fetch_fatal) =
        (settings.clone(), values.clone(), fatal.clone());
    ctx.run("rolefetch", move |ctx| {
        rolefetch(
            ctx,
            fetch_settings.clone(),
            fetch_values.clone(),
            fetch_fatal.clone(),
        )
    })?;
    let (heartbeat_settings, heartbeat_values) = (settings.clone(), values.clone());
    ctx.run("heartbeat", move |ctx| {
        heartbeat(ctx, heartbeat_settings.clone(), heartbeat_values.clone())
    })?;
    let (renew_settings, renew_values) = (settings.clone(), values.clone());
    ctx.run("renew", move |ctx| {
        crate::renew::run(ctx, renew_settings.clone(), renew_values.clone())
    })?;
    ctx.signal_healthy();

    // The control plane follows the ConsensusMember role, live.
    let mut controlplane: Option<supervisor::Stoppable> = None;
    let mut roles = values.roles.watch();
    loop {
        let current = tokio::select! {
            r = roles.get() => r?,
            _ = ctx.cancelled() => return Ok(()),
        };
        match (current.consensus_member, controlplane.is_some()) {
            (true, false) => {
                tracing::info!("this node is a consensus member: starting its control plane");
                let (settings, values, fatal) = (settings.clone(), values.clone(), fatal.clone());
                controlplane = Some(ctx.run_stoppable("controlplane", move |ctx| {
                    crate::controlplane::run(ctx, settings.clone(), values.clone(), fatal.clone())
                })?);
            }
            (false, running) => {
                if let Some(plane) = controlplane.take() {
                    tracing::info!(
                        "the ConsensusMember role was taken away: stopping etcd and the curator"
                    );
                    plane.stop().await;
                }
                if running || crate::controlplane::has_etcd_data(&settings.root) {
                    crate::controlplane::forget_consensus(&settings.root)?;
                    tracing::info!("left consensus: etcd data and peer credentials removed");
                }
            }
            (true, true) => {}
        }
    }
}

/// A client of the cluster's curators with this node's certificate (the current one:
/// after a renewal its next call connects with the new certificate), checking theirs
/// against the cluster CA and the newest CRL this node has seen.
pub fn curator_client(settings: &Settings, values: &NodeValues) -> Result<rpc::CuratorClient> {
    let credentials = values.credentials.slot(&settings.root)?;
    let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
    Ok(rpc::CuratorClient::with_slot(
        values.curators.current().unwrap_or_default(),
        rpc::ServerTrust::ClusterCa {
            ca,
            crl: values.crl.clone(),
        },
        Some(credentials),
    ))
}

/// Takes `crl` (from a curator, or the saved copy) into the node's CRL slot when it is
/// the cluster CA's and newer than the one held; saves it when it was new.
fn offer_crl(
    settings: &Settings,
    values: &NodeValues,
    ca: &[u8],
    crl: &[u8],
    save: bool,
) -> Result<()> {
    match values.crl.offer(ca, crl) {
        Ok(true) if save => {
            write_atomic(&settings.root.cluster_crl(), crl).context("saving the cluster CRL")?;
            tracing::info!(
                revoked = pki::crl_serials(crl).map(|s| s.len()).unwrap_or_default(),
                "cluster CRL updated"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("ignoring a cluster CRL: {e}"),
    }
    Ok(())
}

/// Tells the curator every heartbeat period that this node is alive, with its status;
/// publishes Split when no curator has answered for longer than the heartbeat timeout,
/// and Home again once one answers (`ClusterState::after`).
async fn heartbeat(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    // Home, or Split when this runnable restarts while the node is split.
    let mut state = values.cluster_state.watch();
    tokio::select! {
        s = state.get_matching(|s| matches!(s, ClusterState::Home | ClusterState::Split)) => { s?; }
        _ = ctx.cancelled() => return Ok(()),
    }
    let client = curator_client(&settings, &values)?;
    ctx.signal_healthy();
    let timing = settings.heartbeat;
    let bounds = HeartbeatBounds::new(&timing);
    // When the current run of failed heartbeats began: time without contact counts only
    // while this loop tries (a node that was itself frozen is not split by that).
    let mut failing_since: Option<Instant> = None;
    let mut failures = 0u32;
    loop {
        client.set_endpoints(values.curators.current().unwrap_or_default());
        let request = proto::api::HeartbeatRequest {
            status: Some(node_status(&settings, &values)),
        };
        let attempted = Instant::now();
        let call = client.call(|channel| {
            let request = request.clone();
            async move {
                let mut curator = proto::api::curator_client::CuratorClient::new(channel);
                tokio::time::timeout(bounds.attempt, curator.heartbeat(request))
                    .await
                    .unwrap_or_else(|_| {
                        Err(tonic::Status::unavailable(
                            "the curator did not answer in time",
                        ))
                    })
            }
        });
        let sent = match tokio::time::timeout(bounds.call, call).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no curator answered within {:?}", bounds.call)),
        };
        let wait = match sent {
            Ok(_) => {
                failing_since = None;
                if apply_contact(&values.cluster_state, Contact::Restored) {
                    tracing::info!(curator = ?client.current(), "a curator answers heartbeats again: back Home");
                } else if failures >= 3 {
                    tracing::info!(curator = ?client.current(), "heartbeats reach the curator again");
                }
                failures = 0;
                timing.period()
            }
            Err(e) => {
                failures += 1;
                let silent = failing_since.get_or_insert(attempted).elapsed();
                if silent > timing.timeout() && apply_contact(&values.cluster_state, Contact::Lost)
                {
                    tracing::warn!(
                        "no curator has answered a heartbeat for {silent:?} (timeout {:?}): split from the cluster; last error: {e}",
                        timing.timeout()
                    );
                } else if failures % 10 == 3 {
                    // The curator may still be electing a leader: retry soon, and only
                    // complain when it persists.
                    tracing::warn!("heartbeat failed {failures} times in a row: {e}");
                }
                bounds.retry
            }
        };
        if !pause(&ctx, wait).await {
            return Ok(());
        }
    }
}

/// Time bounds of the heartbeat loop, from the heartbeat timing.
#[derive(Debug, Clone, Copy)]
struct HeartbeatBounds {
    /// One curator gets this long to answer (a stopped one would otherwise hold the
    /// heartbeat for the channel's 30 s).
    attempt: Duration,
    /// One heartbeat, across every curator and the client's retries.
    call: Duration,
    /// Pause after a failed heartbeat.
    retry: Duration,
}

impl HeartbeatBounds {
    fn new(timing: &curator::health::Timing) -> HeartbeatBounds {
        HeartbeatBounds {
            attempt: (timing.timeout() / 4).max(Duration::from_millis(500)),
            call: timing.timeout() / 2,
            retry: timing.period().min(Duration::from_millis(500)),
        }
    }
}

/// What this node reports of itself with each heartbeat.
fn node_status(settings: &Settings, values: &NodeValues) -> NodeStatus {
    let services = values.services.current().unwrap_or_default();
    NodeStatus {
        address: settings.address.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        etcd_member_running: services.etcd_member,
        curator_running: services.curator,
        started_at_unix_ms: settings.started_at_unix_ms,
    }
}

/// Watches this node's record and the curator list (Curator.WatchNode): keeps the
/// cluster directory current, makes a worker Home once a curator answers for it, and
/// carries out a decommission: DECOMMISSIONING makes the node Disowning; DECOMMISSIONED,
/// or its certificate refused as revoked while Disowning, ends the node
/// ([`LeftCluster`]).
async fn rolefetch(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
    fatal: FatalSender,
) -> supervisor::RunnableResult {
    // Runs from the start on consensus members too: a member whose role was taken while
    // it was down learns it here (its own control plane may never come up).
    values.membership.watch().get().await?;
    let mut client = curator_client(&settings, &values)?;
    let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
    ctx.signal_healthy();
    // Whether the node watch was renewed because this node's etcd member stopped.
    let mut resynced = false;
    let mut problems = ProblemLog::default();
    let mut backoff = Backoff::default();
    let own = SocketAddr::new(settings.address, rpc::CURATOR_PORT);
    loop {
        // Other curators first: this node's own curator answers from its own etcd
        // member, which is the one that stops serving when the node leaves consensus.
        let mut endpoints = values.curators.current().unwrap_or_default();
        if let Some(at) = endpoints.iter().position(|e| *e == own) {
            let mine = endpoints.remove(at);
            endpoints.push(mine);
        }
        client.set_endpoints(endpoints);
        let call = client.call(|channel| async move {
            proto::api::curator_client::CuratorClient::new(channel)
                .watch_node(proto::api::WatchNodeRequest {})
                .await
        });
        let mut stream = tokio::select! {
            r = call => match r {
                Ok(s) => s,
                Err(rpc::CallError::Status(status)) if rpc::is_revoked(&status) => {
                    // Node certificates are revoked only when the node is decommissioned
                    // or deleted.
                    let node_id = node_id(&values).await?;
                    if disowning(&settings, &values) {
                        tracing::info!("this node's certificate was revoked: decommission complete");
                        let _ = fatal.send(LeftCluster { node_id }.into());
                    } else {
                        let _ = fatal.send(anyhow::anyhow!(
                            "the cluster refuses this node's certificate as revoked: node {node_id} was \
                             decommissioned or deleted while it was down, and cannot rejoin its cluster. \
                             Its data is kept in {}; to use this machine in a cluster again, remove it \
                             and register the machine anew",
                            settings.root.root.display()
                        ));
                    }
                    ctx.cancelled().await;
                    return Ok(());
                }
                Err(e) => {
                    problems.problem(format!("watching this node's record: {e}"));
                    if !pause(&ctx, backoff.next()).await {
                        return Ok(());
                    }
                    continue;
                }
            },
            _ = ctx.cancelled() => return Ok(()),
        };
        problems.resolved("watching this node's record again");
        backoff.reset();
        loop {
            let update = tokio::select! {
                u = stream.message() => u,
                _ = own_etcd_gone(&values, &mut resynced) => {
                    // Removed from consensus, its etcd stopped: the news of the role going
                    // may be stuck with this node's own curator, or with a stream that
                    // predates it. Ask the other curators afresh (a new client: the one
                    // that answered last is tried first otherwise).
                    problems.problem(
                        "this node's etcd member stopped while it holds the ConsensusMember role; \
                         asking the other curators for its record"
                            .into(),
                    );
                    client = curator_client(&settings, &values)?;
                    break;
                }
                _ = ctx.cancelled() => return Ok(()),
            };
            let Ok(Some(update)) = update else {
                problems.problem("the curator closed the node watch".into());
                break;
            };
            let mut endpoints: Vec<SocketAddr> = update
                .curator_endpoints
                .iter()
                .filter_map(|e| rpc::parse_endpoint(e).ok())
                .collect();
            if !endpoints.is_empty() {
                save_directory(&settings.root, &update.curator_endpoints)?;
                if roles_need_control_plane(&values) && !endpoints.contains(&own) {
                    endpoints.insert(0, own);
                }
                if values.curators.current().as_ref() != Some(&endpoints) {
                    tracing::info!(curators = ?endpoints, "curator directory updated");
                    values.curators.set(endpoints);
                }
            }
            if !update.cluster_crl.is_empty() {
                offer_crl(&settings, &values, &ca, &update.cluster_crl, true)?;
            }
            match proto::api::NodeState::try_from(update.state) {
                Ok(proto::api::NodeState::Decommissioning) => enter_disowning(&settings, &values)?,
                Ok(proto::api::NodeState::Decommissioned) => {
                    enter_disowning(&settings, &values)?;
                    let node_id = node_id(&values).await?;
                    let _ = fatal.send(LeftCluster { node_id }.into());
                    ctx.cancelled().await;
                    return Ok(());
                }
                _ => {}
            }
            let roles = crate::cluster::roles_from_names(&update.roles);
            if values.roles.current().as_ref() != Some(&roles) {
                // Saved first: a restart starts the services these roles call for.
                write_proto(&settings.root.local_roles(), &roles)
                    .context("saving the node's roles")?;
                tracing::info!(consensus_member = roles.consensus_member, "roles changed");
                values.roles.set(roles);
            }
            // A worker enters its cluster here (a consensus member in its control
            // plane); only heartbeats move a node between Home and Split.
            if !roles_need_control_plane(&values) {
                apply_contact(&values.cluster_state, Contact::Joined);
            }
        }
        if !pause(&ctx, backoff.next()).await {
            return Ok(());
        }
    }
}

/// The node is being decommissioned: Disowning, recorded in the root (so that a restart
/// before the end still knows it), logged once.
fn enter_disowning(settings: &Settings, values: &NodeValues) -> Result<()> {
    if values.cluster_state.current() == Some(ClusterState::Disowning) {
        return Ok(());
    }
    crate::storage::write_atomic(&settings.root.disowning_marker(), b"")
        .context("recording that this node is being decommissioned")?;
    tracing::info!("this node is being decommissioned: leaving the cluster");
    values.cluster_state.set(ClusterState::Disowning);
    Ok(())
}

/// Whether this node knows it is being decommissioned (now or before a restart).
fn disowning(settings: &Settings, values: &NodeValues) -> bool {
    values.cluster_state.current() == Some(ClusterState::Disowning)
        || settings.root.disowning_marker().exists()
}

async fn node_id(values: &NodeValues) -> Result<String> {
    Ok(values.membership.watch().get().await?.key().node_id())
}

/// How long a consensus member's etcd may be down before rolefetch stops trusting its
/// current node watch (see [`own_etcd_gone`]).
const OWN_ETCD_GRACE: Duration = Duration::from_secs(5);

/// Resolves once this node holds the ConsensusMember role but its etcd member has not
/// run for [`OWN_ETCD_GRACE`] (it was removed from consensus, or is failing); never on a
/// worker. Once per stop of the etcd member: `fired` remembers that it resolved, until
/// the member runs again.
async fn own_etcd_gone(values: &NodeValues, fired: &mut bool) {
    let mut services = values.services.watch();
    loop {
        if *fired {
            if services.get_matching(|s| s.etcd_member).await.is_err() {
                std::future::pending::<()>().await;
            }
            *fired = false;
        }
        if services.get_matching(|s| !s.etcd_member).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(OWN_ETCD_GRACE).await;
        if values.services.current().is_some_and(|s| !s.etcd_member)
            && roles_need_control_plane(values)
        {
            *fired = true;
            return;
        }
    }
}

/// Whether the node's current roles call for a control plane (whose curator is local).
fn roles_need_control_plane(values: &NodeValues) -> bool {
    values.roles.current().is_some_and(|r| r.consensus_member)
}

/// Rewrites the cluster directory when it changed.
pub fn save_directory(root: &Root, endpoints: &[String]) -> Result<()> {
    let directory = ClusterDirectory {
        curator_endpoints: endpoints.to_vec(),
    };
    let path = root.directory();
    let current: Option<ClusterDirectory> =
        crate::storage::read_proto(&path, "cluster directory").ok();
    if current.as_ref() != Some(&directory) {
        write_proto(&path, &directory).context("saving the cluster directory")?;
    }
    Ok(())
}
