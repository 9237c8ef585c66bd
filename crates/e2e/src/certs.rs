//! Certificates in tests: reading PEM files, and probing an etcd peer port with a
//! given peer certificate.
//!
//! A leaf: may not start processes.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The DER inside a PEM file.
pub fn pem_der(path: &Path) -> Result<Vec<u8>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    Ok(pem::parse(text)?.into_contents())
}

/// An HTTP request to an etcd peer port with the given peer certificate: true when etcd
/// answers, false when it drops the connection (refused certificate).
pub async fn peer_accepts(
    peer: SocketAddr,
    ca_pem: &Path,
    cert_pem: &Path,
    key_pem: &Path,
) -> Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from(pem_der(ca_pem)?))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(
        vec![rustls::pki_types::CertificateDer::from(pem_der(cert_pem)?)],
        rustls::pki_types::PrivateKeyDer::Pkcs8(pem_der(key_pem)?.into()),
    )?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(peer).await?;
    let name = rustls::pki_types::ServerName::IpAddress(peer.ip().into());
    let exchange = async {
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(b"GET /version HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Ok(Ok(answer)) => Ok(answer.starts_with(b"HTTP/1.1 200")),
        Ok(Err(_)) => Ok(false),
        Err(_) => bail!("the etcd peer at {peer} neither answered nor closed"),
    }
}
