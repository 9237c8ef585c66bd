//! Cluster state records in etcd and the transactions that create them.

use consensus::Namespaced;
use consensus::client::txn_get_value;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use prost::Message;
use proto::config::ClusterConfiguration;
use proto::state::{Node, NodeState};

use crate::lifecycle::{Event, Outcome, transition};

/// The consensus user this crate's keys live under.
pub const NAMESPACE: &str = "curator";

pub const INITIAL_OWNER_KEY: &str = "global/initial_owner";
pub const CLUSTER_CONFIGURATION_KEY: &str = "cluster/configuration";

/// The node certificate a node gets from the cluster CA: names its ID (DNS) and its
/// address (IP); it serves the curator and authenticates the node as a client.
pub fn node_certificate_template(
    node_id: &str,
    address: std::net::IpAddr,
    lifetime: std::time::Duration,
) -> pki::Template {
    pki::Template {
        common_name: node_id.to_string(),
        dns_names: vec![node_id.to_string()],
        ip_addresses: vec![address],
        usage: pki::Usage::ServerAndClient,
        lifetime,
        kind: pki::CertificateKind::Node,
    }
}

/// The certificate etcd peers know a node by, from the etcd peer CA. Loopback addresses
/// also get 127.0.0.1: Linux sources connections between 127.0.0.x aliases from
/// 127.0.0.1, and etcd checks the dialing peer's SAN against the source address.
pub fn peer_certificate_template(
    node_id: &str,
    address: std::net::IpAddr,
    lifetime: std::time::Duration,
) -> pki::Template {
    let mut ips = vec![address];
    let localhost: std::net::IpAddr = [127, 0, 0, 1].into();
    if address.is_loopback() && address != localhost {
        ips.push(localhost);
    }
    pki::Template {
        common_name: node_id.to_string(),
        dns_names: vec![node_id.to_string()],
        ip_addresses: ips,
        usage: pki::Usage::ServerAndClient,
        lifetime,
        kind: pki::CertificateKind::EtcdPeer,
    }
}

/// Lifetime of node and etcd peer certificates under `configuration` (0 or absent: the
/// default, a year).
pub fn node_certificate_lifetime(
    configuration: Option<&ClusterConfiguration>,
) -> std::time::Duration {
    match configuration.map(|c| c.node_certificate_lifetime_seconds) {
        None | Some(0) => pki::CERTIFICATE_LIFETIME,
        Some(s) => std::time::Duration::from_secs(s),
    }
}

/// Lifetime of owner certificates under `configuration` (0 or absent: 30 days).
pub fn owner_certificate_lifetime(
    configuration: Option<&ClusterConfiguration>,
) -> std::time::Duration {
    match configuration.map(|c| c.owner_certificate_lifetime_seconds) {
        None | Some(0) => pki::OWNER_CERTIFICATE_LIFETIME,
        Some(s) => std::time::Duration::from_secs(s),
    }
}

/// Checks the certificate lifetimes a cluster configuration asks for (bootstrap
/// parameters are refused before anything is written when they fail this).
pub fn check_configuration(configuration: &ClusterConfiguration) -> Result<(), pki::PkiError> {
    pki::check_lifetime(node_certificate_lifetime(Some(configuration)))?;
    pki::check_lifetime(owner_certificate_lifetime(Some(configuration)))
}

/// Name of a node certificate issued by renewal: keeps the `node-<id>` prefix that
/// CommitNode's first certificate is recorded under, so that revoking a node's
/// certificates by prefix catches every one.
pub fn renewed_node_certificate_name(node_id: &str, serial: &[u8]) -> String {
    format!(
        "{}-{}",
        node_certificate_prefix(node_id),
        hex::encode(serial)
    )
}

/// Name of an etcd peer certificate issued by renewal (prefix `peer-<id>`, see
/// [`peer_certificate_name`]).
pub fn renewed_peer_certificate_name(node_id: &str, member_id: u64, serial: &[u8]) -> String {
    format!(
        "{}-{}",
        peer_certificate_name(node_id, member_id),
        hex::encode(serial)
    )
}

/// The consensus user holding the etcd peer CA: `namespaced:etcd-pki/`.
pub const ETCD_PKI_NAMESPACE: &str = "etcd-pki";

/// The etcd peer CA's store.
pub fn etcd_pki(client: etcd_client::Client) -> pki::CaStore {
    pki::CaStore::new(Namespaced::new(client, ETCD_PKI_NAMESPACE))
}

/// Name under which a node's peer certificate for one etcd membership is stored; the
/// member ID makes a re-joining node get a fresh certificate (the old one is revoked).
pub fn peer_certificate_name(node_id: &str, member_id: u64) -> String {
    format!("{}-{member_id:x}", peer_certificate_prefix(node_id))
}

pub fn node_key(id: &str) -> String {
    format!("nodes/{id}")
}

/// Where a deleted node's record stays, as a tombstone: its key never registers again.
pub fn tombstone_key(id: &str) -> String {
    format!("deleted/{id}")
}

/// Prefix of the names under which the cluster CA records a node's certificates; also
/// the name of its first one (CommitNode, bootstrap).
pub fn node_certificate_prefix(node_id: &str) -> String {
    format!("node-{node_id}")
}

/// Prefix of the names under which the etcd peer CA records a node's certificates; also
/// the name of a bootstrap node's first one (its member ID is not known yet).
pub fn peer_certificate_prefix(node_id: &str) -> String {
    format!("peer-{node_id}")
}

#[derive(Debug, thiserror::Error)]
pub enum CuratorError {
    #[error("etcd request failed")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd request failed")]
    Consensus(#[from] consensus::ConsensusError),
    #[error("stored {what} is corrupt")]
    Corrupt {
        what: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("this curator is not the leader (any more)")]
    NotLeader,
    #[error("the election lease was lost")]
    LeaseLost,
    #[error("{what}")]
    Pki {
        what: String,
        #[source]
        source: pki::PkiError,
    },
    #[error("unexpected etcd response: {0}")]
    Protocol(&'static str),
    #[error(
        "the cluster was already bootstrapped with different state ({what} differs); refusing to overwrite it"
    )]
    BootstrapConflict { what: &'static str },
}

/// The cluster CA's store: `namespaced:curator/cluster-pki/`.
pub fn cluster_pki(curator: &Namespaced) -> pki::CaStore {
    pki::CaStore::new(curator.sub("cluster-pki"))
}

/// What a bootstrapping node writes into a new cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct BootstrapRecords {
    pub node: Node,
    pub owner_public_key: Vec<u8>,
    pub configuration: ClusterConfiguration,
}

/// Creates the first node, the initial owner and the cluster configuration in one
/// create-if-absent transaction. Idempotent for identical records.
pub async fn create_bootstrap_records(
    curator: &Namespaced,
    records: &BootstrapRecords,
) -> Result<(), CuratorError> {
    let keys = [
        curator.key(&node_key(&records.node.id)),
        curator.key(INITIAL_OWNER_KEY),
        curator.key(CLUSTER_CONFIGURATION_KEY),
    ];
    let values = [
        records.node.encode_to_vec(),
        records.owner_public_key.clone(),
        records.configuration.encode_to_vec(),
    ];
    let txn = Txn::new()
        .when(
            keys.iter()
                .map(|k| Compare::create_revision(k.clone(), CompareOp::Equal, 0))
                .collect::<Vec<_>>(),
        )
        .and_then(
            keys.iter()
                .zip(values.iter())
                .map(|(k, v)| TxnOp::put(k.clone(), v.clone(), None))
                .collect::<Vec<_>>(),
        )
        .or_else(
            keys.iter()
                .map(|k| TxnOp::get(k.clone(), None))
                .collect::<Vec<_>>(),
        );
    let response = curator.client().txn(txn).await?;
    if response.succeeded() {
        return Ok(());
    }
    let existing: Vec<Option<Vec<u8>>> = response
        .op_responses()
        .iter()
        .map(|r| txn_get_value(Some(r)))
        .collect();
    let names = [
        "first node record",
        "initial owner key",
        "cluster configuration",
    ];
    // Compared as messages: protobuf maps (labels) encode in no fixed order, so a
    // resumed bootstrap in a new process may encode the same records differently.
    let same = |i: usize| -> bool {
        let Some(stored) = existing.get(i).cloned().flatten() else {
            return false;
        };
        match i {
            0 => Node::decode(stored.as_slice()).is_ok_and(|n| n == records.node),
            1 => stored == records.owner_public_key,
            _ => ClusterConfiguration::decode(stored.as_slice())
                .is_ok_and(|c| c == records.configuration),
        }
    };
    for (i, what) in names.into_iter().enumerate() {
        if !same(i) {
            return Err(CuratorError::BootstrapConflict { what });
        }
    }
    Ok(())
}

/// The node record for `id`, if any.
pub async fn load_node(curator: &Namespaced, id: &str) -> Result<Option<Node>, CuratorError> {
    let Some(bytes) = curator.get(&node_key(id)).await? else {
        return Ok(None);
    };
    Node::decode(bytes.as_slice())
        .map(Some)
        .map_err(|source| CuratorError::Corrupt {
            what: format!("node record {id}"),
            source,
        })
}

pub const REGISTER_TICKET_KEY: &str = "global/register_ticket";
/// Length of a register ticket.
pub const TICKET_LEN: usize = 32;

pub(crate) fn decode_node(id: &str, bytes: &[u8]) -> Result<Node, CuratorError> {
    Node::decode(bytes).map_err(|source| CuratorError::Corrupt {
        what: format!("node record {id}"),
        source,
    })
}

/// Every node record.
pub async fn list_nodes(curator: &Namespaced) -> Result<Vec<Node>, CuratorError> {
    let prefix = curator.key("nodes/");
    let response = curator
        .client()
        .get(
            prefix.clone(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    response
        .kvs()
        .iter()
        .map(|kv| {
            let id = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
            decode_node(&id, kv.value())
        })
        .collect()
}

/// The raw Ed25519 key named as owner at bootstrap.
pub async fn initial_owner(curator: &Namespaced) -> Result<Option<Vec<u8>>, CuratorError> {
    Ok(curator.get(INITIAL_OWNER_KEY).await?)
}

pub async fn cluster_configuration(
    curator: &Namespaced,
) -> Result<Option<ClusterConfiguration>, CuratorError> {
    match curator.get(CLUSTER_CONFIGURATION_KEY).await? {
        None => Ok(None),
        Some(b) => ClusterConfiguration::decode(b.as_slice())
            .map(Some)
            .map_err(|source| CuratorError::Corrupt {
                what: "cluster configuration".into(),
                source,
            }),
    }
}

/// Errors of operations on one node.
#[derive(Debug, thiserror::Error)]
pub enum NodeUpdateError {
    #[error("node {0} does not exist")]
    NotFound(String),
    #[error(transparent)]
    Labels(#[from] proto::labels::LabelError),
    #[error("node {id}: {source}")]
    Transition {
        id: String,
        #[source]
        source: crate::lifecycle::TransitionError,
    },
    #[error("node {0} is registered with a different key")]
    KeyMismatch(String),
    #[error("node {0} is not UP")]
    NotUp(String),
    #[error(transparent)]
    Curator(#[from] CuratorError),
}

/// How many times a change of a node record is attempted before giving up. With writes
/// combined per record inside the leader (`writes`), an attempt fails only when someone
/// else wrote the record in between or etcd failed.
const CAS_ATTEMPTS: u32 = 20;

/// Reads a node record, lets `change` decide its new value from the current one
/// (`None`: no record), and writes it in one transaction guarded by leadership and by
/// the record's revision; repeats (with a short randomized backoff) when the record
/// changed in between or etcd failed. `change` returning `Ok(None)` writes nothing.
/// Returns the record as written or as found. Concurrent changes of one record on this
/// leader are applied in turn and written together (see `writes`), so they do not make
/// each other retry.
pub async fn modify_node(
    curator: &Namespaced,
    leadership: &crate::election::Leadership,
    id: &str,
    mut change: impl FnMut(Option<&Node>) -> Result<Option<Node>, NodeUpdateError>,
) -> Result<Option<Node>, NodeUpdateError> {
    let key = curator.key(&node_key(id));
    for attempt in 0..CAS_ATTEMPTS {
        // The first retry is immediate: it usually only re-reads a cached record.
        if attempt > 1 {
            let jitter = u64::from(random_u16() % 8);
            tokio::time::sleep(std::time::Duration::from_millis(
                u64::from(attempt) + jitter,
            ))
            .await;
        }
        match crate::writes::attempt(curator, leadership, &key, id, &mut change).await? {
            crate::writes::Attempt::Done(node) => return Ok(node),
            crate::writes::Attempt::Retry => continue,
        }
    }
    Err(CuratorError::Protocol("node record kept changing").into())
}

fn random_u16() -> u16 {
    let mut b = [0u8; 2];
    // A failed random source only makes the backoff less random.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u16::from_le_bytes(b)
}

/// Applies a label change to a node (see [`modify_node`]).
pub async fn update_node_labels(
    curator: &Namespaced,
    leadership: &crate::election::Leadership,
    id: &str,
    upsert: &std::collections::BTreeMap<String, String>,
    delete: &[String],
) -> Result<Node, NodeUpdateError> {
    modify_node(curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        node.labels = proto::labels::apply(&node.labels, upsert, delete)?;
        Ok(Some(node))
    })
    .await?
    .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))
}

/// A record's state; unknown numbers read as Invalid.
pub fn node_state(node: &Node) -> NodeState {
    NodeState::try_from(node.state).unwrap_or(NodeState::Invalid)
}

/// Applies a lifecycle `event` to the record of `id` (see [`crate::lifecycle`]):
/// `create` builds the record when the event creates one. Returns the record after the
/// event (unchanged when the event had already happened).
pub async fn apply_event(
    curator: &Namespaced,
    leadership: &crate::election::Leadership,
    id: &str,
    public_key: Option<&[u8]>,
    event: Event,
    create: impl Fn() -> Node,
) -> Result<Node, NodeUpdateError> {
    let transition_error = |source| NodeUpdateError::Transition {
        id: id.to_string(),
        source,
    };
    modify_node(curator, leadership, id, |current| {
        if let (Some(node), Some(key)) = (current, public_key)
            && node.public_key != key
        {
            return Err(NodeUpdateError::KeyMismatch(id.to_string()));
        }
        match transition(current.map(node_state), event).map_err(transition_error)? {
            Outcome::Unchanged => Ok(None),
            Outcome::Remove => Err(CuratorError::Protocol(
                "a removal is written by delete_node, not as a state change",
            )
            .into()),
            Outcome::Enter(state) => {
                let mut node = current.cloned().unwrap_or_else(&create);
                node.state = state as i32;
                Ok(Some(node))
            }
        }
    })
    .await?
    .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))
}

/// Whether `id` was deleted (its tombstone exists).
pub async fn is_deleted(curator: &Namespaced, id: &str) -> Result<bool, CuratorError> {
    Ok(curator.get(&tombstone_key(id)).await?.is_some())
}

/// Deletes the record of `id` as the lifecycle allows (`Event::Delete`), leaving the
/// record as it was under [`tombstone_key`]: one transaction guarded by leadership and
/// by the record's revision, repeated when the record changed in between. Returns the
/// deleted record.
pub async fn delete_node(
    curator: &Namespaced,
    leadership: &crate::election::Leadership,
    id: &str,
) -> Result<Node, NodeUpdateError> {
    let key = curator.key(&node_key(id));
    for _ in 0..CAS_ATTEMPTS {
        let response = curator
            .client()
            .get(key.clone(), None)
            .await
            .map_err(CuratorError::from)?;
        let Some(kv) = response.kvs().first() else {
            return Err(NodeUpdateError::NotFound(id.to_string()));
        };
        let node = decode_node(id, kv.value())?;
        match transition(Some(node_state(&node)), Event::Delete).map_err(|source| {
            NodeUpdateError::Transition {
                id: id.to_string(),
                source,
            }
        })? {
            Outcome::Remove => {}
            Outcome::Unchanged | Outcome::Enter(_) => {
                return Err(CuratorError::Protocol("delete without removal").into());
            }
        }
        let txn = Txn::new()
            .when([
                crate::election::guard(leadership),
                Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision()),
            ])
            .and_then([
                TxnOp::delete(key.clone(), None),
                TxnOp::put(curator.key(&tombstone_key(id)), kv.value(), None),
            ])
            .or_else([TxnOp::get(leadership.key.clone(), None)]);
        let response = curator
            .client()
            .txn(txn)
            .await
            .map_err(CuratorError::from)?;
        if response.succeeded() {
            if let Some(header) = response.header() {
                crate::writes::record_written(leadership, header.revision());
            }
            return Ok(node);
        }
        if !crate::election::still_leads(&response, leadership) {
            return Err(CuratorError::NotLeader.into());
        }
    }
    Err(CuratorError::Protocol("node record kept changing").into())
}

/// The register ticket, if one was ever created.
pub async fn register_ticket(curator: &Namespaced) -> Result<Option<Vec<u8>>, CuratorError> {
    Ok(curator.get(REGISTER_TICKET_KEY).await?)
}

fn new_ticket() -> Result<Vec<u8>, CuratorError> {
    let mut ticket = vec![0u8; TICKET_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut ticket)
        .map_err(|_| CuratorError::Protocol("system random source failed"))?;
    Ok(ticket)
}

/// Replaces the register ticket with a new random one.
pub async fn rotate_register_ticket(
    curator: &Namespaced,
    leadership: &crate::election::Leadership,
) -> Result<(), CuratorError> {
    let txn = Txn::new().and_then([TxnOp::put(
        curator.key(REGISTER_TICKET_KEY),
        new_ticket()?,
        None,
    )]);
    crate::election::leader_txn(curator, leadership, txn).await?;
    Ok(())
}

/// The curator endpoints (host:port) of a cluster: every UP consensus member, sorted.
pub fn curator_endpoints<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Vec<String> {
    let mut endpoints: Vec<String> = nodes
        .into_iter()
        .filter(|n| n.state == NodeState::Up as i32)
        .filter(|n| {
            n.roles
                .as_ref()
                .is_some_and(|r| r.consensus_member.is_some())
        })
        .filter_map(|n| n.address.parse().ok())
        .map(|ip| std::net::SocketAddr::new(ip, rpc::CURATOR_PORT).to_string())
        .collect();
    endpoints.sort();
    endpoints
}

/// Role names of a node record, as the API spells them.
pub fn role_names(node: &Node) -> Vec<String> {
    let mut roles = Vec::new();
    if node
        .roles
        .as_ref()
        .is_some_and(|r| r.consensus_member.is_some())
    {
        roles.push(proto::ROLE_CONSENSUS_MEMBER.to_string());
    }
    roles
}

/// The node records, watched: every node record under `nodes/` as a map from ID (and the
/// etcd revision up to which every change is in it), first as it is, then after every
/// change. `view` turns the map into what the caller wants; a
/// value equal to the last one sent is not sent again. The watch ends (with an error)
/// when etcd's watch stream breaks; dropping the receiver ends it too.
pub fn watch_nodes<T>(
    curator: &Namespaced,
    view: impl Fn(&std::collections::BTreeMap<String, Node>, i64) -> T + Send + Sync + 'static,
) -> tokio::sync::mpsc::Receiver<Result<T, CuratorError>>
where
    T: PartialEq + Clone + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let curator = curator.clone();
    tokio::spawn(async move {
        let run = async {
            let prefix = curator.key("nodes/");
            let mut client = curator.client();
            let snapshot = client
                .get(
                    prefix.clone(),
                    Some(etcd_client::GetOptions::new().with_prefix()),
                )
                .await?;
            let revision = snapshot
                .header()
                .ok_or(CuratorError::Protocol("range response without header"))?
                .revision();
            let mut nodes = std::collections::BTreeMap::new();
            for kv in snapshot.kvs() {
                let id = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                nodes.insert(id.clone(), decode_node(&id, kv.value())?);
            }
            // Every node change up to this revision is in `nodes`.
            let mut seen = revision;
            let mut last = view(&nodes, seen);
            if tx.send(Ok(last.clone())).await.is_err() {
                return Ok(());
            }
            let mut stream = client
                .watch(
                    prefix.clone(),
                    Some(
                        etcd_client::WatchOptions::new()
                            .with_prefix()
                            .with_start_revision(revision + 1),
                    ),
                )
                .await?;
            loop {
                let response = tokio::select! {
                    r = stream.message() => r?,
                    _ = tx.closed() => return Ok(()),
                };
                let Some(response) = response else {
                    return Err(CuratorError::Protocol("the etcd watch ended"));
                };
                if response.canceled() {
                    return Err(CuratorError::Protocol("etcd cancelled the watch"));
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    seen = seen.max(kv.mod_revision());
                    let id = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                    match event.event_type() {
                        etcd_client::EventType::Put => {
                            nodes.insert(id.clone(), decode_node(&id, kv.value())?);
                        }
                        etcd_client::EventType::Delete => {
                            nodes.remove(&id);
                        }
                    }
                }
                let next = view(&nodes, seen);
                if next != last {
                    last = next;
                    if tx.send(Ok(last.clone())).await.is_err() {
                        return Ok(());
                    }
                }
            }
        };
        let outcome: Result<(), CuratorError> = run.await;
        if let Err(e) = outcome {
            let _ = tx.send(Err(e)).await;
        }
    });
    rx
}

/// The cluster's register ticket, created (32 random bytes) on first use.
pub async fn ensure_register_ticket(
    curator: &Namespaced,
    leadership: &crate::election::Leadership,
) -> Result<Vec<u8>, CuratorError> {
    if let Some(t) = curator.get(REGISTER_TICKET_KEY).await? {
        return Ok(t);
    }
    let ticket = new_ticket()?;
    let key = curator.key(REGISTER_TICKET_KEY);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), ticket.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    let response = crate::election::leader_txn(curator, leadership, txn).await?;
    if response.succeeded() {
        return Ok(ticket);
    }
    txn_get_value(response.op_responses().first())
        .ok_or(CuratorError::Protocol("register ticket vanished"))
}

/// Compares a presented ticket with the stored one in constant time.
pub fn ticket_matches(stored: &[u8], presented: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    stored.len() == presented.len() && bool::from(stored.ct_eq(presented))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_compare_exactly() {
        let t = [7u8; TICKET_LEN];
        assert!(ticket_matches(&t, &t));
        let mut other = t;
        other[31] ^= 1;
        assert!(!ticket_matches(&t, &other));
        assert!(!ticket_matches(&t, &t[..31]));
        assert!(!ticket_matches(&t, &[]));
    }
}
