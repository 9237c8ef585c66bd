//! The node's side of talking to its curators: a leader-aware client with this node's
//! certificate that checks the curators' certificates against the cluster CA and the
//! newest cluster CRL, and that CRL's intake and persistence (`data/node/crl.der`).
//!
//! Builds clients; may not make calls itself, retry, or decide anything about roles.

use std::net::IpAddr;

use anyhow::{Context, Result};

use crate::crlfetch;
use crate::settings::Settings;
use crate::storage::read_file;
use crate::values::NodeValues;

/// The local address this node calls curators from: its own when it is a loopback one
/// (nodes sharing a machine on 127.x, in tests and `cluster launch`), so that curators,
/// which cap connections and registration streams per source, count each node as a
/// source of its own, as they do nodes on machines of their own; else the one the
/// system picks (a node's address may not be the route's source).
pub fn local_source(address: IpAddr) -> Option<IpAddr> {
    address.is_loopback().then_some(address)
}

/// A client of the cluster's curators with this node's certificate (the current one:
/// after a renewal its next call connects with the new certificate), checking theirs
/// against the cluster CA and the newest CRL this node has seen.
pub fn curator_client(settings: &Settings, values: &NodeValues) -> Result<rpc::CuratorClient> {
    let credentials = values.credentials.slot(&settings.root)?;
    Ok(rpc::CuratorClient::with_slot(
        values.curators.current().unwrap_or_default(),
        rpc::ServerTrust::ClusterCa {
            trust: trust(settings, values)?,
        },
        Some(credentials),
    )
    .with_epoch(values.epoch_seen.clone())
    .with_source(local_source(settings.address)))
}

/// What this node checks curators against: its trust slot, holding the cluster CA it
/// saved (`data/node/ca.der`, adopted on first use) and the newest CRL seen.
pub fn trust(settings: &Settings, values: &NodeValues) -> Result<rpc::TrustSlot> {
    let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
    values.trust.adopt(vec![ca]).with_context(|| {
        format!(
            "the cluster CA certificate in {} is unusable",
            settings.root.cluster_ca().display()
        )
    })?;
    Ok(values.trust.clone())
}

/// Takes `crl` (from a curator, or the saved copy) into the node's trust slot when a
/// CA of the cluster signed it and it is newer than the one held; saves it when it was
/// new (on a data device, the ESP's copy too: see `crlfetch`).
pub fn offer_crl(settings: &Settings, values: &NodeValues, crl: &[u8], save: bool) -> Result<()> {
    let slot = trust(settings, values)?;
    match slot.offer(crl) {
        Ok(true) if save => {
            crlfetch::save(&settings.root, crl)?;
            tracing::info!(
                revoked = pki::crl_serials(crl).map(|s| s.len()).unwrap_or_default(),
                "cluster CRL updated"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("ignoring a cluster CRL: {e}"),
    }
    Ok(())
}

/// Takes the CRL saved by an earlier run into the node's CRL slot, if there is one.
pub fn load_saved_crl(settings: &Settings, values: &NodeValues) -> Result<()> {
    let saved_crl = settings.root.cluster_crl();
    if saved_crl.exists() {
        let crl = read_file(&saved_crl, "cluster CRL")?;
        offer_crl(settings, values, &crl, false)?;
        let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
        if let Some(held) = values.trust.crl_of(&ca) {
            crlfetch::keep_esp_copy(&settings.root, &held)?;
        }
    }
    Ok(())
}
