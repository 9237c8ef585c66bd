//! The end of a node's life: decommission (UP → DECOMMISSIONING → DECOMMISSIONED) and
//! deletion, driven by the leader.
//!
//! ```text
//!   DecommissionNode (owner)
//!     quorum check (a consensus member whose removal would cost the quorum: refused,
//!     nothing changes) ─▶ record DECOMMISSIONING
//!   decommission runnable (leader; every DECOMMISSIONING record in the node snapshot,
//!   again after a failover)
//!     consensus member? ─▶ removal::remove_role (etcd member removed, peer
//!     certificates revoked, role gone: the node stops etcd and the curator)
//!     ─▶ node certificates revoked (cluster CRL) ─▶ record DECOMMISSIONED
//!   the node (if running) sees DECOMMISSIONING (Disowning), its services stop as its
//!   roles go, and on DECOMMISSIONED (or its revoked certificate being refused) it wipes
//!   its data and exits; a node that is down is finished without it.
//!
//!   DeleteNode (owner): NEW, STANDBY or DECOMMISSIONED only ─▶ certificates revoked
//!     ─▶ record removed, tombstone deleted/<id> (the key never registers again)
//! ```
//! Every step is idempotent, so the runnable simply repeats what is left after a failure
//! or a change of leader; what holds a node up is shown in its `decommission_progress`.
//!
//! Above `removal` (the node leaves consensus through it): may not import the
//! handlers.

use std::sync::Arc;
use std::time::Duration;

use proto::state::{Node, NodeState};
use tonic::Status;

use super::shared::Shared;
use super::status::{node_update_status, status_from};
use super::{membership, removal};
use crate::election::{Leadership, Role};
use crate::error::NodeUpdateError;
use crate::lifecycle::Event;
use crate::{layout, records, writes};

/// How soon a decommission that hit a problem is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// DecommissionNode: checks that the node may leave consensus and marks it
/// DECOMMISSIONING; the `decommission` runnable does the rest.
pub(super) async fn start(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    let node = shared.existing_node(id).await?;
    if records::node_state(&node) == NodeState::Up && has_consensus_role(&node) {
        membership::may_leave(shared, &node).await.map_err(|s| {
            Status::new(
                s.code(),
                format!("decommissioning node {id} is refused: {}", s.message()),
            )
        })?;
    }
    let node = writes::apply_event(
        &shared.curator,
        leadership,
        id,
        None,
        Event::Decommission,
        Node::default,
        None,
    )
    .await
    .map_err(node_update_status)?;
    Ok(node)
}

/// DeleteNode: removes the node's record, leaving a tombstone, then revokes whatever
/// certificates the node has (asked again for a deleted node, it revokes again). Only
/// NEW, STANDBY and DECOMMISSIONED nodes (the lifecycle's Delete event).
pub(super) async fn delete(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    let Some(node) = records::load_node(&shared.curator, id)
        .await
        .map_err(status_from)?
    else {
        let deleted = records::is_deleted(&shared.curator, id)
            .await
            .map_err(status_from)?;
        if deleted {
            // A deletion whose revocation failed is finished by asking again.
            revoke_certificates(shared, id).await?;
        }
        return Err(Status::not_found(if deleted {
            format!("node {id} was deleted already")
        } else {
            format!("node {id} does not exist")
        }));
    };
    // Refused states are refused before anything is revoked.
    crate::lifecycle::transition(Some(records::node_state(&node)), Event::Delete).map_err(
        |source| {
            node_update_status(NodeUpdateError::Transition {
                id: id.to_string(),
                source,
            })
        },
    )?;
    // The record goes first: from then on no commit can hand out a certificate (it
    // answers only once the record is UP), so the revocation after it catches every
    // certificate a commit racing the deletion recorded and could have handed out.
    // (Revoking first left a window: a deletion that then failed let the node commit
    // and receive a revoked certificate.)
    let deleted = writes::delete_node(&shared.curator, leadership, id)
        .await
        .map_err(node_update_status)?;
    revoke_certificates(shared, id).await?;
    Ok(deleted)
}

fn has_consensus_role(node: &Node) -> bool {
    node.roles
        .as_ref()
        .is_some_and(|r| r.consensus_member.is_some())
}

/// What a DECOMMISSIONING node waits for, for operators (`NodeInfo.decommission_progress`).
pub(super) fn progress(shared: &Shared, node: &Node) -> String {
    if records::node_state(node) != NodeState::Decommissioning {
        return String::new();
    }
    let step = if has_consensus_role(node) {
        "leaving consensus"
    } else {
        "revoking certificates"
    };
    match shared
        .decommission_problems
        .lock()
        .expect("decommission problems lock poisoned")
        .get(&node.id)
    {
        Some(problem) => format!("{step}; held up: {problem}"),
        None => step.to_string(),
    }
}

/// Revokes every node certificate (cluster CA) and etcd peer certificate of node `id`;
/// returns how many were revoked.
async fn revoke_certificates(shared: &Shared, id: &str) -> Result<usize, Status> {
    let mut revoked = 0;
    let stores = [
        (
            layout::cluster_pki(&shared.curator),
            layout::node_certificate_prefix(id),
        ),
        (
            layout::cluster_pki(&shared.curator),
            layout::curator_certificate_prefix(id),
        ),
        (
            layout::etcd_pki(shared.curator.client()),
            layout::peer_certificate_prefix(id),
        ),
    ];
    for (store, prefix) in stores {
        let ca = store
            .load_ca()
            .await
            .map_err(|e| Status::unavailable(format!("loading a CA: {e}")))?;
        if ca.is_some() {
            revoked += store.revoke_issued(&prefix).await.map_err(|e| {
                Status::unavailable(format!(
                    "revoking the certificates of node {id}: {}",
                    supervisor::error_chain(&e)
                ))
            })?;
        }
    }
    Ok(revoked)
}

/// Takes one DECOMMISSIONING node through the remaining steps.
async fn finish(shared: &Arc<Shared>, leadership: &Leadership, node: &Node) -> Result<(), Status> {
    let id = node.id.as_str();
    if has_consensus_role(node) {
        removal::remove_role(shared, leadership, id).await?;
        tracing::info!(node = id, "decommission: the node left consensus");
    }
    let revoked = revoke_certificates(shared, id).await?;
    writes::modify_node(&shared.curator, leadership, id, |current| {
        let Some(current) = current else {
            return Err(NodeUpdateError::NotFound(id.to_string()));
        };
        match crate::lifecycle::transition(
            Some(records::node_state(current)),
            Event::FinishDecommission,
        )
        .map_err(|source| NodeUpdateError::Transition {
            id: id.to_string(),
            source,
        })? {
            crate::lifecycle::Outcome::Enter(next) => {
                let mut node = current.clone();
                node.state = next as i32;
                node.roles = None;
                Ok(Some(node))
            }
            _ => Ok(None),
        }
    })
    .await
    .map_err(node_update_status)?;
    tracing::info!(
        node = id,
        revoked,
        "node decommissioned: out of consensus, certificates revoked"
    );
    Ok(())
}

/// The `decommission` runnable: while this curator leads, finishes every
/// DECOMMISSIONING node of the node snapshot, retrying what fails.
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    let mut roles = shared.role.watch();
    let mut snapshots = shared.nodes.watch();
    ctx.signal_healthy();
    loop {
        let leadership = match shared.role.current() {
            Some(Role::Leader(l)) => Some(l),
            _ => None,
        };
        let mut pending = false;
        if let (Some(leadership), Some(snapshot)) = (leadership, shared.nodes.current()) {
            let decommissioning: Vec<Node> = snapshot
                .nodes
                .values()
                .filter(|n| records::node_state(n) == NodeState::Decommissioning)
                .cloned()
                .collect();
            for node in decommissioning {
                let outcome = finish(&shared, &leadership, &node).await;
                let mut problems = shared
                    .decommission_problems
                    .lock()
                    .expect("decommission problems lock poisoned");
                match outcome {
                    Ok(()) => {
                        problems.remove(&node.id);
                    }
                    Err(status) => {
                        pending = true;
                        let problem = status.message().to_string();
                        if problems.get(&node.id) != Some(&problem) {
                            tracing::warn!(node = node.id, "decommission held up: {problem}");
                            problems.insert(node.id.clone(), problem);
                        }
                    }
                }
            }
        }
        let retry = async {
            if pending {
                tokio::time::sleep(RETRY_AFTER).await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            r = roles.get() => { r?; }
            s = snapshots.get() => { s?; }
            _ = retry => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}
