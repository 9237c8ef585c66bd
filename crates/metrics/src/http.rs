//! The `/metrics` endpoint: plain HTTP/1.1 on its own listener, `GET /metrics` answers
//! the registry (OpenMetrics text when the client accepts it, else the Prometheus text
//! format 0.0.4), anything else 404.
//!
//! Serves until its future is dropped; may not serve anything but the metrics.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::Instrument;

use crate::families::Metrics;

/// OpenMetrics text, served to clients that ask for it (Prometheus does).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format 0.0.4, served to every other client.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Longest a client may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Most scrape connections served at once.
const MAX_CONNECTIONS: usize = 64;

fn answer(
    metrics: &Metrics,
    request: &http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    let builder = http::Response::builder();
    let response = if request.uri().path() != "/metrics" {
        builder.status(404).body(Full::new(Bytes::from_static(
            b"only /metrics is served here\n",
        )))
    } else if request.method() != http::Method::GET && request.method() != http::Method::HEAD {
        builder
            .status(405)
            .body(Full::new(Bytes::from_static(b"GET /metrics\n")))
    } else {
        let openmetrics = request
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("application/openmetrics-text"));
        let (content_type, body) = if openmetrics {
            (OPENMETRICS, metrics.encode())
        } else {
            (PROMETHEUS_TEXT, metrics.encode_prometheus())
        };
        builder
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
    };
    response.expect("static response parts are valid")
}

/// Serves `metrics` on `listener` until the future is dropped.
pub async fn serve(listener: TcpListener, metrics: &'static Metrics) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: too many connections, closing");
            continue;
        };
        tokio::spawn(
            async move {
                let service = hyper::service::service_fn(move |request| async move {
                    Ok::<_, Infallible>(answer(metrics, &request))
                });
                let mut builder = http1::Builder::new();
                builder
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT);
                if let Err(e) = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%peer, "metrics connection: {e}");
                }
                drop(slot);
            }
            .instrument(tracing::Span::current()),
        );
    }
}
