//! The API view of node records (`NodeInfo`, for ListNodes, DescribeNode and the
//! answers of calls that change a node): the record with this tenure's health verdict,
//! the decommission progress, the certificate expiry warnings, what a running CA
//! rotation waits for from the node, and a role's program that keeps crashing.
//!
//! Reads memory only (the heartbeat book, the certificate view, the trusted CAs): may
//! not call etcd.

use std::time::Instant;

use proto::api::{self, NodeHealth};
use proto::state::{HealthVerdict, Node};

use super::ca_rotation::{self, Rotated};
use super::health_book::stored_verdict;
use super::shared::Shared;
use super::{certificates, decommission};
use crate::election::Leadership;
use crate::health as rules;
use crate::records;

impl Shared {
    /// The API view of node records, with this tenure's health verdicts (one lock for
    /// all of them; no etcd read).
    pub(super) fn node_infos(
        &self,
        nodes: Vec<Node>,
        leadership: &Leadership,
    ) -> Vec<api::NodeInfo> {
        let now = Instant::now();
        let unix_now = pki::unix_now();
        let certificates = self.certificates.current();
        let trusted = self.trusted.current();
        let peer_trusted = self.peer_trusted.current();
        let timing = self.config.heartbeat;
        let mut book = self.health.lock().expect("health lock poisoned");
        let book = book.tenure(leadership);
        nodes
            .into_iter()
            .map(|node| {
                let up = node.state == proto::state::NodeState::Up as i32;
                let (verdict, last) = match book.trackers.get_mut(&node.id) {
                    Some(t) => (t.evaluate(now, book.since, &timing), t.last()),
                    None => {
                        let mut t = rules::Tracker::new(stored_verdict(&node), now);
                        (t.evaluate(now, book.since, &timing), None)
                    }
                };
                let since = last.map(|l| now.saturating_duration_since(l));
                let decommission_progress = decommission::progress(self, &node);
                let mut warnings = match &certificates {
                    Some(view) => certificates::warnings(&node, view.nodes.get(&node.id), unix_now),
                    None => Vec::new(),
                };
                if let Some(trusted) = &trusted {
                    warnings.extend(
                        ca_rotation::node_holds_up(Rotated::Cluster, trusted, &node)
                            .map(|why| format!("CA rotation: it {why}")),
                    );
                }
                // A role's program that keeps crashing (a Kubernetes component).
                warnings.extend(
                    node.status
                        .iter()
                        .flat_map(|s| &s.services)
                        .filter(|s| kubernetes::board::crash_looping(s))
                        .map(|s| {
                            format!(
                                "{} keeps crashing ({} restarts): {}",
                                s.name, s.restarts, s.last_error
                            )
                        }),
                );
                if let Some(peer) = &peer_trusted {
                    warnings.extend(
                        ca_rotation::node_holds_up(Rotated::EtcdPeer, &peer.trusted, &node)
                            .map(|why| format!("etcd peer CA rotation: it {why}")),
                    );
                }
                api::NodeInfo {
                    roles: records::role_names(&node),
                    health: if up {
                        node_health(verdict)
                    } else {
                        NodeHealth::Unknown
                    } as i32,
                    time_since_heartbeat_ms: since.map(|d| d.as_millis() as u64),
                    // The state enums share their numbering.
                    state: node.state,
                    id: node.id,
                    public_key: node.public_key,
                    address: node.address,
                    labels: node.labels,
                    status: node.status,
                    decommission_progress,
                    warnings,
                }
            })
            .collect()
    }

    pub(super) fn node_info(&self, node: Node, leadership: &Leadership) -> api::NodeInfo {
        self.node_infos(vec![node], leadership)
            .pop()
            .expect("one node in, one out")
    }
}

fn node_health(verdict: HealthVerdict) -> NodeHealth {
    match verdict {
        HealthVerdict::Unknown => NodeHealth::Unknown,
        HealthVerdict::Healthy => NodeHealth::Healthy,
        HealthVerdict::HeartbeatTimeout => NodeHealth::HeartbeatTimeout,
    }
}
