//! The curator's gRPC services and the runnable that serves them.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use consensus::Namespaced;
use proto::api::{self, NodeHealth};
use proto::state::Node;
use tonic::{Request, Response, Status};

use crate::CuratorError;
use crate::election::{self, ElectionConfig, Leadership, Role};
use crate::state::{self, NodeUpdateError};

/// Settings of one curator.
#[derive(Clone)]
pub struct CuratorConfig {
    pub node_id: String,
    pub listen: SocketAddr,
    /// This node's certificate and key, served to clients.
    pub credentials: rpc::Credentials,
    pub ca_certificate: Vec<u8>,
    pub lease_ttl: Duration,
    pub owner_certificate_lifetime: Duration,
    pub heartbeat_timeout: Duration,
}

/// Health of a node, from its last heartbeat as seen by the current leader (pure).
pub fn health(
    up: bool,
    since_heartbeat: Option<Duration>,
    tenure: Duration,
    timeout: Duration,
) -> NodeHealth {
    match (up, since_heartbeat) {
        (false, _) => NodeHealth::Unknown,
        (true, Some(age)) if age <= timeout => NodeHealth::Healthy,
        (true, None) if tenure <= timeout => NodeHealth::Unknown,
        (true, _) => NodeHealth::HeartbeatTimeout,
    }
}

/// Shared by all services of one curator.
pub struct Shared {
    config: CuratorConfig,
    curator: Namespaced,
    role: event::Value<Role>,
    /// Last heartbeat per node, kept by the leader in memory (lost on failover, which
    /// the tenure rule in [`health`] accounts for).
    heartbeats: Mutex<HashMap<String, Instant>>,
}

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

fn identity<T>(request: &Request<T>) -> rpc::Identity {
    request
        .extensions()
        .get::<rpc::Identity>()
        .cloned()
        .unwrap_or(rpc::Identity::Anonymous)
}

fn role_names(node: &Node) -> Vec<String> {
    let mut roles = Vec::new();
    if node
        .roles
        .as_ref()
        .is_some_and(|r| r.consensus_member.is_some())
    {
        roles.push("ConsensusMember".to_string());
    }
    roles
}

impl Shared {
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

    fn node_info(&self, node: Node, tenure: Duration) -> api::NodeInfo {
        let since = self
            .heartbeats
            .lock()
            .expect("heartbeat lock poisoned")
            .get(&node.id)
            .map(|t| t.elapsed());
        let up = node.state == proto::state::NodeState::Up as i32;
        api::NodeInfo {
            roles: role_names(&node),
            health: health(up, since, tenure, self.config.heartbeat_timeout) as i32,
            time_since_heartbeat_ms: since.map(|d| d.as_millis() as u64),
            // The state enums share their numbering.
            state: node.state,
            id: node.id,
            public_key: node.public_key,
            address: node.address,
            labels: node.labels,
        }
    }
}

#[derive(Clone)]
pub struct Services(Arc<Shared>);

#[tonic::async_trait]
impl api::curator_local_server::CuratorLocal for Services {
    async fn get_current_leader(
        &self,
        _: Request<api::GetCurrentLeaderRequest>,
    ) -> Result<Response<api::GetCurrentLeaderResponse>, Status> {
        let leader = election::current_leader(&self.0.curator)
            .await
            .map_err(status_from)?
            .unwrap_or_default();
        Ok(Response::new(api::GetCurrentLeaderResponse {
            leader_node_id: leader.node_id,
            leader_endpoint: leader.endpoint,
            this_node_id: self.0.config.node_id.clone(),
        }))
    }

    async fn get_ca_certificate(
        &self,
        _: Request<api::GetCaCertificateRequest>,
    ) -> Result<Response<api::GetCaCertificateResponse>, Status> {
        Ok(Response::new(api::GetCaCertificateResponse {
            ca_certificate: self.0.config.ca_certificate.clone(),
        }))
    }
}

#[tonic::async_trait]
impl api::aaa_server::Aaa for Services {
    async fn escrow(
        &self,
        request: Request<api::EscrowRequest>,
    ) -> Result<Response<api::EscrowResponse>, Status> {
        let rpc::Identity::SelfSigned { public_key } = identity(&request) else {
            return Err(Status::unauthenticated(
                "escrow needs a self-signed client certificate for the owner key",
            ));
        };
        if request.get_ref().public_key != public_key {
            return Err(Status::invalid_argument(
                "the requested key is not the key of the client certificate",
            ));
        }
        let subject: [u8; 32] = public_key
            .as_slice()
            .try_into()
            .map_err(|_| Status::invalid_argument("the client key is not an Ed25519 key"))?;
        let _leadership = self.0.leadership().await?;
        let owner = state::initial_owner(&self.0.curator)
            .await
            .map_err(status_from)?;
        if owner.as_deref() != Some(public_key.as_slice()) {
            tracing::warn!("escrow refused: key is not the cluster owner's");
            return Err(Status::permission_denied(
                "this key is not the cluster owner's key",
            ));
        }
        let store = state::cluster_pki(&self.0.curator);
        let ca = store
            .load_ca()
            .await
            .map_err(|e| Status::unavailable(format!("loading the cluster CA: {e}")))?
            .ok_or_else(|| Status::internal("the cluster has no CA"))?;
        let template = pki::Template {
            common_name: "owner".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            usage: pki::Usage::Client,
            lifetime: self.0.config.owner_certificate_lifetime,
            kind: pki::CertificateKind::Owner,
        };
        let issued = ca
            .issue(&template, &subject)
            .map_err(|e| Status::internal(format!("issuing the owner certificate: {e}")))?;
        let name = format!("owner-{}", hex::encode(&issued.serial));
        // Not guarded by leadership (the PKI store takes no guard): a deposed leader could
        // still record a certificate it issued, for a key that is the owner's anyway.
        let certificate = store
            .ensure_certificate(&name, || Ok(issued.clone()))
            .await
            .map_err(|e| Status::unavailable(format!("recording the owner certificate: {e}")))?;
        tracing::info!(
            serial = hex::encode(&issued.serial),
            "issued an owner certificate"
        );
        Ok(Response::new(api::EscrowResponse {
            owner_certificate: certificate,
            ca_certificate: ca.cert_der,
        }))
    }
}

fn node_matches(node: &api::NodeInfo, filter: &api::ListNodesRequest) -> bool {
    (filter.state == 0 || node.state == filter.state)
        && (filter.role.is_empty()
            || node
                .roles
                .iter()
                .any(|r| r.eq_ignore_ascii_case(&filter.role)))
        && filter
            .labels
            .iter()
            .all(|(k, v)| node.labels.get(k) == Some(v))
}

#[tonic::async_trait]
impl api::management_server::Management for Services {
    async fn get_cluster_info(
        &self,
        _: Request<api::GetClusterInfoRequest>,
    ) -> Result<Response<api::GetClusterInfoResponse>, Status> {
        self.0.leadership().await?;
        let nodes = state::list_nodes(&self.0.curator)
            .await
            .map_err(status_from)?;
        let configuration = state::cluster_configuration(&self.0.curator)
            .await
            .map_err(status_from)?;
        let mut curator_endpoints: Vec<String> = nodes
            .iter()
            .filter(|n| n.state == proto::state::NodeState::Up as i32)
            .filter(|n| {
                n.roles
                    .as_ref()
                    .is_some_and(|r| r.consensus_member.is_some())
            })
            .filter_map(|n| n.address.parse().ok())
            .map(|ip| SocketAddr::new(ip, rpc::CURATOR_PORT).to_string())
            .collect();
        curator_endpoints.sort();
        Ok(Response::new(api::GetClusterInfoResponse {
            ca_certificate: self.0.config.ca_certificate.clone(),
            cluster_configuration: configuration,
            curator_endpoints,
            node_count: nodes.len() as u32,
        }))
    }

    async fn list_nodes(
        &self,
        request: Request<api::ListNodesRequest>,
    ) -> Result<Response<api::ListNodesResponse>, Status> {
        let leadership = self.0.leadership().await?;
        let tenure = leadership.since.elapsed();
        let filter = request.into_inner();
        let mut nodes: Vec<api::NodeInfo> = state::list_nodes(&self.0.curator)
            .await
            .map_err(status_from)?
            .into_iter()
            .map(|n| self.0.node_info(n, tenure))
            .filter(|n| node_matches(n, &filter))
            .collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Response::new(api::ListNodesResponse { nodes }))
    }

    async fn describe_node(
        &self,
        request: Request<api::DescribeNodeRequest>,
    ) -> Result<Response<api::NodeInfo>, Status> {
        let leadership = self.0.leadership().await?;
        let id = &request.get_ref().id;
        match state::load_node(&self.0.curator, id)
            .await
            .map_err(status_from)?
        {
            Some(node) => Ok(Response::new(
                self.0.node_info(node, leadership.since.elapsed()),
            )),
            None => Err(Status::not_found(format!("node {id} does not exist"))),
        }
    }

    async fn update_node_labels(
        &self,
        request: Request<api::UpdateNodeLabelsRequest>,
    ) -> Result<Response<api::UpdateNodeLabelsResponse>, Status> {
        let leadership = self.0.leadership().await?;
        let caller = identity(&request);
        let r = request.into_inner();
        let upsert: BTreeMap<String, String> = r.upsert.into_iter().collect();
        let node =
            state::update_node_labels(&self.0.curator, &leadership, &r.id, &upsert, &r.delete)
                .await
                .map_err(|e| match e {
                    NodeUpdateError::NotFound(_) => Status::not_found(e.to_string()),
                    NodeUpdateError::Labels(l) => Status::invalid_argument(l.to_string()),
                    NodeUpdateError::Curator(c) => status_from(c),
                })?;
        tracing::info!(node = r.id, %caller, "updated node labels");
        Ok(Response::new(api::UpdateNodeLabelsResponse {
            node: Some(self.0.node_info(node, leadership.since.elapsed())),
        }))
    }

    async fn get_register_ticket(
        &self,
        _: Request<api::GetRegisterTicketRequest>,
    ) -> Result<Response<api::GetRegisterTicketResponse>, Status> {
        let leadership = self.0.leadership().await?;
        let ticket = state::ensure_register_ticket(&self.0.curator, &leadership)
            .await
            .map_err(status_from)?;
        Ok(Response::new(api::GetRegisterTicketResponse { ticket }))
    }
}

#[tonic::async_trait]
impl api::curator_server::Curator for Services {
    async fn heartbeat(
        &self,
        request: Request<api::HeartbeatRequest>,
    ) -> Result<Response<api::HeartbeatResponse>, Status> {
        let rpc::Identity::Node { id, .. } = identity(&request) else {
            return Err(Status::permission_denied("heartbeats come from nodes"));
        };
        self.0.leadership().await?;
        self.0
            .heartbeats
            .lock()
            .expect("heartbeat lock poisoned")
            .insert(id, Instant::now());
        Ok(Response::new(api::HeartbeatResponse {}))
    }
}

/// The curator runnable: campaigns for leadership (`election`) and serves gRPC on
/// `config.listen` (`listener`), on every consensus member.
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
        heartbeats: Mutex::new(HashMap::new()),
    });

    let election_config = ElectionConfig {
        node_id: config.node_id.clone(),
        endpoint: config.listen.to_string(),
        ttl: config.lease_ttl,
    };
    let (election_ns, election_role, heartbeats) = (curator.clone(), role.clone(), shared.clone());
    ctx.run("election", move |ctx| {
        let (ns, cfg, role, shared) = (
            election_ns.clone(),
            election_config.clone(),
            election_role.clone(),
            heartbeats.clone(),
        );
        async move {
            // Heartbeats seen by a previous tenure say nothing about this one.
            shared
                .heartbeats
                .lock()
                .expect("heartbeat lock poisoned")
                .clear();
            election::run(&ns, &cfg, &role, &ctx.cancellation_token(), || {
                ctx.signal_healthy()
            })
            .await?;
            Ok(())
        }
    })?;

    let listener_shared = shared.clone();
    ctx.run("listener", move |ctx| {
        let shared = listener_shared.clone();
        async move { serve(ctx, shared).await }
    })?;
    ctx.signal_healthy();
    ctx.cancelled().await;
    Ok(())
}

async fn serve(ctx: supervisor::Context, shared: Arc<Shared>) -> supervisor::RunnableResult {
    let config = &shared.config;
    let tls = rpc::tls::server_config(&config.credentials)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("listening on {}: {e}", config.listen))?;
    let crl_store = state::cluster_pki(&shared.curator);
    let crl: rpc::CrlSource = Arc::new(move || {
        let store = crl_store.clone();
        Box::pin(async move { store.crl().await.map_err(|e| supervisor::error_chain(&e)) })
    });
    let auth = rpc::AuthLayer::new(
        Arc::new(rpc::Authenticator::new(config.ca_certificate.clone())),
        crl,
    );
    let services = Services(shared.clone());
    tracing::info!(listen = %config.listen, "curator serving");
    ctx.signal_healthy();
    let cancel = ctx.cancellation_token();
    // tonic runs connections and requests in tasks of its own: give them our span.
    let span = tracing::Span::current();
    let server = rpc::server::builder()
        .timeout(REQUEST_TIMEOUT)
        .trace_fn(move |_| span.clone())
        .layer(auth)
        .add_service(api::curator_local_server::CuratorLocalServer::new(
            services.clone(),
        ))
        .add_service(api::aaa_server::AaaServer::new(services.clone()))
        .add_service(api::management_server::ManagementServer::new(
            services.clone(),
        ))
        .add_service(api::curator_server::CuratorServer::new(services))
        .serve_with_incoming_shutdown(
            rpc::incoming(listener, tls),
            cancel.clone().cancelled_owned(),
        );
    // A graceful shutdown waits for open connections; a client that never finishes its
    // request must not keep the node from stopping.
    let drain_deadline = async {
        cancel.cancelled().await;
        tokio::time::sleep(DRAIN_TIMEOUT).await;
    };
    tokio::select! {
        served = server => served?,
        _ = drain_deadline => tracing::warn!(
            "connections still open {DRAIN_TIMEOUT:?} after shutdown began; closing them"
        ),
    }
    Ok(())
}

/// Longest time one RPC may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stopping waits for open connections to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_rules() {
        let t = Duration::from_secs(15);
        let s = Duration::from_secs;
        let cases = [
            (true, Some(s(1)), s(100), NodeHealth::Healthy),
            (true, Some(s(15)), s(100), NodeHealth::Healthy),
            (true, Some(s(16)), s(100), NodeHealth::HeartbeatTimeout),
            (true, None, s(3), NodeHealth::Unknown),
            (true, None, s(16), NodeHealth::HeartbeatTimeout),
            (false, Some(s(1)), s(100), NodeHealth::Unknown),
        ];
        for (up, since, tenure, expected) in cases {
            assert_eq!(
                health(up, since, tenure, t),
                expected,
                "{up} {since:?} {tenure:?}"
            );
        }
    }
}
