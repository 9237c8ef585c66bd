//! The etcd membership as the curator looks it up: the member list, a node's member,
//! the peer URL a node's member has.
//!
//! Lookups only: may not change the membership (that is `membership`'s job) and imports
//! only `status` of the service layer.

use consensus::membership::{self, Member};
use proto::state::Node;
use tonic::Status;

use super::status::{etcd_status, record_address};

/// Every etcd member, as the etcd member `client` talks to knows them, after a
/// linearizable read: etcd 3.4 lists members from the local member's applied state, and
/// the read makes that hold every membership change committed before the call (a node
/// told it is no member wipes its etcd data on that answer, see `node::rejoin`).
pub(super) async fn list(client: &mut etcd_client::Client) -> Result<Vec<Member>, Status> {
    client
        .get("\0polis-membership-barrier", None)
        .await
        .map_err(|e| etcd_status("reading through the etcd leader", e))?;
    membership::members(client)
        .await
        .map_err(|e| etcd_status("listing etcd members", e))
}

/// The peer URL etcd knows a node's member by.
pub(super) fn peer_url(node: &Node) -> Result<String, Status> {
    Ok(consensus::config::peer_url(
        record_address(node)?,
        consensus::config::PEER_PORT,
    ))
}

/// The member of node `node`, if it is one (by name, or by peer URL before it started).
pub(super) fn member_of<'a>(members: &'a [Member], node: &Node) -> Option<&'a Member> {
    let url = peer_url(node).ok();
    members
        .iter()
        .find(|m| m.name == node.id || url.as_ref().is_some_and(|u| m.peer_urls.contains(u)))
}
