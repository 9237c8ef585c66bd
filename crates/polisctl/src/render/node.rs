//! Nodes as `node list` (a table, one row per node) and `node describe` (one node in
//! full) show them, or as JSON / YAML. May not talk to the cluster.

use proto::api;
use proto::state::NodeStatus;
use serde_json::{Value, json};

use crate::names::{health_name, state_name};
use crate::output::{self, Format, escape};

fn node_json(n: &api::NodeInfo) -> Value {
    let labels: serde_json::Map<String, Value> = n
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({
        "id": n.id,
        "state": state_name(n.state),
        "roles": n.roles,
        "address": n.address,
        "health": health_name(n.health),
        "labels": labels,
        "public_key": hex_encode(&n.public_key),
        "time_since_heartbeat_ms": n.time_since_heartbeat_ms,
        "decommission_progress": n.decommission_progress,
        "warnings": n.warnings,
        "status": n.status.as_ref().map(status_json),
    })
}

/// The services a node reported running.
fn services(status: &NodeStatus) -> Vec<&'static str> {
    let mut running = Vec::new();
    if status.etcd_member_running {
        running.push("etcd-member");
    }
    if status.curator_running {
        running.push("curator");
    }
    running
}

fn status_json(status: &NodeStatus) -> Value {
    json!({
        "address": status.address,
        "version": status.version,
        "services": services(status),
        "etcd_member_running": status.etcd_member_running,
        "curator_running": status.curator_running,
        "started_at_unix_ms": status.started_at_unix_ms,
        "started_at": output::utc_time(status.started_at_unix_ms),
        "programs": status.services.iter().map(|s| json!({
            "name": s.name,
            "running": s.running,
            "restarts": s.restarts,
            "last_error": s.last_error,
            "since_unix_ms": s.since_unix_ms,
        })).collect::<Vec<_>>(),
        "kubernetes_node": status.kubernetes_node,
    })
}

/// One line per program a role runs: `kube-apiserver: running since …, 2 restarts
/// (last: …)`.
fn program_lines(status: &NodeStatus) -> Vec<String> {
    status
        .services
        .iter()
        .map(|s| {
            let mut line = format!(
                "{}: {}",
                escape(&s.name),
                match (s.running, s.since_unix_ms) {
                    (true, at) => format!("running since {}", output::utc_time(at)),
                    (false, 0) => "stopped".to_string(),
                    (false, at) => format!("exited at {}", output::utc_time(at)),
                }
            );
            if s.restarts > 0 {
                line.push_str(&format!(", {} restarts", s.restarts));
            }
            if !s.last_error.is_empty() {
                line.push_str(&format!(" (last: {})", escape(&s.last_error)));
            }
            line
        })
        .collect()
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `node list`: one row per node, then the nodes' warnings.
pub(crate) fn print_node_list(nodes: &[api::NodeInfo], format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{}", Value::Array(nodes.iter().map(node_json).collect())),
        Format::Yaml => print!(
            "{}",
            output::yaml(&Value::Array(nodes.iter().map(node_json).collect()))
        ),
        Format::Table => {
            let rows: Vec<Vec<String>> = nodes
                .iter()
                .map(|n| {
                    let mut labels: Vec<String> =
                        n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    labels.sort();
                    let state = if n.decommission_progress.is_empty() {
                        state_name(n.state)
                    } else {
                        format!("{} ({})", state_name(n.state), n.decommission_progress)
                    };
                    vec![
                        n.id.clone(),
                        state,
                        health_name(n.health),
                        n.address.clone(),
                        n.roles.join(","),
                        labels.join(","),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &["ID", "STATE", "HEALTH", "ADDRESS", "ROLES", "LABELS"],
                    &rows
                )
            );
            for n in nodes {
                for w in &n.warnings {
                    println!("warning: node {}: {}", escape(&n.id), escape(w));
                }
            }
        }
    }
}

/// `node describe`: one node in full.
pub(crate) fn print_node(node: &api::NodeInfo, format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{}", node_json(node)),
        Format::Yaml => print!("{}", output::yaml(&node_json(node))),
        Format::Table => {
            let mut labels: Vec<String> = node
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            labels.sort();
            let heartbeat = node
                .time_since_heartbeat_ms
                .map(|ms| format!("{:.1} s ago", ms as f64 / 1000.0))
                .unwrap_or_else(|| "never (since the current leader took over)".into());
            println!("ID:          {}", escape(&node.id));
            println!("State:       {}", state_name(node.state));
            println!("Health:      {}", health_name(node.health));
            println!("Heartbeat:   {heartbeat}");
            println!("Address:     {}", escape(&node.address));
            println!("Roles:       {}", escape(&node.roles.join(", ")));
            println!("Labels:      {}", escape(&labels.join(", ")));
            println!("Public key:  {}", hex_encode(&node.public_key));
            if !node.decommission_progress.is_empty() {
                println!("Decommission: {}", escape(&node.decommission_progress));
            }
            for w in &node.warnings {
                println!("Warning:     {}", escape(w));
            }
            match &node.status {
                None => println!("Status:      not reported yet"),
                Some(status) => {
                    let running = services(status);
                    println!("Status:");
                    println!("  Address:   {}", escape(&status.address));
                    println!("  Version:   {}", escape(&status.version));
                    println!(
                        "  Services:  {}",
                        if running.is_empty() {
                            "none".to_string()
                        } else {
                            running.join(", ")
                        }
                    );
                    println!(
                        "  Started:   {}",
                        output::utc_time(status.started_at_unix_ms)
                    );
                    let programs = program_lines(status);
                    if !programs.is_empty() {
                        println!("  Programs:");
                        for line in programs {
                            println!("    {line}");
                        }
                    }
                    if !status.kubernetes_node.is_empty() {
                        println!("  Kubernetes Node: {}", escape(&status.kubernetes_node));
                    }
                }
            }
        }
    }
}
