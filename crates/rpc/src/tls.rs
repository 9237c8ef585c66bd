//! TLS configuration: the curator's server side, clients, and client classification.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName,
    UnixTime,
};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::RpcError;
use crate::authz::Identity;

/// The only crypto provider Polis uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate and the PKCS#8 private key for it.
#[derive(Clone)]
pub struct Credentials {
    pub certificate: Vec<u8>,
    pub key_pkcs8: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

impl Credentials {
    fn chain(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        (
            vec![CertificateDer::from(self.certificate.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_pkcs8.clone())),
        )
    }
}

/// A self-signed certificate for `key`: proves possession of the key and nothing else.
pub fn self_signed(key: &identity::NodeKey) -> Result<Credentials, RpcError> {
    let pair = rcgen::KeyPair::try_from(key.pkcs8_der())
        .map_err(|e| RpcError::Certificate(e.to_string()))?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "polis self-signed");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::hours(1);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params
        .self_signed(&pair)
        .map_err(|e| RpcError::Certificate(e.to_string()))?;
    Ok(Credentials {
        certificate: cert.der().to_vec(),
        key_pkcs8: key.pkcs8_der().to_vec(),
    })
}

/// Checks handshake signatures: that the peer holds the key of the certificate it
/// presented. Kept even where the certificate itself is judged later (or never).
#[derive(Debug)]
struct ProofOfPossession {
    provider: Arc<CryptoProvider>,
}

impl ProofOfPossession {
    fn verify_tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }
    fn verify_tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }
    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The handshake-signature methods both rustls verifier traits require, delegated to
/// the verifier's `keys: ProofOfPossession`.
macro_rules! handshake_signature_checks {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.keys.verify_tls12(message, cert, dss)
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.keys.verify_tls13(message, cert, dss)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.keys.schemes()
        }
    };
}

/// Accepts any client certificate at the handshake (while still checking that the client
/// holds its key); who the client is gets decided per RPC by [`Authenticator`].
#[derive(Debug)]
struct DeferClientAuthentication {
    keys: ProofOfPossession,
}

impl ClientCertVerifier for DeferClientAuthentication {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    handshake_signature_checks!();
}

/// The curator's TLS server configuration (HTTP/2 only).
pub fn server_config(credentials: &Credentials) -> Result<Arc<rustls::ServerConfig>, RpcError> {
    let provider = provider();
    let (chain, key) = credentials.chain();
    let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(DeferClientAuthentication {
            keys: ProofOfPossession { provider },
        }))
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// How a client checks the server it talks to.
#[derive(Debug, Clone)]
pub enum ServerTrust {
    /// The server certificate must chain to this CA (DER) and name the address dialed.
    PinnedCa(Vec<u8>),
    /// Accept any server certificate: only for fetching the CA to pin (trust on first
    /// use, confirmed by the operator through its fingerprint).
    FirstUse,
}

#[derive(Debug)]
struct AcceptAnyServer {
    keys: ProofOfPossession,
}

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    handshake_signature_checks!();
}

/// A client TLS configuration (HTTP/2), optionally presenting `client` credentials.
pub fn client_config(
    trust: &ServerTrust,
    client: Option<&Credentials>,
) -> Result<Arc<rustls::ClientConfig>, RpcError> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let builder = match trust {
        ServerTrust::PinnedCa(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from(ca.clone()))
                .map_err(|e| RpcError::Certificate(format!("pinned CA: {e}")))?;
            builder.with_root_certificates(roots)
        }
        ServerTrust::FirstUse => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServer {
                keys: ProofOfPossession { provider },
            })),
    };
    let mut config = match client {
        Some(c) => {
            let (chain, key) = c.chain();
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

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
        Some(kind @ pki::CertificateKind::EtcdPeer) => Identity::Invalid {
            reason: format!("a {} certificate is not accepted here", kind.mark()),
        },
        None => Identity::Invalid {
            reason: "the certificate carries no known role mark".into(),
        },
    }
}

/// The verifier for one CRL, and what it concluded about certificates so far.
struct Verified {
    crl: Vec<u8>,
    verifier: Arc<dyn ClientCertVerifier>,
    /// Cluster certificates (DER) that verified, with who they are and until when.
    identities: std::collections::HashMap<Vec<u8>, (Identity, UnixTime)>,
}

/// Certificates whose classification is remembered per CRL. A client keeps presenting
/// the same one, call after call; verifying its signature again each time was a quarter
/// of the curator's CPU per call. Every node heartbeats with its own certificate, so
/// this must hold one per node and more: with 1024 (and the whole cache cleared when
/// full), 2000 heartbeating nodes kept verifying again (bench-heartbeats at 2000 nodes,
/// same bench both ways: p99 53 → 32 ms, curator CPU 0.79 → 0.50 ms per heartbeat).
/// 16384 entries hold 4× the 4096 connections a curator takes (`server::Limits`),
/// about 10 MB.
const REMEMBERED_CERTIFICATES: usize = 16384;

/// Decides who a client is from its certificate, the cluster CA and the current CRL.
pub struct Authenticator {
    ca: CertificateDer<'static>,
    /// The verifier for the last CRL seen, rebuilt (and its conclusions forgotten) when
    /// the CRL changes.
    verified: Mutex<Option<Verified>>,
}

impl Authenticator {
    pub fn new(ca_der: Vec<u8>) -> Authenticator {
        Authenticator {
            ca: CertificateDer::from(ca_der),
            verified: Mutex::new(None),
        }
    }

    fn verifier(&self, crl_der: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, String> {
        let mut cached = self.verified.lock().expect("verifier lock poisoned");
        if let Some(v) = cached.as_ref()
            && v.crl == crl_der
        {
            return Ok(v.verifier.clone());
        }
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca.clone())
            .map_err(|e| format!("cluster CA unusable: {e}"))?;
        let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .with_crls([CertificateRevocationListDer::from(crl_der.to_vec())])
            .build()
            .map_err(|e| format!("building verifier: {e}"))?;
        *cached = Some(Verified {
            crl: crl_der.to_vec(),
            verifier: v.clone(),
            identities: Default::default(),
        });
        Ok(v)
    }

    /// A remembered node or user identity for `leaf` under `crl_der`, still valid `now`.
    fn remembered(&self, leaf: &[u8], crl_der: &[u8], now: UnixTime) -> Option<Identity> {
        let cached = self.verified.lock().expect("verifier lock poisoned");
        let v = cached.as_ref().filter(|v| v.crl == crl_der)?;
        let (identity, until) = v.identities.get(leaf)?;
        (now.as_secs() < until.as_secs()).then(|| identity.clone())
    }

    fn remember(&self, leaf: &[u8], crl_der: &[u8], identity: &Identity, until: UnixTime) {
        let mut cached = self.verified.lock().expect("verifier lock poisoned");
        let Some(v) = cached.as_mut().filter(|v| v.crl == crl_der) else {
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

    /// Classifies the client certificate `leaf` (if any) against the CA and `crl_der`.
    pub fn classify(
        &self,
        leaf: Option<&CertificateDer<'_>>,
        crl_der: &[u8],
        now: UnixTime,
    ) -> Identity {
        let Some(leaf) = leaf else {
            return Identity::Anonymous;
        };
        if let Some(identity) = self.remembered(leaf, crl_der, now) {
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
        let verifier = match self.verifier(crl_der) {
            Ok(v) => v,
            Err(reason) => return Identity::Invalid { reason },
        };
        match verifier.verify_client_cert(leaf, &[], now) {
            Ok(_) => {
                let cn = parsed
                    .subject()
                    .iter_common_name()
                    .next()
                    .and_then(|cn| cn.as_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let identity =
                    classify_cluster_certificate(pki::CertificateKind::of(&parsed), cn, public_key);
                // Only what verified: a verdict that rests on the clock or a missing
                // signature is made afresh each call.
                if matches!(identity, Identity::Node { .. } | Identity::User { .. }) {
                    let until = parsed.validity().not_after.timestamp();
                    let until = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                        u64::try_from(until).unwrap_or(0),
                    ));
                    self.remember(leaf, crl_der, &identity, until);
                }
                identity
            }
            Err(e) if parsed.issuer() == parsed.subject() => {
                tracing::trace!("not a cluster certificate ({e}); treating as self-signed");
                Identity::SelfSigned { public_key }
            }
            Err(e) => Identity::Invalid {
                reason: e.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pki::{CertificateKind, Template, Usage};
    use std::time::Duration;

    /// A CA, its empty CRL, and an authenticator for it.
    fn cluster() -> (pki::Ca, Vec<u8>, Authenticator) {
        let ca = pki::Ca::generate("Polis Cluster CA", pki::CA_LIFETIME).unwrap();
        let crl = ca.crl(&[], 1).unwrap();
        let authenticator = Authenticator::new(ca.cert_der.clone());
        (ca, crl, authenticator)
    }

    fn issue(ca: &pki::Ca, key: &[u8; 32], cn: &str, kind: CertificateKind) -> Vec<u8> {
        let template = Template {
            common_name: cn.into(),
            dns_names: vec![],
            ip_addresses: vec![],
            usage: Usage::ServerAndClient,
            lifetime: Duration::from_secs(3600),
            kind,
        };
        ca.issue(&template, key).unwrap().der
    }

    /// A certificate from the cluster CA with no role mark at all (as issued before
    /// marks existed, or by a future issuer that forgot one).
    fn unmarked(ca: &pki::Ca, key: &identity::NodeKey, cn: &str) -> Vec<u8> {
        let issuer_key = rcgen::KeyPair::try_from(ca.key_pkcs8()).unwrap();
        let issuer =
            rcgen::Issuer::from_ca_cert_der(&ca.cert_der.clone().into(), issuer_key).unwrap();
        let subject = rcgen::KeyPair::try_from(key.pkcs8_der()).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.signed_by(&subject, &issuer).unwrap().der().to_vec()
    }

    #[derive(Debug, PartialEq)]
    enum Want {
        Anonymous,
        SelfSigned,
        Node,
        User(&'static str),
        Invalid,
    }

    fn kind_of(identity: &Identity) -> Want {
        match identity {
            Identity::Anonymous => Want::Anonymous,
            Identity::SelfSigned { .. } => Want::SelfSigned,
            Identity::Node { .. } => Want::Node,
            Identity::User { name, .. } => {
                Want::User(if name == "owner" { "owner" } else { "other" })
            }
            Identity::Invalid { .. } => Want::Invalid,
        }
    }

    /// An owner certificate (1 h) and a CRL revoking it.
    fn revoked_again(ca: &pki::Ca, pk: &[u8; 32]) -> (Option<Vec<u8>>, Vec<u8>) {
        let issued = ca
            .issue(
                &Template {
                    common_name: "owner".into(),
                    dns_names: vec![],
                    ip_addresses: vec![],
                    usage: Usage::Client,
                    lifetime: Duration::from_secs(3600),
                    kind: CertificateKind::Owner,
                },
                pk,
            )
            .unwrap();
        let crl = ca.crl(std::slice::from_ref(&issued.serial), 3).unwrap();
        (Some(issued.der), crl)
    }

    #[test]
    fn classification_table() {
        let (ca, crl, authenticator) = cluster();
        let key = identity::NodeKey::generate().unwrap();
        let pk = key.public_key();
        let id = key.node_id();
        let other_id = identity::NodeKey::generate().unwrap().node_id();
        let foreign = pki::Ca::generate("Foreign CA", pki::CA_LIFETIME).unwrap();
        let self_signed = self_signed(&key).unwrap().certificate;
        let expired = ca
            .issue_at(
                &Template {
                    common_name: "owner".into(),
                    dns_names: vec![],
                    ip_addresses: vec![],
                    usage: Usage::Client,
                    lifetime: Duration::from_secs(3600),
                    kind: CertificateKind::Owner,
                },
                &pk,
                time::OffsetDateTime::now_utc() - time::Duration::days(2),
            )
            .unwrap()
            .der;
        let revoked = ca.issue(
            &Template {
                common_name: "owner".into(),
                dns_names: vec![],
                ip_addresses: vec![],
                usage: Usage::Client,
                lifetime: Duration::from_secs(3600),
                kind: CertificateKind::Owner,
            },
            &pk,
        );
        let revoked = revoked.unwrap();
        let crl_with_revoked = ca.crl(std::slice::from_ref(&revoked.serial), 2).unwrap();

        let check = |name: &str, cert: Option<Vec<u8>>, crl: &[u8], want: Want| {
            let cert = cert.map(CertificateDer::from);
            let got = authenticator.classify(cert.as_ref(), crl, UnixTime::now());
            assert_eq!(kind_of(&got), want, "{name}: {got}");
        };
        let owner = CertificateKind::Owner;
        let node = CertificateKind::Node;
        check("no certificate", None, &crl, Want::Anonymous);
        check("self-signed", Some(self_signed), &crl, Want::SelfSigned);
        let c = issue(&ca, &pk, "owner", owner);
        check("owner mark", Some(c), &crl, Want::User("owner"));
        let c = issue(&ca, &pk, &id, node);
        check("node mark, own ID", Some(c), &crl, Want::Node);
        let c = issue(&ca, &pk, &other_id, node);
        check("node mark, other ID", Some(c), &crl, Want::Invalid);
        let c = issue(&ca, &pk, "owner", node);
        check("node mark, owner name", Some(c), &crl, Want::Invalid);
        let c = issue(&ca, &pk, &id, owner);
        check("owner mark, node ID", Some(c), &crl, Want::Invalid);
        let c = issue(&ca, &pk, "", owner);
        check("owner mark, empty name", Some(c), &crl, Want::Invalid);
        let c = issue(&ca, &pk, &id, CertificateKind::EtcdPeer);
        check("etcd peer mark", Some(c), &crl, Want::Invalid);
        let c = unmarked(&ca, &key, "owner");
        check("no mark, owner-like name", Some(c), &crl, Want::Invalid);
        let c = unmarked(&ca, &key, &id);
        check("no mark, node ID", Some(c), &crl, Want::Invalid);
        check("expired owner", Some(expired), &crl, Want::Invalid);
        let c = Some(revoked.der.clone());
        check("revoked owner", c, &crl_with_revoked, Want::Invalid);
        let c = Some(revoked.der);
        check("owner before revocation", c, &crl, Want::User("owner"));
        let c = issue(&foreign, &pk, "owner", owner);
        check("foreign CA, owner mark", Some(c), &crl, Want::Invalid);
        // Remembered verdicts never outlive a revocation or the certificate's lifetime.
        let c = revoked_again(&ca, &pk);
        check("owner, remembered", c.0.clone(), &crl, Want::User("owner"));
        check(
            "owner, remembered again",
            c.0.clone(),
            &crl,
            Want::User("owner"),
        );
        check("remembered, then revoked", c.0.clone(), &c.1, Want::Invalid);
        let cert = c.0.map(CertificateDer::from);
        let later =
            UnixTime::since_unix_epoch(Duration::from_secs(UnixTime::now().as_secs() + 2 * 3600));
        let got = authenticator.classify(cert.as_ref(), &crl, later);
        assert_eq!(
            kind_of(&got),
            Want::Invalid,
            "remembered past its expiry: {got}"
        );
        let c = b"not a certificate".to_vec();
        check("garbage", Some(c), &crl, Want::Invalid);
    }
}
