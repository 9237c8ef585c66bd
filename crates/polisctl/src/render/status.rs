//! The etcd members and the quorum, as `cluster status` shows them.
//! May not talk to the cluster.

use serde_json::{Value, json};

use crate::consensus_summary::MemberStatus;
use crate::output::{self, Format};

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
    let rows: Vec<Value> = members
        .iter()
        .map(|m| {
            json!({
                "member_id": format!("{:x}", m.id),
                "node": m.node,
                "role": if m.learner { "learner" } else { "voter" },
                "leader": m.leader,
                "raft_index": m.raft.map(|r| r.0),
                "raft_term": m.raft.map(|r| r.1),
                "answered": m.raft.is_some(),
                "db_size": m.db.map(|d| d.0),
                "db_size_in_use": m.db.map(|d| d.1),
            })
        })
        .collect();
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
                    ],
                    &table
                )
            );
            for u in unreachable {
                println!("unreachable: {u}");
            }
            println!("quorum: {}", if quorum { "yes" } else { "NO" });
            match curator_leader {
                Some((node, endpoint)) => println!("curator leader: {node} at {endpoint}"),
                None => println!("curator leader: none answered"),
            }
            for (member, alarm) in alarms {
                println!(
                    "alarm: etcd {alarm} raised by member {member:x}{}",
                    alarm_meaning(alarm)
                );
            }
            for w in warnings {
                println!("warning: {w}");
            }
        }
    }
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
