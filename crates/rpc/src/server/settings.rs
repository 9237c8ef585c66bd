//! The tonic server every curator listener is built from: HTTP/2 settings and the
//! per-call request size limit (a tower layer on the request body).
//!
//! Pure configuration: may not accept connections or look at who calls.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

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
/// (count, handshake, idleness) are in [`incoming`](super::incoming), which replaces
/// tonic's own listener.
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
