//! Cluster state records in etcd and the transactions that create them.

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
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

fn value(response: Option<&TxnOpResponse>) -> Option<Vec<u8>> {
    match response {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    }
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
        .map(|r| value(Some(r)))
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
