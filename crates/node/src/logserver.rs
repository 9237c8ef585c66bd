//! The `root.role.logs` runnable: once the node is Home, serves this node's own log lines (NodeLogs) over mTLS
//! on `<address>:7836` (`rpc::NODE_LOGS_PORT`), with the node certificate, to owner
//! certificates only (the rpc permission table; CA, validity, CRL and kind checked by
//! `rpc::AuthLayer` as on the curator).
//!
//! ```text
//!   hub (logcapture) ──last N──▶ stream
//!        └─ follow: read_from(cursor, 256) ─▶ mpsc(16) ─▶ client; nothing new: wait
//!           for the hub's wake-up; fell behind the ring: a "N lines dropped" marker
//! ```
//! Memory per reader is bounded (a batch and the channel) whatever the rate of lines;
//! a slow reader loses lines, never holds them.
//! May not change anything: it only reads the hub.

use std::pin::Pin;
use std::sync::Arc;

use proto::api::{self, NodeLogLine};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::cluster_state::ClusterState;
use crate::logcapture::hub;
use crate::logring::{LineFilter, LogLine};
use crate::settings::Settings;
use crate::storage::read_file;
use crate::values::NodeValues;

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

struct Logs;

type LineStream = Pin<Box<dyn Stream<Item = Result<NodeLogLine, Status>> + Send>>;

#[tonic::async_trait]
impl api::node_logs_server::NodeLogs for Logs {
    type NodeLogsTailStream = LineStream;

    async fn node_logs_tail(
        &self,
        request: Request<api::NodeLogsRequest>,
    ) -> Result<Response<LineStream>, Status> {
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
            loop {
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
                        _ = tx.closed() => return,
                    }
                }
            }
        };
        tokio::spawn(task.instrument(tracing::Span::current()));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Serves NodeLogs until cancelled.
pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    // The node certificate exists once the node is Home (a bootstrap writes it late).
    let mut state = values.cluster_state.watch();
    tokio::select! {
        s = state.get_matching(|s| matches!(s, ClusterState::Home | ClusterState::Split)) => { s?; }
        _ = ctx.cancelled() => return Ok(()),
    }
    let credentials = values.credentials.slot(&settings.root)?;
    let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
    let tls = rpc::tls::server_config_from(&credentials)?;
    let listen = std::net::SocketAddr::new(settings.address, rpc::NODE_LOGS_PORT);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("listening on {listen}: {e}"))?;
    let crl_slot = values.crl.clone();
    let crl: rpc::CrlSource = Arc::new(move || {
        let current = crl_slot.current();
        Box::pin(async move { current.ok_or_else(|| "no cluster CRL yet".to_string()) })
    });
    let auth = rpc::AuthLayer::new(Arc::new(rpc::Authenticator::new(ca)), crl);
    tracing::info!(%listen, "serving this node's logs");
    ctx.signal_healthy();
    let span = tracing::Span::current();
    rpc::server::builder()
        .trace_fn(move |_| span.clone())
        .layer(auth)
        .add_service(api::node_logs_server::NodeLogsServer::new(Logs))
        .serve_with_incoming_shutdown(
            rpc::incoming(listener, tls),
            ctx.cancellation_token().cancelled_owned(),
        )
        .await?;
    Ok(())
}
