//! The apiserver's token webhook: who a kubelet's token (`kubelet_token`) belongs to,
//! asked of Polis's own records on every request the apiserver has no cached answer
//! for.
//!
//! ```text
//!   kubelet ──token──▶ kube-apiserver ──TokenReview (HTTPS, loopback)──▶ this webhook
//!                                                  │ ours? (node id, secret)
//!                                                  ▼
//!                         check(node id): the record read through the quorum ─▶
//!                         UP ∧ KubernetesWorker ∧ hash(secret) = its newest token's
//!                                                  │
//!            authenticated: system:node:<id> (system:nodes) │ refused (no reason
//!            leaks to the kubelet; the apiserver logs none either)
//! ```
//! Served on the controller's loopback (`webhook_address`) with the apiserver's own
//! serving certificate (the apiserver checks it against the Kubernetes CA under the
//! name `kubernetes`); HTTP/1.1 only, bounded: 64 connections, 16 record reads at once,
//! 64 KiB per review, 10 s for a request's headers. A failed read answers "not
//! authenticated" with an error: the webhook fails closed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::kubelet_token;

/// The webhook's port on a controller.
pub const WEBHOOK_PORT: u16 = 6445;
/// The path the apiserver posts its reviews to.
pub const WEBHOOK_PATH: &str = "/authenticate";
const MAX_CONNECTIONS: usize = 64;
const MAX_CHECKS: usize = 16;
const MAX_REVIEW_BYTES: usize = 64 * 1024;
const HEADER_READ: Duration = Duration::from_secs(10);

/// Where the webhook listens: the controller's loopback, on its own address when that
/// is a loopback one (nodes sharing a machine, in tests).
pub fn webhook_address(address: IpAddr) -> SocketAddr {
    if address.is_loopback() {
        SocketAddr::new(address, WEBHOOK_PORT)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), WEBHOOK_PORT)
    }
}

/// What Polis's records say of a node's kubelet: the SHA-256 of its newest token's
/// secret while the node is UP and holds KubernetesWorker, `None` otherwise; `Err`
/// when the records could not be read.
pub type KubeletCheck =
    Arc<dyn Fn(String) -> BoxFuture<'static, Result<Option<Vec<u8>>, String>> + Send + Sync>;

/// A TokenReview as the apiserver sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    pub api_version: String,
    pub token: String,
    pub audiences: Vec<String>,
}

/// Reads a TokenReview request.
pub fn read_review(body: &[u8]) -> Result<Review, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("not a TokenReview (JSON): {e}"))?;
    if value["kind"] != "TokenReview" {
        return Err(format!("not a TokenReview: kind {}", value["kind"]));
    }
    let api_version = value["apiVersion"]
        .as_str()
        .filter(|v| v.starts_with("authentication.k8s.io/"))
        .ok_or("a TokenReview without an authentication.k8s.io apiVersion")?
        .to_string();
    let token = value["spec"]["token"]
        .as_str()
        .ok_or("a TokenReview without spec.token")?
        .to_string();
    let audiences = value["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Ok(Review {
        api_version,
        token,
        audiences,
    })
}

/// The webhook's decision on one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The kubelet of this node.
    Kubelet(String),
    /// Not a kubelet Polis knows now (why, for the log only).
    Refused(String),
}

/// Decides on `token`: our format, then the node's record (`check`).
pub async fn decide(check: &KubeletCheck, token: &str) -> Result<Verdict, String> {
    let Some(presented) = kubelet_token::parse(token) else {
        return Ok(Verdict::Refused("not a Polis kubelet token".into()));
    };
    let node = presented.node_id.clone();
    Ok(match check(node.clone()).await? {
        None => Verdict::Refused(format!(
            "node {node} is not an UP node holding KubernetesWorker"
        )),
        Some(stored) if kubelet_token::matches(&stored, &presented) => Verdict::Kubelet(node),
        Some(_) => Verdict::Refused(format!("not node {node}'s newest kubelet token")),
    })
}

/// The TokenReview answer to `review`.
pub fn answer(review: &Review, verdict: &Result<Verdict, String>) -> Value {
    let status = match verdict {
        Ok(Verdict::Kubelet(node)) => {
            let (username, groups) = kubelet_token::user(node);
            let mut status = json!({
                "authenticated": true,
                "user": {"username": username, "uid": format!("polis-node:{node}"), "groups": groups},
            });
            // Valid wherever the apiserver asked: it checks the intersection.
            if !review.audiences.is_empty() {
                status["audiences"] = json!(review.audiences);
            }
            status
        }
        Ok(Verdict::Refused(_)) => json!({"authenticated": false}),
        Err(e) => {
            json!({"authenticated": false, "error": format!("Polis could not read its records: {e}")})
        }
    };
    json!({"apiVersion": review.api_version, "kind": "TokenReview", "status": status})
}

/// The TLS configuration the webhook serves with: the apiserver's serving
/// certificate and key (PEM files), HTTP/1.1.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let read = |path: &Path| {
        let text = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        ::pem::parse(text).map_err(|e| format!("reading {}: {e}", path.display()))
    };
    let chain = vec![rustls::pki_types::CertificateDer::from(
        read(cert)?.contents().to_vec(),
    )];
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        read(key)?.contents().to_vec(),
    ));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("the webhook's TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the webhook's certificate: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

async fn respond(
    request: hyper::Request<hyper::body::Incoming>,
    check: KubeletCheck,
    checks: Arc<Semaphore>,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    let plain = |status: u16, text: &str| {
        let mut response = hyper::Response::new(Full::new(Bytes::from(text.to_string())));
        *response.status_mut() = hyper::StatusCode::from_u16(status).expect("a valid status");
        Ok(response)
    };
    if request.method() != hyper::Method::POST || request.uri().path() != WEBHOOK_PATH {
        return plain(404, "POST TokenReviews to /authenticate\n");
    }
    let body = match Limited::new(request.into_body(), MAX_REVIEW_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => return plain(413, &format!("the review: {e}\n")),
    };
    let review = match read_review(&body) {
        Ok(review) => review,
        Err(e) => return plain(400, &format!("{e}\n")),
    };
    let verdict = match checks.acquire().await {
        Ok(_permit) => decide(&check, &review.token).await,
        Err(_) => Err("the webhook is stopping".into()),
    };
    match &verdict {
        Ok(Verdict::Kubelet(node)) => tracing::trace!(node, "kubelet authenticated"),
        Ok(Verdict::Refused(why)) => tracing::debug!("token refused: {why}"),
        Err(e) => tracing::warn!("a kubelet's token could not be checked: {e}"),
    }
    let mut response = hyper::Response::new(Full::new(Bytes::from(
        answer(&review, &verdict).to_string(),
    )));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Serves TokenReviews on `listener` until the future is dropped.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    check: KubeletCheck,
) -> Result<(), String> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let checks = Arc::new(Semaphore::new(MAX_CHECKS));
    loop {
        let seat = connections
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| format!("the webhook's seats: {e}"))?;
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("accepting a webhook connection: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (acceptor, check, checks) = (acceptor.clone(), check.clone(), checks.clone());
        tokio::spawn(
            async move {
                let _seat = seat;
                let Ok(Ok(tls)) = tokio::time::timeout(HEADER_READ, acceptor.accept(stream)).await
                else {
                    return;
                };
                let service = hyper::service::service_fn(move |request| {
                    respond(request, check.clone(), checks.clone())
                });
                let _ = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ)
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            }
            .in_current_span(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_with(stored: Option<Vec<u8>>) -> KubeletCheck {
        Arc::new(move |_| {
            let stored = stored.clone();
            Box::pin(async move { Ok(stored) })
        })
    }

    #[tokio::test]
    async fn a_workers_newest_token_is_its_kubelet_and_nothing_else_is() {
        let made = kubelet_token::make("polis-w").unwrap();
        let check = check_with(Some(made.secret_sha256.clone()));
        assert_eq!(
            decide(&check, &made.token).await,
            Ok(Verdict::Kubelet("polis-w".into()))
        );
        let older = kubelet_token::make("polis-w").unwrap();
        assert!(matches!(
            decide(&check, &older.token).await,
            Ok(Verdict::Refused(_))
        ));
        assert!(matches!(
            decide(&check_with(None), &made.token).await,
            Ok(Verdict::Refused(_))
        ));
        assert!(matches!(
            decide(&check, "eyJhbGciOi.x.y").await,
            Ok(Verdict::Refused(_))
        ));
        let failing: KubeletCheck = Arc::new(|_| Box::pin(async { Err("no quorum".into()) }));
        assert!(decide(&failing, &made.token).await.is_err());
    }

    #[test]
    fn reviews_are_read_and_answered_in_their_own_version() {
        let review = read_review(
            br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview",
                 "spec":{"token":"abc","audiences":["https://kubernetes.default.svc"]}}"#,
        )
        .unwrap();
        assert_eq!(review.token, "abc");
        let yes = answer(&review, &Ok(Verdict::Kubelet("polis-w".into())));
        assert_eq!(yes["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(yes["status"]["authenticated"], true);
        assert_eq!(yes["status"]["user"]["username"], "system:node:polis-w");
        assert_eq!(yes["status"]["user"]["groups"][0], "system:nodes");
        assert_eq!(
            yes["status"]["audiences"][0],
            "https://kubernetes.default.svc"
        );
        let no = answer(&review, &Ok(Verdict::Refused("why".into())));
        assert_eq!(no["status"], json!({"authenticated": false}));
        let failed = answer(&review, &Err("etcd".into()));
        assert_eq!(failed["status"]["authenticated"], false);
        assert!(failed["status"]["error"].as_str().unwrap().contains("etcd"));
        for bad in [
            &b"not json"[..],
            br#"{"kind":"SubjectAccessReview","apiVersion":"authentication.k8s.io/v1"}"#,
            br#"{"kind":"TokenReview","apiVersion":"v1","spec":{"token":"a"}}"#,
            br#"{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","spec":{}}"#,
        ] {
            assert!(
                read_review(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_webhook_listens_on_the_controllers_loopback() {
        assert_eq!(
            webhook_address("10.0.0.5".parse().unwrap()),
            "127.0.0.1:6445".parse().unwrap()
        );
        assert_eq!(
            webhook_address("127.0.0.3".parse().unwrap()),
            "127.0.0.3:6445".parse().unwrap()
        );
    }
}
