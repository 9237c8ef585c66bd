//! The `/metrics` endpoint: plain HTTP/1.1 on its own listener, `GET /metrics` answers
//! the registry (OpenMetrics text when the client accepts it, else the Prometheus text
//! format 0.0.4), anything else 404.
//!
//! Connections are seated (`seats`): at most 8 per source and 64 in all, and at either
//! cap the idlest connection (one that never sent a byte first) is closed to seat the
//! newcomer, so idle connections cannot keep a scraper out. A connection that sends no
//! byte within 2 s of its accept is closed, and so is one that takes longer than 10 s
//! to send its request headers, or that moves no byte for 30 s between keep-alive
//! requests.
//!
//! Serves until its future is dropped; may not serve anything but the metrics.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
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
use crate::seats::{Answering, Conn, Seats};

/// OpenMetrics text, served to clients that ask for it (Prometheus does).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The Prometheus text format 0.0.4, served to every other client.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// How many scrape connections, and how long one may take and idle.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Longest a client may take to send its request headers.
    header_read: Duration,
    /// Longest a new connection may stay silent: a scraper sends its request at once.
    first_byte: Duration,
    /// Longest a connection may go without a byte read or written between keep-alive
    /// requests before it is closed.
    idle: Duration,
    /// Connections served at once.
    max_connections: usize,
    /// Connections one source (an IPv4 address, an IPv6 /64) holds at once.
    per_source: usize,
}

/// A scraper (Prometheus) keeps one keep-alive connection per target and scrapes every
/// 15–60 s, so 30 s of idleness is a normal pause, and eight connections per source
/// allow several scrapers behind one address.
const LIMITS: Limits = Limits {
    header_read: Duration::from_secs(10),
    first_byte: Duration::from_secs(2),
    idle: Duration::from_secs(30),
    max_connections: 64,
    per_source: 8,
};

/// A stream that records its activity in its connection's seat.
struct Tracked<S> {
    inner: S,
    conn: Arc<Conn>,
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
            self.conn.touch(Instant::now(), true);
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
            self.conn.touch(Instant::now(), false);
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

/// A response body that keeps its connection counted as answering until it is sent.
struct Answer {
    body: Full<Bytes>,
    _answering: Answering,
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.body)
    }
    fn size_hint(&self) -> http_body::SizeHint {
        http_body::Body::size_hint(&self.body)
    }
}

/// Frees a seat when its connection's task ends, however it ends.
struct SeatGuard {
    seats: Arc<Mutex<Seats>>,
    id: u64,
}

impl Drop for SeatGuard {
    fn drop(&mut self) {
        self.seats
            .lock()
            .expect("metrics seats poisoned")
            .leave(self.id);
    }
}

fn answer_request(
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

/// Accept errors after which accepting again at once would fail the same way.
fn is_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

async fn serve_with(listener: TcpListener, metrics: &'static Metrics, limits: Limits) {
    let seats = Arc::new(Mutex::new(Seats::new(
        limits.max_connections,
        limits.per_source,
    )));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("metrics listener: accept failed: {e}");
                if is_exhaustion(&e) {
                    let idlest = seats
                        .lock()
                        .expect("metrics seats poisoned")
                        .evict_idlest(None);
                    if let Some(conn) = idlest {
                        conn.evicted.notify_one();
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let conn = Conn::new(Instant::now());
        let admitted = seats
            .lock()
            .expect("metrics seats poisoned")
            .admit(peer.ip(), conn.clone());
        let id = match admitted {
            Ok((id, evicted)) => {
                for idle in evicted {
                    tracing::debug!(%peer, "metrics: closing an idle connection to seat a new one");
                    idle.evicted.notify_one();
                }
                id
            }
            Err(_) => {
                tracing::debug!(%peer, "metrics: every connection is answering, closing");
                continue;
            }
        };
        let seat = SeatGuard {
            seats: seats.clone(),
            id,
        };
        tokio::spawn(
            async move {
                let answering = conn.clone();
                let service = hyper::service::service_fn(move |request| {
                    let busy = answering.answering();
                    async move {
                        let response = answer_request(metrics, &request);
                        Ok::<_, Infallible>(response.map(|body| Answer {
                            body,
                            _answering: busy,
                        }))
                    }
                });
                let mut builder = http1::Builder::new();
                builder
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(limits.header_read);
                let stream = Tracked {
                    inner: stream,
                    conn: conn.clone(),
                };
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                tokio::pin!(connection);
                loop {
                    let deadline = if conn.spoke() {
                        conn.last() + limits.idle
                    } else {
                        conn.since + limits.first_byte
                    };
                    tokio::select! {
                        result = connection.as_mut() => {
                            if let Err(e) = result {
                                tracing::debug!(%peer, "metrics connection: {e}");
                            }
                            break;
                        }
                        () = conn.evicted.notified() => {
                            tracing::debug!(%peer, "metrics connection evicted, closing");
                            break;
                        }
                        () = tokio::time::sleep_until(deadline) => {
                            let spoke = conn.spoke();
                            let still = if spoke {
                                conn.last() + limits.idle
                            } else {
                                conn.since + limits.first_byte
                            };
                            if still <= Instant::now() {
                                // Nothing moved either way for the whole bound: whatever
                                // the client waits for, dropping the connection closes it.
                                tracing::debug!(%peer, spoke, "metrics connection idle, closing");
                                break;
                            }
                        }
                    }
                }
                drop(seat);
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

    /// The header read timeout longer than any test waits: only the idle bounds close.
    const SHORT: Limits = Limits {
        header_read: Duration::from_secs(60),
        first_byte: Duration::from_millis(800),
        idle: Duration::from_millis(800),
        max_connections: 64,
        per_source: 8,
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

    /// A connection to `address` from the loopback address `source`.
    async fn connect_from(source: &str, address: std::net::SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::new(source.parse().unwrap(), 0))
            .unwrap();
        socket.connect(address).await.unwrap()
    }

    /// GET /metrics on a new connection: the status line.
    async fn scrape(address: std::net::SocketAddr) -> String {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let (got, _) = read_until_closed(&mut stream, Duration::from_secs(5))
            .await
            .expect("an answer within 5 s");
        String::from_utf8_lossy(&got)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }

    #[tokio::test]
    async fn idle_connections_from_one_source_or_many_cannot_keep_a_scraper_out() {
        // Long bounds: only the caps close anything here.
        let limits = Limits {
            first_byte: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            max_connections: 16,
            per_source: 4,
            ..SHORT
        };
        let address = server(limits).await;
        // One source far past its cap, then eight sources at theirs (past the total).
        let mut held = Vec::new();
        for _ in 0..40 {
            held.push(connect_from("127.0.0.2", address).await);
        }
        for i in 0..8 {
            for _ in 0..4 {
                held.push(connect_from(&format!("127.0.1.{}", i + 1), address).await);
            }
        }
        for _ in 0..5 {
            assert_eq!(scrape(address).await, "HTTP/1.0 200 OK");
        }
        // The flood only replaced itself: of its 72 connections, the server closed all
        // but the 16 seats (less the scrapers' turns).
        let mut open = 0;
        for stream in &mut held {
            let mut buf = [0u8; 1];
            if tokio::time::timeout(Duration::from_millis(20), stream.read(&mut buf))
                .await
                .is_err()
            {
                open += 1;
            }
        }
        assert!(open <= 16, "{open} idle connections still open");
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
