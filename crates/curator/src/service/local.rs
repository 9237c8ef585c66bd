//! CuratorLocal: served by every curator, leader or not, to anyone (the snapshot
//! calls to UP consensus members only: `scheduled_api`).

use proto::api;
use tonic::{Request, Response, Status};

use super::shared::{Services, Shared};
use super::status::{identity, status_from};
use super::{scheduled_api, upkeep};
use crate::election;

/// How long GetConsensusStatus waits for its linearizable read (it answers anyway).
const QUORUM_READ_BOUND: std::time::Duration = std::time::Duration::from_secs(2);
/// How long it waits for etcd's metrics (its peer view; it answers anyway).
const METRICS_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

#[tonic::async_trait]
impl api::curator_local_server::CuratorLocal for Services {
    type SnapshotsFetchLocalStream = scheduled_api::FileStream;

    async fn snapshots_list_local(
        &self,
        request: Request<api::SnapshotsListLocalRequest>,
    ) -> Result<Response<api::SnapshotsListLocalResponse>, Status> {
        Ok(Response::new(scheduled_api::list_local_call(
            &self.0, &request,
        )?))
    }

    async fn snapshots_fetch_local(
        &self,
        request: Request<api::SnapshotsFetchLocalRequest>,
    ) -> Result<Response<Self::SnapshotsFetchLocalStream>, Status> {
        Ok(Response::new(
            scheduled_api::fetch_local_call(&self.0, &request).await?,
        ))
    }

    async fn get_current_leader(
        &self,
        _: Request<api::GetCurrentLeaderRequest>,
    ) -> Result<Response<api::GetCurrentLeaderResponse>, Status> {
        let leader = election::current_leader(&self.0.curator)
            .await
            .map_err(status_from)?
            .unwrap_or_default();
        Ok(Response::new(api::GetCurrentLeaderResponse {
            leader_node_id: leader.node_id,
            leader_endpoint: leader.endpoint,
            this_node_id: self.0.config.node_id.clone(),
        }))
    }

    async fn get_ca_certificate(
        &self,
        request: Request<api::GetCaCertificateRequest>,
    ) -> Result<Response<api::GetCaCertificateResponse>, Status> {
        let trusted = self.0.trusted.current();
        let handovers = match (&trusted, request.get_ref().with_handovers) {
            (Some(trusted), true) => handovers(&self.0, trusted.cas()).await?,
            _ => Vec::new(),
        };
        Ok(Response::new(api::GetCaCertificateResponse {
            handovers,
            ca_certificate: trusted.as_ref().map_or_else(
                || self.0.config.ca_certificate.clone(),
                |t| t.current.cert.clone(),
            ),
            crl: self.0.crl.current().map(|c| c.to_vec()).unwrap_or_default(),
            trusted_cas: trusted.as_ref().map(|t| t.cas()).unwrap_or_default(),
            crls: trusted.as_ref().map(|t| t.crls()).unwrap_or_default(),
        }))
    }

    async fn get_consensus_status(
        &self,
        _: Request<api::GetConsensusStatusRequest>,
    ) -> Result<Response<api::GetConsensusStatusResponse>, Status> {
        let mut client = self.0.curator.client();
        let status = member_status(
            &mut client,
            &self.0.config.node_id,
            self.0.config.etcd_quota_bytes,
        )
        .await?;
        let status = with_peer_view(status, self.0.config.etcd_run_dir.as_deref()).await;
        let scheduled = self
            .0
            .scheduled
            .lock()
            .expect("scheduled outcome lock")
            .clone();
        let ca_rotation_phase = self
            .0
            .trusted
            .current()
            .map(|t| t.phase().name().to_string())
            .unwrap_or_default();
        let etcd_peer_ca_rotation_phase = self
            .0
            .peer_trusted
            .current()
            .map(|t| t.trusted.phase().name().to_string())
            .unwrap_or_default();
        Ok(Response::new(api::GetConsensusStatusResponse {
            snapshot_last_success_unix_ms: scheduled.last_success_unix_ms,
            snapshot_last_error: scheduled.last_error,
            ca_rotation_phase,
            etcd_peer_ca_rotation_phase,
            ..status
        }))
    }

    async fn defragment_member(
        &self,
        request: Request<api::DefragmentMemberRequest>,
    ) -> Result<Response<api::DefragmentMemberResponse>, Status> {
        let caller = identity(&request);
        let answer = upkeep::defragment_own(&self.0, &caller, request.get_ref().member_id).await?;
        Ok(Response::new(answer))
    }
}

/// The cluster CA's signature of `epoch` with the key the local etcd member (`client`)
/// holds, read without a quorum; None when it cannot be read (or signed).
pub async fn epoch_signature(
    client: &etcd_client::Client,
    epoch: &proto::config::ClusterEpoch,
) -> Option<Vec<u8>> {
    let store = crate::layout::cluster_pki(&consensus::Namespaced::new(
        client.clone(),
        crate::layout::NAMESPACE,
    ));
    let read = tokio::time::timeout(QUORUM_READ_BOUND, store.load_ca_local()).await;
    let ca = read.ok()?.ok()??;
    ca.sign(&rpc::epoch::signed_message(epoch)).ok()
}

/// What the local etcd member (`client`) says of itself and its cluster, answered
/// without a quorum: GetConsensusStatus, here and on a member's own port while its
/// curator cannot run (`polis-node`'s log port; no scheduled-snapshot fields there).
pub async fn member_status(
    client: &mut etcd_client::Client,
    node_id: &str,
    quota_backend_bytes: u64,
) -> Result<api::GetConsensusStatusResponse, Status> {
    let status = tokio::time::timeout(QUORUM_READ_BOUND, client.status())
        .await
        .map_err(|_| Status::unavailable("the local etcd member does not answer"))?
        .map_err(|e| Status::unavailable(format!("the local etcd member does not answer: {e}")))?;
    // A linearizable read first (only with a leader; bounded): the member list read
    // after it holds every committed membership change.
    let quorum_read = status.leader() != 0
        && tokio::time::timeout(QUORUM_READ_BOUND, client.get("\0polis-quorum-read", None))
            .await
            .is_ok_and(|r| r.is_ok());
    let members = consensus::membership::members(client)
        .await
        .map_err(|e| Status::unavailable(format!("listing etcd members: {e}")))?;
    // etcd upkeep: the cluster's alarms as this member knows them (empty if it cannot
    // say: the status above is what matters to a quorum check). etcd 3.4 answers the
    // alarm list through raft: a member without a leader holds the request for its 7 s
    // request timeout (a member just healed from a cut made `cluster status` wait 5 s
    // for it), so only with a leader, and bounded.
    let alarms = if status.leader() == 0 {
        Vec::new()
    } else {
        tokio::time::timeout(QUORUM_READ_BOUND, consensus::maintenance::alarms(client))
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or_default()
    };
    let header = status.header();
    // The epoch of this member's data, from its own applied state (no quorum needed).
    let curator_ns = consensus::Namespaced::new(client.clone(), crate::layout::NAMESPACE);
    let epoch = tokio::time::timeout(QUORUM_READ_BOUND, crate::epochs::chain(&curator_ns, true))
        .await
        .map_err(|_| Status::unavailable("the local etcd member does not answer"))?
        .map_err(|e| Status::unavailable(format!("reading the cluster's epochs: {e}")))?;
    Ok(api::GetConsensusStatusResponse {
        epoch: Some(proto::epoch::latest(&epoch)),
        epoch_chain: epoch,
        revision: header.map(|h| h.revision()).unwrap_or_default(),
        node_id: node_id.to_string(),
        member_id: header.map(|h| h.member_id()).unwrap_or_default(),
        cluster_id: header.map(|h| h.cluster_id()).unwrap_or_default(),
        leader_id: status.leader(),
        raft_index: status.raft_index(),
        raft_term: status.raft_term(),
        is_learner: status.is_learner(),
        quorum_read,
        members: members
            .into_iter()
            .map(|m| api::ConsensusMember {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                is_learner: m.is_learner,
            })
            .collect(),
        db_size: status.db_size(),
        db_size_in_use: status.raft_used_db_size(),
        quota_backend_bytes,
        alarms: alarms
            .into_iter()
            .map(|a| api::ConsensusAlarm {
                member_id: a.member_id,
                alarm: a.kind.name().to_string(),
            })
            .collect(),
        ..Default::default()
    })
}

/// `answer` with this member's own view of its peers, from its etcd's metrics under
/// `run_dir` (the members named from `answer.members`); unchanged (`peers_known` false)
/// without a run directory or when the metrics do not answer in time.
pub async fn with_peer_view(
    mut answer: api::GetConsensusStatusResponse,
    run_dir: Option<&std::path::Path>,
) -> api::GetConsensusStatusResponse {
    let Some(dir) = run_dir else {
        return answer;
    };
    let Ok(Ok(report)) =
        tokio::time::timeout(METRICS_BOUND, consensus::selfreport::self_report(dir)).await
    else {
        return answer;
    };
    let members: Vec<consensus::membership::Member> = answer
        .members
        .iter()
        .map(|m| consensus::membership::Member {
            id: m.id,
            name: m.name.clone(),
            peer_urls: m.peer_urls.clone(),
            is_learner: m.is_learner,
        })
        .collect();
    let view = consensus::selfreport::peer_view(&report, answer.member_id, &members);
    answer.peers = peer_answers(view);
    answer.peers_known = true;
    answer.leader_changes_seen = report.leader_changes_seen;
    answer
}

/// The peer view as GetConsensusStatus carries it.
pub fn peer_answers(view: Vec<consensus::selfreport::PeerView>) -> Vec<api::PeerReachability> {
    view.into_iter()
        .map(|p| api::PeerReachability {
            member_id: p.id,
            node_id: p.name,
            peer_url: p.peer_url,
            reachable: p.reachable,
        })
        .collect()
}

/// The cluster CA's handovers (`pki::CaStore::handovers`), read from etcd once per set
/// of trusted CAs `cas` (a rotation's step) and answered from memory otherwise.
async fn handovers(shared: &Shared, cas: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, Status> {
    let mut cached = shared.handovers.lock().await;
    if let Some((read_for, list)) = cached.as_ref()
        && *read_for == cas
    {
        return Ok(list.clone());
    }
    let list = crate::layout::cluster_pki(&shared.curator)
        .handovers()
        .await
        .map_err(|e| Status::unavailable(format!("reading the cluster CA's handovers: {e}")))?;
    *cached = Some((cas, list.clone()));
    Ok(list)
}
