//! Whether this curator's own etcd member has a leader (the `quorum` runnable), and the
//! layer that answers Unavailable at once while it has none.
//!
//! ```text
//!   quorum runnable: etcd Status of the local member every POLL (bounded by
//!   STATUS_BOUND; a member-local call, answered without quorum) ─▶ Shared::etcd_leader
//!   (false: the member names no leader, or did not answer twice in a row)
//!   QuorumLayer (outside ForwardLayer): etcd_leader false ─▶ Unavailable(NO_LEADER) now;
//!     a call in progress when it turns false ─▶ Unavailable(NO_LEADER) then
//!     (QUORUM_FREE methods pass: they are answered from the local member alone)
//! ```
//! A member cut off from the others loses its leader within about one election timeout
//! (a follower's pre-vote campaign, or a leader's check-quorum step-down, clears it), so
//! a cut-off curator refuses calls within about a second instead of letting them wait
//! out the 10 s etcd request bound — well within the curator lease TTL: a caller that
//! knows other curators tries them next (`rpc::CuratorClient`).
//!
//! A runnable and a layer: imports only `shared` of the service layer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::http;

use super::shared::Shared;

/// How often the local member's leader is looked at.
const POLL: Duration = Duration::from_millis(200);
/// Bound on one look: a member that does not answer its Status this fast counts as
/// having no leader.
const STATUS_BOUND: Duration = Duration::from_millis(700);

/// Why a curator without quorum refuses a call.
pub const NO_LEADER: &str = "this curator's etcd member has no leader (it cannot reach a quorum \
                             of the etcd members); ask another curator";

/// Methods answered from the local etcd member or the node's own files alone, with or
/// without a leader: status, the CA, local maintenance, and every backup and snapshot
/// call — a backup without quorum (of this member's state, marked so) and the scheduled
/// snapshots are exactly what recovery from a lost majority needs.
const QUORUM_FREE: &[&str] = &[
    "/polis.api.CuratorLocal/GetConsensusStatus",
    "/polis.api.CuratorLocal/GetCACertificate",
    "/polis.api.CuratorLocal/DefragmentMember",
    "/polis.api.CuratorLocal/SnapshotsListLocal",
    "/polis.api.CuratorLocal/SnapshotsFetchLocal",
    "/polis.api.Backup/TakeBackup",
    "/polis.api.Backup/ListSnapshots",
    "/polis.api.Backup/FetchSnapshot",
];

/// The `quorum` runnable: keeps `shared.etcd_leader` current, logging each change once.
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    let mut client = shared.curator.client();
    ctx.signal_healthy();
    let mut silent = 0;
    loop {
        // "No leader" when the member says so, or when it did not answer twice in a
        // row (one slow answer on a loaded host is no evidence).
        let leader = match tokio::time::timeout(STATUS_BOUND, client.status()).await {
            Ok(Ok(status)) => {
                silent = 0;
                status.leader() != 0
            }
            Ok(Err(_)) | Err(_) => {
                silent += 1;
                silent < 2 && shared.etcd_leader.current() != Some(false)
            }
        };
        let was = shared.etcd_leader.current();
        if shared
            .etcd_leader
            .update(|c| (c != Some(&leader)).then_some(leader))
        {
            if leader && was.is_some() {
                tracing::info!("this curator's etcd member has a leader again: serving");
            } else if !leader {
                tracing::warn!("{NO_LEADER}: refusing calls that need the cluster");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

/// Tower layer (between the AuthLayer and the ForwardLayer): see the module.
#[derive(Clone)]
pub(super) struct QuorumLayer {
    leader: event::Value<bool>,
}

impl QuorumLayer {
    pub(super) fn new(leader: event::Value<bool>) -> QuorumLayer {
        QuorumLayer { leader }
    }
}

impl<S> tower::Layer<S> for QuorumLayer {
    type Service = QuorumService<S>;
    fn layer(&self, inner: S) -> QuorumService<S> {
        QuorumService {
            inner,
            leader: self.leader.clone(),
        }
    }
}

#[derive(Clone)]
pub(super) struct QuorumService<S> {
    inner: S,
    leader: event::Value<bool>,
}

fn refusal() -> http::Response<tonic::body::Body> {
    tonic::Status::unavailable(NO_LEADER).into_http()
}

impl<S, ReqBody> tower::Service<http::Request<ReqBody>> for QuorumService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send,
    ReqBody: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let quorum_free = QUORUM_FREE.contains(&request.uri().path());
        let leader = self.leader.clone();
        Box::pin(async move {
            if quorum_free {
                return inner.call(request).await;
            }
            if leader.current() == Some(false) {
                return Ok(refusal());
            }
            let mut watch = leader.watch();
            let lost = async move {
                if watch.get_matching(|l| !*l).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                answered = inner.call(request) => answered,
                () = lost => Ok(refusal()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    type Request = http::Request<()>;

    type Answer = Result<http::Response<tonic::body::Body>, Infallible>;
    type Answering = Pin<Box<dyn Future<Output = Answer> + Send>>;

    /// An inner service that answers only once `release` is notified.
    fn service(
        release: Arc<tokio::sync::Notify>,
    ) -> impl tower::Service<
        Request,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future = Answering,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(move |_: Request| {
            let release = release.clone();
            Box::pin(async move {
                release.notified().await;
                Ok::<_, Infallible>(http::Response::new(tonic::body::Body::empty()))
            }) as Answering
        })
    }

    fn request(path: &str) -> Request {
        http::Request::builder().uri(path).body(()).unwrap()
    }

    fn refused(response: &http::Response<tonic::body::Body>) -> bool {
        tonic::Status::from_header_map(response.headers())
            .is_some_and(|s| s.code() == tonic::Code::Unavailable && s.message() == NO_LEADER)
    }

    #[test]
    fn every_quorum_free_method_exists() {
        for method in QUORUM_FREE {
            assert!(
                rpc::authz::METHODS.iter().any(|(m, _)| m == method),
                "{method} is no method of the API"
            );
        }
    }

    #[tokio::test]
    async fn without_a_leader_calls_are_refused_at_once_or_when_it_goes() {
        use tower::{Layer, ServiceExt};
        let leader = event::Value::new();
        let release = Arc::new(tokio::sync::Notify::new());
        let layer = QuorumLayer::new(leader.clone());
        let svc = layer.layer(service(release.clone()));

        // Unknown yet (just started): served.
        let call = tokio::spawn(
            svc.clone()
                .oneshot(request("/polis.api.Management/ListNodes")),
        );
        tokio::task::yield_now().await;
        release.notify_one();
        assert!(!refused(&call.await.unwrap().unwrap()));

        // No leader: refused without reaching the service; quorum-free calls pass.
        leader.set(false);
        let response = svc
            .clone()
            .oneshot(request("/polis.api.Management/ListNodes"))
            .await
            .unwrap();
        assert!(refused(&response));
        let free = tokio::spawn(
            svc.clone()
                .oneshot(request("/polis.api.CuratorLocal/GetConsensusStatus")),
        );
        tokio::task::yield_now().await;
        release.notify_one();
        assert!(!refused(&free.await.unwrap().unwrap()));

        // A call waiting when the leader goes is answered then.
        leader.set(true);
        let waiting = tokio::spawn(svc.clone().oneshot(request("/polis.api.Curator/Heartbeat")));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        leader.set(false);
        let response = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting call was not cut")
            .unwrap()
            .unwrap();
        assert!(refused(&response));
    }
}
