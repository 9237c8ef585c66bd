//! The listener's accept loop: TCP_NODELAY, a seat for every connection (the admission
//! table: caps per source and in all, evicting the oldest idle stranger rather than
//! refusing a newcomer), the handshake gate of its source (a connection beyond it
//! waits, bounded, for its turn), the bounded TLS handshake, running out of
//! descriptors, and rate-limited logging of refusals, evictions and accept errors.
//!
//! May not look at who calls (that is `auth`); a connection's life after the handshake
//! is `conn`'s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use super::admission::{Caps, Refusal, SeatGuard, Table};
use super::calls::Calls;
use super::conn::TlsConn;
use super::limits::{Limits, Port};

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
/// the evicted connection closes, and as idle and stalled ones time out.
const EXHAUSTION_PAUSE: Duration = Duration::from_millis(100);

/// The seat table of one listener.
type Seats = Arc<Mutex<Table<Arc<Calls>>>>;

/// The handshake gate of a connection's source, waiting at most `wait` for a turn;
/// `None` when none came.
pub(super) async fn turn(
    gate: Arc<Semaphore>,
    wait: Duration,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    tokio::time::timeout(wait, gate.acquire_owned())
        .await
        .ok()?
        .ok()
}

/// [`incoming_with`] with the limits of `port` for this process's open-files limit.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    port: Port,
) -> ReceiverStream<Result<TlsConn, std::io::Error>> {
    incoming_with(listener, tls, Limits::for_this_process(port))
}

/// Why a connection was refused, for the log.
fn refusal_text(why: Refusal, limits: &Limits) -> String {
    match why {
        Refusal::SourceFull => format!(
            "its source holds {} connections without a cluster identity, each with a call in flight",
            limits.per_source_connections
        ),
        Refusal::ListenerFull => format!(
            "all {} connections are nodes', owners' or busy",
            limits.max_connections
        ),
    }
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
        per_source_connections = limits.per_source_connections,
        per_source_handshakes = limits.per_source_handshakes,
        "connection limits"
    );
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let seats: Seats = Arc::new(Mutex::new(Table::new(Caps {
        max: limits.max_connections,
        per_source: limits.per_source_connections,
        handshakes_per_source: limits.per_source_handshakes,
        per_identity: limits.per_identity_connections,
    })));
    let demotions = seats.lock().expect("seat table poisoned").demotions();
    tokio::spawn(
        async move {
            let mut errors = LogBudget::new(Duration::from_secs(1));
            let mut refusals = LogBudget::new(Duration::from_secs(1));
            let mut evictions = LogBudget::new(Duration::from_secs(1));
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
                            // Out of descriptors below the caps (something else holds
                            // them): an idle stranger's descriptor is the one to free.
                            let evicted = seats.lock().expect("seat table poisoned").evict_oldest();
                            if let Some(calls) = evicted {
                                calls.evict();
                            }
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
                let calls = Arc::new(Calls::new(demotions.clone()));
                let admitted = seats
                    .lock()
                    .expect("seat table poisoned")
                    .admit(remote.ip(), calls.clone());
                let seated = match admitted {
                    Ok(seated) => seated,
                    Err(why) => {
                        if let Some(n) = refusals.record(std::time::Instant::now()) {
                            tracing::warn!(
                                "refused {n} connections: {} (latest from {remote})",
                                refusal_text(why, &limits)
                            );
                        }
                        drop(tcp);
                        continue;
                    }
                };
                for evicted in &seated.evicted {
                    evicted.evict();
                    if let Some(n) = evictions.record(std::time::Instant::now()) {
                        tracing::warn!(
                            "closed {n} idle connections without a cluster identity to make room (latest for {remote})"
                        );
                    }
                }
                let seat = SeatGuard::new(seated.id, seats.clone());
                let gate = seated.handshake_gate;
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(
                    async move {
                        let handshake = async {
                            // Queued behind its own source's handshakes (bounded by the
                            // source's seats) for at most one handshake timeout.
                            let Some(_turn) = turn(gate, limits.handshake_timeout).await else {
                                tracing::debug!(%remote, "no TLS handshake turn within the handshake timeout");
                                return None;
                            };
                            match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                                Ok(Ok(stream)) => Some(stream),
                                Ok(Err(e)) => {
                                    tracing::debug!(%remote, "TLS handshake failed: {e}");
                                    None
                                }
                                Err(_) => {
                                    tracing::debug!(%remote, "TLS handshake timed out");
                                    None
                                }
                            }
                        };
                        let stream = tokio::select! {
                            stream = handshake => stream,
                            () = calls.evicted() => {
                                tracing::debug!(%remote, "evicted before its handshake ended");
                                None
                            }
                        };
                        if let Some(stream) = stream {
                            let conn = TlsConn::new(stream, remote, limits, seat, calls);
                            let _ = tx.send(Ok(conn)).await;
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
