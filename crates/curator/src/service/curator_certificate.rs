//! The curator certificate this curator serves with (`pki::CertificateKind::Curator`):
//! what lets clients tell a curator from any node holding a valid node certificate.
//!
//! ```text
//!   curator start ─▶ own node record holds ConsensusMember? ─no─▶ refused (no listener)
//!        │ yes
//!        ▼
//!   newest recorded curator-<id>-<serial> for the node key, unrevoked, not due
//!        │ none                                   │ found
//!        ▼                                        ▼
//!   issue (cluster CA, node key, record address) ─▶ served (key: the node key)
//!   `curator-certificate` runnable: at 2/3 of its lifetime the same again, into the slot;
//!   at once when the signing CA is not the one that issued it (a CA rotation)
//! ```
//! Every member gets one this way, whatever brought its curator up (bootstrap, join,
//! recover, restore, an upgrade of a cluster that had none). Nothing is kept on disk:
//! the CA store records every certificate it issues, and it is the authority. The
//! certificates are revoked by prefix (`layout::curator_certificate_prefix`) when the
//! role is taken (`membership`), and on decommission and delete (`decommission`).
//!
//! May not revoke, nor serve; the listener serves what [`credentials`] returns.

use std::sync::Arc;
use std::time::Duration;

use tonic::Status;

use super::fence::{self, Fence};
use super::shared::Shared;
use super::status::{record_address, record_key, status_from};
use crate::{layout, records, templates};

/// Longest wait between two looks at whether the certificate is due.
const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// This curator's current curator certificate (issued now when it has none, or its
/// newest one is due for renewal or revoked), with the node key to serve it with.
/// Refused when the node's record does not hold the ConsensusMember role.
pub(super) async fn credentials(shared: &Shared) -> Result<rpc::Credentials, Status> {
    let id = &shared.config.node_id;
    // Recorded only while the record still holds the role (see `fence`): a removal of
    // the role racing this issue revokes it or makes its recording fail.
    let Fence { guard, node } = fence::check(
        shared,
        id,
        |n| {
            n.roles
                .as_ref()
                .is_some_and(|r| r.consensus_member.is_some())
        },
        "it does not hold the ConsensusMember role (no curator certificate)",
    )
    .await?;
    let key = record_key(&node)?;
    let address = record_address(&node)?;
    let node_credentials = shared.config.credentials.credentials();
    if pki::certificate_public_key(&node_credentials.certificate)
        .ok()
        .as_deref()
        != Some(key.as_slice())
    {
        return Err(Status::failed_precondition(format!(
            "this node's certificate is not for the key in node {id}'s record"
        )));
    }
    let store = layout::cluster_pki(&shared.curator);
    let unavailable = |what: &str, e: pki::PkiError| Status::unavailable(format!("{what}: {e}"));
    let ca = store
        .load_ca()
        .await
        .map_err(|e| unavailable("loading the cluster CA", e))?
        .ok_or_else(|| Status::internal("the cluster has no CA"))?;
    let revoked = pki::crl_serials(
        &store
            .crl()
            .await
            .map_err(|e| unavailable("reading the cluster CRL", e))?,
    )
    .map_err(|e| Status::internal(format!("the cluster CRL: {e}")))?;
    let recorded = store
        .list_issued(&layout::curator_certificate_prefix(id))
        .await
        .map_err(|e| unavailable("listing the curator certificates", e))?;
    let now = pki::unix_now();
    let usable = recorded
        .into_iter()
        .filter_map(|(_, der)| pki::Validity::of(&der).ok().map(|v| (der, v)))
        .filter(|(der, v)| {
            now < v.renew_at()
                && pki::issued_by(der, &ca.cert_der)
                && pki::certificate_public_key(der).ok().as_deref() == Some(key.as_slice())
                && pki::certificate_serial(der).is_ok_and(|s| !revoked.contains(&s))
        })
        .max_by_key(|(_, v)| v.issued());
    let certificate = match usable {
        Some((der, _)) => der,
        None => {
            let configuration = records::cluster_configuration(&shared.curator)
                .await
                .map_err(status_from)?;
            let lifetime = templates::node_certificate_lifetime(configuration.as_ref());
            let template = templates::curator_certificate_template(id, address, lifetime);
            let issued = ca
                .issue(&template, &key)
                .map_err(|e| Status::internal(format!("issuing the curator certificate: {e}")))?;
            let name = layout::curator_certificate_name(id, &issued.serial);
            let der = store
                .ensure_certificate_guarded(&name, vec![guard], || Ok(issued.clone()))
                .await
                .map_err(|e| fence::recording_status("recording the curator certificate", e))?;
            tracing::info!(name, "issued this curator's curator certificate");
            der
        }
    };
    Ok(rpc::Credentials {
        certificate,
        key_pkcs8: node_credentials.key_pkcs8,
    })
}

/// How long until the certificate in `served` is due for renewal (at least a second,
/// at most [`LONGEST_WAIT`]).
fn until_due(served: &rpc::CredentialSlot) -> Duration {
    let renew_at = pki::Validity::of(&served.credentials().certificate)
        .map(|v| v.renew_at())
        .unwrap_or(0);
    Duration::from_secs(renew_at.saturating_sub(pki::unix_now()))
        .clamp(Duration::from_secs(1), LONGEST_WAIT)
}

/// The `curator-certificate` runnable: renews the certificate in `served` when due (the
/// listener serves the new one from the next handshake on).
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
    served: rpc::CredentialSlot,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let mut trusted = shared.trusted.watch();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(until_due(&served)) => {}
            // A rotation made another CA sign: the one served is replaced at once.
            t = trusted.get() => match t {
                Ok(t) if !pki::issued_by(&served.credentials().certificate, &t.current.cert) => {}
                Ok(_) => continue,
                Err(_) => return Ok(()),
            },
            _ = ctx.cancelled() => return Ok(()),
        }
        let current = credentials(&shared)
            .await
            .map_err(|e| format!("renewing the curator certificate: {}", e.message()))?;
        if current.certificate != served.credentials().certificate {
            served.replace(current)?;
        }
    }
}
