//! The audit layer: every call of an audited RPC ([`crate::authz::audited`]) that
//! reaches a handler on this server is handed, with its caller, request and result, to
//! an [`AuditSink`], and its result reaches the client only once the sink has recorded
//! it: an answer the client saw is in the audit log, whatever crashes afterwards.
//!
//! A call abandoned by its client is recorded too, in the background: Cancelled when
//! the handler was cut short (its outcome unknown) or no answer was sent yet; OK when a
//! stream had sent answers before the client closed it.
//!
//! A change and its entry commit together: while a handler runs, its call is in reach
//! of the code it calls ([`call_in_progress`], a task-local). A write that changes
//! cluster state claims the call ([`CallInProgress::claim`]), puts the call's entry in
//! its own transaction, and marks it recorded once that transaction committed; the
//! layer then writes nothing more for a call that succeeded (one entry, one
//! transaction), and a second entry, with the final status, for one that failed after
//! its change. A call that changed nothing goes to the sink as before.
//!
//! ```text
//!   call ─▶ CallInProgress (task-local) ─▶ handler ─▶ write: claim ─▶ txn {change, entry}
//!                                                         ok: recorded │ failed: release
//!   result ─▶ recorded and OK? ─ yes ─▶ passed on at once
//!                               └ no ──▶ sink (entry with the result) ─▶ passed on
//! ```
//!
//! Sits inside [`super::AuthLayer`] (it reads the verified [`Identity`]) and inside the
//! forwarding layer (a call forwarded to the leader is recorded there, once). May not
//! decide anything about the call: it never refuses one, it only delays its end.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use http_body::Frame;
use http_body_util::BodyExt;
use tonic::codegen::Bytes;

use super::auth::ClientCertificate;
use super::conn::PeerInfo;
use crate::authz::{Identity, audited};

/// One audited call, as the server saw it.
#[derive(Debug, Clone)]
pub struct AuditCall {
    pub method: String,
    pub identity: Option<Identity>,
    /// The caller's certificate chain (calls not forwarded by another curator).
    pub certificate: Option<ClientCertificate>,
    pub peer: Option<SocketAddr>,
    /// The request's first protobuf message (without gRPC framing); empty if none or
    /// compressed.
    pub request: Bytes,
    /// gRPC status code and message of the result.
    pub code: i32,
    pub message: String,
    /// The key of the entry a change of this call put in its transaction, when one did:
    /// the call's final entry is written under it, over whatever that transaction left
    /// (an etcd error after a commit: the outcome unknown to the handler). One call, one
    /// entry.
    pub entry_key: Option<String>,
}

/// A call whose handler runs now (see the module documentation).
#[derive(Debug)]
pub struct CallInProgress {
    call: AuditCall,
    /// The ID of the server that records the call (the curator's node ID).
    recorder: Arc<str>,
    state: AtomicU8,
    /// The key of the call's entry, fixed by the first change that claimed it.
    entry_key: OnceLock<String>,
}

/// [`CallInProgress`] states: no change holds the entry; a change's transaction carries
/// it now; a committed change carried it.
const OPEN: u8 = 0;
const CLAIMED: u8 = 1;
const RECORDED: u8 = 2;

impl CallInProgress {
    pub fn new(call: AuditCall, recorder: Arc<str>) -> CallInProgress {
        CallInProgress {
            call,
            recorder,
            state: AtomicU8::new(OPEN),
            entry_key: OnceLock::new(),
        }
    }

    /// The key of the call's entry: `make`'s the first time, the same ever after. Every
    /// change of the call and its final entry write under it, so that a transaction
    /// whose commit the handler could not learn of is overwritten, not repeated.
    pub fn entry_key_or(&self, make: impl FnOnce() -> String) -> &str {
        self.entry_key.get_or_init(make)
    }

    /// The entry's key, once a change claimed it.
    pub fn entry_key(&self) -> Option<&str> {
        self.entry_key.get().map(String::as_str)
    }

    /// The call as it arrived (its code and message are not known yet).
    pub fn call(&self) -> &AuditCall {
        &self.call
    }

    pub fn recorder(&self) -> &str {
        &self.recorder
    }

    /// Takes the call's entry for one change's transaction: false when another change
    /// of this call holds it or already committed it.
    pub fn claim(&self) -> bool {
        self.state
            .compare_exchange(OPEN, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The claiming transaction did not commit: the entry is the call's again.
    pub fn release(&self) {
        let _ = self
            .state
            .compare_exchange(CLAIMED, OPEN, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The claiming transaction committed: the entry is in the log.
    pub fn mark_recorded(&self) {
        let _ = self
            .state
            .compare_exchange(CLAIMED, RECORDED, Ordering::AcqRel, Ordering::Acquire);
    }

    pub fn is_recorded(&self) -> bool {
        self.state.load(Ordering::Acquire) == RECORDED
    }
}

tokio::task_local! {
    static IN_CALL: Arc<CallInProgress>;
}

/// The audited call whose handler runs in this task, if any.
pub fn call_in_progress() -> Option<Arc<CallInProgress>> {
    IN_CALL.try_with(Arc::clone).ok()
}

/// Runs `future` as the handler of `call` (what [`call_in_progress`] finds). For tests
/// and for servers that run handlers outside this layer.
pub async fn run_in_call<F: Future>(call: Arc<CallInProgress>, future: F) -> F::Output {
    IN_CALL.scope(call, future).await
}

/// A sink's recording of one call, under way.
pub type Recorded = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Records one call; the call's result is held until the returned future is done. An
/// error is logged on this node and the result passed on (see `not_recorded`).
pub type AuditSink = Arc<dyn Fn(AuditCall) -> Recorded + Send + Sync>;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Tower layer: see the module documentation.
#[derive(Clone)]
pub struct AuditLayer {
    sink: AuditSink,
    recorder: Arc<str>,
}

impl AuditLayer {
    /// `recorder`: the ID this server's entries name as their writer.
    pub fn new(sink: AuditSink, recorder: &str) -> AuditLayer {
        AuditLayer {
            sink,
            recorder: recorder.into(),
        }
    }
}

impl<S> tower::Layer<S> for AuditLayer {
    type Service = AuditService<S>;
    fn layer(&self, inner: S) -> AuditService<S> {
        AuditService {
            inner,
            sink: self.sink.clone(),
            recorder: self.recorder.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AuditService<S> {
    inner: S,
    sink: AuditSink,
    recorder: Arc<str>,
}

/// The first gRPC message of a request body (5-byte frame header, then the message);
/// empty when compressed or truncated.
pub fn first_message(body: &[u8]) -> Bytes {
    if body.len() < 5 || body[0] != 0 {
        return Bytes::new();
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    match body.get(5..5 + len) {
        Some(message) => Bytes::copy_from_slice(message),
        None => Bytes::new(),
    }
}

/// The gRPC status a header map carries, if any.
fn status_of(headers: &http::HeaderMap) -> Option<(i32, String)> {
    tonic::Status::from_header_map(headers).map(|s| (s.code() as i32, s.message().to_string()))
}

/// An entry etcd did not take (e.g. under a NOSPACE alarm): logged here, on this node
/// (its log is kept in its root), and the call's result is passed on unchanged. Failing
/// the call instead would hide an effect that already happened, and would stop the very
/// calls that free space (defragmentation) or save the data (backups) when etcd is full.
fn not_recorded(method: &str, code: i32, message: &str, error: &str) {
    tracing::warn!(
        method,
        code = ?tonic::Code::from_i32(code),
        message,
        "audit entry not written to etcd ({error}); the call's result is passed on"
    );
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for AuditService<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send,
    ReqBody: http_body::Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let sink = self.sink.clone();
        let recorder = self.recorder.clone();
        Box::pin(async move {
            let method = request.uri().path().to_string();
            if !audited(&method) {
                let request = request.map(tonic::body::Body::new);
                return Ok(inner.call(request).await?.map(tonic::body::Body::new));
            }
            let (parts, body) = request.into_parts();
            // Audited RPCs take one request message (bounded by the server's request
            // size limit): read it whole to name the call's target.
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    // The size limit below fails the body with its own status
                    // (ResourceExhausted): the client gets that one.
                    let e: BoxError = e.into();
                    let status = match e.downcast::<tonic::Status>() {
                        Ok(status) => *status,
                        Err(e) => {
                            tonic::Status::invalid_argument(format!("reading the request: {e}"))
                        }
                    };
                    return Ok(status.into_http());
                }
            };
            let call = AuditCall {
                method,
                identity: parts.extensions.get::<Identity>().cloned(),
                certificate: parts.extensions.get::<ClientCertificate>().cloned(),
                peer: parts.extensions.get::<PeerInfo>().map(|p| p.remote),
                request: first_message(&bytes),
                code: 0,
                message: String::new(),
                entry_key: None,
            };
            let request = http::Request::from_parts(
                parts,
                tonic::body::Body::new(http_body_util::Full::new(bytes)),
            );
            let progress = Arc::new(CallInProgress::new(call, recorder));
            // Dropped with the handler when the client goes away mid-call: recorded then.
            let mut running = Running {
                call: Some(progress.clone()),
                sink: sink.clone(),
            };
            let response = IN_CALL.scope(progress, inner.call(request)).await?;
            let call = running.call.take().expect("taken only here");
            if let Some((code, message)) = status_of(response.headers()) {
                // A trailers-only answer (the call was refused or failed at once).
                if let Some(recorded) = final_entry(&sink, &call, code, &message)
                    && let Err(e) = recorded.await
                {
                    not_recorded(&call.call.method, code, &message, &e);
                }
                return Ok(response.map(tonic::body::Body::new));
            }
            Ok(response.map(|body| {
                tonic::body::Body::new(AuditBody {
                    inner: Box::pin(body),
                    call: Some(call),
                    sink,
                    recording: None,
                    sent: 0,
                })
            }))
        })
    }
}

/// The entry still to write for a call that ended with `code`: none when a change
/// committed it and the call succeeded; the call's result when nothing recorded it; a
/// second entry naming the failure when the call failed after its change was recorded.
fn final_entry(
    sink: &AuditSink,
    progress: &CallInProgress,
    code: i32,
    message: &str,
) -> Option<Recorded> {
    let message = match (progress.is_recorded(), code) {
        (true, 0) => return None,
        (true, _) => format!("after its change was recorded: {message}"),
        (false, _) => message.to_string(),
    };
    Some(sink(AuditCall {
        code,
        message,
        entry_key: progress.entry_key().map(String::from),
        ..progress.call.clone()
    }))
}

/// Records, in the background, a call whose result is unknown or was never sent
/// (unless a change already recorded it).
fn record_later(sink: &AuditSink, progress: &CallInProgress, code: tonic::Code, message: String) {
    if progress.is_recorded() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let recorded = sink(AuditCall {
            code: code as i32,
            message,
            entry_key: progress.entry_key().map(String::from),
            ..progress.call.clone()
        });
        runtime.spawn(async move {
            if let Err(e) = recorded.await {
                tracing::warn!("audit entry of an abandoned call not written: {e}");
            }
        });
    }
}

/// A call whose handler runs: if it is dropped (the client went away and the server
/// cancelled the handler), it is recorded as Cancelled with an unknown outcome.
struct Running {
    call: Option<Arc<CallInProgress>>,
    sink: AuditSink,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            record_later(
                &self.sink,
                &call,
                tonic::Code::Cancelled,
                "the client went away while the call ran; its outcome is unknown".into(),
            );
        }
    }
}

type Recording = Pin<Box<dyn Future<Output = (Frame<Bytes>, Option<tonic::Status>)> + Send>>;

/// A response body whose trailers (the call's status) are held until the call is
/// recorded. A body dropped before its trailers (the client closed a stream, e.g. a
/// registering node once approved) is recorded in the background: OK with the number
/// of messages sent when the server sent any (the server did not fail), else Cancelled.
struct AuditBody<B> {
    inner: Pin<Box<B>>,
    call: Option<Arc<CallInProgress>>,
    sink: AuditSink,
    recording: Option<Recording>,
    /// Data frames sent so far.
    sent: u64,
}

impl<B> http_body::Body for AuditBody<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(recording) = this.recording.as_mut() {
                let (trailers, failure) = ready!(recording.as_mut().poll(cx));
                this.recording = None;
                // An entry not written: the client hears why instead of the result.
                let replaced = failure.and_then(|status| {
                    let mut map = http::HeaderMap::new();
                    status.add_header(&mut map).ok().map(|()| map)
                });
                return Poll::Ready(Some(Ok(match replaced {
                    None => trailers,
                    Some(map) => Frame::trailers(map),
                })));
            }
            let frame = match ready!(this.inner.as_mut().poll_frame(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                Some(Ok(frame)) => frame,
            };
            let Some(trailers) = frame.trailers_ref() else {
                this.sent += 1;
                return Poll::Ready(Some(Ok(frame)));
            };
            let Some(call) = this.call.take() else {
                return Poll::Ready(Some(Ok(frame)));
            };
            let (code, message) = status_of(trailers).unwrap_or((0, String::new()));
            let method = call.call.method.clone();
            let Some(recorded) = final_entry(&this.sink, &call, code, &message) else {
                return Poll::Ready(Some(Ok(frame)));
            };
            this.recording = Some(Box::pin(async move {
                if let Err(e) = recorded.await {
                    not_recorded(&method, code, &message, &e);
                }
                (frame, None)
            }));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recording.is_none() && self.inner.is_end_stream()
    }
}

impl<B> Drop for AuditBody<B> {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            let (code, message) = match self.sent {
                0 => (
                    tonic::Code::Cancelled,
                    "the client went away before any answer".to_string(),
                ),
                n => (
                    tonic::Code::Ok,
                    format!("the client closed the stream after {n} data frames"),
                ),
            };
            record_later(&self.sink, &call, code, message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_message_is_cut_out_of_its_frame() {
        let mut body = vec![0, 0, 0, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0, 1, b'z'];
        assert_eq!(&first_message(&body)[..], b"abc");
        body[0] = 1; // compressed
        assert!(first_message(&body).is_empty());
        assert!(first_message(&[0, 0, 0, 0, 9, 1]).is_empty());
        assert!(first_message(&[]).is_empty());
    }

    fn call() -> AuditCall {
        AuditCall {
            method: "/polis.api.Management/UpdateNodeLabels".into(),
            identity: None,
            certificate: None,
            peer: None,
            request: Bytes::new(),
            code: 0,
            message: String::new(),
            entry_key: None,
        }
    }

    /// A sink that keeps what it was given.
    fn keeping() -> (AuditSink, Arc<std::sync::Mutex<Vec<AuditCall>>>) {
        let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
        let k = kept.clone();
        let sink: AuditSink = Arc::new(move |call| {
            k.lock().unwrap().push(call);
            Box::pin(async { Ok(()) })
        });
        (sink, kept)
    }

    #[test]
    fn a_call_whose_change_may_have_committed_ends_under_that_changes_key() {
        let (sink, kept) = keeping();
        // A change claimed the entry, its transaction's outcome unknown (an etcd error
        // after the commit): released. A retry found nothing to change; the call is OK.
        let progress = CallInProgress::new(call(), "curator".into());
        assert!(progress.claim());
        let key = progress
            .entry_key_or(|| "audit/1-1-curator".into())
            .to_string();
        progress.release();
        assert!(progress.claim(), "the entry is the call's again");
        assert_eq!(progress.entry_key_or(|| "audit/2-2-curator".into()), key);
        progress.release();
        let _written = final_entry(&sink, &progress, 0, "").expect("not recorded: written");
        // An error after a recorded change: the same key, the message saying so.
        let recorded = CallInProgress::new(call(), "curator".into());
        assert!(recorded.claim());
        recorded.entry_key_or(|| "audit/3-3-curator".into());
        recorded.mark_recorded();
        assert!(
            final_entry(&sink, &recorded, 0, "").is_none(),
            "OK: already written"
        );
        let _written =
            final_entry(&sink, &recorded, 14, "etcd away").expect("the failure is written");
        // A call no change claimed gets a key of the sink's choosing.
        let plain = CallInProgress::new(call(), "curator".into());
        let _written = final_entry(&sink, &plain, 0, "").expect("written");
        let kept = kept.lock().unwrap();
        assert_eq!(kept[0].entry_key.as_deref(), Some(key.as_str()));
        assert_eq!(kept[0].code, 0);
        assert_eq!(kept[1].entry_key.as_deref(), Some("audit/3-3-curator"));
        assert!(kept[1].message.starts_with("after its change was recorded"));
        assert_eq!(kept[2].entry_key, None);
    }
}
