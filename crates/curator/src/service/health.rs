//! The leader's health runnable (`root.role.controlplane.curator.health`): evaluates
//! every UP node's heartbeats about once a second ([`crate::health`], pure) and writes a
//! verdict into the node record (`Node.health`) only when it changed, logging each
//! transition once.
//!
//! ```text
//!   Heartbeat (nodes.rs) ──▶ HealthBook (this tenure's trackers) ◀── node_infos (list, describe)
//!                                      │ every EVALUATION_PERIOD, as leader
//!                                      ▼
//!   node snapshot (stored verdicts) ── compare ──▶ writes::modify_node: Node.health
//! ```
//! Evaluation runs only on a snapshot that holds this tenure's own writes
//! (`Shared::fresh_nodes`), so a verdict is compared with what is really stored.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument as _;

use proto::state::{HealthVerdict, Node, NodeState};

use super::health_book::stored_verdict;
use super::shared::Shared;
use crate::election::{Leadership, Role};
use crate::error::NodeUpdateError;
use crate::health::Tracker;
use crate::writes;

/// How often verdicts are evaluated (at most; shorter when the timeout is short).
const EVALUATION_PERIOD: Duration = Duration::from_secs(1);

/// Verdict writes in flight at once.
const CONCURRENT_WRITES: usize = 32;

pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    let every = EVALUATION_PERIOD.min(shared.config.heartbeat.timeout() / 4);
    ctx.signal_healthy();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
        let Some(Role::Leader(leadership)) = shared.role.current() else {
            // Only the leader exports the cluster's nodes.
            metrics::global().nodes.replace(Vec::new());
            metrics::global().heartbeat_age.replace(Vec::new());
            continue;
        };
        let Some(snapshot) = shared.fresh_nodes(&leadership).await else {
            continue;
        };
        let changes = changed_verdicts(&shared, &leadership, &snapshot.nodes);
        let mut writes = tokio::task::JoinSet::new();
        for (id, from, to) in changes {
            if writes.len() >= CONCURRENT_WRITES {
                writes.join_next().await;
            }
            let (shared, leadership) = (shared.clone(), leadership.clone());
            // Spawned tasks leave the runnable's span behind: carry it, so that the
            // verdict lines name the runnable.
            writes.spawn(
                async move { record(&shared, &leadership, &id, from, to).await }
                    .instrument(tracing::Span::current()),
            );
        }
        tokio::select! {
            _ = async { while writes.join_next().await.is_some() {} } => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

/// The UP nodes whose verdict differs from the stored one: (id, stored, new).
/// Trackers of nodes that no longer exist are dropped.
fn changed_verdicts(
    shared: &Shared,
    leadership: &Leadership,
    nodes: &crate::chunkmap::ChunkMap<Node>,
) -> Vec<(String, HealthVerdict, HealthVerdict)> {
    let now = Instant::now();
    let timing = shared.config.heartbeat;
    let mut book = shared.health.lock().expect("health lock poisoned");
    let book = book.tenure(leadership);
    book.trackers.retain(|id, _| nodes.contains_key(id));
    let mut changes = Vec::new();
    for node in nodes.values().filter(|n| n.state == NodeState::Up as i32) {
        let stored = stored_verdict(node);
        let verdict = book
            .trackers
            .entry(node.id.clone())
            .or_insert_with(|| Tracker::new(stored, now))
            .evaluate(now, book.since, &timing);
        if verdict != stored {
            changes.push((node.id.clone(), stored, verdict));
        }
    }
    export_metrics(nodes, &book.trackers, now);
    changes
}

/// `polis_nodes` by state and health (the stored verdicts) and every UP node's
/// heartbeat age, as of this evaluation.
fn export_metrics(
    nodes: &crate::chunkmap::ChunkMap<Node>,
    trackers: &std::collections::HashMap<String, Tracker>,
    now: Instant,
) {
    let mut counts: BTreeMap<(String, String), f64> = BTreeMap::new();
    for node in nodes.values() {
        let state = NodeState::try_from(node.state).unwrap_or(NodeState::Invalid);
        let state = state.as_str_name().trim_start_matches("NODE_STATE_");
        let health = stored_verdict(node)
            .as_str_name()
            .trim_start_matches("HEALTH_VERDICT_");
        *counts
            .entry((state.to_string(), health.to_string()))
            .or_default() += 1.0;
    }
    let registry = metrics::global();
    registry.nodes.replace(
        counts
            .into_iter()
            .map(|((state, health), n)| (vec![("state", state), ("health", health)], n))
            .collect(),
    );
    registry.heartbeat_age.replace(
        nodes
            .values()
            .filter(|n| n.state == NodeState::Up as i32)
            .filter_map(|n| {
                let last = trackers.get(&n.id)?.last()?;
                Some((
                    vec![("node", n.id.clone())],
                    now.duration_since(last).as_secs_f64(),
                ))
            })
            .collect(),
    );
}

/// Writes `to` as node `id`'s verdict unless it is already stored; logs it when written.
async fn record(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
    from: HealthVerdict,
    to: HealthVerdict,
) {
    let mut wrote = false;
    let result = writes::modify_node(&shared.curator, leadership, id, |current| {
        wrote = false;
        let Some(node) = current else {
            return Err(NodeUpdateError::NotFound(id.to_string()));
        };
        if node.health == to as i32 || node.state != NodeState::Up as i32 {
            return Ok(None);
        }
        let mut node = node.clone();
        node.health = to as i32;
        wrote = true;
        Ok(Some(node))
    })
    .await;
    match result {
        Ok(_) if !wrote => {}
        Ok(_) => match to {
            HealthVerdict::HeartbeatTimeout => tracing::warn!(
                node = id,
                from = name(from),
                "node health: HEARTBEAT_TIMEOUT (no heartbeat for {:?})",
                shared.config.heartbeat.timeout()
            ),
            _ => tracing::info!(node = id, from = name(from), "node health: {}", name(to)),
        },
        // Deleted meanwhile: nothing to judge.
        Err(NodeUpdateError::NotFound(_)) => {}
        // Retried on the next evaluation (also after losing leadership: then by the next
        // leader).
        Err(e) => tracing::debug!(node = id, "recording the health verdict: {e}"),
    }
}

/// A verdict's name without the enum prefix, e.g. HEALTHY.
fn name(verdict: HealthVerdict) -> &'static str {
    verdict.as_str_name().trim_start_matches("HEALTH_VERDICT_")
}
