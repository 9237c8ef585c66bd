//! The bootstrap records: the first node, the initial owner and the cluster
//! configuration, written by a bootstrapping node into a new cluster, all or none.
//!
//! Runs before any curator (so no leadership exists to guard the write; the
//! create-if-absent transaction makes it safe to repeat): may import only `error` and
//! `layout`.

use consensus::Namespaced;
use consensus::client::txn_get_value;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use prost::Message;
use proto::config::ClusterConfiguration;
use proto::state::Node;

use crate::error::CuratorError;
use crate::layout::{CLUSTER_CONFIGURATION_KEY, INITIAL_OWNER_KEY, node_key};

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
    let response = curator.kv().txn(txn).await?;
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
