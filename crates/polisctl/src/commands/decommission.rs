//! `node decommission` and `node delete`: the end of a node's life.
//! Prints each step itself (no table to render); may not use other commands.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use proto::api::{self, NodeState};

use crate::names::state_name;
use crate::output::{escape, escape_text};
use crate::session::owner_session;

/// How often a waiting `node decommission` asks how far the node got.
const POLL: Duration = Duration::from_millis(200);

/// `node decommission`: starts the decommission of each node and, unless `wait` is
/// `None`, waits up to that long for each to reach DECOMMISSIONED, printing every step.
pub(crate) async fn node_decommission(
    config: &Path,
    raw_endpoints: &[String],
    ids: &[String],
    wait: Option<Duration>,
) -> Result<()> {
    let session = owner_session(config, raw_endpoints).await?;
    for id in ids {
        identity::validate_node_id(id)?;
    }
    for id in ids {
        let node = session
            .management(&format!("decommissioning node {id}"), |mut m| async move {
                m.decommission_node(api::DecommissionNodeRequest { id: id.clone() })
                    .await
            })
            .await?
            .node
            .unwrap_or_default();
        report(id, &node);
        let Some(wait) = wait else { continue };
        let deadline = Instant::now() + wait;
        let mut last = node;
        while last.state != NodeState::Decommissioned as i32 {
            if Instant::now() >= deadline {
                bail!(
                    "node {id} is still {} after {}s ({}); the cluster keeps at it: follow it with \
                     `polisctl node describe {id}`",
                    state_name(last.state),
                    wait.as_secs(),
                    last.decommission_progress
                );
            }
            tokio::time::sleep(POLL).await;
            let node = session
                .management(&format!("describing node {id}"), |mut m| async move {
                    m.describe_node(api::DescribeNodeRequest { id: id.clone() })
                        .await
                })
                .await?;
            if node.state != last.state || node.decommission_progress != last.decommission_progress
            {
                report(id, &node);
            }
            last = node;
        }
    }
    Ok(())
}

fn report(id: &str, node: &api::NodeInfo) {
    if node.state == NodeState::Decommissioned as i32 {
        println!(
            "{id}: DECOMMISSIONED (out of consensus, certificates revoked); remove its record with \
             `polisctl node delete {id}`"
        );
    } else if node.decommission_progress.is_empty() {
        println!("{id}: {}", state_name(node.state));
    } else {
        println!(
            "{id}: {} ({})",
            state_name(node.state),
            escape(&node.decommission_progress)
        );
    }
}

/// `node delete`: deletes each node's record (DECOMMISSIONED, NEW or STANDBY nodes);
/// every ID is tried, and the command fails if any deletion failed.
pub(crate) async fn node_delete(
    config: &Path,
    raw_endpoints: &[String],
    ids: &[String],
) -> Result<()> {
    let session = owner_session(config, raw_endpoints).await?;
    let mut failed = 0;
    for id in ids {
        if let Err(e) = identity::validate_node_id(id) {
            eprintln!("polisctl: deleting {}: {e}", escape(id));
            failed += 1;
            continue;
        }
        let outcome = session
            .management(&format!("deleting node {id}"), |mut m| async move {
                m.delete_node(api::DeleteNodeRequest { id: id.clone() })
                    .await
            })
            .await;
        match outcome {
            Ok(_) => println!("deleted {id}; its key cannot register again"),
            Err(e) => {
                eprintln!("polisctl: {}", escape_text(&format!("{e:#}")));
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} deletions failed", ids.len());
    }
    Ok(())
}
