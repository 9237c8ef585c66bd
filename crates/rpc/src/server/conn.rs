//! One accepted TLS connection ([`TlsConn`]): what the server knows about its peer
//! ([`PeerInfo`], handed to tonic), the idle timer that closes it once no call has
//! been in flight for too long, and its seat (closed at once when evicted, freed when
//! dropped).
//!
//! May not authenticate or authorize (that is `auth`) nor accept (that is `accept`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::admission::SeatGuard;
use super::calls::Calls;
use super::limits::Limits;

/// What the server knows about a connection's peer.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub remote: SocketAddr,
    pub certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
    pub(crate) calls: Arc<Calls>,
}

/// One accepted TLS connection. It fails its reads (and so hyper closes it) once it has
/// been idle for too long or was evicted; it holds its seat until dropped.
pub struct TlsConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: PeerInfo,
    limits: Limits,
    accepted: Instant,
    idle: Pin<Box<Sleep>>,
    _seat: SeatGuard<Arc<Calls>>,
}

impl TlsConn {
    /// A connection whose handshake just finished, holding `seat` (whose occupant is
    /// `calls`); the first call must start within `limits.first_call_timeout`.
    pub(super) fn new(
        stream: tokio_rustls::server::TlsStream<TcpStream>,
        remote: SocketAddr,
        limits: Limits,
        seat: SeatGuard<Arc<Calls>>,
        calls: Arc<Calls>,
    ) -> TlsConn {
        let certificates = stream
            .get_ref()
            .1
            .peer_certificates()
            .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect()));
        let info = PeerInfo {
            remote,
            certificates,
            calls,
        };
        let accepted = Instant::now();
        TlsConn {
            stream,
            info,
            limits,
            accepted,
            idle: Box::pin(tokio::time::sleep_until(
                accepted + limits.first_call_timeout,
            )),
            _seat: seat,
        }
    }

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
        // waits for the preface), so the idle timer and the eviction are polled here.
        if self.info.calls.poll_evicted(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "connection evicted: the listener needed its seat",
            )));
        }
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
