//! Any curator serves every call: a follower forwards what only the leader can answer,
//! carrying the caller's verified identity.
//!
//! ```text
//!   client ──mTLS──▶ follower: AuthLayer (classify + authorize the caller)
//!                       └─ ForwardLayer: not servable here ─▶ leader, over mTLS with the
//!                          follower's NODE certificate, header x-polis-forwarded-identity
//!   leader: AuthLayer ── header present: accepted only if the TLS caller is a node that
//!                        holds the ConsensusMember role (a curator); the forwarded
//!                        identity then replaces the caller's for authorization
//! ```
//! The trust rule: only a consensus member's certificate may present a forwarded
//! identity. A worker or owner that sends the header is denied, whatever it claims.
//! What this layer lets through is served here; a leader's answers to reads then wait
//! for its proof that it still leads (the curator's `ConfirmLayer`, inside this one).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::Bytes;
use tonic::transport::Channel;

use crate::authz::Identity;

/// The header that carries a forwarded caller's identity.
pub const FORWARDED_IDENTITY: &str = "x-polis-forwarded-identity";

/// How the leader's refusal of an untrusted forwarder begins. A curator whose node just
/// lost its role may still forward for a moment; its client then hears Unavailable
/// (retry elsewhere), not this final-sounding refusal.
pub const UNTRUSTED_FORWARDER: &str = "only a consensus member may forward a caller's identity";

/// Encodes an identity for [`FORWARDED_IDENTITY`]; invalid identities are never
/// forwarded (they were denied before).
pub fn encode_identity(identity: &Identity) -> Option<String> {
    Some(match identity {
        Identity::Anonymous => "anonymous".to_string(),
        Identity::SelfSigned { public_key } => format!("self-signed:{}", hex::encode(public_key)),
        Identity::Node { id, public_key } => format!("node:{id}:{}", hex::encode(public_key)),
        Identity::User { name, public_key } => {
            format!("user:{}:{}", hex::encode(name), hex::encode(public_key))
        }
        // Earlier leaders cannot decode this, so they refuse a forwarded operator
        // rather than mistake it for the owner.
        Identity::Operator {
            name,
            role,
            public_key,
        } => format!(
            "operator:{role}:{}:{}",
            hex::encode(name),
            hex::encode(public_key)
        ),
        Identity::Invalid { .. } => return None,
    })
}

/// Decodes [`encode_identity`]'s output; `None` for anything else.
pub fn decode_identity(text: &str) -> Option<Identity> {
    let key = |h: &str| hex::decode(h).ok();
    let mut parts = text.split(':');
    if text.starts_with("operator:") {
        let (_, role, name, k) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let name = String::from_utf8(hex::decode(name).ok()?).ok()?;
        proto::operators::validate_name(&name).ok()?;
        let identity = Identity::Operator {
            name,
            role: crate::authz::OperatorRole::from_name(role)?,
            public_key: key(k)?,
        };
        return parts.next().is_none().then_some(identity);
    }
    let identity = match (parts.next()?, parts.next(), parts.next()) {
        ("anonymous", None, None) => Identity::Anonymous,
        ("self-signed", Some(k), None) => Identity::SelfSigned {
            public_key: key(k)?,
        },
        ("node", Some(id), Some(k)) => {
            identity::validate_node_id(id).ok()?;
            Identity::Node {
                id: id.to_string(),
                public_key: key(k)?,
            }
        }
        ("user", Some(name), Some(k)) => Identity::User {
            name: String::from_utf8(hex::decode(name).ok()?).ok()?,
            public_key: key(k)?,
        },
        _ => return None,
    };
    parts.next().is_none().then_some(identity)
}

/// A call to forward: the channel to the leader, and what to do when it fails (e.g.
/// drop a cached channel whose connection died).
pub struct Forward {
    pub channel: Channel,
    pub on_failure: Box<dyn FnOnce() + Send>,
}

/// Where a call goes: served here (`None`), or forwarded.
pub type ForwardDecision = Option<Forward>;

/// Decides, per method, whether this curator serves a call or forwards it.
pub type Forwarding =
    Arc<dyn Fn(&str) -> Pin<Box<dyn Future<Output = ForwardDecision> + Send>> + Send + Sync>;

/// Tower layer (inside [`crate::AuthLayer`]): forwards calls the decision sends away.
#[derive(Clone)]
pub struct ForwardLayer {
    decide: Forwarding,
}

impl ForwardLayer {
    pub fn new(decide: Forwarding) -> ForwardLayer {
        ForwardLayer { decide }
    }
}

impl<S> tower::Layer<S> for ForwardLayer {
    type Service = ForwardService<S>;
    fn layer(&self, inner: S) -> ForwardService<S> {
        ForwardService {
            inner,
            decide: self.decide.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ForwardService<S> {
    inner: S,
    decide: Forwarding,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for ForwardService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
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
        let decide = self.decide.clone();
        Box::pin(async move {
            let method = request.uri().path().to_string();
            let Some(Forward {
                channel: leader,
                on_failure,
            }) = decide(&method).await
            else {
                return Ok(inner.call(request).await?.map(tonic::body::Body::new));
            };
            let identity = request.extensions().get::<Identity>().cloned();
            let Some(encoded) = identity.as_ref().and_then(encode_identity) else {
                return Ok(
                    tonic::Status::permission_denied("no verified caller to forward").into_http(),
                );
            };
            let (mut parts, body) = request.into_parts();
            let header = match http::HeaderValue::from_str(&encoded) {
                Ok(h) => h,
                Err(_) => {
                    return Ok(tonic::Status::internal("unencodable caller identity").into_http());
                }
            };
            parts.headers.insert(FORWARDED_IDENTITY, header);
            parts.extensions = http::Extensions::new();
            let forwarded = http::Request::from_parts(parts, tonic::body::Body::new(body));
            tracing::debug!(method, "forwarding to the leader");
            // A Channel must be polled ready before each call: oneshot does both.
            match tower::ServiceExt::oneshot(leader, forwarded).await {
                Ok(response) if refused_as_forwarder(&response) => Ok(tonic::Status::unavailable(
                    "this curator no longer serves (its node left consensus); retry another",
                )
                .into_http()),
                Ok(response) => Ok(response),
                Err(e) => {
                    on_failure();
                    Ok(tonic::Status::unavailable(format!(
                        "forwarding to the curator leader failed: {e}"
                    ))
                    .into_http())
                }
            }
        })
    }
}

/// Whether the leader refused this curator as a forwarder (a trailers-only answer).
fn refused_as_forwarder<B>(response: &http::Response<B>) -> bool {
    // The message travels percent-encoded: let tonic decode it.
    tonic::Status::from_header_map(response.headers()).is_some_and(|s| {
        s.code() == tonic::Code::PermissionDenied && s.message().starts_with(UNTRUSTED_FORWARDER)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untrusted_forwarder_refusal_is_recognized_through_encoding() {
        let refusal =
            tonic::Status::permission_denied(format!("{UNTRUSTED_FORWARDER}; caller is node x"))
                .into_http::<tonic::body::Body>();
        assert!(refused_as_forwarder(&refusal));
        let other =
            tonic::Status::permission_denied("requires Manage").into_http::<tonic::body::Body>();
        assert!(!refused_as_forwarder(&other));
    }

    #[test]
    fn identities_round_trip_and_garbage_is_refused() {
        let all = [
            Identity::Anonymous,
            Identity::SelfSigned {
                public_key: vec![1; 32],
            },
            Identity::Node {
                id: format!("polis-{}", "ab".repeat(16)),
                public_key: vec![2; 32],
            },
            Identity::User {
                name: "owner:with:colons".into(),
                public_key: vec![3; 32],
            },
            Identity::Operator {
                name: "ada".into(),
                role: crate::authz::OperatorRole::Reader,
                public_key: vec![4; 32],
            },
            Identity::Operator {
                name: "otto_2".into(),
                role: crate::authz::OperatorRole::Admin,
                public_key: vec![5; 32],
            },
        ];
        for identity in all {
            let text = encode_identity(&identity).unwrap();
            assert_eq!(decode_identity(&text), Some(identity));
        }
        assert_eq!(
            encode_identity(&Identity::Invalid {
                reason: "expired".into()
            }),
            None
        );
        for bad in [
            "",
            "root",
            "node:polis-x:00",
            "user:zz:00",
            "self-signed:00:extra",
            "anonymous:x",
            // An operator's name must be a valid one, its role known.
            "operator:admin:4f776e6572:00",
            "operator:root:616461:00",
            "operator:admin:616461",
            "operator:admin:616461:00:extra",
            "operator:admin:6f776e6572:00",
        ] {
            assert_eq!(decode_identity(bad), None, "{bad}");
        }
    }
}

/// Properties over arbitrary identities and header values (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn identity() -> impl Strategy<Value = Identity> {
        let key = prop::collection::vec(any::<u8>(), 0..40);
        prop_oneof![
            Just(Identity::Anonymous),
            key.clone()
                .prop_map(|public_key| Identity::SelfSigned { public_key }),
            ("polis-[0-9a-f]{32}", key.clone())
                .prop_map(|(id, public_key)| Identity::Node { id, public_key }),
            (any::<String>(), key)
                .prop_map(|(name, public_key)| Identity::User { name, public_key }),
        ]
    }

    proptest! {
        #[test]
        fn identities_round_trip(identity in identity()) {
            let text = encode_identity(&identity).unwrap();
            prop_assert!(http::HeaderValue::from_str(&text).is_ok(), "{}", text);
            prop_assert_eq!(decode_identity(&text), Some(identity));
        }

        #[test]
        fn what_decodes_encodes_to_the_same_text(
            text in prop_oneof![any::<String>(), "(anonymous|self-signed|node|user)(:[0-9a-fpolis-]{0,8}){0,3}"],
        ) {
            if let Some(identity) = decode_identity(&text) {
                let again = encode_identity(&identity).unwrap();
                prop_assert_eq!(decode_identity(&again), Some(identity));
            }
        }
    }
}
