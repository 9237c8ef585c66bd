//! DataUnlock: a node whose data is encrypted (issue 18) proves its join key and receives
//! the cluster half of its data key, before its data (node key included) is readable.
//!
//! ```text
//!   node (self-signed cert, join key) ── UnlockData ──▶ the record holding that join key
//!        ◀── node ID, cluster half ─────────────────── unless DECOMMISSIONED/DECOMMISSIONING,
//!                                                      erased, or no such record (deleted)
//! ```
//! The half leaves etcd only here, only to the holder of the join key. The holder is
//! found in the node snapshot, its record then read from etcd (not the snapshot), so an
//! erase is never answered around; callers are limited per source
//! (`rpc::server::RateLayer`), as anyone with a self-signed certificate may call.

use proto::api;
use proto::state::{Node, NodeState};
use tonic::{Request, Response, Status};

use super::shared::{Services, Shared};
use super::status::{self_signed_key, status_from};
use crate::records;

/// Why a join key gets no cluster half, or `None` when the record may be unlocked.
pub(crate) fn unlock_refusal(node: &Node) -> Option<String> {
    let state = records::node_state(node);
    if matches!(
        state,
        NodeState::Decommissioned | NodeState::Decommissioning
    ) {
        return Some(format!(
            "node {} is {}: its data stays locked",
            node.id,
            state.as_str_name()
        ));
    }
    if node.data_cluster_half.is_empty() {
        return Some(format!(
            "node {} has no cluster half of a data key (erased, or never registered with an \
             encrypted data device)",
            node.id
        ));
    }
    None
}

/// The longest cluster half a record takes (a datafs half is 41 bytes).
const MAX_HALF_LEN: usize = 128;

/// Checks RegisterNode's data fields: both or neither, a 32-byte key, a bounded half.
pub(super) fn check_registration(join_key: &[u8], half: &[u8]) -> Result<(), Status> {
    match (join_key.len(), half.len()) {
        (0, 0) => Ok(()),
        (32, 1..=MAX_HALF_LEN) => Ok(()),
        (32, 0) | (0, _) => Err(Status::invalid_argument(
            "a data join key and a data cluster half come together",
        )),
        (32, n) => Err(Status::invalid_argument(format!(
            "the data cluster half is {n} bytes (at most {MAX_HALF_LEN})"
        ))),
        (n, _) => Err(Status::invalid_argument(format!(
            "the data join key is {n} bytes, not a 32-byte Ed25519 public key"
        ))),
    }
}

/// The record holding join key `key`, as etcd has it now: found in the node snapshot
/// (a scan in memory, not a read of every record per call), then read alone. Only while
/// the snapshot is not live are all records read.
async fn holder(shared: &Shared, key: &[u8]) -> Result<Option<Node>, Status> {
    let snapshot = shared
        .nodes
        .current()
        .filter(|_| shared.nodes_live.current() == Some(true));
    let Some(snapshot) = snapshot else {
        let nodes = records::list_nodes(&shared.curator)
            .await
            .map_err(status_from)?;
        return Ok(nodes
            .into_iter()
            .find(|n| n.data_join_key.as_slice() == key));
    };
    let Some(id) = snapshot
        .nodes
        .iter()
        .find(|(_, n)| n.data_join_key.as_slice() == key)
        .map(|(id, _)| id.clone())
    else {
        return Ok(None);
    };
    let node = records::load_node(&shared.curator, &id)
        .await
        .map_err(status_from)?;
    // Join keys never move between records; a record gone or changed since is refused.
    Ok(node.filter(|n| n.data_join_key.as_slice() == key))
}

#[tonic::async_trait]
impl api::data_unlock_server::DataUnlock for Services {
    async fn unlock_data(
        &self,
        request: Request<api::UnlockDataRequest>,
    ) -> Result<Response<api::UnlockDataResponse>, Status> {
        let key = self_signed_key(&request)?;
        let Some(node) = holder(&self.0, &key).await? else {
            tracing::warn!("data unlock refused: no record holds this join key");
            return Err(Status::permission_denied(
                "no node of this cluster holds this join key (deleted, or never registered \
                 with an encrypted data device)",
            ));
        };
        if let Some(why) = unlock_refusal(&node) {
            tracing::warn!(node = node.id, "data unlock refused: {why}");
            return Err(Status::permission_denied(why));
        }
        tracing::info!(
            node = node.id,
            "handed a node the cluster half of its data key"
        );
        Ok(Response::new(api::UnlockDataResponse {
            node_id: node.id,
            cluster_half: node.data_cluster_half,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(state: NodeState, half: &[u8]) -> Node {
        Node {
            id: "polis-x".into(),
            state: state as i32,
            data_join_key: vec![1; 32],
            data_cluster_half: half.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn registration_fields_come_together_and_are_bounded() {
        assert!(check_registration(&[], &[]).is_ok());
        assert!(check_registration(&[1; 32], &[2; 41]).is_ok());
        for (key, half) in [
            (vec![1; 32], vec![]),
            (vec![], vec![2; 41]),
            (vec![1; 31], vec![2; 41]),
            (vec![1; 32], vec![2; 129]),
        ] {
            let e = check_registration(&key, &half).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{key:?} {half:?}");
        }
    }

    #[test]
    fn only_live_records_with_a_half_unlock() {
        for state in [NodeState::New, NodeState::Standby, NodeState::Up] {
            assert_eq!(unlock_refusal(&node(state, &[7; 41])), None, "{state:?}");
        }
        for state in [NodeState::Decommissioning, NodeState::Decommissioned] {
            let why = unlock_refusal(&node(state, &[7; 41])).expect("refused");
            assert!(why.contains("stays locked"), "{why}");
        }
        let why = unlock_refusal(&node(NodeState::Up, &[])).expect("refused");
        assert!(why.contains("no cluster half"), "{why}");
    }
}
