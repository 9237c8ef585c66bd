//! The `root.role.logs` runnable: once the node is Home, serves this node's own log lines (NodeLogs) over mTLS
//! on `<address>:7836` (`rpc::NODE_LOGS_PORT`), with the node certificate, to the owner
//! and operators of the `operator` role and up (the rpc permission table; CA, validity, CRL and kind checked by
//! `rpc::AuthLayer` as on the curator). On the same port, CuratorLocal.GetConsensusStatus
//! answers from this node's own etcd member while it runs, with or without a quorum
//! (`NodeValues::local_etcd`): `cluster status` about a member whose curator cannot start.
//!
//! ```text
//!   hub (logcapture) ──last N──▶ stream
//!        └─ follow: read_from(cursor, 256) ─▶ mpsc(16) ─▶ client; nothing new: wait
//!           for the hub's wake-up; fell behind the ring: a "N lines dropped" marker
//! ```
//! Memory per reader is bounded (a batch and the channel) whatever the rate of lines;
//! a slow reader loses lines, never holds them. A follower ends when the node's CRL
//! lists its certificate (checked on each batch, and once a second when idle).
//! Without a quorum the answer comes from etcd's metrics: the member's raft index and
//! sizes, and its own view of its peers (the members recorded by `memberbook`, each
//! reachable or not), which polisctl shows; with one, from its etcd client, the peer
//! view added from the metrics all the same.
//! May not change anything: it only reads the hub (and the local etcd member's status).

use std::pin::Pin;
use std::sync::Arc;

use proto::api::{self, NodeLogLine};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::disk::files::recorded_membership;
use crate::disk::storage::read_proto;
use crate::logs::logcapture::hub;
use crate::logs::logring::{LineFilter, LogLine};
use crate::member::memberbook;
use crate::state::cluster_state::ClusterState;
use crate::state::settings::Settings;
use crate::state::values::{HeldBack, NodeValues};

/// Lines read from the ring at once by a follower.
const BATCH: usize = 256;
/// Lines (or markers) in flight to one reader.
const QUEUE: usize = 16;

fn message(line: LogLine) -> NodeLogLine {
    NodeLogLine {
        sequence: line.sequence,
        time_unix_micros: line.time_unix_micros,
        level: line.level,
        runnable: line.runnable,
        target: line.target,
        text: line.text,
        dropped: 0,
    }
}

/// NodeLogs: the hub's lines; `crl` is the node's current cluster CRL, which a
/// follower's certificate is checked against.
struct Logs {
    crl: rpc::TrustSlot,
}

/// How often an idle follower checks that its certificate was not revoked.
const REVOCATION_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

type LineStream = Pin<Box<dyn Stream<Item = Result<NodeLogLine, Status>> + Send>>;

#[tonic::async_trait]
impl api::node_logs_server::NodeLogs for Logs {
    type NodeLogsTailStream = LineStream;

    async fn node_logs_tail(
        &self,
        request: Request<api::NodeLogsRequest>,
    ) -> Result<Response<LineStream>, Status> {
        let certificate = request
            .extensions()
            .get::<rpc::server::ClientCertificate>()
            .cloned();
        let crl_slot = self.crl.clone();
        let certificate_here = certificate.clone();
        let request = request.into_inner();
        let filter = LineFilter {
            runnable_prefix: request.runnable_prefix,
            since_unix_micros: request.since_unix_micros,
        };
        let (lines, mut cursor) = hub().last(request.lines as usize, &filter);
        let first: Vec<Result<NodeLogLine, Status>> =
            lines.into_iter().map(|l| Ok(message(l))).collect();
        if !request.follow {
            return Ok(Response::new(Box::pin(tokio_stream::iter(first))));
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = async move {
            for line in first {
                if tx.send(line).await.is_err() {
                    return;
                }
            }
            // The CRLs last checked: a follower whose certificate a new one lists ends.
            let mut checked: Vec<Vec<u8>> = Vec::new();
            loop {
                let crls = crl_slot.anchors().crls;
                if let Some(certificate) = &certificate
                    && checked != crls
                {
                    if crls.iter().any(|crl| certificate.listed_in(crl)) {
                        tracing::info!("a followed log stream ends: the caller was revoked");
                        let _ = tx
                            .send(Err(Status::permission_denied(rpc::server::STREAM_REVOKED)))
                            .await;
                        return;
                    }
                    checked = crls;
                }
                let changed = hub().changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let (dropped, lines, next) = hub().read_from(cursor, BATCH, &filter);
                let idle = next == cursor;
                cursor = next;
                if dropped > 0 {
                    let marker = NodeLogLine {
                        dropped,
                        ..Default::default()
                    };
                    if tx.send(Ok(marker)).await.is_err() {
                        return;
                    }
                }
                for line in lines {
                    if tx.send(Ok(message(line))).await.is_err() {
                        return;
                    }
                }
                if idle {
                    tokio::select! {
                        _ = changed => {}
                        _ = tokio::time::sleep(REVOCATION_CHECK) => {}
                        _ = tx.closed() => return,
                    }
                }
            }
        };
        tokio::spawn(task.instrument(tracing::Span::current()));
        Ok(Response::new(Box::pin(rpc::server::ending_at_expiry(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            certificate_here.as_ref(),
        ))))
    }
}

/// CuratorLocal on the log port: only GetConsensusStatus, from this node's own etcd
/// member while it runs — so that a member without a quorum, whose curator does not
/// start, still answers `cluster status` about itself (owner and node certificates, as
/// on the curator; polisctl asks here when a curator port does not answer).
struct MemberStatus {
    settings: Settings,
    values: NodeValues,
    node_id: String,
}

impl MemberStatus {
    /// The member's own account from etcd's metrics (`consensus::selfreport`): no
    /// leader named, its raft index, its peers — the members last recorded
    /// (`memberbook`) and any etcd shows — and which of them it has a stream to. The
    /// raft term stays unknown (not among etcd's metrics; `from_metrics` says so).
    async fn self_report(&self) -> Result<api::GetConsensusStatusResponse, Status> {
        let run_dir = self.settings.root.consensus_run_dir();
        let report = tokio::time::timeout(
            SELF_REPORT_BOUND,
            consensus::selfreport::self_report(&run_dir),
        )
        .await
        .map_err(|_| Status::unavailable("this node's etcd member does not answer"))?
        .map_err(|_| Status::unavailable("this node's etcd member does not run"))?;
        let root = &self.settings.root;
        let sealed: Option<proto::config::SealedConfiguration> =
            read_proto(&root.sealed_configuration(), "sealed configuration").ok();
        let recorded = recorded_membership(root, sealed.as_ref())
            .map_err(|e| Status::internal(format!("{e:#}")))?
            .unwrap_or_default();
        let own = match recorded.etcd_member_id {
            0 => report.member_id,
            id => id,
        };
        // A missing or unreadable record only leaves the peers unnamed.
        let book = memberbook::load(root).unwrap_or_else(|e| {
            tracing::debug!("reading the recorded etcd members: {e:#}");
            Vec::new()
        });
        let peers = consensus::selfreport::peer_view(&report, own, &book);
        let itself = api::ConsensusMember {
            id: own,
            name: self.node_id.clone(),
            peer_urls: vec![consensus::config::peer_url(
                self.settings.address,
                consensus::config::PEER_PORT,
            )],
            is_learner: report.is_learner,
        };
        // The others as recorded: listed (not answering) so that the caller sees them.
        let others = book
            .into_iter()
            .filter(|m| m.id != own)
            .map(|m| api::ConsensusMember {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                is_learner: m.is_learner,
            });
        Ok(api::GetConsensusStatusResponse {
            node_id: self.node_id.clone(),
            member_id: own,
            cluster_id: recorded.etcd_cluster_id,
            leader_id: if report.is_leader { own } else { 0 },
            raft_index: report.raft_index,
            is_learner: report.is_learner,
            members: std::iter::once(itself).chain(others).collect(),
            db_size: report.db_size,
            db_size_in_use: report.db_size_in_use,
            quota_backend_bytes: report.quota_backend_bytes,
            peers: curator::service::peer_answers(peers),
            peers_known: true,
            from_metrics: true,
            leader_changes_seen: report.leader_changes_seen,
            revision: report.revision,
            ..Default::default()
        })
    }

    /// What a member whose etcd does not run says of itself: its node, the epoch of its
    /// data, how far that data reaches, and why it holds back (`superseded`; empty for a
    /// recovery whose etcd is starting).
    fn answer_without_etcd(&self, held: HeldBack) -> api::GetConsensusStatusResponse {
        let root = &self.settings.root;
        let sealed: Option<proto::config::SealedConfiguration> =
            read_proto(&root.sealed_configuration(), "sealed configuration").ok();
        let recorded = recorded_membership(root, sealed.as_ref())
            .ok()
            .flatten()
            .unwrap_or_default();
        api::GetConsensusStatusResponse {
            node_id: self.node_id.clone(),
            member_id: recorded.etcd_member_id,
            cluster_id: recorded.etcd_cluster_id,
            revision: held.revision,
            held_back: held.reason,
            from_metrics: true,
            ..Default::default()
        }
    }
}

/// How long the metrics of a member that does not serve clients may take.
const SELF_REPORT_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

fn curator_only() -> Status {
    Status::unimplemented(format!(
        "served by the curator (port {}), not on the node's own port",
        rpc::CURATOR_PORT
    ))
}

#[tonic::async_trait]
impl api::curator_local_server::CuratorLocal for MemberStatus {
    type SnapshotsFetchLocalStream =
        Pin<Box<dyn Stream<Item = Result<api::SnapshotFileChunk, Status>> + Send>>;

    async fn get_current_leader(
        &self,
        _: Request<api::GetCurrentLeaderRequest>,
    ) -> Result<Response<api::GetCurrentLeaderResponse>, Status> {
        Err(curator_only())
    }

    async fn get_ca_certificate(
        &self,
        _: Request<api::GetCaCertificateRequest>,
    ) -> Result<Response<api::GetCaCertificateResponse>, Status> {
        Err(curator_only())
    }

    async fn get_consensus_status(
        &self,
        _: Request<api::GetConsensusStatusRequest>,
    ) -> Result<Response<api::GetConsensusStatusResponse>, Status> {
        let held = self.values.held_back.current().flatten();
        // The epoch this node's data belongs to, as recorded beside it (the answer from
        // a serving etcd carries the epoch its data holds instead).
        let recorded_epoch = || {
            crate::member::epochs::load(&self.settings.root)
                .map_err(|e| tracing::warn!("reading this node's cluster epoch: {e:#}"))
                .ok()
        };
        let Some(Some(local)) = self.values.local_etcd.current() else {
            // etcd may run without serving clients yet (it takes a quorum after a
            // restart): its metrics still answer.
            let mut answer = match (self.self_report().await, held) {
                (Ok(answer), held) => api::GetConsensusStatusResponse {
                    held_back: held.map(|h| h.reason).unwrap_or_default(),
                    ..answer
                },
                (Err(_), Some(held)) => self.answer_without_etcd(held),
                // A recovery's claim is answered before its etcd runs: a concurrent
                // recovery must see it while both settle.
                (Err(e), None) => match recorded_epoch() {
                    Some(claim)
                        if claim.record_revision == 0 && !proto::epoch::is_bootstrap(&claim) =>
                    {
                        self.answer_without_etcd(HeldBack {
                            reason: String::new(),
                            revision: claim.parent_revision,
                        })
                    }
                    _ => return Err(e),
                },
            };
            answer.epoch = recorded_epoch();
            return Ok(Response::new(answer));
        };
        let mut client = local.client;
        let answer =
            curator::service::member_status(&mut client, &self.node_id, local.quota_backend_bytes)
                .await?;
        let run_dir = self.settings.root.consensus_run_dir();
        let mut answer = curator::service::with_peer_view(answer, Some(&run_dir)).await;
        // A recover's claim is recorded beside the data before its etcd holds it.
        if let Some(recorded) = recorded_epoch()
            && answer
                .epoch
                .as_ref()
                .is_none_or(|e| proto::epoch::newer(&recorded, e))
        {
            answer.epoch = Some(recorded);
        }
        answer.held_back = held.map(|h| h.reason).unwrap_or_default();
        // Signed with the CA key this member's etcd holds: a node that asks this address
        // without knowing it as a member takes a newer epoch only when this verifies.
        if let Some(epoch) = &answer.epoch
            && let Some(signature) = curator::service::epoch_signature(&client, epoch).await
        {
            answer.epoch_signature = signature;
        }
        Ok(Response::new(answer))
    }

    async fn defragment_member(
        &self,
        _: Request<api::DefragmentMemberRequest>,
    ) -> Result<Response<api::DefragmentMemberResponse>, Status> {
        Err(curator_only())
    }

    async fn snapshots_list_local(
        &self,
        _: Request<api::SnapshotsListLocalRequest>,
    ) -> Result<Response<api::SnapshotsListLocalResponse>, Status> {
        Err(curator_only())
    }

    async fn snapshots_fetch_local(
        &self,
        _: Request<api::SnapshotsFetchLocalRequest>,
    ) -> Result<Response<Self::SnapshotsFetchLocalStream>, Status> {
        Err(curator_only())
    }
}

/// Serves NodeLogs (and a member's own consensus status) until cancelled.
pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    // The node certificate exists once the node is Home (a bootstrap writes it late); a
    // node that restarts has it before (and may not get Home without a quorum).
    if !settings.root.node_certificate().exists() {
        let mut state = values.cluster_state.watch();
        tokio::select! {
            s = state.get_matching(|s| matches!(s, ClusterState::Home | ClusterState::Split)) => { s?; }
            _ = ctx.cancelled() => return Ok(()),
        }
    }
    let node_id = match values.membership.current() {
        Some(m) => m.key().node_id(),
        None => return Err("the log server started before the node's membership".into()),
    };
    let credentials = values.credentials.slot(&settings.root)?;
    let trust =
        crate::curators::curator_client::trust(&settings, &values).map_err(|e| format!("{e:#}"))?;
    let tls = rpc::tls::server_config_from(&credentials)?;
    let listen = std::net::SocketAddr::new(settings.address, rpc::NODE_LOGS_PORT);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("listening on {listen}: {e}"))?;
    let logs = Logs { crl: trust.clone() };
    let source: rpc::TrustSource = Arc::new(move || {
        let anchors = trust.anchors();
        Box::pin(async move {
            if anchors.crls.is_empty() {
                Err("no cluster CRL yet".to_string())
            } else {
                Ok(anchors)
            }
        })
    });
    let auth = rpc::AuthLayer::new(Arc::new(rpc::Authenticator::new()), source);
    tracing::info!(%listen, "serving this node's logs");
    ctx.signal_healthy();
    let span = tracing::Span::current();
    rpc::server::builder()
        .trace_fn(move |_| span.clone())
        .layer(auth)
        .add_service(api::node_logs_server::NodeLogsServer::new(logs))
        .add_service(api::curator_local_server::CuratorLocalServer::new(
            MemberStatus {
                settings: settings.clone(),
                values,
                node_id,
            },
        ))
        .serve_with_incoming_shutdown(
            rpc::incoming(listener, tls, rpc::Port::Node),
            ctx.cancellation_token().cancelled_owned(),
        )
        .await?;
    Ok(())
}
