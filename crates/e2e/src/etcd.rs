//! etcd without polis-node ([`BareEtcd`]): its peer TLS files and the flags polis-node
//! would give it, for baselines and for testing etcd-backed libraries.
//!
//! Uses processes only; may not know about nodes or clusters.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::process::Proc;

/// etcd started directly, with the flags polis-node gives it (for baselines and for
/// testing etcd-backed libraries).
pub struct BareEtcd {
    pub proc: Proc,
    pub config: consensus::EtcdConfig,
}

impl BareEtcd {
    /// Writes peer TLS files into `dir` and spawns etcd (does not wait for readiness).
    pub fn spawn(dir: &Path, address: IpAddr, timing: consensus::RaftTiming) -> Result<BareEtcd> {
        Self::spawn_with(dir, address, timing, &[])
    }

    /// [`BareEtcd::spawn`] with `extra` flags after polis-node's.
    pub fn spawn_with(
        dir: &Path,
        address: IpAddr,
        timing: consensus::RaftTiming,
        extra: &[&str],
    ) -> Result<BareEtcd> {
        let key = identity::NodeKey::generate()?;
        let name = key.node_id();
        let ca = pki::Ca::generate("bare etcd CA", pki::CA_LIFETIME)?;
        let cert = ca.issue(
            &pki::Template {
                common_name: name.clone(),
                dns_names: vec![name.clone()],
                ip_addresses: vec![address, IpAddr::V4(Ipv4Addr::LOCALHOST)],
                usage: pki::Usage::ServerAndClient,
                lifetime: pki::CERTIFICATE_LIFETIME,
                kind: pki::CertificateKind::EtcdPeer,
            },
            &key.public_key(),
        )?;
        let peer = dir.join("peer");
        std::fs::create_dir_all(&peer)?;
        let pem = |tag: &str, der: &[u8]| pem::encode(&pem::Pem::new(tag, der));
        std::fs::write(peer.join("key.pem"), pem("PRIVATE KEY", key.pkcs8_der()))?;
        std::fs::write(peer.join("cert.pem"), pem("CERTIFICATE", &cert.der))?;
        std::fs::write(peer.join("ca.pem"), pem("CERTIFICATE", &ca.cert_der))?;
        std::fs::write(peer.join("crl.pem"), pem("X509 CRL", &ca.crl(&[], 1)?))?;
        let run_dir = dir.join("run");
        std::fs::create_dir_all(&run_dir)?;
        let config = consensus::EtcdConfig {
            binary: consensus::config::DEFAULT_ETCD_BINARY.into(),
            name: name.clone(),
            data_dir: dir.join("data"),
            run_dir: run_dir.clone(),
            peer_address: address,
            peer_port: consensus::config::PEER_PORT,
            peer_tls: consensus::PeerTlsFiles {
                cert: peer.join("cert.pem"),
                key: peer.join("key.pem"),
                ca: peer.join("ca.pem"),
                crl: peer.join("crl.pem"),
            },
            initial_cluster: vec![(
                name,
                consensus::config::peer_url(address, consensus::config::PEER_PORT),
            )],
            initial_cluster_state: consensus::InitialClusterState::New,
            cluster_token: "bare".into(),
            timing,
            readiness: consensus::Readiness::Linearizable,
            quota_backend_bytes: proto::quota::DEFAULT_QUOTA_BYTES,
            force_new_cluster: false,
        };
        Self::start(dir, config, extra)
    }

    /// Starts etcd again on the data and files of `config` (the previous process gone).
    pub fn start(dir: &Path, config: consensus::EtcdConfig, extra: &[&str]) -> Result<BareEtcd> {
        // A killed etcd leaves its socket behind, and etcd will not listen over it.
        let _ = std::fs::remove_file(config.socket_path());
        let mut cmd = Command::new(&config.binary);
        cmd.args(config.args())
            .args(extra)
            .current_dir(&config.run_dir);
        let proc = Proc::spawn("etcd", cmd, &dir.join("etcd.log"))?;
        Ok(BareEtcd { proc, config })
    }

    /// Connects to the socket once it exists (retrying until `timeout`).
    pub async fn client(&self, timeout: Duration) -> Result<etcd_client::Client> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.config.socket_path().exists()
                && let Ok(c) = consensus::connect_unix(&self.config.socket_path()).await
            {
                return Ok(c);
            }
            if Instant::now() > deadline {
                bail!("etcd socket did not come up within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A client once etcd serves linearizable requests.
    pub async fn ready_client(&self, timeout: Duration) -> Result<etcd_client::Client> {
        let deadline = Instant::now() + timeout;
        let mut client = self.client(timeout).await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(2), client.get("probe", None)).await {
                Ok(Ok(_)) => return Ok(client),
                _ if Instant::now() > deadline => bail!("etcd not ready within {timeout:?}"),
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}
