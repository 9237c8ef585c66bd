//! The `/metrics` endpoint: plain HTTP/1.1 on its own listener, `GET /metrics` answers
//! the registry (OpenMetrics text when the client accepts it, else the Prometheus text
//! format 0.0.4), anything else 404. A connection is closed once it has moved no byte
//! for 30 s (before its first request or between keep-alive requests), and one that takes
//! longer than 10 s to send its request headers.
//!
//! Serves until its future is dropped; may not serve anything but the metrics.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tracing::Instrument;

use crate::families::Metrics;

/// OpenMetrics text, served to clients that ask for it (Prometheus does).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format 0.0.4, served to every other client.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// How long a scrape connection may take, and idle.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Longest a client may take to send its request headers.
    header_read: Duration,
    /// Longest a connection may go without a byte read or written (before its first
    /// request, or between keep-alive requests) before it is closed.
    idle: Duration,
}

const LIMITS: Limits = Limits {
    header_read: Duration::from_secs(10),
    idle: Duration::from_secs(30),
};
/// Most scrape connections served at once.
const MAX_CONNECTIONS: usize = 64;

/// When a connection last moved a byte (read or written).
#[derive(Clone)]
struct Activity {
    since: Instant,
    /// Milliseconds after `since`.
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    fn touch(&self) {
        let ms = self.since.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }
    fn last(&self) -> Instant {
        self.since + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A stream that records its activity.
struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S> Tracked<S> {
    fn new(inner: S) -> (Tracked<S>, Activity) {
        let activity = Activity {
            since: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        };
        let tracked = Tracked {
            inner,
            activity: activity.clone(),
        };
        (tracked, activity)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

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
    serve_with(listener, metrics, LIMITS).await
}

async fn serve_with(listener: TcpListener, metrics: &'static Metrics, limits: Limits) {
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
                    .header_read_timeout(limits.header_read);
                let (stream, activity) = Tracked::new(stream);
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                tokio::pin!(connection);
                loop {
                    let deadline = activity.last() + limits.idle;
                    tokio::select! {
                        result = connection.as_mut() => {
                            if let Err(e) = result {
                                tracing::debug!(%peer, "metrics connection: {e}");
                            }
                            break;
                        }
                        () = tokio::time::sleep_until(deadline) => {
                            if activity.last() + limits.idle <= Instant::now() {
                                // Nothing moved either way for the whole bound: whatever
                                // the client waits for, dropping the connection closes it.
                                tracing::debug!(%peer, "metrics connection idle, closing");
                                break;
                            }
                        }
                    }
                }
                drop(slot);
            }
            .instrument(tracing::Span::current()),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// The header read timeout longer than any test waits: only the idle bound closes.
    const SHORT: Limits = Limits {
        header_read: Duration::from_secs(60),
        idle: Duration::from_millis(800),
    };

    async fn server(limits: Limits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
        tokio::spawn(serve_with(listener, metrics, limits));
        address
    }

    /// Reads until the server closes the connection (or a reset), at most `within`;
    /// returns what was read and how long it took, `None` when it stayed open.
    async fn read_until_closed(
        stream: &mut TcpStream,
        within: Duration,
    ) -> Option<(Vec<u8>, Duration)> {
        let start = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        loop {
            let left = within.checked_sub(start.elapsed())?;
            match tokio::time::timeout(left, stream.read(&mut buf)).await {
                Err(_) => return None,
                Ok(Ok(0)) | Ok(Err(_)) => return Some((got, start.elapsed())),
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            }
        }
    }

    #[tokio::test]
    async fn a_connection_that_never_sends_a_request_is_closed_after_the_idle_bound() {
        let mut stream = TcpStream::connect(server(SHORT).await).await.unwrap();
        let (got, after) = read_until_closed(&mut stream, Duration::from_secs(10))
            .await
            .expect("the server kept a silent connection open for 10 s");
        assert!(got.is_empty(), "unexpected answer: {got:?}");
        assert!(
            after >= Duration::from_millis(700),
            "closed too early: {after:?}"
        );
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed_after_the_idle_bound() {
        let mut stream = TcpStream::connect(server(SHORT).await).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // The answer comes, then the connection idles and is closed.
        let (got, _) = read_until_closed(&mut stream, Duration::from_secs(10))
            .await
            .expect("the server kept an idle keep-alive connection open for 10 s");
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 200"), "answer: {text}");
    }

    #[tokio::test]
    async fn a_connection_in_use_is_not_cut_by_the_idle_bound() {
        let mut stream = TcpStream::connect(server(SHORT).await).await.unwrap();
        // Requests 400 ms apart, for three times the idle bound: each gets its answer.
        for _ in 0..6 {
            stream
                .write_all(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 64 * 1024];
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
                .await
                .expect("an answer within 5 s")
                .unwrap();
            assert!(
                buf[..n].starts_with(b"HTTP/1.1 200"),
                "answer: {:?}",
                &buf[..n]
            );
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    }
}
