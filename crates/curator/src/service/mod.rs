//! The curator's gRPC services and the runnable that serves them: one module per
//! service, state shared through [`Shared`].
//!
//! ```text
//!   root.role.controlplane.curator
//!   ├── election     campaign → Role (Follower | Leader(Leadership))
//!   ├── nodes        one etcd watch on nodes/ → Shared::nodes (snapshot per change)
//!   ├── crl          one etcd watch on the cluster CRL → Shared::crl (see `crl`)
//!   ├── decommission leader: finishes DECOMMISSIONING nodes (see `decommission`)
//!   ├── certificates every issued certificate, refreshed → Shared::certificates
//!   │                (expiry warnings in NodeInfo; see `certificates`)
//!   ├── health       leader: heartbeat verdicts (crate::health) → Node.health on change
//!   └── listener     TLS + AuthLayer → local | aaa | management | nodes (Curator service)
//! ```
//! Heartbeats land in this tenure's [`HealthBook`]; `node_infos` (ListNodes,
//! DescribeNode) reads verdicts from it, never from etcd.
//! Handlers that change state take a [`Leadership`] from [`Shared::leadership`] and write
//! through `state` functions that require it, so no write bypasses the election.
//! Streams (RegisterNode, WatchNode) are fed by the shared node snapshot, not by an etcd
//! watch per client.

mod aaa;
pub mod certificates;
mod consensus_members;
mod crl;
mod decommission;
mod health;
mod listener;
mod local;
mod management;
mod nodes;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use consensus::Namespaced;
use proto::api::{self, NodeHealth};
use proto::state::HealthVerdict;
use proto::state::Node;
use tonic::{Request, Status};

use crate::CuratorError;
use crate::election::{self, ElectionConfig, Leadership, Role};
use crate::health as rules;
use crate::state::{self, NodeUpdateError};

/// Settings of one curator.
#[derive(Clone)]
pub struct CuratorConfig {
    pub node_id: String,
    pub listen: SocketAddr,
    /// This node's certificate and key: served to clients (from the next handshake on
    /// after a renewal replaced them) and presented when forwarding or asking peers.
    pub credentials: rpc::CredentialSlot,
    pub ca_certificate: Vec<u8>,
    pub lease_ttl: Duration,
    /// Heartbeat period and timeout (the nodes' period must be the one given here).
    pub heartbeat: rules::Timing,
}

/// Every node record, as of one etcd revision.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    pub nodes: BTreeMap<String, Node>,
    /// Every change of a node record up to this revision is in `nodes`.
    pub revision: i64,
    /// The election key under which the watch's first read was made: a snapshot based
    /// on a read after this curator won holds every earlier leader's writes.
    pub based_as_leader: Option<Vec<u8>>,
    /// `state::curator_endpoints` of `nodes`, computed once per snapshot: every WatchNode
    /// stream sends it, and scanning every record per stream per change would cost
    /// streams × nodes on each write (a status or health verdict is one).
    pub curator_endpoints: Vec<String>,
}

pub type NodeSnapshot = Arc<Snapshot>;

/// Shared by all services of one curator.
pub struct Shared {
    config: CuratorConfig,
    curator: Namespaced,
    role: event::Value<Role>,
    /// Heartbeats and health verdicts of this leader tenure (see [`HealthBook`]).
    health: Mutex<HealthBook>,
    /// Node records, fed by one etcd watch (the `nodes` runnable).
    nodes: event::Value<NodeSnapshot>,
    /// Whether that watch runs: when this curator's etcd member stops serving (e.g. it
    /// was removed from consensus) the snapshot is stale, and streams fed by it end.
    nodes_live: event::Value<bool>,
    /// Held while etcd membership changes: etcd 3.4 has at most one learner, so a join
    /// holds it until its learner is promoted, and joins and removals queue behind it.
    membership: Arc<tokio::sync::Mutex<()>>,
    /// The cluster CRL (DER), fed by one etcd watch (the `crl` runnable).
    crl: event::Value<Arc<Vec<u8>>>,
    /// The same CRL for this curator's own calls to other curators (forwarding, quorum
    /// questions): a removed node cannot pose as one.
    crl_slot: rpc::CrlSlot,
    /// What holds up each DECOMMISSIONING node, by node ID (the `decommission` runnable).
    decommission_problems: Mutex<HashMap<String, String>>,
    /// Current certificates per node, for expiry warnings (the `certificates` runnable).
    certificates: event::Value<Arc<certificates::CertificateView>>,
    /// Wakes the `certificates` runnable early: a certificate was just issued here.
    certificates_changed: tokio::sync::Notify,
}

/// The gRPC status for a curator error: Unavailable only for what a retry elsewhere or
/// later can fix; the message never carries request data.
fn status_from(e: CuratorError) -> Status {
    match e {
        CuratorError::NotLeader | CuratorError::LeaseLost => Status::unavailable(e.to_string()),
        CuratorError::Etcd(_) | CuratorError::Consensus(_) => Status::unavailable(format!(
            "cluster state unavailable: {}",
            supervisor::error_chain(&e)
        )),
        other => Status::internal(supervisor::error_chain(&other)),
    }
}

/// The status for a failed node operation.
fn node_update_status(e: NodeUpdateError) -> Status {
    match e {
        NodeUpdateError::NotFound(_) => Status::not_found(e.to_string()),
        NodeUpdateError::Labels(l) => Status::invalid_argument(l.to_string()),
        NodeUpdateError::Transition { .. } | NodeUpdateError::NotUp(_) => {
            Status::failed_precondition(e.to_string())
        }
        NodeUpdateError::KeyMismatch(_) => Status::permission_denied(e.to_string()),
        NodeUpdateError::Curator(c) => status_from(c),
    }
}

/// The Ed25519 key a node record holds; Internal when the record is corrupt.
fn record_key(node: &Node) -> Result<[u8; 32], Status> {
    node.public_key
        .as_slice()
        .try_into()
        .map_err(|_| Status::internal(format!("node {} has a corrupt key in its record", node.id)))
}

/// The address a node record holds; Internal when the record is corrupt.
fn record_address(node: &Node) -> Result<std::net::IpAddr, Status> {
    node.address.parse().map_err(|_| {
        Status::internal(format!(
            "node {} has a corrupt address in its record",
            node.id
        ))
    })
}

/// Refuses what is not a node ID before it reaches etcd, without echoing large input.
fn check_node_id(id: &str) -> Result<(), Status> {
    identity::validate_node_id(id).map_err(|_| {
        let shown: String = id.chars().take(48).collect();
        let more = if id.len() > shown.len() { "…" } else { "" };
        Status::invalid_argument(format!(
            "{shown:?}{more} is not a node ID (polis- and 32 hex digits)"
        ))
    })
}

fn identity<T>(request: &Request<T>) -> rpc::Identity {
    request
        .extensions()
        .get::<rpc::Identity>()
        .cloned()
        .unwrap_or(rpc::Identity::Anonymous)
}

/// The caller's self-signed key (RegisterNode, CommitNode, Escrow).
fn self_signed_key<T>(request: &Request<T>) -> Result<[u8; 32], Status> {
    let rpc::Identity::SelfSigned { public_key } = identity(request) else {
        return Err(Status::unauthenticated(
            "this call needs a self-signed client certificate for the caller's key",
        ));
    };
    public_key
        .as_slice()
        .try_into()
        .map_err(|_| Status::invalid_argument("the client key is not an Ed25519 key"))
}

impl Shared {
    /// The cluster configuration (certificate lifetimes); the default when none is stored.
    async fn configuration(&self) -> Result<proto::config::ClusterConfiguration, Status> {
        Ok(state::cluster_configuration(&self.curator)
            .await
            .map_err(status_from)?
            .unwrap_or_default())
    }

    /// The current leadership, or Unavailable naming the leader.
    async fn leadership(&self) -> Result<Leadership, Status> {
        if let Some(Role::Leader(l)) = self.role.current() {
            return Ok(l);
        }
        let leader = election::current_leader(&self.curator).await.ok().flatten();
        Err(Status::unavailable(match leader {
            Some(l) => format!(
                "this curator is not the leader; the leader is {} at {}",
                l.node_id, l.endpoint
            ),
            None => "no curator leader is elected yet; retry shortly".to_string(),
        }))
    }

    /// The node snapshot, once it holds every write made before this tenure and by it:
    /// reads served from it are as fresh as reads from etcd. `None` when it does not get
    /// there quickly (the caller reads etcd instead).
    async fn fresh_nodes(&self, leadership: &Leadership) -> Option<NodeSnapshot> {
        let written = crate::writes::written_by(leadership);
        let fresh = |s: &NodeSnapshot| {
            s.based_as_leader.as_ref() == Some(&leadership.key) && s.revision >= written
        };
        if let Some(s) = self.nodes.current().filter(|s| fresh(s)) {
            return Some(s);
        }
        let mut snapshots = self.nodes.watch();
        tokio::time::timeout(FRESHNESS_WAIT, snapshots.get_matching(fresh))
            .await
            .ok()?
            .ok()
    }

    /// The cluster CA's store and the CA (with its key), for issuing certificates.
    async fn cluster_ca(&self) -> Result<(pki::CaStore, pki::Ca), Status> {
        let store = state::cluster_pki(&self.curator);
        let ca = store
            .load_ca()
            .await
            .map_err(|e| Status::unavailable(format!("loading the cluster CA: {e}")))?
            .ok_or_else(|| Status::internal("the cluster has no CA"))?;
        Ok((store, ca))
    }

    /// How this curator checks the curators it calls: the cluster CA and the CRL.
    fn server_trust(&self) -> rpc::ServerTrust {
        rpc::ServerTrust::ClusterCa {
            ca: self.config.ca_certificate.clone(),
            crl: self.crl_slot.clone(),
        }
    }

    /// Whether `id` is a curator's node: UP with the ConsensusMember role. Only such
    /// nodes may forward a caller's identity.
    fn is_curator_node(&self, id: &str) -> bool {
        self.nodes.current().is_some_and(|nodes| {
            nodes.nodes.get(id).is_some_and(|n| {
                n.state == proto::state::NodeState::Up as i32
                    && n.roles
                        .as_ref()
                        .is_some_and(|r| r.consensus_member.is_some())
            })
        })
    }

    /// The API view of node records, with this tenure's health verdicts (one lock for
    /// all of them; no etcd read).
    fn node_infos(&self, nodes: Vec<Node>, leadership: &Leadership) -> Vec<api::NodeInfo> {
        let now = Instant::now();
        let unix_now = pki::unix_now();
        let certificates = self.certificates.current();
        let timing = self.config.heartbeat;
        let mut book = self.health.lock().expect("health lock poisoned");
        let book = book.tenure(leadership);
        nodes
            .into_iter()
            .map(|node| {
                let up = node.state == proto::state::NodeState::Up as i32;
                let (verdict, last) = match book.trackers.get_mut(&node.id) {
                    Some(t) => (t.evaluate(now, book.since, &timing), t.last()),
                    None => {
                        let mut t = rules::Tracker::new(stored_verdict(&node));
                        (t.evaluate(now, book.since, &timing), None)
                    }
                };
                let since = last.map(|l| now.saturating_duration_since(l));
                let decommission_progress = decommission::progress(self, &node);
                let warnings = match &certificates {
                    Some(view) => certificates::warnings(&node, view.nodes.get(&node.id), unix_now),
                    None => Vec::new(),
                };
                api::NodeInfo {
                    roles: state::role_names(&node),
                    health: if up {
                        node_health(verdict)
                    } else {
                        NodeHealth::Unknown
                    } as i32,
                    time_since_heartbeat_ms: since.map(|d| d.as_millis() as u64),
                    // The state enums share their numbering.
                    state: node.state,
                    id: node.id,
                    public_key: node.public_key,
                    address: node.address,
                    labels: node.labels,
                    status: node.status,
                    decommission_progress,
                    warnings,
                }
            })
            .collect()
    }

    fn node_info(&self, node: Node, leadership: &Leadership) -> api::NodeInfo {
        self.node_infos(vec![node], leadership)
            .pop()
            .expect("one node in, one out")
    }
}

/// The verdict stored in a record (unknown numbers read as UNKNOWN).
fn stored_verdict(node: &Node) -> HealthVerdict {
    HealthVerdict::try_from(node.health).unwrap_or(HealthVerdict::Unknown)
}

fn node_health(verdict: HealthVerdict) -> NodeHealth {
    match verdict {
        HealthVerdict::Unknown => NodeHealth::Unknown,
        HealthVerdict::Healthy => NodeHealth::Healthy,
        HealthVerdict::HeartbeatTimeout => NodeHealth::HeartbeatTimeout,
    }
}

/// The leader's heartbeat book: one [`rules::Tracker`] per node that heartbeated or was
/// evaluated, for one leadership tenure. Kept in memory only: a new tenure starts a new
/// book from the verdicts stored in the records.
#[derive(Default)]
struct HealthBook {
    /// The tenure (election key, its revision) the trackers belong to.
    tenure: Option<(Vec<u8>, i64)>,
    current: Option<TenureBook>,
}

struct TenureBook {
    since: Instant,
    trackers: HashMap<String, rules::Tracker>,
}

impl HealthBook {
    /// The book of `leadership`'s tenure; an older tenure's book is dropped.
    fn tenure(&mut self, leadership: &Leadership) -> &mut TenureBook {
        let tenure = (leadership.key.clone(), leadership.revision);
        if self.tenure.as_ref() != Some(&tenure) || self.current.is_none() {
            self.tenure = Some(tenure);
            self.current = Some(TenureBook {
                since: leadership.since,
                trackers: HashMap::new(),
            });
        }
        self.current.as_mut().expect("set above")
    }
}

/// How long a read waits for the node snapshot to catch up before reading etcd.
const FRESHNESS_WAIT: Duration = Duration::from_millis(300);

#[derive(Clone)]
pub struct Services(Arc<Shared>);

/// The curator runnable: campaigns for leadership (`election`), keeps the node snapshot
/// (`nodes`) and serves gRPC on `config.listen` (`listener`), on every consensus member.
pub async fn run(
    ctx: supervisor::Context,
    config: CuratorConfig,
    curator: Namespaced,
) -> supervisor::RunnableResult {
    let role = event::Value::new();
    role.set(Role::Follower);
    let shared = Arc::new(Shared {
        config: config.clone(),
        curator: curator.clone(),
        role: role.clone(),
        health: Mutex::new(HealthBook::default()),
        nodes: event::Value::new(),
        nodes_live: event::Value::new(),
        membership: Arc::new(tokio::sync::Mutex::new(())),
        crl: event::Value::new(),
        crl_slot: rpc::CrlSlot::new(),
        decommission_problems: Mutex::new(HashMap::new()),
        certificates: event::Value::new(),
        certificates_changed: tokio::sync::Notify::new(),
    });

    let election_config = ElectionConfig {
        node_id: config.node_id.clone(),
        endpoint: config.listen.to_string(),
        ttl: config.lease_ttl,
    };
    let election_shared = shared.clone();
    ctx.run("election", move |ctx| {
        let (cfg, shared) = (election_config.clone(), election_shared.clone());
        async move {
            election::run(
                &shared.curator,
                &cfg,
                &shared.role,
                &ctx.cancellation_token(),
                || ctx.signal_healthy(),
            )
            .await?;
            Ok(())
        }
    })?;

    let nodes_shared = shared.clone();
    ctx.run("nodes", move |ctx| {
        let shared = nodes_shared.clone();
        async move {
            let mut roles = shared.role.watch();
            loop {
                // Re-based on a fresh read whenever this curator becomes leader, so that
                // reads served from it see everything written before.
                let based_as_leader = match shared.role.current() {
                    Some(Role::Leader(l)) => Some(l.key),
                    _ => None,
                };
                let base = based_as_leader.clone();
                let mut snapshots = state::watch_nodes(&shared.curator, move |nodes, revision| {
                    Arc::new(Snapshot {
                        curator_endpoints: state::curator_endpoints(nodes.values()),
                        nodes: nodes.clone(),
                        revision,
                        based_as_leader: base.clone(),
                    })
                });
                loop {
                    tokio::select! {
                        s = snapshots.recv() => match s {
                            Some(Ok(snapshot)) => {
                                shared.nodes.set(snapshot);
                                if shared.nodes_live.current() != Some(true) {
                                    shared.nodes_live.set(true);
                                }
                                ctx.signal_healthy();
                            }
                            Some(Err(e)) => {
                                shared.nodes_live.set(false);
                                return Err(e.into());
                            }
                            None => {
                                shared.nodes_live.set(false);
                                return Err("the node watch stopped".into());
                            }
                        },
                        r = roles.get() => match r {
                            Ok(Role::Leader(l)) if based_as_leader.as_ref() != Some(&l.key) => break,
                            Ok(_) => {}
                            Err(_) => return Ok(()),
                        },
                        _ = ctx.cancelled() => return Ok(()),
                    }
                }
            }
        }
    })?;

    let crl_shared = shared.clone();
    ctx.run("crl", move |ctx| crl::run(ctx, crl_shared.clone()))?;

    let decommission_shared = shared.clone();
    ctx.run("decommission", move |ctx| {
        decommission::run(ctx, decommission_shared.clone())
    })?;

    let certificates_shared = shared.clone();
    ctx.run("certificates", move |ctx| {
        certificates::run(ctx, certificates_shared.clone())
    })?;

    let health_shared = shared.clone();
    ctx.run("health", move |ctx| health::run(ctx, health_shared.clone()))?;

    let listener_shared = shared.clone();
    ctx.run("listener", move |ctx| {
        let shared = listener_shared.clone();
        async move { listener::serve(ctx, shared).await }
    })?;
    ctx.signal_healthy();
    ctx.cancelled().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_checked_without_echoing_large_input() {
        assert!(check_node_id(&format!("polis-{}", "ab".repeat(16))).is_ok());
        let huge = "x".repeat(1 << 20);
        let status = check_node_id(&huge).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().len() < 200, "{}", status.message().len());
        assert!(check_node_id("polis-XYZ").is_err());
    }
}
