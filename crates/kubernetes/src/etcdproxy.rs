//! The apiserver's only way into etcd: a gRPC server on a unix socket of polis-node
//! that speaks etcd's API, moves every key under `namespace::PREFIX` and passes the
//! request on to the local etcd member; the answer's keys are moved back.
//!
//! ```text
//!   kube-apiserver ──unix socket (0600, in a 0700 dir)──▶ EtcdProxy ──unix──▶ etcd
//!     KV Range/Put/DeleteRange/Txn      keys rewritten (namespace)
//!     Watch                              keys rewritten, events outside dropped
//!     Lease Grant                        remembered (bounded)
//!     Lease Revoke/KeepAlive/TimeToLive  only leases it granted, or whose keys are
//!                                        all inside the prefix
//!     Maintenance Status                 passed on (sizes, version, leader)
//!     everything else                    refused: Compact (Polis's upkeep compacts),
//!                                        Snapshot, Defragment, Alarm, Hash, MoveLeader,
//!                                        Downgrade, Lease Leases; Cluster and Auth are
//!                                        not served at all
//! ```
//! Invariant: no request that passes through can name a key outside the prefix, and no
//! answer shows one. The socket's permissions are the credential: the apiserver is given
//! this socket, never the etcd member's.

use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::proto::*;
use futures_util::{Stream, StreamExt};
use http::uri::PathAndQuery;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::namespace;

/// How many leases granted through the proxy it keeps track of at once (the apiserver
/// reuses one lease per minute or so for events; a runaway client stops here).
pub const MAX_LEASES: usize = 10_000;

/// The largest message either way: a LIST of many objects exceeds tonic's 4 MiB default
/// (etcd itself sends up to 2 GiB; requests are bounded by etcd at 1.5 MiB).
const MAX_MESSAGE: usize = 256 << 20;

/// etcd's require-leader metadata key: passed on, so that a watch through the proxy
/// learns that a partitioned member lost its leader, as a direct one would.
const REQUIRE_LEADER: &str = "hasleader";

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("connecting to the local etcd member at {path}: {source}")]
    Connect {
        path: String,
        source: tonic::transport::Error,
    },
    #[error("listening on {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
    #[error("serving the etcd proxy: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// The proxy: an upstream channel to etcd and the leases granted through it.
#[derive(Clone)]
pub struct EtcdProxy {
    upstream: Channel,
    leases: Arc<Mutex<HashMap<i64, Instant>>>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn refused(what: &str) -> Status {
    Status::permission_denied(format!(
        "{what} is not available through Polis's etcd proxy for Kubernetes (keys under {} only)",
        String::from_utf8_lossy(namespace::PREFIX)
    ))
}

/// A request for upstream carrying the downstream's require-leader flag.
fn onward<T, U>(from: &Request<T>, message: U) -> Request<U> {
    let mut request = Request::new(message);
    if let Some(v) = from.metadata().get(REQUIRE_LEADER) {
        request.metadata_mut().insert(REQUIRE_LEADER, v.clone());
    }
    request
}

impl EtcdProxy {
    /// A proxy to the etcd member listening on the unix socket `etcd_socket`.
    pub async fn connect(etcd_socket: &Path) -> Result<Self, ProxyError> {
        let path = etcd_socket.display().to_string();
        let upstream = tonic::transport::Endpoint::from_shared(format!("unix://{path}"))
            .map_err(|source| ProxyError::Connect {
                path: path.clone(),
                source,
            })?
            .connect_timeout(Duration::from_secs(2))
            .connect_lazy();
        Ok(EtcdProxy {
            upstream,
            leases: Default::default(),
        })
    }

    /// Serves the proxy on the unix socket `socket` (replaced if present; 0600) until
    /// `shutdown` completes.
    pub async fn serve(
        self,
        socket: &Path,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), ProxyError> {
        let path = socket.display().to_string();
        let listen_error = |source| ProxyError::Listen {
            path: path.clone(),
            source,
        };
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(listen_error(e)),
        }
        let listener = tokio::net::UnixListener::bind(socket).map_err(listen_error)?;
        std::fs::set_permissions(
            socket,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
        )
        .map_err(listen_error)?;
        tonic::transport::Server::builder()
            .add_service(
                PbKvServer::new(self.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .add_service(
                PbWatchServer::new(self.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .add_service(PbLeaseServer::new(self.clone()))
            .add_service(PbMaintenanceServer::new(self))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
            .await?;
        Ok(())
    }

    async fn unary<Q, A>(&self, path: &'static str, request: Request<Q>) -> Result<A, Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.upstream.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("the local etcd member: {e}")))?;
        let answer = grpc
            .unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::default(),
            )
            .await?;
        Ok(answer.into_inner())
    }

    async fn streaming<Q, A>(
        &self,
        path: &'static str,
        request: Request<BoxStream<Q>>,
    ) -> Result<Streaming<A>, Status>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.upstream.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("the local etcd member: {e}")))?;
        // The downstream's stream ends at its first error (a client gone).
        let request = request.map(|s| {
            s.take_while(|r| futures_util::future::ready(r.is_ok()))
                .filter_map(|r| futures_util::future::ready(r.ok()))
        });
        Ok(grpc
            .streaming(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::default(),
            )
            .await?
            .into_inner())
    }

    /// Whether lease `id` is the apiserver's: granted through here and not yet expired,
    /// or holding keys, every one inside the prefix.
    async fn owns_lease(&self, from: &Request<impl Sized>, id: i64) -> Result<bool, Status> {
        if self
            .leases
            .lock()
            .expect("lease table")
            .get(&id)
            .is_some_and(|until| *until > Instant::now())
        {
            return Ok(true);
        }
        let answer: PbLeaseTimeToLiveResponse = self
            .unary(
                "/etcdserverpb.Lease/LeaseTimeToLive",
                onward(from, PbLeaseTimeToLiveRequest { id, keys: true }),
            )
            .await?;
        Ok(!answer.keys.is_empty() && namespace::all_inside(&answer.keys))
    }

    fn remember_lease(&self, id: i64, ttl: i64) -> Result<(), Status> {
        let mut leases = self.leases.lock().expect("lease table");
        let now = Instant::now();
        leases.retain(|_, until| *until > now);
        if leases.len() >= MAX_LEASES {
            return Err(Status::resource_exhausted(format!(
                "more than {MAX_LEASES} live leases granted through Polis's etcd proxy"
            )));
        }
        // A keep-alive can extend it; the slack covers one period of it.
        let ttl = Duration::from_secs(ttl.max(1) as u64 * 2 + 60);
        leases.insert(id, now + ttl);
        Ok(())
    }
}

#[tonic::async_trait]
impl PbKvService for EtcdProxy {
    type RangeStreamStream = BoxStream<PbRangeStreamResponse>;

    async fn range_stream(
        &self,
        _r: Request<PbRangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        // etcd 3.4 has no RangeStream: answered as etcd 3.4's gRPC server answers an
        // unknown method (Unimplemented), which the apiserver reads as "fall back to
        // paginated lists". Any other code fails its lists.
        Err(Status::unimplemented(
            "unknown method RangeStream for service etcdserverpb.KV",
        ))
    }

    async fn range(&self, r: Request<PbRangeRequest>) -> Result<Response<PbRangeResponse>, Status> {
        let message = namespace::range_request(r.get_ref().clone());
        let answer = self
            .unary("/etcdserverpb.KV/Range", onward(&r, message))
            .await?;
        Ok(Response::new(namespace::range_response(answer)))
    }

    async fn put(&self, r: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        let message = namespace::put_request(r.get_ref().clone());
        let answer = self
            .unary("/etcdserverpb.KV/Put", onward(&r, message))
            .await?;
        Ok(Response::new(namespace::put_response(answer)))
    }

    async fn delete_range(
        &self,
        r: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        let message = namespace::delete_request(r.get_ref().clone());
        let answer = self
            .unary("/etcdserverpb.KV/DeleteRange", onward(&r, message))
            .await?;
        Ok(Response::new(namespace::delete_response(answer)))
    }

    async fn txn(&self, r: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        let message = namespace::txn_request(r.get_ref().clone());
        let answer = self
            .unary("/etcdserverpb.KV/Txn", onward(&r, message))
            .await?;
        Ok(Response::new(namespace::txn_response(answer)))
    }

    async fn compact(
        &self,
        _r: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        // One owner of compaction: Polis's etcd upkeep (the apiserver runs with
        // --etcd-compaction-interval=0).
        Err(refused("Compact"))
    }
}

#[tonic::async_trait]
impl PbWatchService for EtcdProxy {
    type WatchStream = BoxStream<PbWatchResponse>;

    async fn watch(
        &self,
        r: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let leader = r.metadata().get(REQUIRE_LEADER).cloned();
        let requests = r.into_inner().map(|request| {
            request.map(|mut w| {
                if let Some(PbWatchRequestUnion::CreateRequest(c)) = &mut w.request_union {
                    (c.key, c.range_end) = namespace::range_in(&c.key, &c.range_end);
                }
                w
            })
        });
        let mut upstream = Request::new(Box::pin(requests) as BoxStream<PbWatchRequest>);
        if let Some(v) = leader {
            upstream.metadata_mut().insert(REQUIRE_LEADER, v);
        }
        let answers: Streaming<PbWatchResponse> = self
            .streaming("/etcdserverpb.Watch/Watch", upstream)
            .await?;
        let answers = answers.map(|answer| {
            answer.map(|mut w| {
                w.events = std::mem::take(&mut w.events)
                    .into_iter()
                    .filter_map(namespace::event_out)
                    .collect();
                w
            })
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

#[tonic::async_trait]
impl PbLeaseService for EtcdProxy {
    type LeaseKeepAliveStream = BoxStream<PbLeaseKeepAliveResponse>;

    async fn lease_grant(
        &self,
        r: Request<PbLeaseGrantRequest>,
    ) -> Result<Response<PbLeaseGrantResponse>, Status> {
        let message = *r.get_ref();
        let answer: PbLeaseGrantResponse = self
            .unary("/etcdserverpb.Lease/LeaseGrant", onward(&r, message))
            .await?;
        self.remember_lease(answer.id, answer.ttl)?;
        Ok(Response::new(answer))
    }

    async fn lease_revoke(
        &self,
        r: Request<PbLeaseRevokeRequest>,
    ) -> Result<Response<PbLeaseRevokeResponse>, Status> {
        if !self.owns_lease(&r, r.get_ref().id).await? {
            return Err(refused("a lease the apiserver did not grant"));
        }
        let message = *r.get_ref();
        let answer = self
            .unary("/etcdserverpb.Lease/LeaseRevoke", onward(&r, message))
            .await?;
        self.leases
            .lock()
            .expect("lease table")
            .remove(&r.get_ref().id);
        Ok(Response::new(answer))
    }

    async fn lease_keep_alive(
        &self,
        r: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let leader = r.metadata().get(REQUIRE_LEADER).cloned();
        let proxy = self.clone();
        let probe = Request::new(());
        let mut downstream = r.into_inner();
        // Each keep-alive is checked before it goes on; a stranger's lease ends the stream.
        let (tx, rx) = tokio::sync::mpsc::channel::<PbLeaseKeepAliveRequest>(16);
        let (err_tx, mut err_rx) = tokio::sync::mpsc::channel::<Status>(1);
        tokio::spawn(async move {
            while let Some(Ok(request)) = downstream.next().await {
                match proxy.owns_lease(&probe, request.id).await {
                    Ok(true) => {
                        if tx.send(request).await.is_err() {
                            return;
                        }
                    }
                    Ok(false) => {
                        let _ = err_tx
                            .send(refused("a lease the apiserver did not grant"))
                            .await;
                        return;
                    }
                    Err(status) => {
                        let _ = err_tx.send(status).await;
                        return;
                    }
                }
            }
        });
        let requests = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok);
        let mut upstream = Request::new(Box::pin(requests) as BoxStream<PbLeaseKeepAliveRequest>);
        if let Some(v) = leader {
            upstream.metadata_mut().insert(REQUIRE_LEADER, v);
        }
        let answers: Streaming<PbLeaseKeepAliveResponse> = self
            .streaming("/etcdserverpb.Lease/LeaseKeepAlive", upstream)
            .await?;
        // A refusal ends the stream with its status (the server stops at the first error).
        let refusals = futures_util::stream::poll_fn(move |cx| err_rx.poll_recv(cx)).map(Err);
        Ok(Response::new(Box::pin(futures_util::stream::select(
            answers, refusals,
        ))))
    }

    async fn lease_time_to_live(
        &self,
        r: Request<PbLeaseTimeToLiveRequest>,
    ) -> Result<Response<PbLeaseTimeToLiveResponse>, Status> {
        if !self.owns_lease(&r, r.get_ref().id).await? {
            return Err(refused("a lease the apiserver did not grant"));
        }
        let message = *r.get_ref();
        let mut answer: PbLeaseTimeToLiveResponse = self
            .unary("/etcdserverpb.Lease/LeaseTimeToLive", onward(&r, message))
            .await?;
        answer.keys = answer
            .keys
            .iter()
            .filter_map(|k| namespace::key_out(k))
            .collect();
        Ok(Response::new(answer))
    }

    async fn lease_leases(
        &self,
        _r: Request<PbLeaseLeasesRequest>,
    ) -> Result<Response<PbLeaseLeasesResponse>, Status> {
        Err(refused("Leases (every lease of the cluster)"))
    }
}

#[tonic::async_trait]
impl PbMaintenanceService for EtcdProxy {
    type SnapshotStream = BoxStream<PbSnapshotResponse>;

    async fn alarm(
        &self,
        _r: Request<PbAlarmRequest>,
    ) -> Result<Response<PbAlarmResponse>, Status> {
        Err(refused("Alarm"))
    }

    async fn status(
        &self,
        r: Request<PbStatusRequest>,
    ) -> Result<Response<PbStatusResponse>, Status> {
        let message = *r.get_ref();
        let answer = self
            .unary("/etcdserverpb.Maintenance/Status", onward(&r, message))
            .await?;
        Ok(Response::new(answer))
    }

    async fn defragment(
        &self,
        _r: Request<PbDefragmentRequest>,
    ) -> Result<Response<PbDefragmentResponse>, Status> {
        Err(refused("Defragment"))
    }

    async fn hash(&self, _r: Request<PbHashRequest>) -> Result<Response<PbHashResponse>, Status> {
        Err(refused("Hash"))
    }

    async fn hash_kv(
        &self,
        _r: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        Err(refused("HashKV"))
    }

    async fn snapshot(
        &self,
        _r: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(refused(
            "Snapshot (the whole key space, Polis's CA keys included)",
        ))
    }

    async fn move_leader(
        &self,
        _r: Request<PbMoveLeaderRequest>,
    ) -> Result<Response<PbMoveLeaderResponse>, Status> {
        Err(refused("MoveLeader"))
    }

    async fn downgrade(
        &self,
        _r: Request<PbDowngradeRequest>,
    ) -> Result<Response<PbDowngradeResponse>, Status> {
        Err(refused("Downgrade"))
    }
}
