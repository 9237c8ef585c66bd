//! Who a client is ([`Authenticator`]): its certificate checked against the cluster CAs
//! trusted (one, or two during a rotation), validity and the current CRLs, then
//! classified by the kind the CA marked it with (anonymous, self-signed, node, user,
//! operator, invalid). Verdicts on certificates that verified are remembered per
//! [`Anchors`] (CAs and CRLs) until the certificate expires.
//!
//! May not build TLS configurations or decide permissions (that is `authz`).

use std::sync::{Arc, Mutex};

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

use super::crypto::provider;
use super::trust_slot::Anchors;
use crate::authz::Identity;

/// Who holds a certificate that verified against the cluster CA, from the kind the CA
/// marked it with (`pki::CertificateKind`). The mark alone decides the kind; the name is
/// then checked against it. Anything unmarked, or marked for another purpose (an etcd
/// peer certificate), is denied rather than guessed at.
fn classify_cluster_certificate(
    kind: Option<pki::CertificateKind>,
    cn: String,
    public_key: Vec<u8>,
) -> Identity {
    match kind {
        Some(pki::CertificateKind::Node) => {
            let key_id = <[u8; 32]>::try_from(public_key.as_slice())
                .ok()
                .map(|k| identity::node_id(&k));
            if key_id.as_deref() == Some(cn.as_str()) {
                Identity::Node { id: cn, public_key }
            } else {
                Identity::Invalid {
                    reason: format!(
                        "node certificate names {cn:?}, which is not its key's identity"
                    ),
                }
            }
        }
        Some(pki::CertificateKind::Owner) => {
            if cn.is_empty() || cn.starts_with(identity::NODE_ID_PREFIX) {
                Identity::Invalid {
                    reason: format!("owner certificate with the name {cn:?}"),
                }
            } else {
                Identity::User {
                    name: cn,
                    public_key,
                }
            }
        }
        Some(pki::CertificateKind::Operator(role)) => match proto::operators::validate_name(&cn) {
            Ok(()) => Identity::Operator {
                name: cn,
                role,
                public_key,
            },
            Err(e) => Identity::Invalid {
                reason: format!("operator certificate: {e}"),
            },
        },
        Some(kind @ pki::CertificateKind::EtcdPeer) => Identity::Invalid {
            reason: format!("a {} certificate is not accepted here", kind.mark()),
        },
        // A curator's server certificate says "this serves the curator", not who calls:
        // curators call each other with their node certificates (forwarding), so
        // accepting it as a client would only widen what a stolen one could do.
        Some(kind @ pki::CertificateKind::Curator) => Identity::Invalid {
            reason: format!(
                "a {} certificate only serves the curator; it is no client identity",
                kind.mark()
            ),
        },
        None => Identity::Invalid {
            reason: "the certificate carries no known role mark".into(),
        },
    }
}

/// The verifier for one set of anchors, and what it concluded about certificates so far.
struct Verified {
    anchors: Anchors,
    verifier: Arc<dyn ClientCertVerifier>,
    /// Cluster certificates (DER) that verified, with who they are and until when.
    identities: std::collections::HashMap<Vec<u8>, (Identity, UnixTime)>,
}

/// Certificates whose classification is remembered per set of anchors. A client keeps presenting
/// the same one, call after call; verifying its signature again each time was a quarter
/// of the curator's CPU per call. Every node heartbeats with its own certificate, so
/// this must hold one per node and more: with 1024 (and the whole cache cleared when
/// full), 2000 heartbeating nodes kept verifying again (bench-heartbeats at 2000 nodes,
/// same bench both ways: p99 53 → 32 ms, curator CPU 0.79 → 0.50 ms per heartbeat).
/// 16384 entries hold 4× the 4096 connections a curator takes (`server::Limits`),
/// about 10 MB.
const REMEMBERED_CERTIFICATES: usize = 16384;

/// Decides who a client is from its certificate and the anchors it is given with it:
/// the cluster CAs trusted and their current CRLs.
#[derive(Default)]
pub struct Authenticator {
    /// The verifier for the last anchors seen, rebuilt (and its conclusions forgotten)
    /// when they change.
    verified: Mutex<Option<Verified>>,
}

impl Authenticator {
    pub fn new() -> Authenticator {
        Authenticator::default()
    }

    fn verifier(&self, anchors: &Anchors) -> Result<Arc<dyn ClientCertVerifier>, String> {
        let mut cached = self.verified.lock().expect("verifier lock poisoned");
        if let Some(v) = cached.as_ref()
            && v.anchors == *anchors
        {
            return Ok(v.verifier.clone());
        }
        // Every CA trusted must come with its CRL: a certificate of a CA whose CRL is
        // missing is refused (its revocation status is unknown), never let through.
        let v = WebPkiClientVerifier::builder_with_provider(anchors.roots()?, provider())
            .with_crls(anchors.crl_ders())
            .build()
            .map_err(|e| format!("building verifier: {e}"))?;
        *cached = Some(Verified {
            anchors: anchors.clone(),
            verifier: v.clone(),
            identities: Default::default(),
        });
        Ok(v)
    }

    /// A remembered node or user identity for `leaf` under `anchors`, still valid `now`.
    fn remembered(&self, leaf: &[u8], anchors: &Anchors, now: UnixTime) -> Option<Identity> {
        let cached = self.verified.lock().expect("verifier lock poisoned");
        let v = cached.as_ref().filter(|v| v.anchors == *anchors)?;
        let (identity, until) = v.identities.get(leaf)?;
        (now.as_secs() < until.as_secs()).then(|| identity.clone())
    }

    fn remember(&self, leaf: &[u8], anchors: &Anchors, identity: &Identity, until: UnixTime) {
        let mut cached = self.verified.lock().expect("verifier lock poisoned");
        let Some(v) = cached.as_mut().filter(|v| v.anchors == *anchors) else {
            return;
        };
        if v.identities.len() >= REMEMBERED_CERTIFICATES {
            // Expired ones first; if that is not enough, an arbitrary quarter (hash
            // order), so the rest keep being served from memory.
            let now = UnixTime::now().as_secs();
            v.identities.retain(|_, (_, until)| until.as_secs() > now);
            let mut dropped = 0;
            let excess = v
                .identities
                .len()
                .saturating_sub(REMEMBERED_CERTIFICATES * 3 / 4);
            v.identities.retain(|_, _| {
                dropped += 1;
                dropped > excess
            });
        }
        v.identities
            .insert(leaf.to_vec(), (identity.clone(), until));
    }

    /// Classifies the client certificate `leaf` (if any) against `anchors`.
    pub fn classify(
        &self,
        leaf: Option<&CertificateDer<'_>>,
        anchors: &Anchors,
        now: UnixTime,
    ) -> Identity {
        let Some(leaf) = leaf else {
            return Identity::Anonymous;
        };
        if let Some(identity) = self.remembered(leaf, anchors, now) {
            return identity;
        }
        let parsed = match x509_parser::parse_x509_certificate(leaf) {
            Ok((_, c)) => c,
            Err(e) => {
                return Identity::Invalid {
                    reason: format!("malformed certificate: {e}"),
                };
            }
        };
        let public_key = parsed.public_key().subject_public_key.data.to_vec();
        let verifier = match self.verifier(anchors) {
            Ok(v) => v,
            Err(reason) => return Identity::Invalid { reason },
        };
        match verifier.verify_client_cert(leaf, &[], now) {
            Ok(_) => {
                let cn = pki::common_name(parsed.subject());
                let identity =
                    classify_cluster_certificate(pki::CertificateKind::of(&parsed), cn, public_key);
                // Only what verified: a verdict that rests on the clock or a missing
                // signature is made afresh each call.
                if matches!(identity, Identity::Node { .. }) || identity.is_user() {
                    let until = parsed.validity().not_after.timestamp();
                    let until = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                        u64::try_from(until).unwrap_or(0),
                    ));
                    self.remember(leaf, anchors, &identity, until);
                }
                identity
            }
            Err(e) if parsed.issuer() == parsed.subject() => {
                tracing::trace!("not a cluster certificate ({e}); treating as self-signed");
                Identity::SelfSigned { public_key }
            }
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked)) => {
                Identity::Invalid {
                    reason: crate::REVOKED.to_string(),
                }
            }
            Err(e) => Identity::Invalid {
                reason: e.to_string(),
            },
        }
    }
}
