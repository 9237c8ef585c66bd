//! The layer every call passes before its handler: classifies the caller's certificate
//! (against the current CRL), resolves a forwarded identity, applies the permission
//! table, and hands the [`Identity`] to the handler (with the [`ClientCertificate`] of a
//! caller calling directly, so that a long stream can end once it is revoked); it
//! counts the call as in flight until its response body ends.
//!
//! May not accept connections or change connection limits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, UnixTime};

use super::calls::CallGuard;
use super::conn::PeerInfo;
use super::sweep::Sweeper;
pub use super::sweep::TrustSource;
use crate::authz::{Denied, Identity, authorize};
use crate::tls::Authenticator;

/// The certificate chain the caller presented (shared with its connection, not copied),
/// for calls not forwarded by another curator: a stream handler ends the stream once
/// the caller's certificate is revoked.
#[derive(Clone, Debug)]
pub struct ClientCertificate(Arc<Vec<CertificateDer<'static>>>);

impl ClientCertificate {
    /// The DER of the caller's own (leaf) certificate.
    pub fn leaf(&self) -> Option<&[u8]> {
        self.0.first().map(|c| c.as_ref())
    }

    /// Whether the CRL `crl_der` lists this certificate (by serial): a stream that
    /// outlives a revocation checks this to end (a CRL that does not parse lists
    /// nothing; the per-call check refuses calls under it anyway).
    pub fn listed_in(&self, crl_der: &[u8]) -> bool {
        let Some(serial) = self.leaf().and_then(|l| pki::certificate_serial(l).ok()) else {
            return false;
        };
        pki::crl_serials(crl_der).is_ok_and(|listed| listed.contains(&serial))
    }
}

/// What a stream ends with when its caller's certificate was revoked (or, forwarded,
/// the key it proved no longer holds) while it was open.
pub const STREAM_REVOKED: &str =
    "the caller's certificate was revoked (or its key removed); the stream ends";

/// Tower layer: classifies the caller, applies the permission table, and hands the
/// [`Identity`] to the handler through the request extensions.
#[derive(Clone)]
pub struct AuthLayer {
    authenticator: Arc<Authenticator>,
    trust: TrustSource,
    sweeper: Arc<Sweeper>,
    forwarders: Option<Forwarders>,
    denials: Option<DenialHook>,
}

/// Told of every refused call of an audited RPC ([`crate::authz::audited`]) by a caller
/// with a valid cluster certificate (a node or an owner): method, caller, TCP peer,
/// refusal. The refusal is answered once the returned future is done. Callers without
/// a cluster certificate are only logged: anyone could make those, and recording them
/// would let a stranger push real entries out of a bounded log.
pub type DenialHook = Arc<
    dyn Fn(
            &str,
            &Identity,
            Option<std::net::SocketAddr>,
            &tonic::Status,
        ) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// Whether the node with this ID may present forwarded identities (it is a curator: a
/// consensus member).
pub type Forwarders = Arc<dyn Fn(&str) -> bool + Send + Sync>;

impl AuthLayer {
    pub fn new(authenticator: Arc<Authenticator>, trust: TrustSource) -> AuthLayer {
        AuthLayer {
            authenticator,
            trust,
            sweeper: Sweeper::new(),
            forwarders: None,
            denials: None,
        }
    }

    /// Reports refused calls to `hook` (see [`DenialHook`]).
    pub fn with_denials(mut self, hook: DenialHook) -> AuthLayer {
        self.denials = Some(hook);
        self
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
    pub(super) inner: Pin<Box<B>>,
    pub(super) _call: Option<CallGuard>,
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
            let connection = peer.map(|p| p.calls.clone());
            let leaf = peer.and_then(|p| p.certificates.clone());
            let remote = peer.map(|p| p.remote);
            let caller = match leaf.as_ref().and_then(|c| c.first()) {
                None => Identity::Anonymous,
                Some(cert) => match (layer.trust)().await {
                    Ok(anchors) => {
                        layer
                            .authenticator
                            .classify(Some(cert), &anchors, UnixTime::now())
                    }
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
            // A node's or an admin's connection keeps its seat: never evicted for a
            // newcomer, not counted against its source (`admission`). Not a reader's
            // or an operator's: anyone given one certificate could hold every seat.
            // The latest call decides: once the certificate is revoked (a removed
            // admin, a deleted node), the connection counts again (it stays open; this
            // call's refusal is answered on it).
            // Up to `Limits::per_identity` of one identity's connections (`admission`).
            // A curator trusted to forward calls keeps every connection it forwards on
            // (one per forwarded call: a registration waits on its own for approval);
            // its own calls count like any node's.
            // A connection whose certificate verified is closed once it no longer
            // does (a CA retired, a revocation, an expiry): `sweep`.
            if let (Some(connection), Some(chain)) = (&connection, &leaf)
                && (matches!(caller, Identity::Node { .. }) || caller.is_user())
            {
                layer
                    .sweeper
                    .register(connection, chain, &layer.authenticator, &layer.trust);
            }
            if let Some(connection) = &connection {
                let forwarder = request
                    .headers()
                    .contains_key(crate::forward::FORWARDED_IDENTITY)
                    && matches!(&caller, Identity::Node { id, .. }
                        if layer.forwarders.as_ref().is_some_and(|f| f(id)));
                let proves = matches!(caller, Identity::Node { .. })
                    || caller.holds(crate::authz::OperatorRole::Admin);
                connection.set_proven(proves.then(|| {
                    let prefix = if forwarder {
                        super::admission::UNCAPPED
                    } else {
                        ""
                    };
                    Arc::from(format!("{prefix}{caller}"))
                }));
            }
            // A forwarded call: the identity a curator verified, if this caller is one.
            let forwarded = request
                .headers_mut()
                .remove(crate::forward::FORWARDED_IDENTITY);
            let was_forwarded = forwarded.is_some();
            let identity = match forwarded {
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
                let status = denied_status(&denied);
                if let Some(hook) = &layer.denials
                    && (matches!(identity, Identity::Node { .. }) || identity.is_user())
                    && crate::authz::audited(&method)
                {
                    hook(&method, &identity, remote, &status).await;
                }
                return Ok(status.into_http());
            }
            if !was_forwarded && let Some(chain) = leaf {
                request.extensions_mut().insert(ClientCertificate(chain));
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
