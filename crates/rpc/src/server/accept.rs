//! The listener's accept loop: TCP_NODELAY, the cap on open connections (refused at once),
//! the cap on concurrent handshakes (a connection beyond it waits, bounded, for a slot:
//! a whole cluster reconnecting at once is queued, not refused), the bounded TLS
//! handshake, and rate-limited logging of refusals and accept errors.
//!
//! May not look at who calls (that is `auth`); a connection's life after the handshake
//! is `conn`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use super::conn::TlsConn;
use super::limits::Limits;

/// Counts events and says when to log them: at most once per interval, with the number
/// seen since the last line.
#[derive(Debug)]
pub struct LogBudget {
    interval: Duration,
    last: Option<std::time::Instant>,
    pending: u64,
}

impl LogBudget {
    pub fn new(interval: Duration) -> LogBudget {
        LogBudget {
            interval,
            last: None,
            pending: 0,
        }
    }

    /// Records one event at `now`; returns how many to report if a line is due.
    pub fn record(&mut self, now: std::time::Instant) -> Option<u64> {
        self.pending += 1;
        match self.last {
            Some(last) if now.duration_since(last) < self.interval => None,
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.pending))
            }
        }
    }
}

/// Accept errors after which accepting again at once would fail the same way.
fn is_exhaustion(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// How long the accept loop pauses after an exhaustion error: descriptors free up as
/// idle and stalled connections time out.
const EXHAUSTION_PAUSE: Duration = Duration::from_millis(100);

/// A handshake slot, waiting at most `wait` for one; `None` when none came free.
pub(super) async fn admit(
    handshakes: Arc<Semaphore>,
    wait: Duration,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    tokio::time::timeout(wait, handshakes.acquire_owned())
        .await
        .ok()?
        .ok()
}

/// [`incoming_with`] with [`Limits::for_this_process`].
pub fn incoming(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) -> ReceiverStream<Result<TlsConn, std::io::Error>> {
    incoming_with(listener, tls, Limits::for_this_process())
}

/// Accepts TCP connections within `limits` and completes TLS handshakes concurrently (a
/// slow client cannot hold up others); yields finished connections.
pub fn incoming_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
) -> ReceiverStream<Result<TlsConn, std::io::Error>> {
    tracing::info!(
        max_connections = limits.max_connections,
        max_handshakes = limits.max_handshakes,
        "connection limits"
    );
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let handshakes = Arc::new(Semaphore::new(limits.max_handshakes));
    tokio::spawn(
        async move {
            let mut errors = LogBudget::new(Duration::from_secs(1));
            let mut refusals = LogBudget::new(Duration::from_secs(1));
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = tx.closed() => return,
                };
                let (tcp, remote) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        if let Some(n) = errors.record(std::time::Instant::now()) {
                            tracing::warn!("accepting connections: {e} ({n} errors)");
                        }
                        if is_exhaustion(&e) {
                            tokio::time::sleep(EXHAUSTION_PAUSE).await;
                        }
                        continue;
                    }
                };
                // Without it, a response's last segment can wait for the client's
                // delayed ACK (~40 ms) before leaving.
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(%remote, "setting TCP_NODELAY: {e}");
                }
                let Ok(slot) = connections.clone().try_acquire_owned() else {
                    if let Some(n) = refusals.record(std::time::Instant::now()) {
                        tracing::warn!(
                            "refused {n} connections at the cap on open connections (latest from {remote})"
                        );
                    }
                    drop(tcp);
                    continue;
                };
                let handshakes = handshakes.clone();
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(
                    async move {
                        // Queued (it holds its connection slot, so the queue is bounded by
                        // the connection cap) for at most one handshake timeout.
                        let Some(handshake) = admit(handshakes, limits.handshake_timeout).await
                        else {
                            tracing::debug!(%remote, "no TLS handshake slot within the handshake timeout");
                            return;
                        };
                        let handshake_result =
                            tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp))
                                .await;
                        drop(handshake);
                        match handshake_result {
                            Ok(Ok(stream)) => {
                                let conn = TlsConn::new(stream, remote, limits, slot);
                                let _ = tx.send(Ok(conn)).await;
                            }
                            Ok(Err(e)) => tracing::debug!(%remote, "TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                        }
                    }
                    .in_current_span(),
                );
            }
        }
        .in_current_span(),
    );
    ReceiverStream::new(rx)
}
