//! Cluster state records in etcd and the transactions that create them.

use consensus::Namespaced;
use consensus::client::txn_get_value;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use prost::Message;
use proto::config::ClusterConfiguration;
use proto::state::Node;

/// The consensus user this crate's keys live under.
pub const NAMESPACE: &str = "curator";

pub const INITIAL_OWNER_KEY: &str = "global/initial_owner";
pub const CLUSTER_CONFIGURATION_KEY: &str = "cluster/configuration";

pub fn node_key(id: &str) -> String {
    format!("nodes/{id}")
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
    for ((stored, ours), what) in existing.iter().zip(values.iter()).zip(names) {
        if stored.as_deref() != Some(ours.as_slice()) {
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

fn decode_node(id: &str, bytes: &[u8]) -> Result<Node, CuratorError> {
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
    #[error(transparent)]
    Curator(#[from] CuratorError),
}

/// Applies a label change to a node: a compare-and-swap on the node record, guarded by
/// leadership; retried when the record changed concurrently.
pub async fn update_node_labels(
    curator: &Namespaced,
    leadership: &crate::election::Leadership,
    id: &str,
    upsert: &std::collections::BTreeMap<String, String>,
    delete: &[String],
) -> Result<Node, NodeUpdateError> {
    let key = curator.key(&node_key(id));
    for _ in 0..10 {
        let response = curator
            .client()
            .get(key.clone(), None)
            .await
            .map_err(CuratorError::from)?;
        let kv = response
            .kvs()
            .first()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        let mut node = decode_node(id, kv.value())?;
        node.labels = proto::labels::apply(&node.labels, upsert, delete)?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::put(key.clone(), node.encode_to_vec(), None)]);
        if crate::election::leader_txn(curator, leadership, txn)
            .await?
            .succeeded()
        {
            return Ok(node);
        }
    }
    Err(CuratorError::Protocol("node record kept changing").into())
}

/// The cluster's register ticket, created (32 random bytes) on first use.
pub async fn ensure_register_ticket(
    curator: &Namespaced,
    leadership: &crate::election::Leadership,
) -> Result<Vec<u8>, CuratorError> {
    if let Some(t) = curator.get(REGISTER_TICKET_KEY).await? {
        return Ok(t);
    }
    let mut ticket = vec![0u8; TICKET_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut ticket)
        .map_err(|_| CuratorError::Protocol("system random source failed"))?;
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
