//! Fenced issuing: the guard every node-bound certificate is recorded under, so that
//! issuing and a decommission or deletion of the recipient are exclusive.
//!
//! The guard is the node record's mod revision, read when the record is checked
//! (state, key, role); the certificate is recorded in one etcd transaction that
//! compares it (`pki::CaStore::ensure_certificate_guarded`). A decommission or deletion
//! first changes the record (DECOMMISSIONING, or deleted) and only then lists and
//! revokes the node's certificates: a certificate recorded before the change is listed
//! and revoked, one whose recording comes after it fails the comparison and is never
//! recorded nor handed out. Any other change of the record in between also fails it:
//! the caller answers Aborted and the node asks again.
//!
//! Below `issuance`: may not import the handlers, `issuance` or `decommission`.

use etcd_client::{Compare, CompareOp};
use proto::state::Node;
use tonic::Status;

use super::shared::Shared;
use super::status::status_from;
use crate::{layout, records};

/// The guard to record a checked node's certificates under.
pub(super) struct Fence {
    pub(super) guard: Compare,
    /// The record as it was checked.
    pub(super) node: Node,
}

/// Reads node `id`'s record; refuses (FailedPrecondition, naming `why`) unless `may`
/// accepts it; returns it with the guard on its mod revision.
pub(super) async fn check(
    shared: &Shared,
    id: &str,
    may: impl Fn(&Node) -> bool,
    why: &str,
) -> Result<Fence, Status> {
    require(read(shared, id).await?, id, may, why)
}

/// Node `id`'s record as it is now, with the guard on its mod revision (`None`: it has
/// no record). Callers that decide more on the record than [`require`] does (CommitNode:
/// its lifecycle transition) read it once, here, and decide on the record the guard
/// compares.
pub(super) async fn read(shared: &Shared, id: &str) -> Result<Option<Fence>, Status> {
    let key = shared.curator.key(&layout::node_key(id));
    let response = shared
        .curator
        .kv()
        .get(key.clone(), None)
        .await
        .map_err(|e| Status::unavailable(format!("reading the record of node {id}: {e}")))?;
    let Some(kv) = response.kvs().first() else {
        return Ok(None);
    };
    let node = records::decode_node(id, kv.value()).map_err(status_from)?;
    Ok(Some(Fence {
        guard: Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision()),
        node,
    }))
}

/// The fence of a record [`read`] unless it has none or `may` refuses it
/// (FailedPrecondition, naming `why`).
pub(super) fn require(
    fence: Option<Fence>,
    id: &str,
    may: impl Fn(&Node) -> bool,
    why: &str,
) -> Result<Fence, Status> {
    let Some(fence) = fence else {
        return Err(Status::failed_precondition(format!(
            "node {id} has no record: no certificate is issued to it"
        )));
    };
    if !may(&fence.node) {
        return Err(Status::failed_precondition(format!(
            "node {id}: no certificate is issued to it: {why}"
        )));
    }
    Ok(fence)
}

/// The status for a recording the guard refused (or another recording failure).
pub(super) fn recording_status(what: &str, e: pki::PkiError) -> Status {
    match e {
        pki::PkiError::Fenced(_) => Status::aborted(format!(
            "{what}: the node's record changed while it was issued \
             (decommissioned, deleted or updated); nothing was recorded, ask again"
        )),
        e => Status::unavailable(format!("{what}: {e}")),
    }
}
