//! The node's side of talking to its curators: a leader-aware client with this node's
//! certificate that checks the curators' certificates against the cluster CA and the
//! newest cluster CRL, and that CRL's intake and persistence (`data/node/crl.der`).
//!
//! Builds clients; may not make calls itself, retry, or decide anything about roles.

use std::net::IpAddr;

use anyhow::{Context, Result};

use crate::curators::crlfetch;
use crate::disk::storage::read_file;
use crate::state::settings::Settings;
use crate::state::values::NodeValues;

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

/// What this node checks curators against: its trust slot, holding the cluster CAs it
/// saved (adopted on first use: `data/node/trust.pem` once a curator named them, else
/// the CA it joined under, `data/node/ca.der`) and the newest CRLs seen.
pub fn trust(settings: &Settings, values: &NodeValues) -> Result<rpc::TrustSlot> {
    if values.trust.cas().is_empty() {
        let ca = read_file(&settings.root.cluster_ca(), "cluster CA certificate")?;
        adopt_saved(&values.trust, &settings.root.cluster_trust(), ca)?;
    }
    Ok(values.trust.clone())
}

/// Makes the empty `slot` trust the CAs saved in `saved` (with their CRLs) or, when
/// nothing is saved there, `ca` (the CA the node joined under).
pub fn adopt_saved(slot: &rpc::TrustSlot, saved: &std::path::Path, ca: Vec<u8>) -> Result<()> {
    let (cas, crls) = match saved_trust(saved)? {
        Some(anchors) => (anchors.cas, anchors.crls),
        None => (vec![ca], Vec::new()),
    };
    if slot
        .adopt(cas)
        .with_context(|| format!("the cluster CAs in {} are unusable", saved.display()))?
    {
        for crl in crls {
            crlfetch::offer(slot, &crl, "the saved trust");
        }
    }
    Ok(())
}

/// A slot trusting what `saved` holds, else `ca` alone (see [`adopt_saved`]).
pub fn saved_slot(saved: &std::path::Path, ca: Vec<u8>) -> Result<rpc::TrustSlot> {
    let slot = rpc::TrustSlot::empty();
    adopt_saved(&slot, saved, ca)?;
    Ok(slot)
}

/// The CAs and CRLs saved in `path` (PEM: CERTIFICATE and X509 CRL blocks), if any.
pub fn saved_trust(path: &std::path::Path) -> Result<Option<rpc::Anchors>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let blocks =
        pem::parse_many(&text).with_context(|| format!("{} is not PEM", path.display()))?;
    let mut anchors = rpc::Anchors::default();
    for block in blocks {
        match block.tag() {
            "CERTIFICATE" => anchors.cas.push(block.into_contents()),
            "X509 CRL" => anchors.crls.push(block.into_contents()),
            other => anyhow::bail!("{} holds a {other} block", path.display()),
        }
    }
    if anchors.cas.is_empty() {
        anyhow::bail!("{} names no CA", path.display());
    }
    Ok(Some(anchors))
}

/// Trusts exactly `cas` (signing first) with their `crls`, as a curator named them, and
/// saves them (`data/node/trust.pem`) when that changed anything: a CA rotation's
/// step. Refused (logged, nothing changes) when the list keeps none of the CAs trusted
/// now: no rotation's step does that.
pub fn apply_trust(
    settings: &Settings,
    values: &NodeValues,
    cas: &[prost::bytes::Bytes],
    crls: &[prost::bytes::Bytes],
) -> Result<()> {
    let slot = trust(settings, values)?;
    let before = slot.anchors();
    match slot.trust(cas.iter().map(|c| c.to_vec()).collect()) {
        Ok(true) => tracing::info!(
            cas = ?cas.iter().map(|c| rpc::fingerprint(c)).collect::<Vec<_>>(),
            "trusting the cluster CAs a curator named (a CA rotation)"
        ),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!("ignoring the cluster CAs a curator named: {e}");
            return Ok(());
        }
    }
    // Each taken the way a single CRL is (saved in data/node/crl.der when new): every
    // trusted CA's CRL lists every revocation.
    for crl in crls.iter().filter(|c| !c.is_empty()) {
        offer_crl(settings, values, crl, true)?;
    }
    let after = slot.anchors();
    if after != before {
        let mut text = Vec::new();
        for ca in &after.cas {
            text.extend(crate::disk::storage::pem("CERTIFICATE", ca));
        }
        for crl in &after.crls {
            text.extend(crate::disk::storage::pem("X509 CRL", crl));
        }
        crate::disk::storage::write_atomic(&settings.root.cluster_trust(), &text)
            .context("saving the cluster CAs trusted")?;
        // A data device: the locked unlock reads the ESP's copy.
        if crate::disk::datakeys::local_half(&settings.root).exists() {
            crate::disk::storage::write_atomic(
                &crate::disk::datakeys::trust_copy(&settings.root),
                &text,
            )
            .context("saving the cluster CAs trusted in the ESP")?;
        }
    }
    Ok(())
}

/// Puts `certificate` (DER, for the key `slot` holds) in use: loaded first (a
/// certificate rustls refuses never reaches the disk), saved, then applied to every
/// client and the curator's server (their next handshake uses it).
pub fn install_node_certificate(
    settings: &Settings,
    slot: &rpc::CredentialSlot,
    certificate: &[u8],
) -> Result<()> {
    let renewed = rpc::Credentials {
        certificate: certificate.to_vec(),
        key_pkcs8: slot.credentials().key_pkcs8,
    };
    rpc::CredentialSlot::new(renewed.clone()).context("loading the new node certificate")?;
    crate::disk::storage::write_atomic(&settings.root.node_certificate(), certificate)
        .context("saving the new node certificate")?;
    slot.replace(renewed)
        .context("applying the new node certificate")
}

/// The SHA-256 fingerprints of the cluster CAs this node trusts, and of the one that
/// issued `certificate` (empty when none of them did): what it reports in its status.
pub fn trust_report(values: &NodeValues, certificate: &[u8]) -> (Vec<String>, String) {
    let cas = values.trust.cas();
    let issuer = cas
        .iter()
        .find(|ca| pki::issued_by(certificate, ca))
        .map(|ca| rpc::fingerprint(ca))
        .unwrap_or_default();
    (cas.iter().map(|c| rpc::fingerprint(c)).collect(), issuer)
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
