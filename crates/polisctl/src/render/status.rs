//! The etcd members and the quorum, as `cluster status` shows them.
//! May not talk to the cluster.

use serde_json::{Value, json};

use crate::consensus_summary::MemberStatus;
use crate::output::{self, Format};

/// The members (a table, or JSON / YAML with the quorum), the curators that did not
/// answer, whether there is a quorum, and the nodes' warnings.
pub(crate) fn print_status(
    members: &[MemberStatus],
    quorum: bool,
    unreachable: &[String],
    warnings: &[String],
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
            })
        })
        .collect();
    let value = json!({
        "quorum": quorum,
        "members": rows,
        "unreachable": unreachable,
        "warnings": warnings,
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
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &["MEMBER", "NODE", "ROLE", "LEADER", "RAFT INDEX", "ANSWERS"],
                    &table
                )
            );
            for u in unreachable {
                println!("unreachable: {u}");
            }
            println!("quorum: {}", if quorum { "yes" } else { "NO" });
            for w in warnings {
                println!("warning: {w}");
            }
        }
    }
}
