//! Server plumbing: TLS connections carrying the client's certificate, and the layer
//! that authenticates and authorizes every call before it reaches a handler.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::Instrument;

use crate::authz::{Denied, Identity, authorize};
use crate::tls::Authenticator;

/// How long a client gets to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the server knows about a connection's peer.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub remote: SocketAddr,
    pub certificates: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// One accepted TLS connection.
pub struct TlsConn {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: PeerInfo,
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
        Pin::new(&mut self.stream).poll_read(cx, buf)
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

/// Accepts TCP connections and completes TLS handshakes concurrently (a slow client
/// cannot hold up others); yields finished connections.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) -> ReceiverStream<Result<TlsConn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(
        async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = tx.closed() => return,
                };
                let (tcp, remote) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(
                    async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                let certificates =
                                    stream.get_ref().1.peer_certificates().map(|c| {
                                        Arc::new(c.iter().map(|c| c.clone().into_owned()).collect())
                                    });
                                let info = PeerInfo {
                                    remote,
                                    certificates,
                                };
                                let _ = tx.send(Ok(TlsConn { stream, info })).await;
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
}

impl AuthLayer {
    pub fn new(authenticator: Arc<Authenticator>, crl: CrlSource) -> AuthLayer {
        AuthLayer { authenticator, crl }
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
    type Response = http::Response<ResBody>;
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
            let leaf = request
                .extensions()
                .get::<PeerInfo>()
                .and_then(|p| p.certificates.clone());
            let identity = match leaf.as_ref().and_then(|c| c.first()) {
                None => Identity::Anonymous,
                Some(cert) => match (layer.crl)().await {
                    Ok(crl) => layer
                        .authenticator
                        .classify(Some(cert), &crl, UnixTime::now()),
                    Err(e) => {
                        tracing::warn!(method, "cannot read the cluster CRL: {e}");
                        return Ok(tonic::Status::unavailable(format!(
                            "cannot check certificates right now: {e}"
                        ))
                        .into_http());
                    }
                },
            };
            if let Err(denied) = authorize(&method, &identity) {
                tracing::info!(method, caller = %identity, "denied: {denied}");
                return Ok(denied_status(&denied).into_http());
            }
            request.extensions_mut().insert(identity);
            inner.call(request).await
        })
    }
}
