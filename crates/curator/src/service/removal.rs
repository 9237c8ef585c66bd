//! The ConsensusMember role taken away, as a durable intent: UpdateNodeRoles remove
//! and decommission record it (`removal_pending`, after the quorum check, guarded by
//! the leadership); the steps that carry it out are run by the request and by the
//! leader's `reconciler` (which resumes one a timeout or a leader's death interrupted),
//! each safe to repeat. Also the reconciler's undoing of learners no record stands for.
//! See `membership` for the whole picture.
//!
//! Above `membership` (quorum check, retries, the role's predicates), below the
//! handlers, `decommission` and `reconciler`: may not import them.

use std::sync::Arc;

use consensus::membership as etcd;
use proto::state::Node;
use tonic::Status;

use super::etcd_members;
use super::membership::{
    MEMBERSHIP_PAUSE, check_removal, has_role, removal_pending, when_accepted,
};
use super::shared::Shared;
use super::status::{etcd_status, node_update_status, status_from};
use crate::election::Leadership;
use crate::error::NodeUpdateError;
use crate::{layout, records, writes};

/// Takes the ConsensusMember role from node `id` (UpdateNodeRoles remove, decommission):
/// records the removal as a durable intent ([`request_removal`]: refused when the
/// remaining voters could not keep a quorum) and carries it out
/// ([`carry_out_removal`]). Interrupted (a timeout, this leader gone), the leader's
/// `reconciler` finishes it. A node without the role is left alone (no etcd member is
/// removed on its behalf). Returns the record.
pub(super) async fn remove_role(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    // Recorded before the lock is taken: a join waiting on this leader (it holds the
    // lock from before its learner is added until the promotion) then finds the record
    // changed and adds nothing.
    let node = request_removal(shared, leadership, id).await?;
    if !removal_pending(&node) {
        return Ok(node);
    }
    let _guard = shared.membership.clone().lock_owned().await;
    carry_out_removal(shared, leadership, id).await
}

/// Records that node `id`'s role is to be removed, after the quorum check, with a
/// leadership-guarded write that also records its etcd member's ID (so that the
/// removal finds the member by ID, whoever resumes it). A record without the role, or
/// with the removal already pending, is returned as it is.
async fn request_removal(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    let node = shared.existing_node(id).await?;
    if !has_role(&node) || removal_pending(&node) {
        // Not a holder (or an earlier removal finished, the role going last): nothing
        // in etcd is this node's to remove, whatever member its address may match.
        return Ok(node);
    }
    let mut client = shared.curator.client();
    let members = etcd_members::list(&mut client).await?;
    let member = etcd_members::member_of(&members, &node).cloned();
    if let Some(member) = &member {
        check_removal(shared, &members, member, id).await?;
    }
    let recorded = writes::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        let Some(role) = node
            .roles
            .as_mut()
            .and_then(|r| r.consensus_member.as_mut())
            .filter(|c| !c.removal_pending)
        else {
            return Ok(None);
        };
        role.removal_pending = true;
        if let Some(member) = &member {
            role.member_id = member.id;
        }
        Ok(Some(node))
    })
    .await
    .map_err(node_update_status)?;
    if recorded.is_some() {
        tracing::info!(
            node = id,
            member = member.as_ref().map(|m| format!("{:x}", m.id)),
            "removal of the ConsensusMember role recorded"
        );
    }
    shared.existing_node(id).await
}

/// Carries out the recorded removal of node `id`'s role (the caller holds the
/// membership lock; a record without a pending removal is returned as it is). Each
/// step may be repeated, so whoever leads next simply runs this again:
/// 1. the etcd member (found by its recorded ID) is removed first — while the node
///    still runs it and can vote the change through; before that the quorum is checked
///    again, and a removal that is no longer safe is withdrawn (the role stays);
/// 2. its peer and curator certificates are revoked;
/// 3. the record loses the role (the node then stops etcd and wipes its data);
/// 4. the certificates are revoked once more: one recorded in between was recorded
///    under the guard of the record that still held the role (see `fence`); after the
///    role is gone none can be.
pub(super) async fn carry_out_removal(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    let node = shared.existing_node(id).await?;
    if !removal_pending(&node) {
        return Ok(node);
    }
    let mut client = shared.curator.client();
    let members = etcd_members::list(&mut client).await?;
    if let Some(member) = etcd_members::member_of(&members, &node).cloned() {
        if let Err(refused) = check_removal(shared, &members, &member, id).await {
            withdraw_removal(shared, leadership, id).await?;
            return Err(refused);
        }
        if id == shared.config.node_id {
            // This curator's own etcd member would vanish under the request: hand the
            // leadership over (the next curator wins at once and finishes the removal)
            // and let the caller retry there.
            let _ = client.lease_revoke(leadership.lease).await;
            tracing::info!(
                "asked to remove this curator's own node from consensus: leadership handed over"
            );
            return Err(Status::unavailable(
                "this curator's own node is leaving consensus; leadership was handed over, retry",
            ));
        }
        when_accepted("removing the etcd member", || {
            let mut client = client.clone();
            async move { etcd::remove(&mut client, member.id).await }
        })
        .await?;
        tracing::info!(
            node = id,
            member = format!("{:x}", member.id),
            "removed etcd member"
        );
        crate::pause::pause_point(MEMBERSHIP_PAUSE, id).await;
    }
    revoke_member_certificates(shared, &client, id).await?;
    let node = writes::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        let Some(roles) = node.roles.as_mut().filter(|r| {
            r.consensus_member
                .as_ref()
                .is_some_and(|c| c.removal_pending)
        }) else {
            return Ok(None);
        };
        roles.consensus_member = None;
        Ok(Some(node))
    })
    .await
    .map_err(node_update_status)?
    .unwrap_or(node);
    revoke_member_certificates(shared, &client, id).await?;
    tracing::info!(node = id, "the ConsensusMember role is removed");
    Ok(node)
}

/// Withdraws a pending removal whose etcd member is still there (nothing was done yet)
/// but may no longer leave.
async fn withdraw_removal(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
) -> Result<(), Status> {
    writes::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        let Some(role) = node
            .roles
            .as_mut()
            .and_then(|r| r.consensus_member.as_mut())
            .filter(|c| c.removal_pending)
        else {
            return Ok(None);
        };
        role.removal_pending = false;
        Ok(Some(node))
    })
    .await
    .map_err(node_update_status)?;
    tracing::warn!(
        node = id,
        "removal of the ConsensusMember role withdrawn: it would cost the quorum now"
    );
    Ok(())
}

/// Revokes node `id`'s etcd peer certificates and curator certificates.
async fn revoke_member_certificates(
    shared: &Shared,
    client: &etcd_client::Client,
    id: &str,
) -> Result<(), Status> {
    revoke_under(
        layout::etcd_pki(client.clone()),
        &layout::peer_certificate_prefix(id),
        id,
        "etcd peer",
    )
    .await?;
    revoke_under(
        layout::cluster_pki(&shared.curator),
        &layout::curator_certificate_prefix(id),
        id,
        "curator",
    )
    .await
}

/// Revokes what `store`'s CA issued under `prefix` (node `id`'s `kind` certificates),
/// when that CA exists.
async fn revoke_under(
    store: pki::CaStore,
    prefix: &str,
    id: &str,
    kind: &str,
) -> Result<(), Status> {
    if store
        .load_ca()
        .await
        .map_err(|e| etcd_status(&format!("loading the CA of the {kind} certificates"), e))?
        .is_none()
    {
        return Ok(());
    }
    let revoked = store
        .revoke_issued(prefix)
        .await
        .map_err(|e| etcd_status(&format!("revoking the {kind} certificates"), e))?;
    tracing::info!(node = id, revoked, "revoked the node's {kind} certificates");
    Ok(())
}

/// Removes every etcd learner that no node record holding the ConsensusMember role
/// stands for (found by recorded ID, name, or the peer URL of one never started): left
/// by a deposed leader's join that raced the role's removal. Members are listed before
/// the records are read, so a learner added after the listing is not judged; leadership
/// is confirmed right before each removal. Voters are never removed here.
pub(super) async fn remove_orphan_learners(
    shared: &Shared,
    leadership: &Leadership,
) -> Result<(), Status> {
    let mut client = shared.curator.client();
    let members = etcd_members::list(&mut client).await?;
    if !members.iter().any(|m| m.is_learner) {
        return Ok(());
    }
    let nodes = records::list_nodes(&shared.curator)
        .await
        .map_err(status_from)?;
    let owned: std::collections::HashSet<u64> = nodes
        .iter()
        .filter(|n| has_role(n))
        .filter_map(|n| etcd_members::member_of(&members, n))
        .map(|m| m.id)
        .collect();
    for orphan in members
        .iter()
        .filter(|m| m.is_learner && !owned.contains(&m.id))
    {
        crate::election::leader_txn(&shared.curator, leadership, etcd_client::Txn::new())
            .await
            .map_err(status_from)?;
        etcd::remove(&mut client, orphan.id)
            .await
            .map_err(|e| etcd_status("removing an etcd learner no node holds", e))?;
        tracing::warn!(
            member = format!("{:x}", orphan.id),
            name = orphan.name,
            "removed an etcd learner no node record holds the ConsensusMember role for"
        );
    }
    Ok(())
}
