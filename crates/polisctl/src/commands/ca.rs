//! `cluster rotate-ca` and `cluster ca`: replacing the cluster CA online, and where a
//! rotation stands. May not format results itself (`render::ca` does).

use std::path::Path;

use anyhow::Result;
use proto::api;

use crate::output::Format;
use crate::render::ca::print_rotation;
use crate::session::owner_session;

/// `cluster rotate-ca [--force]`: starts a rotation (or forces the running one on).
pub(crate) async fn rotate(
    config: &Path,
    raw_endpoints: &[String],
    force: bool,
    format: Format,
) -> Result<()> {
    let session = owner_session(config, raw_endpoints).await?;
    // The CA this configuration knows to sign, as of now: the rotation is away from it.
    session.refresh_trust().await;
    let signing_ca_fingerprint = rpc::fingerprint(&session.pinned_ca());
    let answer = session
        .management("rotating the cluster CA", |mut m| {
            let signing_ca_fingerprint = signing_ca_fingerprint.clone();
            async move {
                m.rotate_ca(api::RotateCaRequest {
                    force,
                    signing_ca_fingerprint,
                })
                .await
            }
        })
        .await?;
    print_rotation(&answer, format);
    Ok(())
}

/// `cluster ca`: the CAs trusted and the running rotation, if any.
pub(crate) async fn show(config: &Path, raw_endpoints: &[String], format: Format) -> Result<()> {
    let answer = owner_session(config, raw_endpoints)
        .await?
        .management("reading the CA rotation", |mut m| async move {
            m.get_ca_rotation(api::GetCaRotationRequest {}).await
        })
        .await?;
    print_rotation(&answer, format);
    Ok(())
}
