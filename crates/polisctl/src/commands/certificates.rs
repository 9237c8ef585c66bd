//! `cluster certificates`.
//! May not format results itself (`render::certificates` does).

use std::path::Path;

use anyhow::Result;
use proto::api;

use crate::output::Format;
use crate::render::certificates::print_certificates;
use crate::session::owner_session;

/// `cluster certificates`: every certificate the cluster's CAs issued.
pub(crate) async fn certificates(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
) -> Result<()> {
    let list = owner_session(config, raw_endpoints)
        .await?
        .management("listing certificates", |mut m| async move {
            m.list_certificates(api::ListCertificatesRequest {}).await
        })
        .await?
        .certificates;
    print_certificates(&list, pki::unix_now(), format);
    Ok(())
}
