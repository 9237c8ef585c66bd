//! `cluster tickets` and `cluster ticket revoke ID`: the register tickets (created by
//! `params register`, revoked all at once by `cluster rotate-ticket`).
//! May not format results itself (`render::tickets` does).

use std::path::Path;

use anyhow::{Result, bail};
use proto::api;

use crate::output::Format;
use crate::render::tickets::print_tickets;
use crate::session::owner_session;

/// `cluster tickets`: every register ticket, never a secret.
pub(crate) async fn list(config: &Path, raw_endpoints: &[String], format: Format) -> Result<()> {
    let tickets = owner_session(config, raw_endpoints)
        .await?
        .management("listing register tickets", |mut m| async move {
            m.list_register_tickets(api::ListRegisterTicketsRequest {})
                .await
        })
        .await?
        .tickets;
    print_tickets(&tickets, pki::unix_now(), format);
    Ok(())
}

/// `cluster ticket revoke ID`.
pub(crate) async fn revoke(config: &Path, raw_endpoints: &[String], id: &str) -> Result<()> {
    if id.len() != 8 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "{id:?} is not a register ticket id (8 hex digits, as `polisctl cluster tickets` lists them)"
        );
    }
    let id = id.to_ascii_lowercase();
    let request = api::RevokeRegisterTicketRequest { id: id.clone() };
    owner_session(config, raw_endpoints)
        .await?
        .management(&format!("revoking register ticket {id}"), |mut m| {
            let request = request.clone();
            async move { m.revoke_register_ticket(request).await }
        })
        .await?;
    eprintln!(
        "revoked register ticket {id}: nodes that have not registered with it yet are refused"
    );
    Ok(())
}
