//! Curator: the node-facing calls. Registration (RegisterNode, CommitNode) is made with
//! a self-signed certificate for the node's key; Heartbeat and WatchNode with the node
//! certificate CommitNode issued.
//!
//! ```text
//!   node                                   curator (leader)
//!   RegisterNode(ticket) ─────────────────▶ a new key: ticket live (hash compared in
//!                                          constant time), labels; record, its
//!                                          address and join key claimed (index) and
//!                                          one use of the ticket in one txn
//!        ◀── stream: NEW … STANDBY ─────── record NEW (lifecycle::Register), then the
//!                                          node snapshot as the owner approves
//!   CommitNode ───────────────────────────▶ lifecycle::Commit: node certificate ensured
//!        ◀── certificate, CA, roles ─────── (issuance; same one on a retry), record UP
//!   WatchNode (node certificate) ────────▶ stream: own state and roles, curator list
//!   Heartbeat(status) (node certificate) ─▶ this tenure's health tracker (see `health`);
//!                                          the status into the record when it differs
//!                                          from the snapshot's (no etcd read otherwise),
//!                                          at most once per period per node
//!   RenewCertificates (node certificate) ─▶ issuance::renew: new node (and peer)
//!                                          certificate
//!   ReissueNodeCertificate (self-signed, ─▶ reissue: a node that missed a CA rotation
//!     the retired CA's certificate shown)  (its certificate of a retired CA)
//!   JoinConsensus (node certificate) ────▶ membership::join
//! ```
//! Handlers check the request and build the answer; certificates come from `issuance`,
//! membership changes from `membership`, record writes from `writes`.

use std::net::IpAddr;
use std::pin::Pin;
use std::time::Instant;

use proto::api;
use proto::state::{HealthVerdict, Node, NodeState, NodeStatus};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::health_book::stored_verdict;
use super::node_status::{self, StatusWrite};
use super::shared::{NodeSnapshot, Services, Shared};
use super::status::{
    identity, node_update_status, record_address, record_key, self_signed_key, status_from,
};
use super::{issuance, membership, tickets, unlock};
use crate::election::Leadership;
use crate::error::NodeUpdateError;
use crate::health::Tracker;
use crate::lifecycle::{Event, Outcome, TransitionError};
use crate::{records, writes};

/// The longest version string a node may report.
const MAX_VERSION_LEN: usize = 64;

/// Refuses a status that is not what a node reports, before it reaches etcd.
fn check_status(status: &NodeStatus) -> Result<(), Status> {
    if status.address.parse::<IpAddr>().is_err() {
        return Err(Status::invalid_argument(
            "the status address is not an IP address",
        ));
    }
    if status.version.len() > MAX_VERSION_LEN {
        return Err(Status::invalid_argument(format!(
            "the status version is longer than {MAX_VERSION_LEN} bytes"
        )));
    }
    // What a CA rotation reads: bounded like the trust a node can hold, so that no node
    // can grow its record (and every snapshot and watch event carrying it).
    if status.trusted_ca_fingerprints.len() > rpc::tls::MAX_TRUSTED_CAS
        || status.etcd_loaded_peer_ca_fingerprints.len() > rpc::tls::MAX_TRUSTED_CAS
    {
        return Err(Status::invalid_argument(format!(
            "the status names more than {} trusted CAs",
            rpc::tls::MAX_TRUSTED_CAS
        )));
    }
    let fingerprint = |f: &str| f.len() == 64 && f.bytes().all(|b| b.is_ascii_hexdigit());
    let issuer = |f: &str| f.is_empty() || fingerprint(f);
    if !status
        .trusted_ca_fingerprints
        .iter()
        .chain(&status.etcd_loaded_peer_ca_fingerprints)
        .all(|f| fingerprint(f))
        || !issuer(&status.certificate_ca_fingerprint)
        || !issuer(&status.etcd_peer_certificate_ca_fingerprint)
    {
        return Err(Status::invalid_argument(
            "a CA fingerprint in the status is not 64 hex digits (SHA-256)",
        ));
    }
    if status.services.len() > MAX_SERVICES
        || status.services.iter().any(|s| {
            s.name.is_empty()
                || s.name.len() > MAX_VERSION_LEN
                || s.last_error.len() > MAX_SERVICE_ERROR_LEN
        })
    {
        return Err(Status::invalid_argument(format!(
            "the status names more than {MAX_SERVICES} services, or one with an empty or \
             overlong name or error"
        )));
    }
    if status.kubernetes_node.len() > MAX_SERVICE_ERROR_LEN {
        return Err(Status::invalid_argument(format!(
            "the status's Kubernetes Node state is over {MAX_SERVICE_ERROR_LEN} bytes"
        )));
    }
    Ok(())
}

/// The most services a node's status names (a node runs a handful per role).
const MAX_SERVICES: usize = 16;

/// The longest error a service's state carries (the node's board bounds it so:
/// `kubernetes::board::MAX_ERROR_LEN`).
const MAX_SERVICE_ERROR_LEN: usize = kubernetes::board::MAX_ERROR_LEN;

/// The version-skew policy: a node this curator may not work with is told why, with
/// both versions, on every heartbeat. Its status is still recorded (at most once a
/// period, like any other), so that `polisctl cluster versions` shows the version that
/// was refused; the heartbeat does not count (the node is never HEALTHY here). A version
/// that is not one cannot be judged: its status is kept and shown as it is (`cluster
/// versions` calls it unreadable); the policy is between honest builds, a hostile node
/// can claim any version.
fn skew_refusal(status: &NodeStatus) -> Option<Status> {
    match proto::version::check_skew(&status.version, CURATOR_VERSION) {
        Err(e @ proto::version::SkewError::TooFarApart { .. }) => Some(
            Status::failed_precondition(format!("this node is refused: {e}")),
        ),
        _ => None,
    }
}

/// The version of this curator (the workspace's: every crate of one build shares it).
const CURATOR_VERSION: &str = env!("CARGO_PKG_VERSION");

type UpdateStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A stream of views of the node snapshot: `view` picks what the client sees (`None`:
/// nothing to say yet); a view equal to the last one sent is not sent again. Ends when
/// the client goes away or the curator stops.
fn snapshot_stream<T>(
    shared: &Shared,
    revocable: Option<Vec<u8>>,
    view: impl Fn(&NodeSnapshot) -> Option<T> + Send + Sync + 'static,
) -> UpdateStream<T>
where
    T: PartialEq + Clone + Send + 'static,
{
    snapshot_stream_from(shared, revocable, None, view)
}

/// [`snapshot_stream`] whose first message is `first` (what the handler just wrote or
/// read), sent at once: the client never waits for the snapshot to catch up to learn
/// it, even when the snapshot never shows it (a record deleted before its watch event
/// was applied).
fn snapshot_stream_from<T>(
    shared: &Shared,
    revocable: Option<Vec<u8>>,
    first: Option<T>,
    view: impl Fn(&NodeSnapshot) -> Option<T> + Send + Sync + 'static,
) -> UpdateStream<T>
where
    T: PartialEq + Clone + Send + 'static,
{
    let mut snapshots = shared.nodes.watch();
    let mut live = shared.nodes_live.watch();
    let mut crls = shared.crl.watch();
    let mut trusted = shared.trusted.watch();
    let mut peer_trusted = shared.peer_trusted.watch();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        if let Some(first) = &first
            && tx.send(Ok(first.clone())).await.is_err()
        {
            return;
        }
        let mut last: Option<T> = first;
        let mut current: Option<NodeSnapshot> = None;
        loop {
            let snapshot = tokio::select! {
                s = snapshots.get() => match s {
                    Ok(s) => s,
                    Err(_) => return,
                },
                // Views may show the CRL too: look again when it changes. A stream
                // authorized with a certificate that is now revoked ends here.
                c = crls.get() => match (c, current.clone()) {
                    (Ok(crl), _) if revocable.as_deref().is_some_and(|s| on_crl(&crl, s)) => {
                        let _ = tx
                            .send(Err(Status::unauthenticated(format!(
                                "{}: the stream ends",
                                rpc::REVOKED
                            ))))
                            .await;
                        return;
                    }
                    (Ok(_), Some(s)) => s,
                    (Ok(_), None) => continue,
                    (Err(_), _) => return,
                },
                // And the CAs trusted (a rotation's step), the etcd peer CAs too.
                t = trusted.get() => match (t, current.clone()) {
                    (Ok(_), Some(s)) => s,
                    (Ok(_), None) => continue,
                    (Err(_), _) => return,
                },
                t = peer_trusted.get() => match (t, current.clone()) {
                    (Ok(_), Some(s)) => s,
                    (Ok(_), None) => continue,
                    (Err(_), _) => return,
                },
                // The snapshot went stale: end the stream, the client goes elsewhere.
                _ = live.get_matching(|l| !*l) => {
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "this curator's view of the cluster is stale; reconnect to another curator",
                        )))
                        .await;
                    return;
                }
                _ = tx.closed() => return,
            };
            current = Some(snapshot.clone());
            let Some(next) = view(&snapshot) else {
                continue;
            };
            if last.as_ref() != Some(&next) {
                last = Some(next.clone());
                if tx.send(Ok(next)).await.is_err() {
                    return;
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A WatchNode update, equal to another when the node would act the same on both: a
/// change of its record that only moves its revision (a label, a status, a health
/// verdict: nothing the update carries) is not sent. The node would only record the
/// newer revision — a synced file write per change on the node, for nothing it acts on
/// — and the stale-view rule (`node::state::staleview`) holds as well with the revisions of
/// the updates that are sent.
#[derive(Clone)]
struct NodeView(api::WatchNodeUpdate);

impl PartialEq for NodeView {
    fn eq(&self, other: &NodeView) -> bool {
        // Every field named: a field added to the update must be decided on here.
        let api::WatchNodeUpdate {
            record_revision: _,
            record_etcd_cluster,
            state,
            roles,
            curator_endpoints,
            cluster_crl,
            cluster_cas,
            cluster_crls,
            etcd_peer_cas,
        } = &self.0;
        let b = &other.0;
        *record_etcd_cluster == b.record_etcd_cluster
            && *state == b.state
            && *roles == b.roles
            && *curator_endpoints == b.curator_endpoints
            && *cluster_crl == b.cluster_crl
            && *cluster_cas == b.cluster_cas
            && *cluster_crls == b.cluster_crls
            && *etcd_peer_cas == b.etcd_peer_cas
    }
}

/// Whether the certificate with `serial` is on `crl` (an unreadable CRL revokes nothing:
/// the curator took it from its own watch).
fn on_crl(crl: &[u8], serial: &[u8]) -> bool {
    pki::crl_serials(crl).is_ok_and(|serials| serials.iter().any(|s| s == serial))
}

/// Waits until this tenure's leader has indexed the claims of every record (see
/// `writes::claims`): once per tenure, before its first registration.
async fn claims_indexed(shared: &Shared, leadership: &Leadership) -> Result<(), Status> {
    let tenure = (leadership.key.clone(), leadership.revision);
    let mut indexed = shared.claims_indexed.lock().await;
    if indexed.as_ref() == Some(&tenure) {
        return Ok(());
    }
    let written = writes::claims::backfill(&shared.curator, leadership)
        .await
        .map_err(status_from)?;
    tracing::info!(
        written,
        "address and join key index complete for this tenure"
    );
    *indexed = Some(tenure);
    Ok(())
}

#[tonic::async_trait]
impl api::curator_server::Curator for Services {
    async fn heartbeat(
        &self,
        request: Request<api::HeartbeatRequest>,
    ) -> Result<Response<api::HeartbeatResponse>, Status> {
        let rpc::Identity::Node { id, .. } = identity(&request) else {
            return Err(Status::permission_denied("heartbeats come from nodes"));
        };
        let status = request.into_inner().status;
        if let Some(status) = &status {
            check_status(status)?;
        }
        let refused = status.as_ref().and_then(skew_refusal);
        let leadership = self.0.leadership().await?;
        // Compared with the snapshot: an unchanged status (nearly every heartbeat) costs
        // no etcd request.
        let stored = self.0.nodes.current().and_then(|s| {
            s.nodes
                .get(&id)
                .map(|n| (stored_verdict(n), n.status.clone()))
        });
        let changed =
            status.filter(|status| stored.as_ref().is_none_or(|s| s.1.as_ref() != Some(status)));
        let write = {
            let mut book = self.0.health.lock().expect("health lock poisoned");
            let verdict = stored.as_ref().map_or(HealthVerdict::Unknown, |s| s.0);
            let now = Instant::now();
            let timing = &self.0.config.heartbeat;
            let book = book.tenure(&leadership);
            let tracker = book
                .trackers
                .entry(id.clone())
                .or_insert_with(|| Tracker::new(verdict, now));
            if refused.is_none() {
                tracker.heartbeat(now, timing);
            }
            // Decided under the lock: of concurrent heartbeats, one writes.
            node_status::decide(book, &id, changed, now, timing)
        };
        // A refused node is told of its refusal even when its status could not be written.
        let recorded = match write {
            StatusWrite::Now(status) => {
                node_status::record(&self.0, &leadership, &id, status).await
            }
            StatusWrite::Later(at) => {
                tracing::debug!(
                    node = id,
                    "status changed within a period: written at its end"
                );
                node_status::record_later(self.0.clone(), leadership, id.clone(), at);
                Ok(())
            }
            StatusWrite::None => Ok(()),
        };
        if let Some(refusal) = refused {
            if let Err(e) = recorded {
                tracing::warn!(
                    node = id,
                    "the status of a node refused for its version was not recorded: {}",
                    e.message()
                );
            }
            return Err(refusal);
        }
        recorded?;
        Ok(Response::new(api::HeartbeatResponse {}))
    }

    type RegisterNodeStream = UpdateStream<api::RegistrationUpdate>;

    async fn register_node(
        &self,
        request: Request<api::RegisterNodeRequest>,
    ) -> Result<Response<Self::RegisterNodeStream>, Status> {
        let key = self_signed_key(&request)?;
        let id = identity::node_id(&key);
        let r = request.into_inner();
        let address: IpAddr = r
            .address
            .parse()
            .map_err(|_| Status::invalid_argument("the node address is not an IP address"))?;
        let labels = proto::labels::apply(
            &Default::default(),
            &r.labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            &[],
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
        unlock::check_registration(&r.data_join_key, &r.data_cluster_half)?;
        let leadership = self.0.leadership().await?;
        // Whether the key registered already, from the snapshot once it holds every write
        // of this tenure (no etcd read), else from etcd. A record created meanwhile, or a
        // deletion (a tombstone), fails the creating transaction, which says which.
        let existing = match self.0.fresh_nodes(&leadership).await {
            Some(snapshot) => snapshot.nodes.get(&id).is_some(),
            None => records::load_node(&self.0.curator, &id)
                .await
                .map_err(status_from)?
                .is_some(),
        };
        // The ticket authorizes creating a record. A node that already registered this
        // key may repeat the call (a lost reply, a restart) even after the ticket was
        // rotated: it only learns its own state.
        if !existing {
            claims_indexed(&self.0, &leadership).await?;
        }
        let new_record = || Node {
            id: id.clone(),
            public_key: key.to_vec(),
            state: NodeState::New as i32,
            roles: None,
            address: address.to_string(),
            labels: labels.clone().into_iter().collect(),
            data_join_key: r.data_join_key.clone(),
            data_cluster_half: r.data_cluster_half.clone(),
            ..Default::default()
        };
        // A new key spends one use of its ticket in the transaction creating its record;
        // a key already registered (a retry, a restart) spends nothing and is not asked
        // for a live ticket: it only learns its own state.
        let created = if existing {
            None
        } else {
            tickets::register_new(&self.0, &leadership, &r.register_ticket, new_record()).await?
        };
        let node = match created {
            Some(node) => {
                tracing::info!(node = id, %address, "registered a new node; it waits for approval");
                node
            }
            // The record exists: the event only reads it. A record is never created
            // here, without its ticket and claims: one gone meanwhile was deleted
            // (records leave only that way).
            None => writes::modify_node(&self.0.curator, &leadership, &id, |current| {
                let node = current.ok_or_else(|| NodeUpdateError::Deleted(id.clone()))?;
                if node.public_key != key {
                    return Err(NodeUpdateError::KeyMismatch(id.clone()));
                }
                match crate::lifecycle::transition(Some(records::node_state(node)), Event::Register)
                {
                    Ok(Outcome::Unchanged) => Ok(None),
                    Ok(_) => Err(crate::error::CuratorError::Protocol(
                        "registering an existing record changes it",
                    )
                    .into()),
                    Err(source) => Err(NodeUpdateError::Transition {
                        id: id.clone(),
                        source,
                    }),
                }
            })
            .await
            .and_then(|n| n.ok_or_else(|| NodeUpdateError::Deleted(id.clone())))
            .map_err(|e| match e {
                NodeUpdateError::Transition {
                    source: TransitionError::Decommissioned(_),
                    ..
                } => Status::permission_denied(e.to_string()),
                other => node_update_status(other),
            })?,
        };
        let first = api::RegistrationUpdate {
            node_id: id.clone(),
            state: node.state,
        };
        // The answer starts with what was just written (at once: a record deleted before
        // the snapshot showed it would otherwise leave the caller waiting for good); the
        // snapshot may lag it by one watch event, and states only move forward, so older
        // states are not repeated.
        let floor = first.state;
        let stream = snapshot_stream_from(&self.0, None, Some(first), move |nodes| {
            let state = nodes.nodes.get(&id).map(|n| n.state)?;
            (state >= floor).then(|| api::RegistrationUpdate {
                node_id: id.clone(),
                state,
            })
        });
        Ok(Response::new(stream))
    }

    async fn commit_node(
        &self,
        request: Request<api::CommitNodeRequest>,
    ) -> Result<Response<api::CommitNodeResponse>, Status> {
        let key = self_signed_key(&request)?;
        let id = identity::node_id(&key);
        let leadership = self.0.leadership().await?;
        // Refuse before issuing anything; the guarded write below decides for real.
        // Decided on the record the certificate's recording is fenced by (one read).
        let admit = |node: Option<&Node>| {
            crate::lifecycle::transition(node.map(records::node_state), Event::Commit).map_err(
                |source| {
                    let code = match source {
                        TransitionError::Decommissioned(_) => tonic::Code::PermissionDenied,
                        _ => tonic::Code::FailedPrecondition,
                    };
                    Status::new(code, format!("node {id}: {source}"))
                },
            )?;
            let node = node.expect("the transition refuses a missing record");
            if node.public_key != key {
                return Err(Status::permission_denied(format!(
                    "node {id} is registered with a different key"
                )));
            }
            record_address(node)
        };
        let (certificate, ca_certificate) =
            issuance::commit_node_certificate(&self.0, &leadership, &id, &key, admit).await?;
        let node = writes::apply_event(
            &self.0.curator,
            &leadership,
            &id,
            Some(&key),
            Event::Commit,
            Node::default,
            self.0.known_record(&id),
        )
        .await
        .map_err(node_update_status)?;
        // The snapshot once it holds this tenure's writes (no range read of every record
        // per enrolment), else etcd.
        let curator_endpoints = match self.0.fresh_nodes(&leadership).await {
            Some(snapshot) => snapshot.curator_endpoints.clone(),
            None => records::curator_endpoints(
                &records::list_nodes(&self.0.curator)
                    .await
                    .map_err(status_from)?,
            ),
        };
        tracing::info!(node = id, "node committed: UP with its certificate");
        Ok(Response::new(api::CommitNodeResponse {
            node_certificate: certificate,
            ca_certificate,
            roles: records::role_names(&node),
            curator_endpoints,
        }))
    }

    type WatchNodeStream = UpdateStream<api::WatchNodeUpdate>;

    async fn watch_node(
        &self,
        request: Request<api::WatchNodeRequest>,
    ) -> Result<Response<Self::WatchNodeStream>, Status> {
        let rpc::Identity::Node { id, .. } = identity(&request) else {
            return Err(Status::permission_denied("only nodes watch their record"));
        };
        // Any curator answers from its own watched snapshot (it is not forwarded), as
        // long as that snapshot is live.
        if self.0.nodes_live.current() != Some(true) {
            return Err(Status::unavailable(
                "this curator's view of the cluster is not current; use another curator",
            ));
        }
        // The stream ends once the certificate it was opened with is revoked.
        let serial = request
            .extensions()
            .get::<rpc::server::ClientCertificate>()
            .and_then(|c| c.leaf())
            .and_then(|der| pki::certificate_serial(der).ok());
        let crl = self.0.crl.clone();
        let trusted = self.0.trusted_wire.clone();
        let peer_trusted = self.0.peer_trusted.clone();
        let seat = self.0.watchers.open(&id);
        let certificate = request
            .extensions()
            .get::<rpc::server::ClientCertificate>()
            .cloned();
        let stream = snapshot_stream(&self.0, serial, move |nodes| {
            let trusted = trusted.current();
            let member = nodes
                .nodes
                .get(&id)
                .and_then(|n| n.roles.as_ref())
                .is_some_and(|r| r.consensus_member.is_some());
            // Only members run an etcd that needs them.
            let etcd_peer_cas = match peer_trusted.current() {
                Some(p) if member => p.wire.clone(),
                _ => Vec::new(),
            };
            let node = nodes.nodes.get(&id)?;
            Some(NodeView(api::WatchNodeUpdate {
                record_revision: nodes
                    .record_revisions
                    .by_node
                    .get(&id)
                    .copied()
                    .unwrap_or_default(),
                record_etcd_cluster: nodes.record_revisions.etcd_cluster_id,
                state: node.state,
                roles: records::role_names(node),
                curator_endpoints: nodes.curator_endpoints.clone(),
                cluster_crl: crl.current().unwrap_or_default(),
                cluster_cas: trusted.as_ref().map(|t| t.cas.clone()).unwrap_or_default(),
                cluster_crls: trusted.as_ref().map(|t| t.crls.clone()).unwrap_or_default(),
                etcd_peer_cas,
            }))
        });
        Ok(Response::new(Box::pin(super::watchers::seated(
            rpc::server::ending_at_expiry(
                stream.map(|view| view.map(|NodeView(update)| update)),
                certificate.as_ref(),
            ),
            seat,
        ))))
    }

    async fn join_consensus(
        &self,
        request: Request<api::JoinConsensusRequest>,
    ) -> Result<Response<api::JoinConsensusResponse>, Status> {
        let rpc::Identity::Node { id, .. } = identity(&request) else {
            return Err(Status::permission_denied("only nodes join consensus"));
        };
        let leadership = self.0.leadership().await?;
        let answer = membership::join(&self.0, &leadership, &id).await?;
        Ok(Response::new(answer))
    }

    async fn renew_certificates(
        &self,
        request: Request<api::RenewCertificatesRequest>,
    ) -> Result<Response<api::RenewCertificatesResponse>, Status> {
        let rpc::Identity::Node { id, public_key } = identity(&request) else {
            return Err(Status::permission_denied(
                "only nodes renew their certificates, with their node certificate",
            ));
        };
        let peer = request.get_ref().peer;
        let _leadership = self.0.leadership().await?;
        let node = records::load_node(&self.0.curator, &id)
            .await
            .map_err(status_from)?
            .ok_or_else(|| Status::not_found(format!("node {id} has no record")))?;
        if node.state != NodeState::Up as i32 {
            return Err(Status::failed_precondition(format!(
                "node {id} is not UP; only UP nodes renew their certificates"
            )));
        }
        if node.public_key != public_key {
            return Err(Status::permission_denied(format!(
                "node {id} is registered with a different key"
            )));
        }
        let key = record_key(&node)?;
        let address = record_address(&node)?;
        let renewed = issuance::renew(&self.0, &node, &key, address, peer).await?;
        let (node_certificate, ca_certificate) = renewed.node;
        let (peer_certificate, peer_ca_certificate) = renewed.peer.unwrap_or_default();
        Ok(Response::new(api::RenewCertificatesResponse {
            node_certificate,
            ca_certificate,
            peer_certificate,
            peer_ca_certificate,
        }))
    }

    async fn reissue_node_certificate(
        &self,
        request: Request<api::ReissueNodeCertificateRequest>,
    ) -> Result<Response<api::RenewCertificatesResponse>, Status> {
        let key = self_signed_key(&request)?;
        let previous = request.into_inner().previous_certificate;
        super::reissue::node_certificate(&self.0, &key, &previous)
            .await
            .map(Response::new)
    }

    async fn issue_kubernetes_certificates(
        &self,
        request: Request<api::IssueKubernetesCertificatesRequest>,
    ) -> Result<Response<api::IssueKubernetesCertificatesResponse>, Status> {
        let rpc::Identity::Node { id, .. } = identity(&request) else {
            return Err(Status::permission_denied(
                "only nodes ask for their Kubernetes components' certificates",
            ));
        };
        let leadership = self.0.leadership().await?;
        let answer =
            super::kubernetes::issue_for_node(&self.0, &leadership, &id, request.into_inner())
                .await?;
        tracing::info!(
            node = id,
            certificates = answer.certificates.len(),
            "issued Kubernetes certificates"
        );
        Ok(Response::new(answer))
    }
}

#[cfg(test)]
mod node_view_tests {
    use super::*;

    #[test]
    fn a_status_names_few_well_formed_ca_fingerprints_or_is_refused() {
        let fp = "ab".repeat(32);
        let ok = NodeStatus {
            address: "127.0.0.2".into(),
            trusted_ca_fingerprints: vec![fp.clone(); rpc::tls::MAX_TRUSTED_CAS],
            certificate_ca_fingerprint: fp.clone(),
            ..Default::default()
        };
        assert!(check_status(&ok).is_ok());
        let too_many = NodeStatus {
            trusted_ca_fingerprints: vec![fp.clone(); rpc::tls::MAX_TRUSTED_CAS + 1],
            ..ok.clone()
        };
        assert!(check_status(&too_many).is_err());
        let service = proto::state::ServiceState {
            name: "kube-apiserver".into(),
            last_error: "x".repeat(256),
            ..Default::default()
        };
        let services = NodeStatus {
            services: vec![service.clone(); MAX_SERVICES],
            ..ok.clone()
        };
        assert!(check_status(&services).is_ok());
        for bad in [
            vec![service.clone(); MAX_SERVICES + 1],
            vec![proto::state::ServiceState {
                last_error: "x".repeat(257),
                ..service.clone()
            }],
            vec![proto::state::ServiceState::default()],
        ] {
            let refused = NodeStatus {
                services: bad,
                ..ok.clone()
            };
            assert!(check_status(&refused).is_err());
        }
        let long = NodeStatus {
            trusted_ca_fingerprints: vec!["a".repeat(10_000)],
            ..ok.clone()
        };
        assert!(check_status(&long).is_err());
        let junk_issuer = NodeStatus {
            certificate_ca_fingerprint: "zz".repeat(32),
            ..ok.clone()
        };
        assert!(check_status(&junk_issuer).is_err());
        // The same bounds for what a member's etcd loaded and presents.
        let peer = NodeStatus {
            etcd_loaded_peer_ca_fingerprints: vec![fp.clone(); rpc::tls::MAX_TRUSTED_CAS],
            etcd_peer_certificate_ca_fingerprint: fp.clone(),
            ..ok.clone()
        };
        assert!(check_status(&peer).is_ok());
        for bad in [
            NodeStatus {
                etcd_loaded_peer_ca_fingerprints: vec![fp.clone(); rpc::tls::MAX_TRUSTED_CAS + 1],
                ..peer.clone()
            },
            NodeStatus {
                etcd_loaded_peer_ca_fingerprints: vec!["a".repeat(10_000)],
                ..peer.clone()
            },
            NodeStatus {
                etcd_peer_certificate_ca_fingerprint: "zz".repeat(32),
                ..peer.clone()
            },
        ] {
            assert!(check_status(&bad).is_err(), "{bad:?}");
        }
        let none_yet = NodeStatus {
            trusted_ca_fingerprints: vec![],
            certificate_ca_fingerprint: String::new(),
            ..ok
        };
        assert!(check_status(&none_yet).is_ok());
    }

    #[test]
    fn an_update_that_only_moves_the_revision_is_not_sent_again() {
        let update = api::WatchNodeUpdate {
            record_revision: 10,
            record_etcd_cluster: 7,
            state: api::NodeState::Up as i32,
            roles: vec!["ConsensusMember".into()],
            curator_endpoints: vec!["127.0.0.2:7835".into()],
            cluster_crl: vec![1, 2, 3].into(),
            cluster_cas: vec![vec![4].into()],
            cluster_crls: vec![vec![1, 2, 3].into()],
            etcd_peer_cas: vec![vec![6].into()],
        };
        let moved = api::WatchNodeUpdate {
            record_revision: 11,
            ..update.clone()
        };
        assert!(NodeView(update.clone()) == NodeView(moved));
        let changed = [
            api::WatchNodeUpdate {
                roles: vec![],
                ..update.clone()
            },
            api::WatchNodeUpdate {
                state: api::NodeState::Decommissioning as i32,
                ..update.clone()
            },
            api::WatchNodeUpdate {
                record_etcd_cluster: 8,
                ..update.clone()
            },
            api::WatchNodeUpdate {
                curator_endpoints: vec![],
                ..update.clone()
            },
            api::WatchNodeUpdate {
                cluster_crl: vec![9].into(),
                ..update.clone()
            },
            api::WatchNodeUpdate {
                cluster_cas: vec![vec![4].into(), vec![5].into()],
                ..update.clone()
            },
            api::WatchNodeUpdate {
                cluster_crls: vec![vec![9].into()],
                ..update.clone()
            },
            api::WatchNodeUpdate {
                etcd_peer_cas: vec![vec![6].into(), vec![7].into()],
                ..update.clone()
            },
        ];
        for other in changed {
            assert!(
                NodeView(update.clone()) != NodeView(other.clone()),
                "{other:?}"
            );
        }
    }
}
