//! Changes of etcd membership, made by the leader for JoinConsensus and UpdateNodeRoles.
//!
//! ```text
//!   JoinConsensus (node with role ConsensusMember, no etcd data)
//!     its learner exists already ─▶ answer again (no queueing), promotion resumed
//!     else: membership lock ─▶ role re-checked ─▶ member_add(learner) ─▶ peer
//!           certificate ─▶ answer the node
//!           └─ task: promote as soon as etcd accepts, then release the lock
//!   remove role
//!     membership lock ─▶ plan_removal (quorum; members' curators asked) ─▶ own node?
//!     hand leadership over ─▶ member_remove (while the node still votes) ─▶ revoke peer
//!     certificates ─▶ record without the role (the node then stops etcd, wipes data)
//! ```
//! The lock serializes membership changes within this leader; etcd's own rules (one
//! learner at a time, no change within 5 s of reconnecting) cover a change of leader in
//! between, and changes it refuses for now are retried for a while.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use consensus::membership::{self, Member};
use proto::api;
use proto::state::{Node, NodeState};
use tonic::Status;

use super::{Shared, status_from};
use crate::election::Leadership;
use crate::state::{self, NodeUpdateError};

/// How long a learner may take to catch up before its promotion is given up (the node
/// asks again, which resumes it).
const PROMOTION_PATIENCE: Duration = Duration::from_secs(30);

fn etcd_status(what: &str, e: impl std::error::Error + 'static) -> Status {
    Status::unavailable(format!("{what}: {}", supervisor::error_chain(&e)))
}

/// How long a membership change waits for etcd to accept it. etcd refuses membership
/// changes ("unhealthy cluster") until its leader has been connected to a quorum of
/// the voters for 5 s, e.g. right after the previous learner was promoted.
const ADD_PATIENCE: Duration = Duration::from_secs(20);

/// Runs a membership change, retrying while etcd says the cluster is not ready for it
/// yet (its strict reconfiguration check, or a learner still pending).
async fn when_accepted<T, F, Fut>(what: &str, mut change: F) -> Result<T, Status>
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

/// The peer URL etcd knows a node's member by.
pub fn peer_url(node: &Node) -> Result<String, Status> {
    Ok(consensus::config::peer_url(
        super::record_address(node)?,
        consensus::config::PEER_PORT,
    ))
}

/// The member of node `node`, if it is one (by name, or by peer URL before it started).
fn member_of<'a>(members: &'a [Member], node: &Node) -> Option<&'a Member> {
    let url = peer_url(node).ok();
    members
        .iter()
        .find(|m| m.name == node.id || url.as_ref().is_some_and(|u| m.peer_urls.contains(u)))
}

/// JoinConsensus for `node` (which holds the ConsensusMember role).
pub async fn join(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    node: &Node,
) -> Result<api::JoinConsensusResponse, Status> {
    // Proof that this curator leads: only the leader changes etcd membership.
    let _ = leadership;
    let mut client = shared.curator.client();
    let members = membership::members(&mut client)
        .await
        .map_err(|e| etcd_status("listing etcd members", e))?;
    // This node asking again (a lost reply, a restart before its etcd ran): its learner
    // is served without queueing behind the promotion its own answer is needed for.
    let (member, members, guard) = match member_of(&members, node) {
        Some(m) => (m.clone(), members, None),
        None => {
            let guard = shared.membership.clone().lock_owned().await;
            // The role may have been taken away while this call waited.
            let node = state::load_node(&shared.curator, &node.id)
                .await
                .map_err(status_from)?
                .ok_or_else(|| Status::not_found(format!("node {} has no record", node.id)))?;
            may_join(&node)?;
            let members = membership::members(&mut client)
                .await
                .map_err(|e| etcd_status("listing etcd members", e))?;
            if let Some(m) = member_of(&members, &node) {
                (m.clone(), members, Some(guard))
            } else {
                if let Some(other) = members.iter().find(|m| m.is_learner) {
                    // A learner left behind by a join that never finished: promote it if
                    // etcd lets us; etcd takes no second learner meanwhile.
                    let nudge = membership::promote_when_in_sync(
                        &mut client,
                        other.id,
                        Duration::from_secs(2),
                    )
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
                let url = peer_url(&node)?;
                let (added, all) = when_accepted("adding the etcd learner", || {
                    let mut client = client.clone();
                    let url = url.clone();
                    async move { membership::add_learner(&mut client, &url).await }
                })
                .await?;
                tracing::info!(
                    node = node.id,
                    member = format!("{:x}", added.id),
                    "added etcd learner"
                );
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
    let peer_pki = state::etcd_pki(client.clone());
    let peer_ca = peer_pki
        .load_ca()
        .await
        .map_err(|e| etcd_status("loading the etcd peer CA", e))?
        .ok_or_else(|| Status::internal("the cluster has no etcd peer CA"))?;
    let key = super::record_key(node)?;
    let address = super::record_address(node)?;
    let lifetime = state::node_certificate_lifetime(Some(&shared.configuration().await?));
    let certificate = peer_pki
        .ensure_certificate(&state::peer_certificate_name(&node.id, member.id), || {
            peer_ca.issue(
                &state::peer_certificate_template(&node.id, address, lifetime),
                &key,
            )
        })
        .await
        .map_err(|e| etcd_status("issuing the etcd peer certificate", e))?;
    let crl = peer_pki
        .crl()
        .await
        .map_err(|e| etcd_status("reading the etcd peer CRL", e))?;
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
            match membership::promote_when_in_sync(&mut client, id, PROMOTION_PATIENCE).await {
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
    Ok(api::JoinConsensusResponse {
        peer_certificate: certificate,
        peer_ca_certificate: peer_ca.cert_der,
        peer_crl: crl,
        initial_cluster,
        member_id: member.id,
    })
}

/// A new etcd peer certificate for `node`'s current etcd member (RenewCertificates),
/// recorded under `peer-<id>-<member>-<serial>`; returns it and the peer CA (DER). The
/// previous one is not revoked: it expires.
pub async fn renew_peer(
    shared: &Shared,
    node: &Node,
    key: &[u8; 32],
    address: IpAddr,
    lifetime: Duration,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    let mut client = shared.curator.client();
    let members = membership::members(&mut client)
        .await
        .map_err(|e| etcd_status("listing etcd members", e))?;
    let member = member_of(&members, node).ok_or_else(|| {
        Status::failed_precondition(format!("node {} is no etcd member", node.id))
    })?;
    let peer_pki = state::etcd_pki(client);
    let peer_ca = peer_pki
        .load_ca()
        .await
        .map_err(|e| etcd_status("loading the etcd peer CA", e))?
        .ok_or_else(|| Status::internal("the cluster has no etcd peer CA"))?;
    let issued = peer_ca
        .issue(
            &state::peer_certificate_template(&node.id, address, lifetime),
            key,
        )
        .map_err(|e| Status::internal(format!("issuing the etcd peer certificate: {e}")))?;
    let name = state::renewed_peer_certificate_name(&node.id, member.id, &issued.serial);
    let certificate = peer_pki
        .ensure_certificate(&name, || Ok(issued.clone()))
        .await
        .map_err(|e| etcd_status("recording the etcd peer certificate", e))?;
    Ok((certificate, peer_ca.cert_der))
}

/// Takes the ConsensusMember role from node `id`: refused when the remaining voters
/// could not keep a quorum; otherwise the etcd member is removed first — while the node
/// still runs it and can vote the change through — then its peer certificates are
/// revoked and, last, the record loses the role (which makes the node stop etcd and
/// wipe its data). Every step is idempotent: after a failure, running it again finishes
/// the job. Returns the record.
pub async fn remove_role(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    id: &str,
) -> Result<Node, Status> {
    let _guard = shared.membership.clone().lock_owned().await;
    let node = state::load_node(&shared.curator, id)
        .await
        .map_err(status_from)?
        .ok_or_else(|| Status::not_found(format!("node {id} does not exist")))?;
    let mut client = shared.curator.client();
    let members = membership::members(&mut client)
        .await
        .map_err(|e| etcd_status("listing etcd members", e))?;
    let member = member_of(&members, &node).cloned();
    if let Some(member) = &member {
        check_removal(shared, &members, member, id).await?;
        if id == shared.config.node_id {
            // This curator's own etcd member would vanish under the request: hand the
            // leadership over (the next curator wins at once) and let the caller retry
            // there.
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
            async move { membership::remove(&mut client, member.id).await }
        })
        .await?;
        tracing::info!(
            node = id,
            member = format!("{:x}", member.id),
            "removed etcd member"
        );
    }
    let peer_pki = state::etcd_pki(client.clone());
    if let Some(peer_ca) = peer_pki
        .load_ca()
        .await
        .map_err(|e| etcd_status("loading the etcd peer CA", e))?
    {
        let revoked = peer_pki
            .revoke_issued(&peer_ca, &state::peer_certificate_prefix(id))
            .await
            .map_err(|e| etcd_status("revoking the etcd peer certificates", e))?;
        tracing::info!(
            node = id,
            revoked,
            "revoked the node's etcd peer certificates"
        );
    }
    let node = state::modify_node(&shared.curator, leadership, id, |current| {
        let mut node = current
            .cloned()
            .ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        let Some(roles) = node.roles.as_mut().filter(|r| r.consensus_member.is_some()) else {
            return Ok(None);
        };
        roles.consensus_member = None;
        Ok(Some(node))
    })
    .await
    .map_err(super::node_update_status)?
    .unwrap_or(node);
    Ok(node)
}

/// Refuses the removal of `member` (node `id`) when the remaining voters could not keep
/// a quorum (see `membership::plan_removal`; members' curators are asked whether their
/// etcd member is healthy).
async fn check_removal(
    shared: &Arc<Shared>,
    members: &[Member],
    member: &Member,
    id: &str,
) -> Result<(), Status> {
    let answering = shared.answering_members(members).await;
    let healthy = |m: &Member| answering.contains(&m.id);
    membership::plan_removal(members, member.id, healthy).map_err(|refused| {
        Status::failed_precondition(format!(
            "removing node {id} from consensus is refused: {refused}"
        ))
    })
}

/// Whether node `node` could leave consensus now without costing the quorum: `Ok` when
/// it is no etcd member or its removal is safe. Checked before a decommission starts,
/// so that an unsafe one is refused up front instead of hanging half-done.
pub async fn may_leave(shared: &Arc<Shared>, node: &Node) -> Result<(), Status> {
    let mut client = shared.curator.client();
    let members = membership::members(&mut client)
        .await
        .map_err(|e| etcd_status("listing etcd members", e))?;
    match member_of(&members, node) {
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

/// Whether a node record holds the ConsensusMember role and may run etcd.
pub fn may_join(node: &Node) -> Result<(), Status> {
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
    Ok(())
}
