//! The role server: runs the services the node's roles call for.
//!
//! ```text
//!   cluster manager ──Membership──▶ controlplane ──spawns──▶ consensus (etcd)
//!                                        │
//!                                        ├─ bootstrap: CAs, node record, owner, sealed config
//!                                        ├─ join: checks etcd is this node's cluster
//!                                        ├─▶ ClusterState::Home
//!                                        └──spawns──▶ curator (election + gRPC :7835)
//!   heartbeat ── waits for Home ── Curator.Heartbeat every 5 s (node certificate)
//! ```
//! Today every node is a consensus member (the bootstrap node); role fetch and status
//! push arrive with registration of further nodes.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use consensus::{EtcdConfig, InitialClusterState, PeerTlsFiles, RaftTiming, Running, Status};
use curator::BootstrapRecords;
use proto::config::{ClusterConfiguration, SealedConfiguration};
use proto::state::{ConsensusMemberRole, Node, NodeRoles, NodeState};

use crate::cluster::{BootstrapData, JoinData, Membership, NodeValues, crash_point, node_template};
use crate::decision::ClusterState;
use crate::storage::{Root, read_file, write_atomic, write_proto};

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
    let (heartbeat_settings, heartbeat_values) = (settings.clone(), values.clone());
    ctx.run("controlplane", move |ctx| {
        controlplane(ctx, settings.clone(), values.clone(), fatal.clone())
    })?;
    ctx.run("heartbeat", move |ctx| {
        heartbeat(ctx, heartbeat_settings.clone(), heartbeat_values.clone())
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
        Membership::Bootstrap(b) => bootstrap_finish(&settings, &running, b).await,
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

/// Tells the curator every [`HEARTBEAT_PERIOD`] that this node is alive.
async fn heartbeat(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    let mut state = values.cluster_state.watch();
    tokio::select! {
        s = state.get_matching(|s| *s == ClusterState::Home) => { s?; }
        _ = ctx.cancelled() => return Ok(()),
    }
    let credentials = node_credentials(&settings.root)?;
    let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
    let own = SocketAddr::new(settings.address, rpc::CURATOR_PORT);
    let trust = rpc::ServerTrust::PinnedCa(ca);
    ctx.signal_healthy();
    // Heartbeats go to the leader: start with the local curator and follow the leader
    // it names when it is not the leader itself.
    let mut target = own;
    let mut channel = None;
    let mut failures = 0u32;
    loop {
        if channel.is_none() {
            channel = rpc::connect(target, &trust, Some(&credentials)).await.ok();
        }
        let sent = match channel.clone() {
            Some(ch) => proto::api::curator_client::CuratorClient::new(ch)
                .heartbeat(proto::api::HeartbeatRequest {})
                .await
                .map(drop),
            None => Err(tonic::Status::unavailable(format!(
                "cannot reach the curator at {target}"
            ))),
        };
        let wait = match sent {
            Ok(()) => {
                failures = 0;
                HEARTBEAT_PERIOD
            }
            Err(status) => {
                failures += 1;
                // The curator may still be electing a leader: retry soon, and only
                // complain when it persists.
                if failures % 10 == 3 {
                    tracing::warn!(%target, "heartbeat failed {failures} times in a row: {}", status.message());
                }
                let leader = match (&channel, status.code()) {
                    (Some(ch), tonic::Code::Unavailable) => rpc::leader_endpoint(ch.clone()).await,
                    _ => None,
                };
                match leader {
                    Some(leader) if leader != target => {
                        tracing::info!(%leader, "heartbeats go to the curator leader");
                        target = leader;
                        channel = None;
                    }
                    _ if channel.is_none() && target != own => {
                        // The leader we followed is gone: ask the local curator again.
                        target = own;
                    }
                    _ if failures.is_multiple_of(5) => channel = None,
                    _ => {}
                }
                Duration::from_millis(500)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

/// A failed step is either worth retrying (etcd hiccup) or proof that this root cannot
/// come up as its cluster (mismatched identity).
enum Step {
    Retry(anyhow::Error),
    Fatal(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Step {
    fn from(e: E) -> Self {
        Step::Retry(e.into())
    }
}

/// Writes the new cluster's state into etcd, then the sealed configuration (last).
/// Every step is idempotent, so a restart of this runnable repeats it safely.
async fn bootstrap_finish(
    settings: &Settings,
    running: &Running,
    b: &BootstrapData,
) -> Result<(), Step> {
    crash_point("etcd-ready");
    let root = &settings.root;
    let node_id = b.key.node_id();
    let curator_ns = running.namespaced(curator::state::NAMESPACE);
    let cluster_pki = curator::cluster_pki(&curator_ns);
    let etcd_pki = pki::CaStore::new(running.namespaced("etcd-pki"));

    let (cluster_ca, _) = cluster_pki
        .ensure_ca(|| Ok(b.cluster_ca.clone()))
        .await
        .context("storing the cluster CA")?;
    let (peer_ca, _) = etcd_pki
        .ensure_ca(|| Ok(b.peer_ca.clone()))
        .await
        .context("storing the etcd peer CA")?;
    crash_point("cluster-pki");
    if cluster_ca != b.cluster_ca || peer_ca != b.peer_ca {
        return Err(Step::Fatal(anyhow!(
            "etcd already holds CAs other than the ones this bootstrap created"
        )));
    }
    etcd_pki
        .ensure_certificate(&format!("peer-{node_id}"), || {
            Ok(b.peer_certificate.clone())
        })
        .await
        .context("recording the etcd peer certificate")?;
    let node_certificate = cluster_pki
        .ensure_certificate(&format!("node-{node_id}"), || {
            cluster_ca.issue(
                &node_template(&node_id, settings.address),
                &b.key.public_key(),
            )
        })
        .await
        .context("issuing the node certificate")?;
    write_atomic(&root.node_certificate(), &node_certificate)
        .context("saving the node certificate")?;
    write_atomic(&root.cluster_ca(), &cluster_ca.cert_der)
        .context("saving the cluster CA certificate")?;
    crash_point("node-certificate");

    let records = BootstrapRecords {
        node: Node {
            id: node_id.clone(),
            public_key: b.key.public_key().to_vec(),
            state: NodeState::Up as i32,
            roles: Some(NodeRoles {
                consensus_member: Some(ConsensusMemberRole {}),
            }),
            address: settings.address.to_string(),
            labels: b.parameters.labels.clone(),
        },
        owner_public_key: b.parameters.owner_public_key.clone(),
        configuration: b
            .parameters
            .initial_cluster_configuration
            .clone()
            .unwrap_or_else(|| ClusterConfiguration {
                cluster_domain: "polis.internal".into(),
            }),
    };
    match curator::create_bootstrap_records(&curator_ns, &records).await {
        Ok(()) => {}
        Err(e @ curator::CuratorError::BootstrapConflict { .. }) => {
            return Err(Step::Fatal(e.into()));
        }
        Err(e) => {
            return Err(Step::Retry(
                anyhow::Error::from(e).context("writing the cluster records"),
            ));
        }
    }
    crash_point("records");

    let sealed = SealedConfiguration {
        node_id,
        cluster_ca_certificate: cluster_ca.cert_der.clone(),
        address: settings.address.to_string(),
        etcd_cluster_id: running.cluster_id,
        etcd_member_id: running.member_id,
    };
    write_proto(&root.sealed_configuration(), &sealed)
        .context("writing the sealed configuration")?;
    crash_point("sealed");
    tracing::info!(
        cluster_id = format!("{:x}", running.cluster_id),
        "bootstrap complete; sealed configuration written"
    );
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
