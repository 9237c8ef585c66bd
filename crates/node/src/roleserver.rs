//! The role server: runs the services the node's roles call for.
//!
//! ```text
//!   cluster manager ──Membership──▶ role server
//!                                     │ consensus member (bootstrap node, or roles say so):
//!                                     ├─▶ controlplane ──spawns──▶ consensus (etcd)
//!                                     │        ├─ bootstrap: CAs, node record, owner, sealed config
//!                                     │        ├─ join: checks etcd is this node's cluster
//!                                     │        ├─▶ ClusterState::Home
//!                                     │        └──spawns──▶ curator (election + gRPC :7835)
//!                                     ├─▶ rolefetch ── Curator.WatchNode (stream, node certificate):
//!                                     │                 own state and roles, curator list →
//!                                     │                 cluster directory (esp/directory.pb);
//!                                     │                 a worker is Home once a curator answers
//!                                     └─▶ heartbeat ── waits for Home ── Curator.Heartbeat every 5 s
//! ```
//! Every call to the cluster goes through one leader-aware `rpc::CuratorClient` over the
//! curators this node knows (`NodeValues::curators`: its own first, then the directory).
//! Starting and stopping the control plane when roles change arrives with live
//! membership changes; today roles are fixed when the node joins.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use consensus::{EtcdConfig, InitialClusterState, PeerTlsFiles, RaftTiming, Running, Status};
use proto::config::ClusterDirectory;

use crate::bootstrap::Step;
use crate::cluster::{JoinData, Membership, NodeValues};
use crate::decision::ClusterState;
use crate::register::{Backoff, ProblemLog, pause};
use crate::storage::{Root, read_file, write_proto};

/// Node settings the role server needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub root: Root,
    pub address: IpAddr,
    pub etcd_binary: PathBuf,
    pub raft_timing: RaftTiming,
    pub curator_lease_ttl: Duration,
    pub owner_certificate_lifetime: Duration,
}

/// How often a node tells the curator it is alive, and after how long without a
/// heartbeat the curator reports it as timed out (three missed periods: no flapping).
pub const HEARTBEAT_PERIOD: Duration = Duration::from_secs(5);
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(15);

/// Where a fatal (not retryable) error goes: main stops the node with it.
pub type FatalSender = tokio::sync::mpsc::UnboundedSender<anyhow::Error>;

pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
    fatal: FatalSender,
) -> supervisor::RunnableResult {
    // A registering node waits here until it belongs to the cluster.
    let mut membership_watcher = values.membership.watch();
    let membership = tokio::select! {
        m = membership_watcher.get() => m?,
        _ = ctx.cancelled() => return Ok(()),
    };
    if membership.consensus_member() {
        let (settings, values, fatal) = (settings.clone(), values.clone(), fatal.clone());
        ctx.run("controlplane", move |ctx| {
            controlplane(ctx, settings.clone(), values.clone(), fatal.clone())
        })?;
    }
    let (fetch_settings, fetch_values) = (settings.clone(), values.clone());
    ctx.run("rolefetch", move |ctx| {
        rolefetch(ctx, fetch_settings.clone(), fetch_values.clone())
    })?;
    ctx.run("heartbeat", move |ctx| {
        heartbeat(ctx, settings.clone(), values.clone())
    })?;
    ctx.signal_healthy();
    ctx.cancelled().await;
    Ok(())
}

fn etcd_config(settings: &Settings, membership: &Membership) -> EtcdConfig {
    let root = &settings.root;
    let name = membership.key().node_id();
    let peer_dir = root.etcd_peer_dir();
    let peer_url = consensus::config::peer_url(settings.address, consensus::config::PEER_PORT);
    EtcdConfig {
        binary: settings.etcd_binary.clone(),
        name: name.clone(),
        data_dir: root.etcd_data(),
        run_dir: root.consensus_run_dir(),
        peer_address: settings.address,
        peer_port: consensus::config::PEER_PORT,
        peer_tls: PeerTlsFiles {
            cert: peer_dir.join("cert.pem"),
            key: peer_dir.join("key.pem"),
            ca: peer_dir.join("ca.pem"),
            crl: peer_dir.join("crl.pem"),
        },
        initial_cluster: vec![(name.clone(), peer_url)],
        initial_cluster_state: match membership {
            Membership::Bootstrap(_) => InitialClusterState::New,
            // With existing data etcd ignores this; without, it refuses instead of
            // silently creating a new cluster.
            Membership::Join(_) => InitialClusterState::Existing,
        },
        cluster_token: format!("polis-{name}"),
        timing: settings.raft_timing,
    }
}

async fn controlplane(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
    fatal: FatalSender,
) -> supervisor::RunnableResult {
    let membership = values.membership.watch().get().await?;
    let config = etcd_config(&settings, &membership);
    let status = event::Value::<Status>::new();
    let etcd_status = status.clone();
    ctx.run("consensus", move |ctx| {
        let (config, status) = (config.clone(), etcd_status.clone());
        async move {
            consensus::run(&ctx, &config, &status).await?;
            Ok(())
        }
    })?;
    let mut status_watcher = status.watch();
    let running = tokio::select! {
        s = status_watcher.get_matching(|s| matches!(s, Status::Running(_))) => match s? {
            Status::Running(r) => r,
            Status::Stopped => unreachable!("filtered for Running"),
        },
        _ = ctx.cancelled() => return Ok(()),
    };
    let outcome = match &membership {
        Membership::Bootstrap(b) => {
            crate::bootstrap::finish(&settings.root, settings.address, &running, b).await
        }
        Membership::Join(j) => check_join(&running, j).await,
    };
    match outcome {
        Ok(()) => {}
        Err(Step::Retry(e)) => return Err(e.into()),
        Err(Step::Fatal(e)) => {
            let _ = fatal.send(e);
            ctx.cancelled().await;
            return Ok(());
        }
    }
    let curator_config = curator::service::CuratorConfig {
        node_id: membership.key().node_id(),
        listen: SocketAddr::new(settings.address, rpc::CURATOR_PORT),
        credentials: node_credentials(&settings.root)?,
        ca_certificate: read_file(&settings.root.cluster_ca(), "cluster CA certificate")?,
        lease_ttl: settings.curator_lease_ttl,
        owner_certificate_lifetime: settings.owner_certificate_lifetime,
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
    };
    let curator_ns = running.namespaced(curator::state::NAMESPACE);
    ctx.run("curator", move |ctx| {
        curator::service::run(ctx, curator_config.clone(), curator_ns.clone())
    })?;
    values.cluster_state.set(ClusterState::Home);
    ctx.signal_healthy();
    ctx.cancelled().await;
    Ok(())
}

/// The node's own certificate and key, for serving and for calling the curator.
fn node_credentials(root: &Root) -> Result<rpc::Credentials> {
    Ok(rpc::Credentials {
        certificate: read_file(&root.node_certificate(), "node certificate")?,
        key_pkcs8: read_file(&root.node_key(), "node key")?,
    })
}

/// A client of the cluster's curators with this node's certificate.
fn curator_client(settings: &Settings, values: &NodeValues) -> Result<rpc::CuratorClient> {
    let credentials = node_credentials(&settings.root)?;
    let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
    Ok(rpc::CuratorClient::new(
        values.curators.current().unwrap_or_default(),
        rpc::ServerTrust::PinnedCa(ca),
        Some(credentials),
    ))
}

/// Waits for the cluster state `want`; false when cancelled first.
async fn wait_for_state(
    ctx: &supervisor::Context,
    values: &NodeValues,
    want: ClusterState,
) -> Result<bool> {
    let mut state = values.cluster_state.watch();
    tokio::select! {
        s = state.get_matching(|s| *s == want) => { s?; Ok(true) }
        _ = ctx.cancelled() => Ok(false),
    }
}

/// Tells the curator every [`HEARTBEAT_PERIOD`] that this node is alive.
async fn heartbeat(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    if !wait_for_state(&ctx, &values, ClusterState::Home).await? {
        return Ok(());
    }
    let client = curator_client(&settings, &values)?;
    ctx.signal_healthy();
    let mut failures = 0u32;
    loop {
        client.set_endpoints(values.curators.current().unwrap_or_default());
        let sent = client
            .call(|channel| async move {
                proto::api::curator_client::CuratorClient::new(channel)
                    .heartbeat(proto::api::HeartbeatRequest {})
                    .await
            })
            .await;
        let wait = match sent {
            Ok(_) => {
                if failures >= 3 {
                    tracing::info!(curator = ?client.current(), "heartbeats reach the curator again");
                }
                failures = 0;
                HEARTBEAT_PERIOD
            }
            Err(e) => {
                failures += 1;
                // The curator may still be electing a leader: retry soon, and only
                // complain when it persists.
                if failures % 10 == 3 {
                    tracing::warn!("heartbeat failed {failures} times in a row: {e}");
                }
                Duration::from_millis(500)
            }
        };
        if !pause(&ctx, wait).await {
            return Ok(());
        }
    }
}

/// Watches this node's record and the curator list (Curator.WatchNode): keeps the
/// cluster directory current, and makes a worker Home once a curator answers for it.
async fn rolefetch(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    let membership = values.membership.watch().get().await?;
    let consensus_member = membership.consensus_member();
    // A consensus member is Home once its control plane runs; its curator answers then.
    if consensus_member && !wait_for_state(&ctx, &values, ClusterState::Home).await? {
        return Ok(());
    }
    let client = curator_client(&settings, &values)?;
    ctx.signal_healthy();
    let mut problems = ProblemLog::default();
    let mut backoff = Backoff::default();
    let own = SocketAddr::new(settings.address, rpc::CURATOR_PORT);
    loop {
        client.set_endpoints(values.curators.current().unwrap_or_default());
        let call = client.call(|channel| async move {
            proto::api::curator_client::CuratorClient::new(channel)
                .watch_node(proto::api::WatchNodeRequest {})
                .await
        });
        let mut stream = tokio::select! {
            r = call => match r {
                Ok(s) => s,
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
                if consensus_member && !endpoints.contains(&own) {
                    endpoints.insert(0, own);
                }
                if values.curators.current().as_ref() != Some(&endpoints) {
                    tracing::info!(curators = ?endpoints, "curator directory updated");
                    values.curators.set(endpoints);
                }
            }
            if !consensus_member && values.cluster_state.current() != Some(ClusterState::Home) {
                values.cluster_state.set(ClusterState::Home);
            }
        }
        if !pause(&ctx, backoff.next()).await {
            return Ok(());
        }
    }
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

/// On restart: the etcd we started must be the cluster and member this node sealed.
async fn check_join(running: &Running, j: &JoinData) -> Result<(), Step> {
    let sealed = &j.sealed;
    if running.cluster_id != sealed.etcd_cluster_id || running.member_id != sealed.etcd_member_id {
        return Err(Step::Fatal(anyhow!(
            "etcd data is cluster {:x} member {:x}, but the sealed configuration says cluster {:x} member {:x}; \
             the etcd data directory does not belong to this node",
            running.cluster_id,
            running.member_id,
            sealed.etcd_cluster_id,
            sealed.etcd_member_id
        )));
    }
    let curator_ns = running.namespaced(curator::state::NAMESPACE);
    let ca = curator::cluster_pki(&curator_ns)
        .load_ca()
        .await
        .context("loading the cluster CA")?;
    match ca {
        Some(ca) if ca.cert_der == sealed.cluster_ca_certificate => {}
        _ => {
            return Err(Step::Fatal(anyhow!(
                "the cluster CA in etcd does not match the sealed configuration"
            )));
        }
    }
    match curator::load_node(&curator_ns, &sealed.node_id).await {
        Ok(Some(node))
            if node.public_key == j.key.public_key() && node.address == sealed.address =>
        {
            Ok(())
        }
        Ok(Some(node)) => Err(Step::Fatal(anyhow!(
            "the cluster's record of node {} (address {}) does not match this node's key and address {}",
            sealed.node_id,
            node.address,
            sealed.address
        ))),
        Ok(None) => Err(Step::Fatal(anyhow!(
            "node {} has no record in the cluster",
            sealed.node_id
        ))),
        Err(e) => Err(Step::Retry(e.into())),
    }
}

/// Preflight for a join: refuses roots whose etcd data is gone.
pub fn check_join_root(root: &Root) -> Result<()> {
    let data = root.etcd_data();
    if !data.join("member").is_dir() {
        bail!(
            "the sealed configuration says this node is a consensus member, but its etcd data at {} is missing; \
             starting would create a new, empty cluster",
            data.display()
        );
    }
    Ok(())
}
