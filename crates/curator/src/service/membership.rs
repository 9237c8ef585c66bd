//! Every change of etcd membership, made by the leader: a node joining (learner added,
//! then promoted), the ConsensusMember role given and taken, the quorum probe that
//! decides whether a member may leave, and the steps the leader's `reconciler` runs.
//!
//! ```text
//!   UpdateNodeRoles add ─▶ add_role: record gains the role (the node then asks to join)
//!   JoinConsensus (node with role ConsensusMember, no etcd data) ─▶ join
//!     its learner exists already ─▶ answer again (no queueing), promotion resumed
//!     else: membership lock ─▶ role re-checked ─▶ confirm_join: one txn guarded by the
//!           leadership comparing the record checked (still leads, role still granted,
//!           no removal pending) ─▶ member_add(learner) ─▶ member ID recorded, guarded
//!           (refused: the learner removed again) ─▶ peer certificate (issuance) ─▶
//!           answer the node
//!           └─ task: promote as soon as etcd accepts, then release the lock
//!   UpdateNodeRoles remove, decommission ─▶ remove_role
//!     request_removal: plan_removal (quorum; members' curators asked) ─▶ record
//!     `removal_pending` (+ the member's ID), guarded: the durable intent
//!     ─▶ membership lock ─▶ carry_out_removal (also the reconciler's, after a failover):
//!     quorum re-checked (refused: intent withdrawn) ─▶ own node? hand leadership over
//!     ─▶ member_remove by recorded ID (while the node still votes) ─▶ revoke peer and
//!     curator certificates ─▶ record without the role (the node then stops etcd,
//!     wipes data) ─▶ revoke again
//!   reconciler ─▶ remove_orphan_learners: a learner no record with the role stands
//!     for (a deposed leader's add) is removed
//!   DecommissionNode ─▶ may_leave: the same quorum check, up front
//! ```
//! The lock serializes membership changes within this leader; across leaders the
//! record fences them (every write is guarded by the leadership, a join confirms the
//! record and the leadership right before its add), etcd's own rules (one learner at a
//! time, no change within 5 s of reconnecting) cover the rest, and changes it refuses
//! for now are retried for a while. Every step may be repeated.
//!
//! Above `issuance` (a joining member's peer certificate), below the handlers, `decommission` and `reconciler`: may not import them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use consensus::membership::{self as etcd, Member};
use proto::api;
use proto::state::{Node, NodeState};
use tonic::Status;

use super::shared::Shared;
use super::status::{etcd_status, node_update_status, status_from};
use super::{etcd_members, issuance};
use crate::election::Leadership;
use crate::error::NodeUpdateError;
use crate::{layout, records, writes};

/// How long a learner may take to catch up before its promotion is given up (the node
/// asks again, which resumes it).
const PROMOTION_PATIENCE: Duration = Duration::from_secs(30);

/// How long a membership change waits for etcd to accept it. etcd refuses membership
/// changes ("unhealthy cluster") until its leader has been connected to a quorum of
/// the voters for 5 s, e.g. right after the previous learner was promoted.
const ADD_PATIENCE: Duration = Duration::from_secs(20);

/// Runs a membership change, retrying while etcd says the cluster is not ready for it
/// yet (its strict reconfiguration check, or a learner still pending).
pub(super) async fn when_accepted<T, F, Fut>(what: &str, mut change: F) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, consensus::ConsensusError>>,
{
    let deadline = Instant::now() + ADD_PATIENCE;
    let mut pause = Duration::from_millis(50);
    loop {
        match change().await {
            Ok(done) => return Ok(done),
            Err(e) => {
                let text = supervisor::error_chain(&e);
                let transient = text.contains("unhealthy cluster")
                    || text.contains("too many learner")
                    || text.contains("timed out");
                if !transient || Instant::now() + pause > deadline {
                    return Err(etcd_status(what, e));
                }
                tracing::debug!("etcd does not take the change yet ({what}): {text}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Gives node `id` (UP) the ConsensusMember role; the node then asks to join
/// ([`join`]). Returns the record.
pub(super) async fn add_role(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    writes::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        if node.state != proto::state::NodeState::Up as i32 {
            return Err(NodeUpdateError::NotUp(id.to_string()));
        }
        let roles = node.roles.get_or_insert_with(Default::default);
        if roles.consensus_member.is_some() {
            return Ok(None);
        }
        roles.consensus_member = Some(Default::default());
        Ok(Some(node))
    })
    .await
    .map_err(node_update_status)?
    .ok_or_else(|| Status::not_found(format!("node {id} does not exist")))
}

/// JoinConsensus for node `id`: its record must hold the ConsensusMember role
/// ([`may_join`]); adds its learner (or finds the one added before), issues its peer
/// certificate and answers; a task promotes the learner once etcd lets it.
pub(super) async fn join(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    id: &str,
) -> Result<api::JoinConsensusResponse, Status> {
    let node = records::load_node(&shared.curator, id)
        .await
        .map_err(status_from)?
        .ok_or_else(|| Status::not_found(format!("node {id} has no record")))?;
    may_join(&node)?;
    let node = &node;
    let mut client = shared.curator.client();
    let members = etcd_members::list(&mut client).await?;
    // This node asking again (a lost reply, a restart before its etcd ran): its learner
    // is served without queueing behind the promotion its own answer is needed for.
    let (member, members, guard) = match etcd_members::member_of(&members, node) {
        Some(m) => (m.clone(), members, None),
        None => {
            let guard = shared.membership.clone().lock_owned().await;
            // The role may have been taken away while this call waited.
            let node = records::load_node(&shared.curator, &node.id)
                .await
                .map_err(status_from)?
                .ok_or_else(|| Status::not_found(format!("node {} has no record", node.id)))?;
            may_join(&node)?;
            let members = etcd_members::list(&mut client).await?;
            if let Some(m) = etcd_members::member_of(&members, &node) {
                (m.clone(), members, Some(guard))
            } else {
                if let Some(other) = members.iter().find(|m| m.is_learner) {
                    // A learner left behind by a join that never finished: promote it if
                    // etcd lets us; etcd takes no second learner meanwhile.
                    let nudge =
                        etcd::promote_when_in_sync(&mut client, other.id, Duration::from_secs(2))
                            .await;
                    if nudge.is_err() {
                        return Err(Status::unavailable(format!(
                            "etcd member {:x} ({}) is a learner that has not caught up; its node must \
                             start it (or remove its role); retry later",
                            other.id,
                            if other.name.is_empty() {
                                "never started"
                            } else {
                                &other.name
                            }
                        )));
                    }
                }
                let url = etcd_members::peer_url(&node)?;
                crate::pause::pause_point(MEMBERSHIP_PAUSE, &node.id).await;
                // The add cannot be part of a guarded transaction: right before it,
                // this curator still leads and the record still grants the role.
                if let Err(refused) = confirm_join(shared, leadership, &node.id).await {
                    tracing::warn!(
                        node = node.id,
                        "join refused right before adding its learner: {}",
                        refused.message()
                    );
                    return Err(refused);
                }
                let (added, all) = when_accepted("adding the etcd learner", || {
                    let mut client = client.clone();
                    let url = url.clone();
                    async move { etcd::add_learner(&mut client, &url).await }
                })
                .await?;
                tracing::info!(
                    node = node.id,
                    member = format!("{:x}", added.id),
                    "added etcd learner"
                );
                if let Err(refused) =
                    record_joined_member(shared, leadership, &node.id, added.id).await
                {
                    // Deposed, or the role was taken meanwhile: undo the add (else the
                    // leader's reconciler removes the learner no record stands for).
                    let undone = etcd::remove(&mut client, added.id).await;
                    tracing::warn!(
                        node = node.id,
                        member = format!("{:x}", added.id),
                        undone = undone.is_ok(),
                        "the added learner could not be recorded: {}",
                        refused.message()
                    );
                    return Err(refused);
                }
                (added, all, Some(guard))
            }
        }
    };
    if !member.is_learner {
        // JoinConsensus comes from a node without etcd data: a voter by its name is a
        // leftover whose data is gone, and starting it empty would break Raft's safety.
        return Err(Status::failed_precondition(format!(
            "node {} is still etcd voter {:x} but has no etcd data; take its ConsensusMember role \
             (polisctl node remove-role) and give it again",
            node.id, member.id
        )));
    }
    record_member_id(shared, leadership, &node.id, member.id).await?;
    let (certificate, peer_ca_certificate) =
        issuance::join_peer_certificate(shared, &client, node, member.id).await?;
    let peer_pki = layout::etcd_pki(client.clone());
    let crl = peer_pki
        .crl()
        .await
        .map_err(|e| etcd_status("reading the etcd peer CRL", e))?;
    // Read after the certificate was issued: a rotation's promotion in between leaves
    // the issuing CA trusted (as the previous one).
    let peer_trusted_cas = peer_pki
        .trusted()
        .await
        .map_err(|e| etcd_status("reading the etcd peer CAs", e))?
        .cas();
    let mut initial_cluster = Vec::new();
    for m in &members {
        let name = if m.id == member.id {
            node.id.clone()
        } else if m.name.is_empty() {
            return Err(Status::unavailable(format!(
                "etcd member {:x} was added but never started; retry later",
                m.id
            )));
        } else {
            m.name.clone()
        };
        let peer_url = m.peer_urls.first().cloned().unwrap_or_default();
        initial_cluster.push(api::InitialMember { name, peer_url });
    }
    {
        // Promote as soon as etcd accepts; the lock is held until then, so the next
        // join (etcd takes one learner at a time) waits its turn instead of failing.
        let (id, node_id) = (member.id, node.id.clone());
        tokio::spawn(async move {
            let _guard = guard;
            let started = Instant::now();
            match etcd::promote_when_in_sync(&mut client, id, PROMOTION_PATIENCE).await {
                Ok(()) => tracing::info!(
                    node = node_id,
                    member = format!("{id:x}"),
                    ms = started.elapsed().as_millis() as u64,
                    "promoted etcd learner to voter"
                ),
                Err(e) => tracing::warn!(node = node_id, "promoting the etcd learner: {e}"),
            }
        });
    }
    let etcd_quota_bytes = join_quota(shared).await?;
    let epochs = crate::epochs::chain(&shared.curator, false)
        .await
        .map_err(status_from)?;
    Ok(api::JoinConsensusResponse {
        epochs,
        peer_certificate: certificate,
        peer_ca_certificate,
        peer_crl: crl,
        peer_trusted_cas,
        initial_cluster,
        member_id: member.id,
        etcd_quota_bytes,
    })
}

/// Whether `node` holds the ConsensusMember role.
pub(super) fn has_role(node: &Node) -> bool {
    node.roles
        .as_ref()
        .is_some_and(|r| r.consensus_member.is_some())
}

/// Whether the removal of `node`'s ConsensusMember role was accepted and is not
/// finished yet.
pub(super) fn removal_pending(node: &Node) -> bool {
    node.roles
        .as_ref()
        .and_then(|r| r.consensus_member.as_ref())
        .is_some_and(|c| c.removal_pending)
}

/// The pause point (test builds) right after a membership change reached etcd and
/// before it is recorded: after a removal's `member_remove`, and before a join's
/// `member_add` (after its fenced check).
pub(super) const MEMBERSHIP_PAUSE: &str = "membership-etcd-change";

/// Refuses the removal of `member` (node `id`) when the remaining voters could not keep
/// a quorum (see `consensus::membership::plan_removal`; members' curators are asked
/// whether their etcd member is healthy).
pub(super) async fn check_removal(
    shared: &Arc<Shared>,
    members: &[Member],
    member: &Member,
    id: &str,
) -> Result<(), Status> {
    let answering = shared.answering_members(members).await;
    let healthy = |m: &Member| answering.contains(&m.id);
    etcd::plan_removal(members, member.id, healthy).map_err(|refused| {
        Status::failed_precondition(format!(
            "removing node {id} from consensus is refused: {refused}"
        ))
    })
}

/// The backend quota a joining member runs with: the cluster configuration's (etcd
/// upkeep), else this leader's own.
async fn join_quota(shared: &Shared) -> Result<u64, Status> {
    let configured = records::cluster_configuration(&shared.curator)
        .await
        .map_err(status_from)?
        .map(|c| c.etcd_quota_bytes)
        .unwrap_or_default();
    Ok(proto::quota::effective_quota(configured).unwrap_or(shared.config.etcd_quota_bytes))
}

/// Whether node `node` could leave consensus now without costing the quorum: `Ok` when
/// it is no etcd member or its removal is safe. Checked before a decommission starts,
/// so that an unsafe one is refused up front instead of hanging half-done.
pub(super) async fn may_leave(shared: &Arc<Shared>, node: &Node) -> Result<(), Status> {
    let mut client = shared.curator.client();
    let members = etcd_members::list(&mut client).await?;
    match etcd_members::member_of(&members, node) {
        Some(member) => check_removal(shared, &members, member, &node.id).await,
        None => Ok(()),
    }
}

/// How long a member's curator gets to answer the health question of a removal.
const MEMBER_ANSWER: Duration = Duration::from_secs(1);

impl Shared {
    /// The etcd members that count as healthy for quorum planning: this curator's own,
    /// and every other voter whose curator answers (within [`MEMBER_ANSWER`]) that its
    /// etcd member is a voter that knows a leader. Asked directly, node to node: a new
    /// leader has seen no heartbeats yet.
    async fn answering_members(&self, members: &[Member]) -> std::collections::HashSet<u64> {
        let trust = self.server_trust();
        let mut asks = tokio::task::JoinSet::new();
        let mut healthy = std::collections::HashSet::new();
        for m in members.iter().filter(|m| !m.is_learner) {
            if m.name == self.config.node_id {
                healthy.insert(m.id);
                continue;
            }
            let Some(ip) = m.peer_urls.first().and_then(|u| rpc::url_address(u)) else {
                continue;
            };
            let (trust, credentials, id) = (trust.clone(), self.config.credentials.clone(), m.id);
            asks.spawn(async move {
                let endpoint = std::net::SocketAddr::new(ip, rpc::CURATOR_PORT);
                let ask = async {
                    let channel = rpc::connect_with(endpoint, &trust, Some(&credentials))
                        .await
                        .ok()?;
                    api::curator_local_client::CuratorLocalClient::new(channel)
                        .get_consensus_status(api::GetConsensusStatusRequest {})
                        .await
                        .ok()
                };
                let answer = tokio::time::timeout(MEMBER_ANSWER, ask)
                    .await
                    .ok()??
                    .into_inner();
                (answer.member_id == id && !answer.is_learner && answer.leader_id != 0)
                    .then_some(id)
            });
        }
        while let Some(answer) = asks.join_next().await {
            if let Ok(Some(id)) = answer {
                healthy.insert(id);
            }
        }
        healthy
    }
}

/// Records etcd member `member_id` in node `id`'s ConsensusMember role (once: the
/// record keeps it until the role is taken), so that removals match the member by ID
/// (`etcd_members::member_of`), never by the address another record may share.
async fn record_member_id(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
    member_id: u64,
) -> Result<(), Status> {
    writes::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        match node
            .roles
            .as_mut()
            .and_then(|r| r.consensus_member.as_mut())
        {
            Some(role) if role.member_id != member_id => role.member_id = member_id,
            _ => return Ok(None),
        }
        Ok(Some(node))
    })
    .await
    .map_err(node_update_status)?;
    Ok(())
}

/// Whether a node record holds the ConsensusMember role and may run etcd.
pub(super) fn may_join(node: &Node) -> Result<(), Status> {
    if node.state != NodeState::Up as i32 {
        return Err(Status::failed_precondition(format!(
            "node {} is not UP",
            node.id
        )));
    }
    if node
        .roles
        .as_ref()
        .is_none_or(|r| r.consensus_member.is_none())
    {
        return Err(Status::failed_precondition(format!(
            "node {} does not hold the ConsensusMember role",
            node.id
        )));
    }
    if removal_pending(node) {
        return Err(Status::failed_precondition(format!(
            "node {}: its ConsensusMember role is being removed",
            node.id
        )));
    }
    Ok(())
}

/// Right before a join's `member_add`: one transaction guarded by `leadership` that
/// compares node `id`'s record with the one checked ([`may_join`]); refused unless this
/// curator still leads and the record is unchanged.
async fn confirm_join(shared: &Shared, leadership: &Leadership, id: &str) -> Result<(), Status> {
    let key = shared.curator.key(&layout::node_key(id));
    let response = shared
        .curator
        .kv()
        .get(key.clone(), None)
        .await
        .map_err(|e| Status::unavailable(format!("reading the record of node {id}: {e}")))?;
    let kv = response
        .kvs()
        .first()
        .ok_or_else(|| Status::not_found(format!("node {id} has no record")))?;
    may_join(&records::decode_node(id, kv.value()).map_err(status_from)?)?;
    let unchanged =
        etcd_client::Compare::mod_revision(key, etcd_client::CompareOp::Equal, kv.mod_revision());
    let confirmed = crate::election::leader_txn(
        &shared.curator,
        leadership,
        etcd_client::Txn::new().when([unchanged]),
    )
    .await
    .map_err(status_from)?;
    if !confirmed.succeeded() {
        return Err(Status::aborted(format!(
            "the record of node {id} changed while it joined; ask again"
        )));
    }
    Ok(())
}

/// Records the learner a join just added in node `id`'s role, guarded by
/// `leadership`; refused when the record no longer grants the role (taken, or its
/// removal pending).
async fn record_joined_member(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
    member_id: u64,
) -> Result<(), Status> {
    let mut granted = true;
    writes::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        granted = may_join(&node).is_ok();
        let role = node
            .roles
            .as_mut()
            .and_then(|r| r.consensus_member.as_mut())
            .filter(|_| granted);
        match role {
            Some(role) if role.member_id != member_id => role.member_id = member_id,
            _ => return Ok(None),
        }
        Ok(Some(node))
    })
    .await
    .map_err(node_update_status)?;
    if !granted {
        return Err(Status::failed_precondition(format!(
            "node {id} lost its ConsensusMember role while it joined"
        )));
    }
    Ok(())
}
