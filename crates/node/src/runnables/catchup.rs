//! The `root.role.catchup` runnable: brings back a node that missed a whole CA
//! rotation (off, or cut off, while `rotate-ca --force` moved on and retired the CA it
//! trusts and its node certificate chains to).
//!
//! ```text
//!   every CHECK while the node is not Home (heartbeats do not get through):
//!   handover::ask(curators) ──▶ handover::successor(trusted, answer)
//!     a chain leads to the presented CA, and this node's certificate is still valid
//!       ──▶ trust it (curator_client::apply_trust: data/node/trust.pem, the ESP's copy)
//!   this node's certificate issued by no CA the cluster trusts now, the presented CA
//!   trusted here ──▶ Curator.ReissueNodeCertificate (self-signed for the node key, the
//!       old certificate shown) ──▶ checked (this key, a trusted CA) ──▶ installed
//! ```
//! Heartbeats, WatchNode and renewals then get through with what was installed: the
//! node is Home again with its data, its roles and (a member) its etcd data. Nothing is
//! asked while the node is Home: its heartbeats prove it missed nothing.
//!
//! May not change shared values other than the trust slot and the node certificate.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use proto::api;

use crate::curators::curator_client::{apply_trust, install_node_certificate, local_source, trust};
use crate::curators::handover;
use crate::curators::retry::{ProblemLog, pause};
use crate::state::cluster_state::ClusterState;
use crate::state::settings::Settings;
use crate::state::values::NodeValues;

/// How often a node that is not Home looks for rotations it missed.
const CHECK: Duration = Duration::from_secs(5);

/// The runnable's body (see the module documentation).
pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    let slot = values.credentials.slot(&settings.root)?;
    ctx.signal_healthy();
    let mut problems = ProblemLog::default();
    loop {
        if values.cluster_state.current() != Some(ClusterState::Home) {
            match catch_up(&settings, &values, &slot).await {
                Ok(true) => problems.resolved("caught up with a CA rotation"),
                Ok(false) => {}
                Err(e) => problems.problem(format!("catching up with a CA rotation: {e:#}")),
            }
        }
        if !pause(&ctx, CHECK).await {
            return Ok(());
        }
    }
}

/// One look: true when it changed what this node trusts or the certificate it uses.
async fn catch_up(
    settings: &Settings,
    values: &NodeValues,
    slot: &rpc::CredentialSlot,
) -> Result<bool> {
    let endpoints = values.curators.current().unwrap_or_default();
    let Some(answer) = handover::ask(&endpoints).await else {
        return Ok(false);
    };
    let trusted = trust(settings, values)?;
    let certificate = slot.credentials().certificate;
    let mut changed = false;
    if let Some(cas) = handover::successor(&trusted.cas(), &answer)? {
        // The bound on a retired key's use against this node (see `handover`).
        if pki::time_to_expiry(&certificate)
            .context("reading the node certificate")?
            .is_none()
        {
            bail!(
                "the cluster CA was rotated while this node was away, and its node \
                 certificate has expired since: decommission, delete and register it again"
            );
        }
        let cas: Vec<prost::bytes::Bytes> = cas.into_iter().map(Into::into).collect();
        let crls: Vec<prost::bytes::Bytes> = Some(answer.crl.clone())
            .filter(|c| !c.is_empty())
            .map(Into::into)
            .into_iter()
            .collect();
        apply_trust(settings, values, &cas, &crls)?;
        tracing::warn!(
            ca = rpc::fingerprint(&answer.ca_certificate),
            "the cluster CA was rotated while this node was away: followed its handovers \
             to the CA the curators present"
        );
        changed = true;
    }
    let current_cas = if answer.trusted_cas.is_empty() {
        vec![answer.ca_certificate.clone()]
    } else {
        answer.trusted_cas.clone()
    };
    let outdated = !current_cas
        .iter()
        .any(|ca| pki::issued_by(&certificate, ca));
    if outdated && trusted.cas().contains(&answer.ca_certificate) {
        reissue(settings, values, slot, &trusted, &certificate).await?;
        changed = true;
    }
    Ok(changed)
}

/// Exchanges `previous` (of a retired CA) for a node certificate of the signing CA,
/// proving the node key; installs the answer once it is for this key, of a CA trusted.
async fn reissue(
    settings: &Settings,
    values: &NodeValues,
    slot: &rpc::CredentialSlot,
    trusted: &rpc::TrustSlot,
    previous: &[u8],
) -> Result<()> {
    let key = identity::NodeKey::from_pkcs8(&slot.credentials().key_pkcs8)
        .context("reading the node key")?;
    let proof = rpc::self_signed(&key).context("creating the node key's certificate")?;
    let client = rpc::CuratorClient::new(
        values.curators.current().unwrap_or_default(),
        rpc::ServerTrust::ClusterCa {
            trust: trusted.clone(),
        },
        Some(proof),
    )
    .context("loading the node key's certificate")?
    .with_epoch(values.epoch_seen.clone())
    .with_source(local_source(settings.address));
    let request = api::ReissueNodeCertificateRequest {
        previous_certificate: previous.to_vec(),
    };
    let answer = client
        .call(|channel| {
            let request = request.clone();
            async move {
                api::curator_client::CuratorClient::new(channel)
                    .reissue_node_certificate(request)
                    .await
            }
        })
        .await
        .context("asking for the node certificate of the new CA")?;
    let certificate = answer.node_certificate;
    if pki::certificate_public_key(&certificate)? != key.public_key().as_slice() {
        bail!("the curator answered with a node certificate for another key");
    }
    if !trusted
        .cas()
        .iter()
        .any(|ca| pki::issued_by(&certificate, ca))
    {
        bail!("the curator answered with a node certificate of a CA this node does not trust");
    }
    install_node_certificate(settings, slot, &certificate)?;
    tracing::warn!(
        serial = hex::encode(pki::certificate_serial(&certificate)?),
        "the node certificate of the retired CA was exchanged for one of the CA that signs"
    );
    Ok(())
}
