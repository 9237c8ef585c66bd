//! The curator's listener: TLS connections, the authorization layer and every service.

use std::sync::Arc;
use std::time::Duration;

use proto::api;

use std::net::SocketAddr;

use super::shared::{Services, Shared};
use crate::election::{self, Role};

/// Longest time one RPC may take (streams: until their response headers).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long stopping waits for open connections to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Forwarded calls that may stay open for minutes: a registration waiting for the
/// owner's approval, a followed audit log. Each goes over a connection of its own, so
/// that however many are open, they never take the streams of the shared connection
/// the unary calls (heartbeats above all) are forwarded on (one HTTP/2 connection
/// carries at most the leader's stream limit, `rpc::server::MAX_CONCURRENT_STREAMS`).
const LONG_LIVED_FORWARDED: [&str; 2] = [
    "/polis.api.Curator/RegisterNode",
    "/polis.api.Audit/AuditLog",
];

/// The forwarding decision: a follower sends every call but CuratorLocal and Backup
/// (which any curator answers from its own etcd member) to the leader with this node's
/// certificate: unary calls over one cached channel (the current certificate: a channel
/// made with one renewed since is replaced), long-lived ones each over its own.
fn forwarding(shared: Arc<Shared>) -> rpc::Forwarding {
    // The leader's endpoint, the channel, and the credential generation it was made with:
    // after a renewal the next forward connects with the new certificate.
    type Cached = Option<(SocketAddr, tonic::transport::Channel, u64)>;
    let cached: Arc<std::sync::Mutex<Cached>> = Arc::default();
    Arc::new(move |method: &str| {
        let (shared, cached) = (shared.clone(), cached.clone());
        // Answered from this curator's own etcd member: CuratorLocal, and the long-lived
        // WatchNode streams (which would otherwise pile up on one forwarding connection).
        let local = method.starts_with("/polis.api.CuratorLocal/")
            || method == "/polis.api.Curator/WatchNode"
            // A backup is a snapshot of this curator's own etcd member.
            || method.starts_with("/polis.api.Backup/");
        let long_lived = LONG_LIVED_FORWARDED.contains(&method);
        // Decided before the forwarding future exists: that future (a connect inside) is
        // several KiB, too much to allocate for every call the leader answers itself.
        if local || matches!(shared.role.current(), Some(Role::Leader(_))) {
            return Box::pin(std::future::ready(None));
        }
        Box::pin(async move {
            let leader = election::current_leader(&shared.curator).await.ok()??;
            let endpoint: SocketAddr = leader.endpoint.parse().ok()?;
            if endpoint == shared.config.listen {
                // Elected but not yet acting as leader: answer here (Unavailable, retry).
                return None;
            }
            // A failed forward drops the cached channel: the next call connects anew.
            let forget = {
                let cached = cached.clone();
                Box::new(move || {
                    let mut c = cached.lock().expect("forwarding cache lock");
                    if c.as_ref().is_some_and(|(at, _, _)| *at == endpoint) {
                        *c = None;
                    }
                }) as Box<dyn FnOnce() + Send>
            };
            let generation = shared.config.credentials.generation();
            let hit = (!long_lived)
                .then(|| {
                    cached
                        .lock()
                        .expect("forwarding cache lock")
                        .as_ref()
                        .filter(|(at, _, made_with)| *at == endpoint && *made_with == generation)
                        .map(|(_, channel, _)| channel.clone())
                })
                .flatten();
            let channel = match hit {
                Some(channel) => channel,
                // Connected without holding the cache: a slow leader delays only this call.
                None => match rpc::connect_with(
                    endpoint,
                    &shared.server_trust(),
                    Some(&shared.config.credentials),
                )
                .await
                {
                    Ok(channel) => {
                        if !long_lived {
                            *cached.lock().expect("forwarding cache lock") =
                                Some((endpoint, channel.clone(), generation));
                        }
                        channel
                    }
                    Err(e) => {
                        tracing::warn!(%endpoint, "cannot reach the curator leader to forward: {e}");
                        return None;
                    }
                },
            };
            metrics::global().forwarded_calls.inc();
            Some(rpc::forward::Forward {
                channel,
                // A long-lived call's own connection closes when the call ends (its last
                // handle drops); nothing is cached to forget.
                on_failure: if long_lived { Box::new(|| {}) } else { forget },
            })
        })
    })
}

pub(super) async fn serve(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
    served: rpc::CredentialSlot,
) -> supervisor::RunnableResult {
    let config = &shared.config;
    // Serves the curator certificate (`curator_certificate`), whatever the slot holds
    // at each handshake: renewals apply live.
    let tls = rpc::tls::server_config_from(&served)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("listening on {}: {e}", config.listen))?;
    let trust = super::crl::source(&shared);
    let audit_sink = super::audit_writer::sink(shared.clone());
    let forwarders_shared = shared.clone();
    let auth = rpc::AuthLayer::new(Arc::new(rpc::Authenticator::new()), trust)
        .with_forwarders(Arc::new(move |id: &str| {
            forwarders_shared.is_curator_node(id)
        }))
        .with_denials(super::audit_writer::denials(audit_sink.clone()));
    let forward = rpc::ForwardLayer::new(forwarding(shared.clone()));
    // Inside forwarding: a read served here as leader leaves only once etcd confirms,
    // after it was answered, that this curator still leads.
    let confirm = super::confirm::ConfirmLayer::new(shared.clone());
    // Before forwarding (whose leader lookup reads etcd): no leader, no wait.
    let quorum = super::quorum::QuorumLayer::new(shared.etcd_leader.clone());
    // Innermost: sees exactly the calls handled here, with their verified caller.
    let audit = rpc::server::AuditLayer::new(audit_sink, &shared.config.node_id);
    // The epoch of this member's data cannot change while it serves (a member that
    // sees a newer one stops, `node::member::superseded`): read once, named on every answer.
    let chain = crate::epochs::chain(&shared.curator, true)
        .await
        .map_err(|e| format!("reading the cluster's epochs: {e}"))?;
    let epoch = rpc::epoch::EpochLayer::new(proto::epoch::latest(&chain));
    // Signed by the CA that signs (clients keep only a verified newer epoch); stopped
    // with this listener.
    let signed_by = super::epoch_signer::sign_first(&shared, &epoch).await;
    let signer_stop = ctx.cancellation_token().child_token();
    let _signer_guard = signer_stop.clone().drop_guard();
    tokio::spawn(tracing::Instrument::instrument(
        super::epoch_signer::run(shared.clone(), epoch.clone(), signed_by, signer_stop),
        tracing::Span::current(),
    ));
    let services = Services(shared.clone());
    tracing::info!(listen = %config.listen, "curator serving");
    ctx.signal_healthy();
    config.serving.set(true);
    let _not_serving = NotServing(config.serving.clone());
    let cancel = ctx.cancellation_token();
    // tonic runs connections and requests in tasks of its own: give them our span.
    let span = tracing::Span::current();
    // Outermost: every call is counted, denied and forwarded ones too; labelled by
    // method only for the methods in the permission table (every one served), so
    // that junk paths cannot add series.
    let rpc_metrics = metrics::enabled().then(|| {
        metrics::RpcLayer::new(
            metrics::global(),
            rpc::authz::METHODS.iter().map(|(path, _)| *path),
        )
    });
    let server = rpc::server::builder()
        .timeout(REQUEST_TIMEOUT)
        .trace_fn(move |_| span.clone())
        .layer(tower::util::option_layer(rpc_metrics))
        .layer(epoch)
        .layer(rpc::server::RateLayer::new(config.entry_rate))
        .layer(auth)
        .layer(quorum)
        .layer(forward)
        .layer(confirm)
        .layer(audit)
        .add_service(api::curator_local_server::CuratorLocalServer::new(
            services.clone(),
        ))
        .add_service(api::aaa_server::AaaServer::new(services.clone()))
        .add_service(api::management_server::ManagementServer::new(
            services.clone(),
        ))
        .add_service(api::curator_server::CuratorServer::new(services.clone()))
        .add_service(api::backup_server::BackupServer::new(services.clone()))
        .add_service(api::data_unlock_server::DataUnlockServer::new(
            services.clone(),
        ))
        .add_service(api::audit_server::AuditServer::new(services))
        .serve_with_incoming_shutdown(
            rpc::incoming(listener, tls, rpc::Port::Curator),
            cancel.clone().cancelled_owned(),
        );
    // A graceful shutdown waits for open connections; a client that never finishes its
    // request (or holds a stream) must not keep the node from stopping.
    let drain_deadline = async {
        cancel.cancelled().await;
        tokio::time::sleep(DRAIN_TIMEOUT).await;
    };
    tokio::select! {
        served = server => served?,
        _ = drain_deadline => tracing::warn!(
            "connections still open {DRAIN_TIMEOUT:?} after shutdown began; closing them"
        ),
    }
    Ok(())
}

/// Marks the listener as no longer serving when it ends, however it ends.
struct NotServing(event::Value<bool>);

impl Drop for NotServing {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
