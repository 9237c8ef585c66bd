//! Server plumbing: the curator's listener, TLS connections carrying the client's
//! certificate, and the layer that authenticates and authorizes every call before it
//! reaches a handler.
//!
//! ```text
//!   accept ─▶ TCP_NODELAY ─▶ connection slot? ─▶ handshake slot? ─▶ TLS (≤ 5 s) ─▶ tonic
//!             (no slot: closed at once)                                │
//!   TlsConn: closed when no call starts within 10 s of the handshake, or when no call
//!            has been in flight for 120 s (AuthLayer counts calls per connection)
//! ```
//!
//! Invariants (see [`Limits`] for the numbers and why):
//! - A client holds a descriptor only while it makes progress: a handshake is bounded,
//!   a connection that never calls (no HTTP/2 preface, or silence after it) is closed,
//!   and so is one that stopped calling.
//! - Open connections and concurrent handshakes are capped; beyond a cap a new connection
//!   is closed at once, never queued, so a flood cannot hold the curator's descriptors.
//! - Refusals and accept errors are logged at most once a second, with a count, and an
//!   accept error that signals exhaustion (EMFILE, ENFILE, ENOBUFS, ENOMEM) pauses the
//!   accept loop briefly instead of spinning on it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::Instrument;

use crate::authz::{Denied, Identity, authorize};
use crate::tls::Authenticator;

/// Most HTTP/2 streams (calls) one connection may have open at once. Polis clients make
/// one call at a time per connection (a heartbeat, a polisctl command); 32 leaves room
/// for concurrent tooling while bounding what one connection can make the server hold.
pub const MAX_CONCURRENT_STREAMS: u32 = 32;
/// Server keepalive pings: a peer that vanished (no FIN, no RST) is noticed within
/// interval + timeout even while a call is in flight.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Polis metadata is tiny; this bounds what a client can make the server buffer in
/// headers.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
/// Streams a client may open and reset before they are processed (the HTTP/2 "rapid
/// reset" attack); beyond this the connection is closed.
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 32;

/// Largest request body (all gRPC messages of one call) the curator reads. The largest
/// valid request is an UpdateNodeLabels with 128 upserts and a delete of every existing
/// label: about 26 KiB. tonic's default is 4 MiB per message, enough for a client to make
/// the curator parse and check ~60k labels per call.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The tonic server every curator listener is built from: HTTP/2 settings bounding what
/// one connection may hold, and [`MAX_REQUEST_BYTES`] per call (tonic sets message limits
/// per service only, so a layer enforces it for all of them). Connection-level limits
/// (count, handshake, idleness) are in [`incoming`], which replaces tonic's own listener.
pub fn builder() -> tonic::transport::Server<
    tower::layer::util::Stack<RequestSizeLimit, tower::layer::util::Identity>,
> {
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .layer(RequestSizeLimit(MAX_REQUEST_BYTES))
}

/// Tower layer: fails a call whose request body grows beyond the limit, as soon as it
/// does (ResourceExhausted), before the message is decoded.
#[derive(Debug, Clone, Copy)]
pub struct RequestSizeLimit(pub usize);

impl<S> tower::Layer<S> for RequestSizeLimit {
    type Service = SizeLimited<S>;
    fn layer(&self, inner: S) -> SizeLimited<S> {
        SizeLimited {
            inner,
            limit: self.0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SizeLimited<S> {
    inner: S,
    limit: usize,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for SizeLimited<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let limit = self.limit;
        self.inner.call(request.map(|body| {
            tonic::body::Body::new(LimitedBody {
                inner: body,
                remaining: limit,
                limit,
            })
        }))
    }
}

struct LimitedBody {
    inner: tonic::body::Body,
    remaining: usize,
    limit: usize,
}

impl http_body::Body for LimitedBody {
    type Data = <tonic::body::Body as http_body::Body>::Data;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let len = frame.data_ref().map_or(0, |d| d.len());
        if len > self.remaining {
            // The error reaches the client as this status (tonic looks for a Status in
            // body errors).
            return Poll::Ready(Some(Err(tonic::Status::resource_exhausted(format!(
                "request larger than {} bytes",
                self.limit
            )))));
        }
        self.remaining -= len;
        Poll::Ready(Some(Ok(frame)))
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Connection limits of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections (including those in their handshake).
    pub max_connections: usize,
    /// Connections in their TLS handshake at once.
    pub max_handshakes: usize,
    /// How long a client gets to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long after the handshake the first call must start (covers clients that
    /// never send the HTTP/2 preface).
    pub first_call_timeout: Duration,
    /// How long a connection may go without a call in flight.
    pub idle_timeout: Duration,
}

impl Limits {
    /// For a curator serving ~1000 nodes: each node keeps about one connection (its
    /// heartbeat channel), plus operators and other curators; 4096 is four times that.
    /// A restart of the whole cluster reconnects every node at once, so 1024 handshakes
    /// may run together. A TLS 1.3 handshake takes one round trip; 5 s allows slow
    /// links. Clients call right after connecting (10 s), and nodes heartbeat every 5 s,
    /// so 120 s without a call means the connection is abandoned.
    pub const PRODUCTION: Limits = Limits {
        max_connections: 4096,
        max_handshakes: 1024,
        handshake_timeout: Duration::from_secs(5),
        first_call_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
    };

    /// Descriptors kept free for everything else (etcd client, logs, files, etcd's
    /// peer connections are etcd's own).
    const RESERVED_DESCRIPTORS: usize = 256;

    /// [`Limits::PRODUCTION`], scaled down to fit the open-files limit `nofile` so that
    /// the caps, not EMFILE, decide who is refused.
    pub fn within_open_files(nofile: u64) -> Limits {
        let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
        let fit = nofile.saturating_sub(Self::RESERVED_DESCRIPTORS).max(16);
        let max_connections = Self::PRODUCTION.max_connections.min(fit);
        Limits {
            max_connections,
            max_handshakes: Self::PRODUCTION
                .max_handshakes
                .min(max_connections / 4)
                .max(1),
            ..Self::PRODUCTION
        }
    }

    /// The limits for this process's current open-files soft limit.
    pub fn for_this_process() -> Limits {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid pointer to a local struct.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return Self::within_open_files(1024);
        }
        Self::within_open_files(limit.rlim_cur)
    }
}

/// Calls in flight on one connection, and when the last one started or ended.
#[derive(Debug)]
pub(crate) struct Calls {
    in_flight: AtomicUsize,
    /// `None` until the first call starts.
    last: Mutex<Option<Instant>>,
}

impl Calls {
    fn new() -> Calls {
        Calls {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(None),
        }
    }

    fn touch(&self) {
        *self.last.lock().expect("calls lock poisoned") = Some(Instant::now());
    }

    fn start(self: &Arc<Calls>) -> CallGuard {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.touch();
        CallGuard(self.clone())
    }

    /// When the connection becomes closable for idleness: `None` while a call is in
    /// flight.
    fn idle_deadline(&self, accepted: Instant, limits: &Limits) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(match *self.last.lock().expect("calls lock poisoned") {
            None => accepted + limits.first_call_timeout,
            Some(last) => last + limits.idle_timeout,
        })
    }
}

struct CallGuard(Arc<Calls>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the server knows about a connection's peer.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub remote: SocketAddr,
    pub certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
    pub(crate) calls: Arc<Calls>,
}

/// One accepted TLS connection. It fails its reads (and so hyper closes it) once it has
/// been idle for too long; it holds its slot of the connection cap until dropped.
pub struct TlsConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: PeerInfo,
    limits: Limits,
    accepted: Instant,
    idle: Pin<Box<Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl TlsConn {
    /// The TCP socket under the TLS session.
    pub fn tcp(&self) -> &TcpStream {
        self.stream.get_ref().0
    }

    /// Ready with an error once the connection is idle past its deadline; registers the
    /// timer otherwise.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        loop {
            if self.idle.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            match self.info.calls.idle_deadline(self.accepted, &self.limits) {
                Some(deadline) if deadline <= now => {
                    return Poll::Ready(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connection idle: no call in flight",
                    ));
                }
                Some(deadline) => self.idle.as_mut().reset(deadline),
                None => self.idle.as_mut().reset(now + self.limits.idle_timeout),
            }
        }
    }
}

impl Connected for TlsConn {
    type ConnectInfo = PeerInfo;
    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // hyper always has a read outstanding on an HTTP/2 connection (also while it
        // waits for the preface), so the idle timer is polled here.
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Pending => self.poll_idle(cx).map(Err),
            ready => ready,
        }
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

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
                let slots = connections.clone().try_acquire_owned().map(|c| {
                    let h = handshakes.clone().try_acquire_owned();
                    (c, h)
                });
                let (slot, handshake) = match slots {
                    Ok((slot, Ok(handshake))) => (slot, handshake),
                    refused => {
                        let which = match refused {
                            Err(_) => "open connections",
                            Ok(_) => "concurrent TLS handshakes",
                        };
                        if let Some(n) = refusals.record(std::time::Instant::now()) {
                            tracing::warn!(
                                "refused {n} connections at the cap on {which} (latest from {remote})"
                            );
                        }
                        drop(tcp);
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(
                    async move {
                        let handshake_result =
                            tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp))
                                .await;
                        drop(handshake);
                        match handshake_result {
                            Ok(Ok(stream)) => {
                                let certificates =
                                    stream.get_ref().1.peer_certificates().map(|c| {
                                        Arc::new(c.iter().map(|c| c.clone().into_owned()).collect())
                                    });
                                let info = PeerInfo {
                                    remote,
                                    certificates,
                                    calls: Arc::new(Calls::new()),
                                };
                                let accepted = Instant::now();
                                let conn = TlsConn {
                                    stream,
                                    info,
                                    limits,
                                    accepted,
                                    idle: Box::pin(tokio::time::sleep_until(
                                        accepted + limits.first_call_timeout,
                                    )),
                                    _slot: slot,
                                };
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

/// Fetches the current cluster CRL (DER).
pub type CrlSource =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>> + Send + Sync>;

/// Tower layer: classifies the caller, applies the permission table, and hands the
/// [`Identity`] to the handler through the request extensions.
#[derive(Clone)]
pub struct AuthLayer {
    authenticator: Arc<Authenticator>,
    crl: CrlSource,
    forwarders: Option<Forwarders>,
}

/// Whether the node with this ID may present forwarded identities (it is a curator: a
/// consensus member).
pub type Forwarders = Arc<dyn Fn(&str) -> bool + Send + Sync>;

impl AuthLayer {
    pub fn new(authenticator: Arc<Authenticator>, crl: CrlSource) -> AuthLayer {
        AuthLayer {
            authenticator,
            crl,
            forwarders: None,
        }
    }

    /// Accepts identities forwarded by the nodes `forwarders` names (see
    /// [`crate::forward`]); without this, a forwarded identity is always denied.
    pub fn with_forwarders(mut self, forwarders: Forwarders) -> AuthLayer {
        self.forwarders = Some(forwarders);
        self
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;
    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    layer: AuthLayer,
}

/// The gRPC status for a refusal.
pub fn denied_status(denied: &Denied) -> tonic::Status {
    match denied {
        Denied::UndeclaredMethod { .. } | Denied::Insufficient { .. } => {
            tonic::Status::permission_denied(denied.to_string())
        }
        Denied::InvalidCertificate { .. } => tonic::Status::unauthenticated(denied.to_string()),
    }
}

/// A response body that keeps its call counted as in flight until the body ends (or is
/// dropped): a streaming response (RegisterNode waiting for approval, WatchNode) keeps
/// its connection from being closed as idle.
pub struct CountedBody<B> {
    inner: Pin<Box<B>>,
    _call: Option<CallGuard>,
}

impl<B: Default> Default for CountedBody<B> {
    fn default() -> Self {
        CountedBody {
            inner: Box::pin(B::default()),
            _call: None,
        }
    }
}

impl<B: http_body::Body> http_body::Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.get_mut().inner.as_mut().poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for AuthService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<CountedBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        // The clone is not ready; keep the ready one for this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let method = request.uri().path().to_string();
            let peer = request.extensions().get::<PeerInfo>();
            // Keeps the connection from being closed as idle while the call runs, up to
            // the end of its response body.
            let call = peer.map(|p| p.calls.start());
            let leaf = peer.and_then(|p| p.certificates.clone());
            let caller = match leaf.as_ref().and_then(|c| c.first()) {
                None => Identity::Anonymous,
                Some(cert) => match (layer.crl)().await {
                    Ok(crl) => layer
                        .authenticator
                        .classify(Some(cert), &crl, UnixTime::now()),
                    Err(e) => {
                        // The client hears Unavailable and retries; the CRL's own source
                        // logs why it has none (e.g. for the first moments after start).
                        tracing::debug!(method, "cannot read the cluster CRL: {e}");
                        return Ok(tonic::Status::unavailable(format!(
                            "cannot check certificates right now: {e}"
                        ))
                        .into_http());
                    }
                },
            };
            // A forwarded call: the identity a curator verified, if this caller is one.
            let identity = match request
                .headers_mut()
                .remove(crate::forward::FORWARDED_IDENTITY)
            {
                None => caller,
                Some(header) => {
                    let trusted = matches!(&caller, Identity::Node { id, .. }
                        if layer.forwarders.as_ref().is_some_and(|f| f(id)));
                    if !trusted {
                        tracing::warn!(method, %caller, "denied: forged forwarded identity");
                        return Ok(tonic::Status::permission_denied(format!(
                            "{}; caller is {caller}",
                            crate::forward::UNTRUSTED_FORWARDER
                        ))
                        .into_http());
                    }
                    match header
                        .to_str()
                        .ok()
                        .and_then(crate::forward::decode_identity)
                    {
                        Some(forwarded) => forwarded,
                        None => {
                            return Ok(tonic::Status::invalid_argument(
                                "malformed forwarded identity",
                            )
                            .into_http());
                        }
                    }
                }
            };
            if let Err(denied) = authorize(&method, &identity) {
                tracing::info!(method, caller = %identity, "denied: {denied}");
                return Ok(denied_status(&denied).into_http());
            }
            request.extensions_mut().insert(identity);
            let response = inner.call(request).await?;
            Ok(response.map(|body| CountedBody {
                inner: Box::pin(body),
                _call: call,
            }))
        })
    }
}

#[cfg(test)]
mod tests;
