//! Reading the curator's records: node records decoded, loaded, listed and watched;
//! the initial owner and the cluster configuration; and plain facts about a record
//! (its state, roles, the curator endpoints of a set of records).
//!
//! Reads only: may not write (every write of a node record is in `writes`), and imports
//! only `chunkmap`, `error` and `layout` of this crate.

use consensus::Namespaced;
use prost::Message;
use proto::config::ClusterConfiguration;
use proto::state::{Node, NodeState};

use crate::chunkmap::ChunkMap;
use crate::error::CuratorError;
use crate::layout::{
    CLUSTER_CONFIGURATION_KEY, INITIAL_OWNER_KEY, NODES_PREFIX, node_key, tombstone_key,
};

pub(crate) fn decode_node(id: &str, bytes: &[u8]) -> Result<Node, CuratorError> {
    Node::decode(bytes).map_err(|source| CuratorError::Corrupt {
        what: format!("node record {id}"),
        source,
    })
}

/// The node record for `id`, if any.
pub async fn load_node(curator: &Namespaced, id: &str) -> Result<Option<Node>, CuratorError> {
    let Some(bytes) = curator.get(&node_key(id)).await? else {
        return Ok(None);
    };
    decode_node(id, bytes.as_slice()).map(Some)
}

/// Every node record, read in pages at one revision (`consensus::pages`): a cluster of
/// many nodes with many labels outgrows one etcd response.
pub async fn list_nodes(curator: &Namespaced) -> Result<Vec<Node>, CuratorError> {
    let prefix = curator.key(NODES_PREFIX);
    consensus::pages::read_prefix(&curator.client(), prefix.clone())
        .await?
        .kvs
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

/// Whether `id` was deleted (its tombstone exists).
pub async fn is_deleted(curator: &Namespaced, id: &str) -> Result<bool, CuratorError> {
    Ok(curator.get(&tombstone_key(id)).await?.is_some())
}

/// A record's state; unknown numbers read as Invalid.
pub fn node_state(node: &Node) -> NodeState {
    NodeState::try_from(node.state).unwrap_or(NodeState::Invalid)
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
    if node
        .roles
        .as_ref()
        .is_some_and(|r| r.kubernetes_controller.is_some())
    {
        roles.push(proto::ROLE_KUBERNETES_CONTROLLER.to_string());
    }
    if node
        .roles
        .as_ref()
        .is_some_and(|r| r.kubernetes_worker.is_some())
    {
        roles.push(proto::ROLE_KUBERNETES_WORKER.to_string());
    }
    roles
}

/// Each node record's last-modified etcd revision, by node ID, and the ID of the etcd
/// cluster they were read from (a restored cluster starts a new count).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordRevisions {
    pub etcd_cluster_id: u64,
    pub by_node: ChunkMap<i64>,
}

/// The node records, watched: every node record under `nodes/` as a map from ID (and the
/// etcd revision up to which every change is in it, and each record's own last-modified
/// revision), first as it is, then after every change. The maps are changed in place
/// by each event, and a clone of them shares every chunk the change did not touch
/// (`ChunkMap`), so a view that keeps them costs one chunk per change, not the table.
/// `view` turns the maps into what the caller wants; a value equal to the last one sent
/// is not sent again. The watch ends (with an error)
/// when etcd's watch stream breaks; dropping the receiver ends it too.
pub fn watch_nodes<T>(
    curator: &Namespaced,
    view: impl Fn(&ChunkMap<Node>, &RecordRevisions, i64) -> T + Send + Sync + 'static,
) -> tokio::sync::mpsc::Receiver<Result<T, CuratorError>>
where
    T: PartialEq + Clone + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let curator = curator.clone();
    tokio::spawn(async move {
        let run = async {
            let prefix = curator.key(NODES_PREFIX);
            let client = curator.client();
            // In pages at one revision: the watch below continues from it.
            let snapshot = consensus::pages::read_prefix(&client, prefix.clone()).await?;
            let revision = snapshot.revision;
            if revision == 0 {
                return Err(CuratorError::Protocol("range response without header"));
            }
            let mut nodes = ChunkMap::new();
            let mut revisions = RecordRevisions {
                etcd_cluster_id: snapshot.cluster_id,
                by_node: ChunkMap::new(),
            };
            for kv in &snapshot.kvs {
                let id = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                nodes.insert(id.clone(), decode_node(&id, kv.value())?);
                revisions.by_node.insert(id, kv.mod_revision());
            }
            // Every node change up to this revision is in `nodes`.
            let mut seen = revision;
            let mut last = view(&nodes, &revisions, seen);
            if tx.send(Ok(last.clone())).await.is_err() {
                return Ok(());
            }
            let mut stream = consensus::pages::watch_client(&client)
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
                            revisions.by_node.insert(id, kv.mod_revision());
                        }
                        etcd_client::EventType::Delete => {
                            nodes.remove(id.as_str());
                            revisions.by_node.remove(id.as_str());
                        }
                    }
                }
                let next = view(&nodes, &revisions, seen);
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
