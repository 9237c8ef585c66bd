//! The etcd members and the quorum, as `cluster status` shows them.
//! May not talk to the cluster.

use serde_json::{Value, json};

use crate::consensus_summary::{MemberStatus, PeerSeen};
use crate::output::{self, Format, escape};

/// The members (a table, or JSON / YAML with the quorum), the curators that did not
/// answer, whether there is a quorum, the curator leader, and the nodes' warnings.
pub(crate) fn print_status(
    members: &[MemberStatus],
    quorum: bool,
    curator_leader: Option<&(String, String)>,
    unreachable: &[String],
    warnings: &[String],
    alarms: &[(u64, String)],
    format: Format,
) {
    let rows: Vec<Value> = members.iter().map(member_json).collect();
    let value = json!({
        "quorum": quorum,
        "curator_leader": curator_leader.map(|(node, endpoint)| json!({"node": node, "endpoint": endpoint})),
        "members": rows,
        "unreachable": unreachable,
        "warnings": warnings,
        "alarms": alarms
            .iter()
            .map(|(member, alarm)| json!({"member_id": format!("{member:x}"), "alarm": alarm}))
            .collect::<Vec<_>>(),
    });
    match format {
        Format::Quiet => {}
        Format::Json => println!("{value}"),
        Format::Yaml => print!("{}", output::yaml(&value)),
        Format::Table => {
            let table: Vec<Vec<String>> = members
                .iter()
                .map(|m| {
                    vec![
                        format!("{:x}", m.id),
                        if m.node.is_empty() {
                            "(not started)".into()
                        } else {
                            m.node.clone()
                        },
                        if m.learner { "learner" } else { "voter" }.into(),
                        if m.leader { "*" } else { "" }.into(),
                        m.raft
                            .map(|r| r.0.to_string())
                            .unwrap_or_else(|| "-".into()),
                        if m.raft.is_some() { "yes" } else { "NO" }.into(),
                        m.db.map(|d| db_size(d.0)).unwrap_or_else(|| "-".into()),
                        m.db.map(|d| db_size(d.1)).unwrap_or_else(|| "-".into()),
                        m.epoch
                            .as_ref()
                            .map(|e| e.number.to_string())
                            .unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &[
                        "MEMBER",
                        "NODE",
                        "ROLE",
                        "LEADER",
                        "RAFT INDEX",
                        "ANSWERS",
                        "DB SIZE",
                        "IN USE",
                        "EPOCH",
                    ],
                    &table
                )
            );
            for u in unreachable {
                println!("unreachable: {}", escape(u));
            }
            for line in members.iter().filter_map(peer_line) {
                println!("{}", escape(&line));
            }
            println!("quorum: {}", if quorum { "yes" } else { "NO" });
            match curator_leader {
                Some((node, endpoint)) => {
                    println!("curator leader: {} at {}", escape(node), escape(endpoint))
                }
                None => println!("curator leader: none answered"),
            }
            for (member, alarm) in alarms {
                println!(
                    "alarm: etcd {} raised by member {member:x}{}",
                    escape(alarm),
                    alarm_meaning(alarm)
                );
            }
            for w in warnings {
                println!("warning: {}", escape(w));
            }
        }
    }
}

/// One member in JSON / YAML: its answer and its own view of its peers (`null` when it
/// gave none); `raft_term` is `null` when it answered from etcd's metrics (no term).
fn member_json(m: &MemberStatus) -> Value {
    let peer = |p: &PeerSeen| {
        json!({
            "member_id": format!("{:x}", p.id),
            "node": p.node,
            "address": p.address,
            "reachable": p.reachable,
        })
    };
    let peers = m.peers.as_ref().map(|peers| {
        json!({
            "reachable": peers.iter().filter(|p| p.reachable).count(),
            "total": peers.len(),
            "members": peers.iter().map(peer).collect::<Vec<_>>(),
            "cannot_reach": peers.iter().filter(|p| !p.reachable).map(peer_name).collect::<Vec<_>>(),
        })
    });
    json!({
        "member_id": format!("{:x}", m.id),
        "node": m.node,
        "role": if m.learner { "learner" } else { "voter" },
        "leader": m.leader,
        "raft_index": m.raft.map(|r| r.0),
        "raft_term": m.raft.filter(|_| !m.from_metrics).map(|r| r.1),
        "answered": m.raft.is_some(),
        "from_metrics": m.from_metrics,
        "epoch": m.epoch.as_ref().map(|e| json!({
            "number": e.number,
            "kind": e.kind,
            "made_by": e.made_by,
            "made_unix_ms": e.made_unix_ms,
            "description": proto::epoch::describe(e),
        })),
        "db_size": m.db.map(|d| d.0),
        "db_size_in_use": m.db.map(|d| d.1),
        "peers": peers,
    })
}

/// A peer as the operator knows it: node ID and address, else its etcd member ID.
fn peer_name(p: &PeerSeen) -> String {
    match (p.node.is_empty(), p.address.is_empty()) {
        (false, false) => format!("{} ({})", p.node, p.address),
        (false, true) => p.node.clone(),
        (true, false) => format!("member {:x} ({})", p.id, p.address),
        (true, true) => format!("member {:x} (not known to this node)", p.id),
    }
}

/// The table's line about a member's own view of its peers: shown when it answered from
/// etcd's metrics (no quorum) or cannot reach one; nothing for a member in touch with
/// every other, or one that gave no view.
fn peer_line(m: &MemberStatus) -> Option<String> {
    let peers = m.peers.as_ref()?;
    let cannot: Vec<String> = peers
        .iter()
        .filter(|p| !p.reachable)
        .map(peer_name)
        .collect();
    if cannot.is_empty() && !m.from_metrics {
        return None;
    }
    let node = if m.node.is_empty() { "?" } else { &m.node };
    let mut line = format!(
        "member {:x} ({node}) sees: peers reachable: {} of {}",
        m.id,
        peers.len() - cannot.len(),
        peers.len()
    );
    if !cannot.is_empty() {
        line.push_str(&format!("; cannot reach: {}", cannot.join(", ")));
    }
    if m.from_metrics {
        line.push_str(
            " (answered from its etcd's metrics: no quorum since it started; raft term \
             unknown, etcd's metrics do not hold it)",
        );
    }
    Some(line)
}

fn db_size(bytes: i64) -> String {
    proto::quota::show(bytes.max(0) as u64)
}

/// What an etcd alarm means for the operator.
fn alarm_meaning(alarm: &str) -> &'static str {
    match alarm {
        "NOSPACE" => {
            " (backend quota reached: writes are refused; the curator compacts and \
             defragments etcd and disarms it by itself once space is free)"
        }
        "CORRUPT" => " (its data differs from the other members')",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alone() -> MemberStatus {
        MemberStatus {
            id: 0xa,
            node: "polis-a".into(),
            raft: Some((42, 0)),
            db: Some((1, 1)),
            from_metrics: true,
            peers: Some(vec![
                PeerSeen {
                    id: 0xb,
                    node: "polis-b".into(),
                    address: "127.0.0.2".into(),
                    reachable: false,
                },
                PeerSeen {
                    id: 0xc,
                    node: String::new(),
                    address: String::new(),
                    reachable: false,
                },
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn a_member_alone_says_which_peers_it_cannot_reach() {
        let line = peer_line(&alone()).unwrap();
        assert!(
            line.starts_with(
                "member a (polis-a) sees: peers reachable: 0 of 2; cannot reach: \
                 polis-b (127.0.0.2), member c (not known to this node) (answered from"
            ),
            "{line}"
        );
        assert!(line.contains("raft term unknown"), "{line}");
        let value = member_json(&alone());
        assert_eq!(value["raft_term"], Value::Null);
        assert_eq!(value["from_metrics"], true);
        assert_eq!(value["peers"]["reachable"], 0);
        assert_eq!(value["peers"]["total"], 2);
        assert_eq!(
            value["peers"]["cannot_reach"],
            json!(["polis-b (127.0.0.2)", "member c (not known to this node)"])
        );
        assert_eq!(value["peers"]["members"][0]["member_id"], "b");
    }

    #[test]
    fn a_member_in_touch_with_every_peer_gets_no_line() {
        let mut m = alone();
        m.from_metrics = false;
        m.raft = Some((42, 7));
        for p in m.peers.as_mut().unwrap() {
            p.reachable = true;
        }
        assert_eq!(peer_line(&m), None);
        assert_eq!(member_json(&m)["raft_term"], 7);
        assert_eq!(member_json(&m)["peers"]["reachable"], 2);
        // One peer lost: the line names it.
        m.peers.as_mut().unwrap()[0].reachable = false;
        assert_eq!(
            peer_line(&m).unwrap(),
            "member a (polis-a) sees: peers reachable: 1 of 2; cannot reach: polis-b (127.0.0.2)"
        );
        // No view given: no line, `null` in JSON.
        m.peers = None;
        assert_eq!(peer_line(&m), None);
        assert_eq!(member_json(&m)["peers"], Value::Null);
    }
}
