//! The gRPC face of errors and requests: curator errors as statuses, and the checks a
//! request or a record passes before anything acts on it (caller identity, node IDs,
//! a record's key and address).
//!
//! A leaf of the service layer: pure, may import only `error` of this crate.

use proto::state::Node;
use tonic::{Request, Status};

use crate::error::{CuratorError, NodeUpdateError};

/// The gRPC status for a curator error: Unavailable only for what a retry elsewhere or
/// later can fix; the message never carries request data.
pub(super) fn status_from(e: CuratorError) -> Status {
    if consensus::maintenance::is_no_space(&e) {
        return no_space_status();
    }
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
pub(super) fn node_update_status(e: NodeUpdateError) -> Status {
    match e {
        NodeUpdateError::NotFound(_) => Status::not_found(e.to_string()),
        NodeUpdateError::Labels(l) => Status::invalid_argument(l.to_string()),
        NodeUpdateError::Transition { .. }
        | NodeUpdateError::NotUp(_)
        | NodeUpdateError::RoleMissing { .. } => Status::failed_precondition(e.to_string()),
        NodeUpdateError::KeyMismatch(_) | NodeUpdateError::Deleted(_) => {
            Status::permission_denied(e.to_string())
        }
        NodeUpdateError::Curator(c) => status_from(c),
    }
}

/// The Ed25519 key a node record holds; Internal when the record is corrupt.
pub(super) fn record_key(node: &Node) -> Result<[u8; 32], Status> {
    node.public_key
        .as_slice()
        .try_into()
        .map_err(|_| Status::internal(format!("node {} has a corrupt key in its record", node.id)))
}

/// The address a node record holds; Internal when the record is corrupt.
pub(super) fn record_address(node: &Node) -> Result<std::net::IpAddr, Status> {
    node.address.parse().map_err(|_| {
        Status::internal(format!(
            "node {} has a corrupt address in its record",
            node.id
        ))
    })
}

/// Refuses what is not a node ID before it reaches etcd, without echoing large input.
pub(super) fn check_node_id(id: &str) -> Result<(), Status> {
    identity::validate_node_id(id).map_err(|_| {
        Status::invalid_argument(format!(
            "{} is not a node ID (polis- and 32 hex digits)",
            proto::echo::quoted(id)
        ))
    })
}

pub(super) fn identity<T>(request: &Request<T>) -> rpc::Identity {
    request
        .extensions()
        .get::<rpc::Identity>()
        .cloned()
        .unwrap_or(rpc::Identity::Anonymous)
}

/// The caller's self-signed key (RegisterNode, CommitNode, Escrow).
pub(super) fn self_signed_key<T>(request: &Request<T>) -> Result<[u8; 32], Status> {
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

/// The status for a failed etcd (or etcd CA store) call: Unavailable, naming the step.
pub(super) fn etcd_status(what: &str, e: impl std::error::Error + 'static) -> Status {
    if consensus::maintenance::is_no_space(&e) {
        return no_space_status();
    }
    Status::unavailable(format!("{what}: {}", supervisor::error_chain(&e)))
}

/// A write etcd refused under its NOSPACE alarm: ResourceExhausted, saying what
/// happens next (no retry elsewhere helps; the curator frees space by itself).
pub(super) fn no_space_status() -> Status {
    Status::resource_exhausted(
        "the cluster's etcd is out of space (NOSPACE alarm: its backend quota is reached); \
         writes are refused until space is freed — the curator compacts and defragments \
         etcd and the alarm clears by itself; see `polisctl cluster status`",
    )
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

    #[test]
    fn no_space_is_resource_exhausted_not_internal() {
        let etcd = etcd_client::Error::GRpcStatus(Status::resource_exhausted(
            "etcdserver: mvcc: database space exceeded",
        ));
        let status = status_from(CuratorError::Etcd(etcd));
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("out of space"),
            "{}",
            status.message()
        );
        let timeout =
            etcd_client::Error::GRpcStatus(Status::unavailable("etcdserver: request timed out"));
        assert_eq!(
            status_from(CuratorError::Etcd(timeout)).code(),
            tonic::Code::Unavailable
        );
    }
}
