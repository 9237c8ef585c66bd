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

/// Credentials that can be replaced while in use (certificate renewal): servers built
/// with [`server_config_from`] present the current ones on every new handshake, clients
/// built with [`client_config_from`] on every new connection, and long-lived channels
/// compare [`CredentialSlot::generation`] to notice that they were made with older ones.
/// Clones share the slot.
#[derive(Clone)]
pub struct CredentialSlot(Arc<std::sync::RwLock<Arc<Loaded>>>);

/// Credentials with the rustls key they were parsed into, once.
struct Loaded {
    generation: u64,
    credentials: Credentials,
    certified: Arc<rustls::sign::CertifiedKey>,
}

impl std::fmt::Debug for CredentialSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialSlot")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl CredentialSlot {
    /// A slot holding `credentials`; refuses a key that does not load or does not match.
    pub fn new(credentials: Credentials) -> Result<CredentialSlot, RpcError> {
        Ok(CredentialSlot(Arc::new(std::sync::RwLock::new(Arc::new(
            Self::load(credentials, 0)?,
        )))))
    }

    fn load(credentials: Credentials, generation: u64) -> Result<Loaded, RpcError> {
        let (chain, key) = credentials.chain();
        let certified = rustls::sign::CertifiedKey::from_der(chain, key, &provider())?;
        Ok(Loaded {
            generation,
            credentials,
            certified: Arc::new(certified),
        })
    }

    fn loaded(&self) -> Arc<Loaded> {
        self.0
            .read()
            .expect("credential slot lock poisoned")
            .clone()
    }

    /// Replaces the credentials for every later handshake; refuses (and keeps the old
    /// ones) when the new key does not load or does not match the certificate.
    pub fn replace(&self, credentials: Credentials) -> Result<(), RpcError> {
        let mut current = self.0.write().expect("credential slot lock poisoned");
        *current = Arc::new(Self::load(credentials, current.generation + 1)?);
        Ok(())
    }

    /// The current credentials.
    pub fn credentials(&self) -> Credentials {
        self.loaded().credentials.clone()
    }

    /// Grows by one with every [`CredentialSlot::replace`].
    pub fn generation(&self) -> u64 {
        self.loaded().generation
    }
}

/// Presents a slot's current credentials (server and client side).
#[derive(Debug)]
struct SlotResolver(CredentialSlot);

impl rustls::server::ResolvesServerCert for SlotResolver {
    fn resolve(
        &self,
        _client_hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.loaded().certified.clone())
    }
}

impl rustls::client::ResolvesClientCert for SlotResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.loaded().certified.clone())
    }
    fn has_certs(&self) -> bool {
        true
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

/// The curator's TLS server configuration (HTTP/2 only) with fixed credentials.
pub fn server_config(credentials: &Credentials) -> Result<Arc<rustls::ServerConfig>, RpcError> {
    server_config_from(&CredentialSlot::new(credentials.clone())?)
}

/// The curator's TLS server configuration (HTTP/2 only), presenting whatever `slot`
/// holds at each handshake: a renewed certificate is served from the next one on.
pub fn server_config_from(slot: &CredentialSlot) -> Result<Arc<rustls::ServerConfig>, RpcError> {
    let provider = provider();
    let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(DeferClientAuthentication {
            keys: ProofOfPossession { provider },
        }))
        .with_cert_resolver(Arc::new(SlotResolver(slot.clone())));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The newest cluster CRL a client has seen, shared by all its connections: a server
/// whose certificate it lists is refused at the handshake, so that a node removed from
/// the cluster cannot pose as a curator. CRLs are accepted only when signed by the
/// cluster CA and not older (by CRL number) than the one held, so it does not matter
/// which server delivered them.
#[derive(Debug, Clone, Default)]
pub struct CrlSlot(Arc<Mutex<Option<HeldCrl>>>);

/// A CRL (DER) and its CRL number.
type HeldCrl = (Vec<u8>, u64);

impl CrlSlot {
    pub fn new() -> CrlSlot {
        CrlSlot::default()
    }

    /// The CRL held (DER), if any.
    pub fn current(&self) -> Option<Vec<u8>> {
        self.0
            .lock()
            .expect("CRL slot lock poisoned")
            .as_ref()
            .map(|(der, _)| der.clone())
    }

    /// Offers `crl_der`: kept when signed by `ca_der` and at least as new as the CRL
    /// held. Returns whether it replaced that CRL (false: the same or an older one).
    pub fn offer(&self, ca_der: &[u8], crl_der: &[u8]) -> Result<bool, RpcError> {
        let number = pki::verified_crl_number(crl_der, ca_der)
            .map_err(|e| RpcError::Certificate(format!("cluster CRL: {e}")))?;
        let mut held = self.0.lock().expect("CRL slot lock poisoned");
        match held.as_ref() {
            Some((der, n)) if *n > number || (*n == number && der == crl_der) => Ok(false),
            _ => {
                *held = Some((crl_der.to_vec(), number));
                Ok(true)
            }
        }
    }
}

/// How a client checks the server it talks to.
#[derive(Debug, Clone)]
pub enum ServerTrust {
    /// The server certificate must chain to this CA (DER) and name the address dialed.
    PinnedCa(Vec<u8>),
    /// As `PinnedCa`, and the certificate must not be on the CRL in `crl` (as it is
    /// when the connection is made): what nodes and owners use once they belong to the
    /// cluster.
    ClusterCa { ca: Vec<u8>, crl: CrlSlot },
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
    client_config_from(
        trust,
        client
            .map(|c| CredentialSlot::new(c.clone()))
            .transpose()?
            .as_ref(),
    )
}

/// A client TLS configuration (HTTP/2), presenting what `client` holds at each
/// handshake, if given.
pub fn client_config_from(
    trust: &ServerTrust,
    client: Option<&CredentialSlot>,
) -> Result<Arc<rustls::ClientConfig>, RpcError> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let pinned = |ca: &Vec<u8>| -> Result<Arc<rustls::RootCertStore>, RpcError> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca.clone()))
            .map_err(|e| RpcError::Certificate(format!("pinned CA: {e}")))?;
        Ok(Arc::new(roots))
    };
    let builder = match trust {
        ServerTrust::PinnedCa(ca) => builder.with_root_certificates(pinned(ca)?),
        ServerTrust::ClusterCa { ca, crl } => match crl.current() {
            None => builder.with_root_certificates(pinned(ca)?),
            Some(crl) => {
                let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    pinned(ca)?,
                    provider,
                )
                .with_crls([CertificateRevocationListDer::from(crl)])
                .build()
                .map_err(|e| RpcError::Certificate(format!("cluster CRL: {e}")))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(verifier)
            }
        },
        ServerTrust::FirstUse => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServer {
                keys: ProofOfPossession { provider },
            })),
    };
    let mut config = match client {
        Some(slot) => builder.with_client_cert_resolver(Arc::new(SlotResolver(slot.clone()))),
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

    /// One TLS handshake with a server presenting `server` (at 127.0.0.1), as a client
    /// trusting `trust`.
    async fn handshake(server: &Credentials, trust: &ServerTrust) -> Result<(), String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config(server).unwrap());
        let serving = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let _ = acceptor.accept(tcp).await;
        });
        let connector = tokio_rustls::TlsConnector::from(client_config(trust, None).unwrap());
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let name = ServerName::IpAddress(address.ip().into());
        let outcome = connector
            .connect(name, tcp)
            .await
            .map(drop)
            .map_err(|e| e.to_string());
        serving.abort();
        outcome
    }

    #[tokio::test]
    async fn a_revoked_server_is_refused_by_clients_holding_the_crl() {
        let (ca, empty_crl, _) = cluster();
        let key = identity::NodeKey::generate().unwrap();
        let issued = ca
            .issue(
                &Template {
                    common_name: key.node_id(),
                    dns_names: vec![key.node_id()],
                    ip_addresses: vec![[127, 0, 0, 1].into()],
                    usage: Usage::ServerAndClient,
                    lifetime: Duration::from_secs(3600),
                    kind: CertificateKind::Node,
                },
                &key.public_key(),
            )
            .unwrap();
        let server = Credentials {
            certificate: issued.der.clone(),
            key_pkcs8: key.pkcs8_der().to_vec(),
        };
        let revoking = ca.crl(std::slice::from_ref(&issued.serial), 2).unwrap();
        let slot = CrlSlot::new();
        let trust = ServerTrust::ClusterCa {
            ca: ca.cert_der.clone(),
            crl: slot.clone(),
        };
        handshake(&server, &trust).await.expect("no CRL yet");
        assert!(slot.offer(&ca.cert_der, &empty_crl).unwrap());
        handshake(&server, &trust).await.expect("not revoked");
        assert!(slot.offer(&ca.cert_der, &revoking).unwrap());
        let refused = handshake(&server, &trust).await.unwrap_err();
        assert!(refused.contains("Revoked"), "{refused}");
        // An older CRL does not undo the revocation; a CRL of another CA is refused.
        assert!(!slot.offer(&ca.cert_der, &empty_crl).unwrap());
        assert!(handshake(&server, &trust).await.is_err());
        let foreign = pki::Ca::generate("Polis Cluster CA", pki::CA_LIFETIME).unwrap();
        let foreign_crl = foreign.crl(&[], 9).unwrap();
        assert!(slot.offer(&ca.cert_der, &foreign_crl).is_err());
        // Without the CRL, the same server passes: it is the CRL that refuses it.
        let pinned = ServerTrust::PinnedCa(ca.cert_der.clone());
        handshake(&server, &pinned).await.expect("pinned CA only");
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
        // Revocation is named as such: a node learns from it that it left the cluster.
        let leaf = CertificateDer::from(revoked.der.clone());
        let got = authenticator.classify(Some(&leaf), &crl_with_revoked, UnixTime::now());
        assert!(
            matches!(&got, Identity::Invalid { reason } if reason.contains(crate::REVOKED)),
            "{got:?}"
        );
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
