//! `cluster rotate-ca` and `cluster ca`: replacing the cluster CA online, and where a
//! rotation stands. May not format results itself (`render::ca` does).

use std::path::Path;

use anyhow::{Result, anyhow};
use proto::api;

use crate::output::Format;
use crate::render::ca::print_rotation;
use crate::session::{OwnerSession, owner_session};

/// `cluster rotate-ca [--force] [--etcd-peer]`: starts a rotation (or forces the running
/// one on).
pub(crate) async fn rotate(
    config: &Path,
    raw_endpoints: &[String],
    force: bool,
    etcd_peer: bool,
    format: Format,
) -> Result<()> {
    let session = owner_session(config, raw_endpoints).await?;
    // The CA signing as of now: the rotation is away from it. The cluster CA as this
    // configuration knows it; the etcd peer CA as the cluster says.
    let signing_ca_fingerprint = if etcd_peer {
        rotation(&session, true)
            .await?
            .trusted_ca_fingerprints
            .first()
            .cloned()
            .ok_or_else(|| anyhow!("the cluster named no etcd peer CA"))?
    } else {
        session.refresh_trust().await;
        rpc::fingerprint(&session.pinned_ca())
    };
    let what = if etcd_peer {
        "rotating the etcd peer CA"
    } else {
        "rotating the cluster CA"
    };
    let answer = session
        .management(what, |mut m| {
            let signing_ca_fingerprint = signing_ca_fingerprint.clone();
            async move {
                m.rotate_ca(api::RotateCaRequest {
                    force,
                    signing_ca_fingerprint,
                    etcd_peer,
                })
                .await
            }
        })
        .await?;
    print_rotation(&answer, format);
    Ok(())
}

async fn rotation(session: &OwnerSession, etcd_peer: bool) -> Result<api::CaRotation> {
    session
        .management("reading the CA rotation", |mut m| async move {
            m.get_ca_rotation(api::GetCaRotationRequest { etcd_peer })
                .await
        })
        .await
}

/// `cluster ca [--etcd-peer]`: the CAs trusted and the running rotation, if any.
pub(crate) async fn show(
    config: &Path,
    raw_endpoints: &[String],
    etcd_peer: bool,
    format: Format,
) -> Result<()> {
    let session = owner_session(config, raw_endpoints).await?;
    print_rotation(&rotation(&session, etcd_peer).await?, format);
    Ok(())
}
