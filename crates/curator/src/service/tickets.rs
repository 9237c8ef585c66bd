//! Register tickets, for the handlers: Management's ticket calls (create, list, revoke,
//! rotate), and RegisterNode's creation of a record that spends one use of a ticket.
//!
//! ```text
//!   CreateRegisterTicket / GetRegisterTicket ─▶ ticket::create (ttl, uses, caller)
//!   ListRegisterTickets ─▶ ticket::prune, ticket::list (never a secret)
//!   RevokeRegisterTicket ─▶ ticket::revoke      RotateRegisterTicket ─▶ ticket::revoke_all
//!   RegisterNode (new key) ─▶ register_new: ticket::authorize ─▶ writes::create_node
//!                            (record + its claims + the ticket's use, one transaction;
//!                            repeated when the ticket or a claim changed in between;
//!                            limited tickets spent one at a time on this leader)
//! ```
//! Imports only `status` and `shared` of the service, and the crate's `ticket`,
//! `writes`, `election`.

use std::time::Duration;

use proto::api;
use proto::state::{Node, RegisterTicket};
use tonic::Status;

use super::shared::Shared;
use super::status::{node_update_status, status_from};
use crate::election::Leadership;
use crate::error::NodeUpdateError;
use crate::ticket::{self, TicketError};
use crate::writes::{self, Created};

/// How often a registration re-reads a ticket that changed under it (other nodes
/// spending it) before giving up.
const SPEND_ATTEMPTS: usize = 20;

/// The longest lifetime a ticket may be given (0 aside: never expires).
const MAX_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The status for a ticket refusal: never reveals a secret, names the ticket's id for
/// an expired or used-up one.
pub(super) fn ticket_status(e: TicketError) -> Status {
    match e {
        TicketError::Malformed
        | TicketError::Invalid
        | TicketError::Expired(_)
        | TicketError::UsedUp(_) => Status::permission_denied(e.to_string()),
        TicketError::NotFound(_) => Status::not_found(e.to_string()),
        TicketError::TooMany => Status::resource_exhausted(e.to_string()),
        TicketError::Changed => Status::aborted(e.to_string()),
        TicketError::Curator(c) => status_from(c),
    }
}

/// A ticket as listed.
pub(super) fn info(t: &RegisterTicket) -> api::RegisterTicketInfo {
    api::RegisterTicketInfo {
        id: t.id.clone(),
        created_unix: t.created_unix,
        expires_unix: t.expires_unix,
        uses_left: t.uses_left,
        created_by: t.created_by.clone(),
        last_used_unix: t.last_used_unix,
    }
}

/// CreateRegisterTicket: a ticket for `ttl_seconds` (0: never expires) and `uses`
/// registrations (0: unlimited).
pub(super) async fn create(
    shared: &Shared,
    caller: &rpc::Identity,
    r: api::CreateRegisterTicketRequest,
) -> Result<api::CreateRegisterTicketResponse, Status> {
    let ttl = match r.ttl_seconds {
        0 => None,
        s if Duration::from_secs(s) > MAX_TTL => {
            return Err(Status::invalid_argument(format!(
                "a register ticket's lifetime is at most {} days",
                MAX_TTL.as_secs() / 86400
            )));
        }
        s => Some(Duration::from_secs(s)),
    };
    let uses = (r.uses > 0).then_some(r.uses);
    let leadership = shared.leadership().await?;
    let (ticket, record) =
        ticket::create(&shared.curator, &leadership, ttl, uses, &caller.to_string())
            .await
            .map_err(ticket_status)?;
    tracing::info!(
        ticket = record.id,
        %caller,
        expires_unix = record.expires_unix,
        uses = ?record.uses_left,
        "created a register ticket"
    );
    Ok(api::CreateRegisterTicketResponse {
        ticket,
        info: Some(info(&record)),
    })
}

/// ListRegisterTickets: every ticket (pruned ones first dropped), never a secret.
pub(super) async fn list(shared: &Shared) -> Result<api::ListRegisterTicketsResponse, Status> {
    let leadership = shared.leadership().await?;
    ticket::prune(&shared.curator, &leadership, ticket::now_unix())
        .await
        .map_err(status_from)?;
    let tickets = ticket::list(&shared.curator).await.map_err(status_from)?;
    Ok(api::ListRegisterTicketsResponse {
        tickets: tickets.iter().map(info).collect(),
    })
}

/// RevokeRegisterTicket: deletes one ticket; nodes that registered with it stay.
pub(super) async fn revoke(
    shared: &Shared,
    caller: &rpc::Identity,
    id: &str,
) -> Result<(), Status> {
    let leadership = shared.leadership().await?;
    ticket::revoke(&shared.curator, &leadership, id)
        .await
        .map_err(ticket_status)?;
    tracing::info!(ticket = id, %caller, "revoked a register ticket");
    Ok(())
}

/// RotateRegisterTicket: revokes every ticket (`params register` creates new ones).
pub(super) async fn rotate(shared: &Shared, caller: &rpc::Identity) -> Result<(), Status> {
    let leadership = shared.leadership().await?;
    let revoked = ticket::revoke_all(&shared.curator, &leadership)
        .await
        .map_err(status_from)?;
    tracing::info!(%caller, revoked, "revoked every register ticket");
    Ok(())
}

/// Creates the record of a new node (`node`, NEW) with one use of the ticket it
/// presented and its address and data join key claimed (see `writes::claims`), in one
/// transaction. `Ok(None)`: a record of this key exists already (a concurrent call of
/// the same node), nothing was spent. The ticket is checked before the claims: a caller
/// without a good ticket learns nothing about other nodes.
pub(super) async fn register_new(
    shared: &Shared,
    leadership: &Leadership,
    presented: &[u8],
    node: Node,
) -> Result<Option<Node>, Status> {
    let id = node.id.clone();
    // Spends of a limited ticket conflict in etcd: on this leader they are made one at
    // a time (etcd's guard keeps them exact regardless). Unlimited ones run in parallel.
    let mut one_at_a_time = None;
    for _ in 0..SPEND_ATTEMPTS {
        let spend = ticket::authorize(&shared.curator, leadership, presented)
            .await
            .map_err(|e| {
                tracing::warn!(node = id, "registration refused: {e}");
                ticket_status(e)
            })?;
        if spend.exact && one_at_a_time.is_none() {
            one_at_a_time = Some(shared.limited_spends.lock().await);
            continue;
        }
        match writes::create_node(
            &shared.curator,
            leadership,
            node.clone(),
            spend.compares,
            spend.ops,
        )
        .await
        {
            Ok(Created::New(node)) => {
                tracing::info!(node = id, ticket = spend.id, "a register ticket was used");
                return Ok(Some(*node));
            }
            Ok(Created::Exists) => return Ok(None),
            Ok(Created::Taken { what, holder }) => {
                tracing::warn!(node = id, holder, "registration refused: {what} is taken");
                return Err(Status::already_exists(format!(
                    "{what} belongs to node {holder}; every node needs its own"
                )));
            }
            Ok(Created::GuardFailed) => continue,
            Err(e @ NodeUpdateError::Deleted(_)) => {
                tracing::warn!(node = id, "registration refused: the node was deleted");
                return Err(node_update_status(e));
            }
            Err(e) => return Err(node_update_status(e)),
        }
    }
    Err(ticket_status(TicketError::Changed))
}
