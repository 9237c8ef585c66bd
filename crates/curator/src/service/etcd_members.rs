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
/// told it is no member wipes its etcd data on that answer, see `node::member::rejoin`).
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

/// The member of node `node`, if it is one: the member with the ID its record holds;
/// for a record without one (or with one of another cluster, as after a restore), the
/// member named by its node ID, else a member that never started (no name yet) at its
/// peer URL. A started member is never matched by URL: another node's record that
/// names the same address cannot reach it.
pub(super) fn member_of<'a>(members: &'a [Member], node: &Node) -> Option<&'a Member> {
    let recorded = node
        .roles
        .as_ref()
        .and_then(|r| r.consensus_member.as_ref())
        .map(|c| c.member_id)
        .filter(|id| *id != 0);
    if let Some(m) = recorded.and_then(|id| members.iter().find(|m| m.id == id)) {
        return Some(m);
    }
    let url = peer_url(node).ok();
    members.iter().find(|m| m.name == node.id).or_else(|| {
        members
            .iter()
            .find(|m| m.name.is_empty() && url.as_ref().is_some_and(|u| m.peer_urls.contains(u)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::state::{ConsensusMemberRole, NodeRoles};

    fn member(id: u64, name: &str, address: &str) -> Member {
        Member {
            id,
            name: name.into(),
            peer_urls: vec![consensus::config::peer_url(
                address.parse().unwrap(),
                consensus::config::PEER_PORT,
            )],
            is_learner: false,
        }
    }

    fn node(id: &str, address: &str, member_id: Option<u64>) -> Node {
        Node {
            id: id.into(),
            address: address.into(),
            roles: member_id.map(|member_id| NodeRoles {
                consensus_member: Some(ConsensusMemberRole {
                    member_id,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_url_collision_cannot_reach_another_nodes_member() {
        let members = [
            member(1, "node-a", "127.0.0.1"),
            member(2, "node-b", "127.0.0.2"),
        ];
        // A worker (or a stale record) at member 2's address: matches nothing.
        assert!(member_of(&members, &node("node-w", "127.0.0.2", None)).is_none());
        assert!(member_of(&members, &node("node-w", "127.0.0.2", Some(0))).is_none());
        // By recorded ID, whatever the address and name say.
        let b = member_of(&members, &node("node-b", "127.0.0.9", Some(2))).unwrap();
        assert_eq!(b.id, 2);
        // A recorded ID of another cluster (a restore): by name.
        let b = member_of(&members, &node("node-b", "127.0.0.2", Some(77))).unwrap();
        assert_eq!(b.id, 2);
        // A learner that never started has no name yet: by its peer URL only.
        let fresh = [member(1, "node-a", "127.0.0.1"), member(3, "", "127.0.0.3")];
        let c = member_of(&fresh, &node("node-c", "127.0.0.3", Some(0))).unwrap();
        assert_eq!(c.id, 3);
        assert!(member_of(&fresh, &node("node-c", "127.0.0.4", None)).is_none());
    }
}
