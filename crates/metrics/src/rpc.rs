//! The tower layer on the curator's tonic server that counts every call by gRPC service,
//! method and status code and times it until its response headers.
//!
//! The status code is read from the response headers (`grpc-status`, where tonic puts
//! every error a handler returns); a response without it succeeded as far as the
//! headers go and counts as `OK`. Only the methods the server is told of (its RPC table)
//! get labels of their own; every other path, whatever a client sends, counts under
//! `service="unknown",method="unknown"`, so no client can add series. The label sets and
//! metric handles of a method are made on its first call and reused: a call allocates
//! nothing here and takes no lock. May not look at bodies.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use crate::families::Metrics;

/// The label value of the service and method of every path that is not a known method.
pub const UNKNOWN: &str = "unknown";

/// gRPC status code names, indexed by code (0..=16).
pub const CODE_NAMES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// Splits `/pkg.Service/Method` into service and method; anything else is `None`.
pub fn split_path(path: &str) -> Option<(&str, &str)> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    (!service.is_empty() && !method.is_empty() && !method.contains('/'))
        .then_some((service, method))
}

/// The gRPC code of a response from its `grpc-status` header (absent: OK; unparsable:
/// Unknown).
pub fn code_of(headers: &http::HeaderMap) -> usize {
    match headers.get("grpc-status") {
        None => 0,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|c| *c < CODE_NAMES.len())
            .unwrap_or(2),
    }
}

/// One method's handles: a counter per code (made on first use), one histogram.
#[derive(Debug)]
struct MethodSeries {
    labels: (String, String),
    codes: [OnceLock<Counter>; 17],
    latency: Histogram,
}

/// A method's labels and its handles, made on its first call.
#[derive(Debug)]
struct Slot {
    labels: (String, String),
    series: OnceLock<Arc<MethodSeries>>,
}

impl Slot {
    fn new(service: &str, method: &str) -> Slot {
        Slot {
            labels: (service.to_string(), method.to_string()),
            series: OnceLock::new(),
        }
    }
}

/// The per-method handles shared by every connection's service: one slot per known
/// method, fixed at construction, and one for everything else.
#[derive(Debug)]
pub struct RpcMetrics {
    metrics: &'static Metrics,
    known: HashMap<String, Slot>,
    unknown: Slot,
}

impl RpcMetrics {
    fn series(&self, path: &str) -> Arc<MethodSeries> {
        let slot = self.known.get(path).unwrap_or(&self.unknown);
        slot.series
            .get_or_init(|| {
                let labels = slot.labels.clone();
                let latency = self
                    .metrics
                    .rpc_latency
                    .get_or_create(&[("service", labels.0.clone()), ("method", labels.1.clone())])
                    .clone();
                Arc::new(MethodSeries {
                    labels,
                    codes: Default::default(),
                    latency,
                })
            })
            .clone()
    }

    fn record(&self, series: &MethodSeries, code: usize, seconds: f64) {
        series.latency.observe(seconds);
        series.codes[code]
            .get_or_init(|| {
                self.metrics
                    .rpc_calls
                    .get_or_create(&[
                        ("service", series.labels.0.clone()),
                        ("method", series.labels.1.clone()),
                        ("code", CODE_NAMES[code].to_string()),
                    ])
                    .clone()
            })
            .inc();
    }
}

/// Tower layer: counts and times every call (outermost, so denied and forwarded calls
/// count too).
#[derive(Debug, Clone)]
pub struct RpcLayer(Arc<RpcMetrics>);

impl RpcLayer {
    /// Counts calls of the `known` methods (`/pkg.Service/Method` paths: the server's
    /// RPC table) under their own labels, every other path under [`UNKNOWN`]. A known
    /// path that is not of that form counts as unknown too.
    pub fn new<'a>(
        metrics: &'static Metrics,
        known: impl IntoIterator<Item = &'a str>,
    ) -> RpcLayer {
        let known = known
            .into_iter()
            .filter_map(|path| {
                let (service, method) = split_path(path)?;
                Some((path.to_string(), Slot::new(service, method)))
            })
            .collect();
        RpcLayer(Arc::new(RpcMetrics {
            metrics,
            known,
            unknown: Slot::new(UNKNOWN, UNKNOWN),
        }))
    }
}

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcService<S>;
    fn layer(&self, inner: S) -> RpcService<S> {
        RpcService {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RpcService<S> {
    inner: S,
    metrics: Arc<RpcMetrics>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for RpcService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let series = self.metrics.series(request.uri().path());
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            // A transport error (no response) counts as Unavailable.
            let code = response.as_ref().map_or(14, |r| code_of(r.headers()));
            metrics.record(&series, code, started.elapsed().as_secs_f64());
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_grpc_paths() {
        assert_eq!(
            split_path("/polis.api.Curator/Heartbeat"),
            Some(("polis.api.Curator", "Heartbeat"))
        );
        assert_eq!(split_path("/x"), None);
        assert_eq!(split_path("/a/b/c"), None);
        assert_eq!(split_path("a/b"), None);
    }

    #[test]
    fn reads_the_code_from_headers() {
        let mut h = http::HeaderMap::new();
        assert_eq!(code_of(&h), 0);
        h.insert("grpc-status", "7".parse().unwrap());
        assert_eq!(CODE_NAMES[code_of(&h)], "PermissionDenied");
        h.insert("grpc-status", "99".parse().unwrap());
        assert_eq!(code_of(&h), 2);
    }

    #[tokio::test]
    async fn counts_known_methods_and_everything_else_as_unknown() {
        use tower::{Service, ServiceExt};
        let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
        let layer = RpcLayer::new(metrics, ["/p.S/A", "/p.S/Deny", "/p.S/Never", "junk"]);
        let mut svc = tower::Layer::layer(
            &layer,
            tower::service_fn(|r: http::Request<()>| async move {
                let mut resp = http::Response::new(());
                if r.uri().path().ends_with("/Deny") {
                    resp.headers_mut()
                        .insert("grpc-status", "7".parse().unwrap());
                }
                Ok::<_, std::convert::Infallible>(resp)
            }),
        );
        let call = async |svc: &mut RpcService<_>, path: String| {
            let req = http::Request::builder().uri(path).body(()).unwrap();
            svc.ready().await.unwrap().call(req).await.unwrap();
        };
        for path in ["/p.S/A", "/p.S/A", "/p.S/Deny"] {
            call(&mut svc, path.into()).await;
        }
        // A client's junk first, before any known method is called: it must not take
        // a label of its own, however many distinct paths it sends.
        for i in 0..300 {
            call(&mut svc, format!("/junk{i}.S/M{i}")).await;
        }
        for path in ["/x", "/p.S/A/b", "/p.S/Deny/"] {
            call(&mut svc, path.into()).await;
        }
        let text = metrics.encode();
        assert!(
            text.contains(r#"polis_curator_rpc_calls_total{service="p.S",method="A",code="OK"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"polis_curator_rpc_calls_total{service="p.S",method="Deny",code="PermissionDenied"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"polis_curator_rpc_calls_total{service="unknown",method="unknown",code="OK"} 303"#
            ),
            "{text}"
        );
        assert!(!text.contains("junk"), "{text}");
        // A known method never called has no series yet.
        assert!(!text.contains("Never"), "{text}");
        let series = text
            .lines()
            .filter(|l| l.starts_with("polis_curator_rpc_calls_total{"))
            .count();
        assert_eq!(series, 3, "{text}");
    }
}
