//! The cluster CRL a node checks curators against before its own curator client runs:
//! while it registers (no node certificate yet) and while its data device is locked
//! (`data/node/crl.der` is on it). Gathered from what the node holds (the register
//! parameters' CRL, the ESP's copy) and from every curator it knows (GetCACertificate):
//! a CRL is signed by the cluster CA, so it may come from anywhere, and the newest by
//! CRL number is kept (`rpc::TrustSlot`). A curator whose certificate that CRL lists is
//! then refused at the handshake, as the running node's client refuses it.
//! A node on a data device keeps a copy of the newest CRL in its ESP
//! (`datakeys::crl_copy`) for the locked unlock.
//!
//! A leaf (on `datakeys`, `storage`): it asks, it decides nothing about the answers but
//! which CRL is newest.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use proto::api;

use crate::disk::datakeys;
use crate::disk::storage::{Root, write_atomic};

/// How long one curator gets to hand out its CRL.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(3);
/// How long asking every curator may take in all (a long list of silent endpoints
/// does not hold up the start beyond it).
pub const GATHER_TIMEOUT: Duration = Duration::from_secs(10);

/// Saves `crl` (the cluster's, newest seen) where the node reads it on its next start:
/// `data/node/crl.der`, and on a data device the ESP's copy too (read while data/ is
/// still locked).
pub fn save(root: &Root, crl: &[u8]) -> Result<()> {
    write_atomic(&root.cluster_crl(), crl).context("saving the cluster CRL")?;
    keep_esp_copy(root, crl)
}

/// On a data device: the ESP's copy made `crl` unless it is already (a node started
/// before the copy existed gets one on its first start).
pub fn keep_esp_copy(root: &Root, crl: &[u8]) -> Result<()> {
    let copy = datakeys::crl_copy(root);
    if !datakeys::local_half(root).exists() || std::fs::read(&copy).is_ok_and(|c| c == crl) {
        return Ok(());
    }
    write_atomic(&copy, crl).context("saving the cluster CRL in the ESP")
}

/// Offers `crl` from `source` to `slot`; one that no CA of the cluster signed is logged
/// and left out (a stranger's answer must not stop the node).
pub fn offer(slot: &rpc::TrustSlot, crl: &[u8], source: &str) {
    if crl.is_empty() {
        return;
    }
    match slot.offer(crl) {
        Ok(true) => tracing::debug!(source, "took a newer cluster CRL"),
        Ok(false) => {}
        Err(e) => tracing::warn!(source, "ignoring a cluster CRL: {e}"),
    }
}

/// The ESP's copy of the CRL offered to `slot`, if there is one.
pub fn offer_esp_copy(root: &Root, slot: &rpc::TrustSlot) -> Result<()> {
    let path = datakeys::crl_copy(root);
    match std::fs::read(&path) {
        Ok(crl) => {
            offer(slot, &crl, "the ESP");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Asks each of `endpoints` for the cluster's current CRL (checking their certificates
/// against what `slot` holds so far), each for at most [`ASK_TIMEOUT`], all for at most
/// [`GATHER_TIMEOUT`]; every CRL of a CA `slot` trusts is offered to it. Curators that
/// do not answer are skipped: what was gathered is what the caller checks with.
pub async fn gather(slot: &rpc::TrustSlot, endpoints: &[SocketAddr]) {
    let trust = rpc::ServerTrust::ClusterCa {
        trust: slot.clone(),
    };
    let ask = async |endpoint: SocketAddr| -> Result<Vec<u8>, String> {
        let channel = rpc::connect(endpoint, &trust, None)
            .await
            .map_err(|e| e.to_string())?;
        api::curator_local_client::CuratorLocalClient::new(channel)
            .get_ca_certificate(api::GetCaCertificateRequest::default())
            .await
            .map(|r| r.into_inner().crl)
            .map_err(|s| s.message().to_string())
    };
    let all = async {
        for endpoint in endpoints {
            match tokio::time::timeout(ASK_TIMEOUT, ask(*endpoint)).await {
                Ok(Ok(crl)) => offer(slot, &crl, &endpoint.to_string()),
                Ok(Err(e)) => tracing::debug!(%endpoint, "asking for the cluster CRL: {e}"),
                Err(_) => tracing::debug!(%endpoint, "asking for the cluster CRL: no answer"),
            }
        }
    };
    if tokio::time::timeout(GATHER_TIMEOUT, all).await.is_err() {
        tracing::debug!("asking the curators for the cluster CRL took too long; going on");
    }
}
