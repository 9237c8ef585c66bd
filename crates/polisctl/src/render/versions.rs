//! `cluster versions`: each node's version against the version-skew policy
//! (`proto::version`), and whether the next upgrade step may start.
//!
//! An upgrade step (one node restarted on the next version, docs/upgrades.md) may
//! start when every node reports a readable version, the oldest and the newest are
//! within the policy, and every node that is UP is HEALTHY (no member behind, no node
//! that would be lost with the one restarting). Pure: the node list in, a report out.
//! [`upgrade_check`] asks the same of one node's step (`node upgrade-check ID`), and
//! also whether the consensus members left while it restarts keep a quorum.

use proto::api;
use serde_json::{Value, json};

use crate::names::{health_name, state_name};
use crate::output::{self, Format, escape};

/// One node's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeVersion {
    pub id: String,
    pub address: String,
    pub roles: String,
    pub state: String,
    pub health: String,
    /// As the node reported it ("" before its first heartbeat).
    pub version: String,
    /// What the policy says of it: "ok", or why not.
    pub verdict: String,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VersionsReport {
    pub nodes: Vec<NodeVersion>,
    pub oldest: Option<String>,
    pub newest: Option<String>,
    /// Why the next upgrade step may not start (empty: it may).
    pub blockers: Vec<String>,
}

/// The report of `nodes` (as ListNodes answers them).
pub(crate) fn report(nodes: &[api::NodeInfo]) -> VersionsReport {
    let reported = |n: &api::NodeInfo| {
        n.status
            .as_ref()
            .map(|s| s.version.clone())
            .unwrap_or_default()
    };
    let readable: Vec<proto::version::Version> = nodes
        .iter()
        .filter_map(|n| proto::version::parse(&reported(n)))
        .collect();
    let (oldest, newest) = (
        readable.iter().min().copied(),
        readable.iter().max().copied(),
    );
    let mut blockers = Vec::new();
    let lines = nodes
        .iter()
        .map(|n| {
            let version = reported(n);
            let up = n.state == api::NodeState::Up as i32;
            let verdict = match (proto::version::parse(&version), newest, oldest) {
                _ if version.is_empty() => "no heartbeat yet".to_string(),
                (None, _, _) => "unreadable".to_string(),
                (Some(v), Some(newest), Some(oldest)) => {
                    match (
                        proto::version::check_skew(&v.to_string(), &newest.to_string()),
                        proto::version::check_skew(&v.to_string(), &oldest.to_string()),
                    ) {
                        (Ok(()), Ok(())) => "ok".to_string(),
                        (Err(_), _) => format!("more than one minor version behind {newest}"),
                        (_, Err(_)) => format!("more than one minor version ahead of {oldest}"),
                    }
                }
                (Some(_), _, _) => "ok".to_string(),
            };
            if up && verdict != "ok" {
                blockers.push(format!("node {}: version {}", n.id, verdict));
            }
            if up && n.health != api::NodeHealth::Healthy as i32 {
                blockers.push(format!(
                    "node {} is {}, not HEALTHY",
                    n.id,
                    health_name(n.health)
                ));
            }
            NodeVersion {
                id: n.id.clone(),
                address: n.address.clone(),
                roles: n.roles.join(","),
                state: state_name(n.state),
                health: health_name(n.health),
                version,
                verdict,
            }
        })
        .collect();
    VersionsReport {
        nodes: lines,
        oldest: oldest.map(|v| v.to_string()),
        newest: newest.map(|v| v.to_string()),
        blockers,
    }
}

/// Whether node `id` may be restarted on the next version now: the cluster's blockers
/// ([`report`]), the node itself UP, and — for a consensus member — a quorum of the
/// members kept by the HEALTHY others while it is away. The reasons it may not.
pub(crate) fn upgrade_check(nodes: &[api::NodeInfo], id: &str) -> Vec<String> {
    let mut reasons = report(nodes).blockers;
    let Some(node) = nodes.iter().find(|n| n.id == id) else {
        return vec![format!("node {id} is not in the cluster")];
    };
    if node.state != api::NodeState::Up as i32 {
        reasons.push(format!(
            "node {id} is {}, not UP: it has no running version to upgrade in place",
            state_name(node.state)
        ));
    }
    let is_member = |n: &api::NodeInfo| {
        n.state == api::NodeState::Up as i32 && n.roles.iter().any(|r| r == "ConsensusMember")
    };
    if is_member(node) {
        let members = nodes.iter().filter(|n| is_member(n)).count();
        let others_healthy = nodes
            .iter()
            .filter(|n| is_member(n) && n.id != id && n.health == api::NodeHealth::Healthy as i32)
            .count();
        let quorum = members / 2 + 1;
        if others_healthy < quorum {
            reasons.push(format!(
                "node {id} is one of {members} consensus members: while it restarts only \
                 {others_healthy} HEALTHY members remain, short of the {quorum} a quorum \
                 needs — the cluster would stop taking writes until it is back{}",
                if members == 1 {
                    " (a one-member cluster: add members first, or accept the pause)"
                } else {
                    ""
                }
            ));
        }
    }
    reasons
}

fn report_json(report: &VersionsReport) -> Value {
    json!({
        "nodes": report.nodes.iter().map(|n| json!({
            "id": n.id, "address": n.address, "roles": n.roles, "state": n.state,
            "health": n.health, "version": n.version, "verdict": n.verdict,
        })).collect::<Vec<_>>(),
        "oldest": report.oldest,
        "newest": report.newest,
        "upgrade_can_proceed": report.blockers.is_empty(),
        "blockers": report.blockers,
    })
}

/// Prints `report` in `format`.
pub(crate) fn print_report(report: &VersionsReport, format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{}", report_json(report)),
        Format::Yaml => print!("{}", output::yaml(&report_json(report))),
        Format::Table => {
            let rows: Vec<Vec<String>> = report
                .nodes
                .iter()
                .map(|n| {
                    vec![
                        n.id.clone(),
                        n.address.clone(),
                        n.roles.clone(),
                        n.state.clone(),
                        n.health.clone(),
                        n.version.clone(),
                        n.verdict.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &[
                        "ID", "ADDRESS", "ROLES", "STATE", "HEALTH", "VERSION", "POLICY"
                    ],
                    &rows
                )
            );
            if let (Some(oldest), Some(newest)) = (&report.oldest, &report.newest) {
                println!("versions: {oldest} to {newest}");
            }
            if report.blockers.is_empty() {
                println!("upgrade can proceed: yes (restart one node at a time)");
            } else {
                println!("upgrade can proceed: NO");
                for b in &report.blockers {
                    println!("  {}", escape(b));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, version: &str, health: api::NodeHealth) -> api::NodeInfo {
        api::NodeInfo {
            id: id.into(),
            state: api::NodeState::Up as i32,
            health: health as i32,
            status: (!version.is_empty()).then(|| proto::state::NodeStatus {
                version: version.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn member(id: &str, health: api::NodeHealth) -> api::NodeInfo {
        api::NodeInfo {
            roles: vec!["ConsensusMember".into()],
            ..node(id, "0.2.0", health)
        }
    }

    #[test]
    fn a_step_that_would_lose_the_quorum_is_refused() {
        use api::NodeHealth::{Healthy, HeartbeatTimeout};
        let three = [
            member("m1", Healthy),
            member("m2", Healthy),
            member("m3", Healthy),
            node("w1", "0.2.0", Healthy),
        ];
        for id in ["m1", "m2", "m3", "w1"] {
            assert!(upgrade_check(&three, id).is_empty(), "{id}");
        }
        // One member already down: restarting another would leave one of three.
        let degraded = [
            member("m1", Healthy),
            member("m2", Healthy),
            member("m3", HeartbeatTimeout),
        ];
        let reasons = upgrade_check(&degraded, "m1");
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("short of the 2 a quorum needs")),
            "{reasons:?}"
        );
        // A one-member cluster pauses whatever is done.
        let alone = [member("m1", Healthy)];
        let reasons = upgrade_check(&alone, "m1");
        assert!(
            reasons.iter().any(|r| r.contains("one-member cluster")),
            "{reasons:?}"
        );
        assert_eq!(
            upgrade_check(&alone, "nope"),
            vec!["node nope is not in the cluster".to_string()]
        );
    }

    #[test]
    fn a_cluster_one_minor_apart_and_healthy_may_take_the_next_step() {
        let r = report(&[
            node("a", "0.1.0", api::NodeHealth::Healthy),
            node("b", "0.2.0", api::NodeHealth::Healthy),
        ]);
        assert!(r.blockers.is_empty(), "{r:?}");
        assert_eq!(r.oldest.as_deref(), Some("0.1.0"));
        assert_eq!(r.newest.as_deref(), Some("0.2.0"));
        assert!(r.nodes.iter().all(|n| n.verdict == "ok"));
    }

    #[test]
    fn skew_unhealthy_unreadable_and_silent_nodes_block_it() {
        let r = report(&[
            node("a", "0.1.0", api::NodeHealth::Healthy),
            node("b", "0.3.0", api::NodeHealth::Healthy),
            node("c", "0.2.0", api::NodeHealth::HeartbeatTimeout),
            node("d", "garbage", api::NodeHealth::Healthy),
            node("e", "", api::NodeHealth::Healthy),
        ]);
        let verdict = |id: &str| r.nodes.iter().find(|n| n.id == id).unwrap().verdict.clone();
        assert_eq!(verdict("a"), "more than one minor version behind 0.3.0");
        assert_eq!(verdict("b"), "more than one minor version ahead of 0.1.0");
        assert_eq!(verdict("c"), "ok");
        assert_eq!(verdict("d"), "unreadable");
        assert_eq!(verdict("e"), "no heartbeat yet");
        assert_eq!(r.blockers.len(), 5, "{:?}", r.blockers);
        assert!(
            r.blockers
                .iter()
                .any(|b| b.contains("node c") && b.contains("not HEALTHY"))
        );
    }
}
