//! `cluster info` and `cluster rotate-ticket`.
//! May not format results itself (`render::cluster` does).

use std::path::Path;

use anyhow::Result;
use proto::api;

use crate::output::Format;
use crate::render::cluster::print_cluster_info;
use crate::session::owner_session;

/// `cluster info`; refreshes the remembered curator endpoints on the way.
pub(crate) async fn cluster_info(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
) -> Result<()> {
    let info = owner_session(config, raw_endpoints)
        .await?
        .cluster_info()
        .await?;
    print_cluster_info(info, format);
    Ok(())
}

/// `cluster rotate-ticket`.
pub(crate) async fn rotate_ticket(config: &Path, raw_endpoints: &[String]) -> Result<()> {
    owner_session(config, raw_endpoints)
        .await?
        .management("revoking every register ticket", |mut m| async move {
            m.rotate_register_ticket(api::RotateRegisterTicketRequest {})
                .await
        })
        .await?;
    println!(
        "Revoked every register ticket. Parameters made so far no longer let new nodes register \
         (`polisctl params register` makes new ones); nodes that already registered can still be approved."
    );
    Ok(())
}
