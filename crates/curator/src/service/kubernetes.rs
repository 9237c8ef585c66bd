//! Kubernetes on the cluster, the curator's part: the KubernetesController role on node
//! records, the Kubernetes CA and front-proxy CA (apart from the cluster CA and the etcd
//! peer CA; their keys in etcd under `kubernetes-pki/` and `kubernetes-front-proxy-pki/`),
//! the service-account key, and the certificates they issue — only by the leader, each
//! recorded under its guard (and, for a node, the fence on its record).
//!
//! ```text
//!   UpdateNodeRoles add KubernetesController ─▶ the node must be UP and a consensus
//!       member (not leaving it) ─▶ record gains the role ─▶ the node's role server
//!       starts the components ─▶ IssueKubernetesCertificates (node key, fenced)
//!   remove ConsensusMember while KubernetesController is set ─▶ refused
//!   IssueKubernetesCredentials (owner, operators) ─▶ a client certificate whose group
//!       is the caller's role (kubernetes::certs::user_group)
//! ```

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use proto::api;
use proto::api::KubernetesCertificatePurpose as Purpose;
use proto::state::Node;
use tonic::Status;

use super::Shared;
use super::fence;
use super::issuance::configuration;
use super::status::{node_update_status, record_address, status_from};
use crate::election::{self, Leadership};
use crate::error::NodeUpdateError;
use crate::records;
use crate::writes;
use kubernetes::certs as kubernetes_certs;

/// The Kubernetes CA's store.
pub fn kubernetes_pki(curator: &consensus::Namespaced) -> pki::CaStore {
    pki::CaStore::new(curator.sub("kubernetes-pki"))
}

/// The front-proxy CA's store (the apiserver's aggregation layer).
pub fn front_proxy_pki(curator: &consensus::Namespaced) -> pki::CaStore {
    pki::CaStore::new(curator.sub("kubernetes-front-proxy-pki"))
}

/// Where the service-account key pair is kept (PEM: private, then public).
const SERVICE_ACCOUNT_KEY: &str = "kubernetes-pki/service-account";

/// Whether `node` holds KubernetesController.
pub fn is_controller(node: &Node) -> bool {
    node.roles
        .as_ref()
        .is_some_and(|r| r.kubernetes_controller.is_some())
}

/// Whether `node` holds KubernetesWorker.
pub fn is_worker(node: &Node) -> bool {
    node.roles
        .as_ref()
        .is_some_and(|r| r.kubernetes_worker.is_some())
}

/// Which Kubernetes role a change names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KubernetesRole {
    Controller,
    Worker,
}

/// Adds KubernetesWorker to node `id` (UP): its role server starts containerd and a
/// kubelet, with certificates from IssueKubernetesCertificates.
pub(super) async fn add_worker(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    set_role(shared, leadership, id, KubernetesRole::Worker, true).await
}

/// Takes KubernetesWorker from node `id`.
pub(super) async fn remove_worker(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    set_role(shared, leadership, id, KubernetesRole::Worker, false).await
}

/// Adds KubernetesController to node `id`: it must be UP and a consensus member that is
/// not leaving consensus.
pub(super) async fn add_role(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    let current = records::load_node(&shared.curator, id)
        .await
        .map_err(status_from)?
        .ok_or_else(|| Status::not_found(format!("node {id} does not exist")))?;
    let member = current
        .roles
        .as_ref()
        .and_then(|r| r.consensus_member.as_ref());
    if member.is_none_or(|m| m.removal_pending) {
        return Err(Status::failed_precondition(format!(
            "{} requires {} (Kubernetes stores in the cluster's etcd); node {id} is not a \
             consensus member: add that role first",
            proto::ROLE_KUBERNETES_CONTROLLER,
            proto::ROLE_CONSENSUS_MEMBER
        )));
    }
    set_role(shared, leadership, id, KubernetesRole::Controller, true).await
}

/// Takes KubernetesController from node `id`.
pub(super) async fn remove_role(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    set_role(shared, leadership, id, KubernetesRole::Controller, false).await
}

async fn set_role(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
    role: KubernetesRole,
    on: bool,
) -> Result<Node, Status> {
    let changed = writes::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        if on && node.state != proto::state::NodeState::Up as i32 {
            return Err(NodeUpdateError::NotUp(id.to_string()));
        }
        let roles = node.roles.get_or_insert_with(Default::default);
        let held = match role {
            KubernetesRole::Controller => roles.kubernetes_controller.is_some(),
            KubernetesRole::Worker => roles.kubernetes_worker.is_some(),
        };
        if held == on {
            return Ok(None);
        }
        match role {
            KubernetesRole::Controller => roles.kubernetes_controller = on.then(Default::default),
            KubernetesRole::Worker => roles.kubernetes_worker = on.then(Default::default),
        }
        Ok(Some(node))
    })
    .await
    .map_err(node_update_status)?;
    match changed {
        Some(node) => Ok(node),
        None => records::load_node(&shared.curator, id)
            .await
            .map_err(status_from)?
            .ok_or_else(|| Status::not_found(format!("node {id} does not exist"))),
    }
}

/// Both CAs, made on first use (create-if-absent: racing leaders agree).
async fn authorities(shared: &Shared) -> Result<(pki::Ca, pki::Ca), Status> {
    let ensure = |store: pki::CaStore, name: &'static str| async move {
        store
            .ensure_ca(|| pki::Ca::generate(name, pki::CA_LIFETIME))
            .await
            .map(|(ca, _)| ca)
            .map_err(|e| Status::unavailable(format!("the {name}: {e}")))
    };
    Ok((
        ensure(kubernetes_pki(&shared.curator), "Polis Kubernetes CA").await?,
        ensure(
            front_proxy_pki(&shared.curator),
            "Polis Kubernetes front-proxy CA",
        )
        .await?,
    ))
}

/// The service-account key pair (PKCS#8 PEM, public PEM), made on first use.
async fn service_account_key(
    shared: &Shared,
    leadership: &Leadership,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    let key = shared.curator.key(SERVICE_ACCOUNT_KEY);
    let read = |stored: &[u8]| -> Result<(Vec<u8>, Vec<u8>), Status> {
        let text = std::str::from_utf8(stored)
            .map_err(|_| Status::internal("the stored service-account key is corrupt"))?;
        let split = text
            .find("-----BEGIN PUBLIC KEY-----")
            .ok_or_else(|| Status::internal("the stored service-account key is corrupt"))?;
        Ok((
            text.as_bytes()[..split].to_vec(),
            text.as_bytes()[split..].to_vec(),
        ))
    };
    if let Some(stored) = shared
        .curator
        .kv()
        .get(key.clone(), None)
        .await
        .map_err(|e| Status::unavailable(format!("reading the service-account key: {e}")))?
        .kvs()
        .first()
    {
        return read(stored.value());
    }
    let made = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| Status::internal(format!("making the service-account key: {e}")))?;
    let pem = format!("{}{}", made.serialize_pem(), made.public_key_pem());
    let txn = Txn::new()
        .when([
            election::guard(leadership),
            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(key.clone(), pem.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    let response = shared
        .curator
        .kv()
        .txn(txn)
        .await
        .map_err(|e| Status::unavailable(format!("storing the service-account key: {e}")))?;
    if response.succeeded() {
        return read(pem.as_bytes());
    }
    match response.op_responses().first() {
        Some(etcd_client::TxnOpResponse::Get(get)) if !get.kvs().is_empty() => {
            read(get.kvs()[0].value())
        }
        _ => Err(Status::unavailable(
            "this curator is no longer the leader; ask again",
        )),
    }
}

fn template(spec: &kubernetes_certs::Spec, lifetime: std::time::Duration) -> pki::Template {
    pki::Template {
        common_name: spec.common_name.clone(),
        dns_names: spec.dns_names.clone(),
        ip_addresses: spec.ip_addresses.clone(),
        usage: if spec.server {
            pki::Usage::Server
        } else {
            pki::Usage::Client
        },
        lifetime,
        // Not written into the certificate (issue_foreign): Kubernetes', not Polis's.
        kind: pki::CertificateKind::Node,
    }
}

/// Records `issued` under `name` in `store`, guarded by the leadership and `guards`.
async fn record(
    store: &pki::CaStore,
    name: &str,
    guards: Vec<Compare>,
    issued: &pki::Issued,
) -> Result<(), Status> {
    match store
        .record_new_certificate_guarded(name, guards, issued)
        .await
        .map_err(|e| fence::recording_status("recording a Kubernetes certificate", e))?
    {
        pki::NewRecord::Recorded => Ok(()),
        _ => Err(Status::aborted(
            "a Kubernetes certificate was not recorded (leadership or the node's record \
             changed); ask again",
        )),
    }
}

/// IssueKubernetesCertificates for node `id`.
pub(super) async fn issue_for_node(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    id: &str,
    request: api::IssueKubernetesCertificatesRequest,
) -> Result<api::IssueKubernetesCertificatesResponse, Status> {
    if request.keys.is_empty() || request.keys.len() > 8 {
        return Err(Status::invalid_argument(
            "ask for between 1 and 8 Kubernetes certificates",
        ));
    }
    // A controller's components' certificates for a controller, a kubelet's for a
    // worker: each checked against the record, under its fence.
    let purposes: Vec<Purpose> = request
        .keys
        .iter()
        .map(|k| Purpose::try_from(k.purpose).unwrap_or(Purpose::Unspecified))
        .collect();
    if purposes.contains(&Purpose::KubeletClient) {
        return Err(Status::invalid_argument(
            kubernetes_certs::NO_KUBELET_CLIENT_CERTIFICATE,
        ));
    }
    let wants_worker = purposes.iter().any(|p| kubernetes_certs::for_worker(*p));
    let wants_controller = purposes.iter().any(|p| !kubernetes_certs::for_worker(*p));
    let fence::Fence { guard, node } = fence::check(
        shared,
        id,
        |n| {
            n.state == proto::state::NodeState::Up as i32
                && (!wants_controller || is_controller(n))
                && (!wants_worker || is_worker(n))
        },
        "only UP nodes holding KubernetesController (a kubelet's: KubernetesWorker) get \
         those Kubernetes certificates",
    )
    .await?;
    let address = record_address(&node)?;
    let domain = configuration(shared).await?.cluster_domain;
    let lifetime = match request.lifetime_seconds {
        0 => kubernetes_certs::DEFAULT_LIFETIME,
        s => std::time::Duration::from_secs(s)
            .clamp(pki::MIN_CERTIFICATE_LIFETIME, pki::MAX_CERTIFICATE_LIFETIME),
    };
    let (ca, front_proxy) = authorities(shared).await?;
    let stores = (
        kubernetes_pki(&shared.curator),
        front_proxy_pki(&shared.curator),
    );
    let mut certificates = Vec::new();
    for key in &request.keys {
        let purpose = Purpose::try_from(key.purpose).unwrap_or(Purpose::Unspecified);
        let spec = kubernetes_certs::spec(purpose, id, address, &domain).ok_or_else(|| {
            Status::invalid_argument(format!(
                "unknown Kubernetes certificate purpose {}",
                key.purpose
            ))
        })?;
        let public: [u8; 32] = key.public_key.as_slice().try_into().map_err(|_| {
            Status::invalid_argument("a Kubernetes key is a raw Ed25519 public key (32 bytes)")
        })?;
        let (signer, store) = match spec.signer {
            kubernetes_certs::Signer::Kubernetes => (&ca, &stores.0),
            kubernetes_certs::Signer::FrontProxy => (&front_proxy, &stores.1),
        };
        let issued = signer
            .issue_foreign(&template(&spec, lifetime), &spec.organizations, &public)
            .map_err(|e| Status::internal(format!("issuing a Kubernetes certificate: {e}")))?;
        let name = format!(
            "k8s-{}-{id}-{}",
            purpose.as_str_name().to_ascii_lowercase(),
            hex::encode(&issued.serial)
        );
        record(
            store,
            &name,
            vec![election::guard(leadership), guard.clone()],
            &issued,
        )
        .await?;
        certificates.push(api::KubernetesCertificate {
            purpose: key.purpose,
            certificate: issued.der,
        });
    }
    // A kubelet's token, new with every issuance (the older one stops working).
    let kubelet_token = if wants_worker {
        new_kubelet_token(shared, leadership, id).await?
    } else {
        String::new()
    };
    // The service-account signing key is the cluster's: controllers only.
    let (service_account_key_pem, service_account_public_key_pem) = if wants_controller {
        service_account_key(shared, leadership).await?
    } else {
        Default::default()
    };
    Ok(api::IssueKubernetesCertificatesResponse {
        ca_certificate: ca.cert_der.clone(),
        front_proxy_ca_certificate: front_proxy.cert_der.clone(),
        certificates,
        service_account_key_pem,
        service_account_public_key_pem,
        lifetime_seconds: lifetime.as_secs(),
        service_cluster_ip_range: kubernetes_certs::SERVICE_CLUSTER_IP_RANGE.into(),
        cluster_domain: domain,
        apiservers: apiserver_endpoints(shared).await?,
        kubelet_token,
    })
}

/// A new token for node `id`'s kubelet; its secret's hash kept in the worker role of
/// the record (only while the node is UP and holds the role).
async fn new_kubelet_token(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
) -> Result<String, Status> {
    let made = kubernetes::kubelet_token::make(id)
        .map_err(|e| Status::internal(format!("making a kubelet token: {e}")))?;
    let hash = made.secret_sha256.clone();
    writes::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        if node.state != proto::state::NodeState::Up as i32 {
            return Err(NodeUpdateError::NotUp(id.to_string()));
        }
        let Some(worker) = node
            .roles
            .as_mut()
            .and_then(|r| r.kubernetes_worker.as_mut())
        else {
            return Err(NodeUpdateError::RoleMissing {
                id: id.to_string(),
                role: proto::ROLE_KUBERNETES_WORKER,
            });
        };
        worker.kubelet_token_sha256 = hash.clone();
        Ok(Some(node))
    })
    .await
    .map_err(node_update_status)?;
    Ok(made.token)
}

/// The UP controllers' apiservers (ADDRESS:PORT), sorted.
async fn apiserver_endpoints(shared: &Shared) -> Result<Vec<String>, Status> {
    let mut apiservers: Vec<String> = records::list_nodes(&shared.curator)
        .await
        .map_err(status_from)?
        .iter()
        .filter(|n| n.state == proto::state::NodeState::Up as i32 && is_controller(n))
        .filter_map(|n| n.address.parse::<std::net::IpAddr>().ok())
        .map(|ip| std::net::SocketAddr::new(ip, kubernetes_certs::APISERVER_PORT).to_string())
        .collect();
    apiservers.sort();
    Ok(apiservers)
}

/// IssueKubernetesCredentials for a person (owner or operator).
pub(super) async fn issue_for_user(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    caller: &rpc::Identity,
    request: api::IssueKubernetesCredentialsRequest,
) -> Result<api::IssueKubernetesCredentialsResponse, Status> {
    let (user, role) = match caller {
        rpc::Identity::User { name, .. } => (format!("polis:{name}"), pki::OperatorRole::Admin),
        rpc::Identity::Operator { name, role, .. } => (format!("polis:operator:{name}"), *role),
        other => {
            return Err(Status::permission_denied(format!(
                "Kubernetes credentials are for the owner and operators; caller is {other}"
            )));
        }
    };
    let public: [u8; 32] =
        request.public_key.as_slice().try_into().map_err(|_| {
            Status::invalid_argument("the key is a raw Ed25519 public key (32 bytes)")
        })?;
    let group = kubernetes_certs::user_group(role);
    let spec = kubernetes_certs::Spec {
        signer: kubernetes_certs::Signer::Kubernetes,
        common_name: user.clone(),
        organizations: vec![group.to_string()],
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        server: false,
    };
    let lifetime = kubernetes_certs::user_lifetime(request.lifetime_seconds);
    let (ca, _) = authorities(shared).await?;
    let issued = ca
        .issue_foreign(&template(&spec, lifetime), &spec.organizations, &public)
        .map_err(|e| Status::internal(format!("issuing Kubernetes credentials: {e}")))?;
    let name = format!(
        "k8s-user-{}-{}",
        user.replace(':', "-"),
        hex::encode(&issued.serial)
    );
    record(
        &kubernetes_pki(&shared.curator),
        &name,
        vec![election::guard(leadership)],
        &issued,
    )
    .await?;
    let apiservers = apiserver_endpoints(shared)
        .await?
        .into_iter()
        .map(|endpoint| format!("https://{endpoint}"))
        .collect();
    Ok(api::IssueKubernetesCredentialsResponse {
        certificate: issued.der,
        ca_certificate: ca.cert_der.clone(),
        apiservers,
        user,
        group: group.to_string(),
    })
}
