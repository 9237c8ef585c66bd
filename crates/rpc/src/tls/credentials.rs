//! A node's or user's own TLS credentials: a certificate with its key
//! ([`Credentials`]), a slot that renewal replaces while servers and clients use it
//! ([`CredentialSlot`], presented through `SlotResolver`), and self-signed credentials
//! that prove possession of a key and nothing else.
//!
//! May not decide whom to trust (that is `client_side` and `authenticator`).

use std::sync::Arc;

use rustls::SignatureScheme;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::crypto::provider;
use crate::RpcError;

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
/// with [`server_config_from`](super::server_config_from) present the current ones on
/// every new handshake, clients built with [`client_config_from`](super::client_config_from)
/// on every new connection, and long-lived channels compare
/// [`CredentialSlot::generation`] to notice that they were made with older ones.
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
pub(super) struct SlotResolver(pub(super) CredentialSlot);

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
