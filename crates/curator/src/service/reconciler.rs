//! The membership reconciler: the leader's runnable that carries out every recorded
//! membership intent and undoes what no record stands for.
//!
//! ```text
//!   while this curator leads (again after every change of leader):
//!     every record whose ConsensusMember removal is pending (node snapshot)
//!       ─▶ membership lock ─▶ removal::carry_out_removal (member removed by its
//!          recorded ID, certificates revoked, role cleared, revoked again)
//!     etcd learners no record with the role stands for (a deposed leader's join)
//!       ─▶ removal::remove_orphan_learners
//!   on a change of leadership or of what membership depends on in the node snapshot
//!   (IDs, states, addresses, roles: not labels nor status), every RECONCILE_EVERY,
//!   and RETRY_AFTER after a step that failed
//! ```
//! Every step is idempotent, so the next leader simply runs them again.
//!
//! Above `removal` (the steps) and `membership`: may not import the handlers or
//! `decommission`.

use std::sync::Arc;
use std::time::Duration;

use super::shared::{NodeSnapshot, Shared};
use super::{membership, removal};
use crate::election::{Leadership, Role};

/// How often the leader looks for orphaned learners without another reason to.
const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// How soon a step that failed is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// One pass: every pending removal, then the orphaned learners. Returns the first
/// problem met (the other steps still run).
async fn reconcile(shared: &Arc<Shared>, leadership: &Leadership) -> Result<(), String> {
    let pending: Vec<String> = shared
        .nodes
        .current()
        .map(|snapshot| {
            snapshot
                .nodes
                .values()
                .filter(|n| membership::removal_pending(n))
                .map(|n| n.id.clone())
                .collect()
        })
        .unwrap_or_default();
    let _guard = shared.membership.clone().lock_owned().await;
    let mut problem = None;
    for id in pending {
        match removal::carry_out_removal(shared, leadership, &id).await {
            Ok(_) => tracing::info!(node = id, "reconciler: finished a recorded role removal"),
            Err(status) => {
                problem.get_or_insert(format!(
                    "removing the ConsensusMember role of node {id}: {}",
                    status.message()
                ));
            }
        }
    }
    if let Err(status) = removal::remove_orphan_learners(shared, leadership).await {
        problem.get_or_insert(format!("orphaned learners: {}", status.message()));
    }
    problem.map_or(Ok(()), Err)
}

/// What of the node records the reconciler acts on: each record's ID, state, address
/// and roles (a fingerprint). A change of anything else (labels, status, health) does
/// not start a pass: under a flood of label writes each pass would cost an etcd read
/// and a member list per write.
fn membership_view(snapshot: Option<&NodeSnapshot>) -> u64 {
    use prost::Message;
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for node in snapshot.iter().flat_map(|s| s.nodes.values()) {
        (&node.id, node.state, &node.address).hash(&mut hasher);
        node.roles
            .as_ref()
            .map(|r| r.encode_to_vec())
            .hash(&mut hasher);
    }
    hasher.finish()
}

/// The `membership` runnable: while this curator leads, reconciles etcd membership with
/// the node records (see the module documentation).
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    let mut roles = shared.role.watch();
    let mut snapshots = shared.nodes.watch();
    ctx.signal_healthy();
    let mut last_problem = None;
    let mut reconciled_view = None;
    loop {
        let leadership = match shared.role.current() {
            Some(Role::Leader(l)) => Some(l),
            _ => None,
        };
        let mut wait = RECONCILE_EVERY;
        if let Some(leadership) = leadership {
            let view = membership_view(shared.nodes.current().as_ref());
            match reconcile(&shared, &leadership).await {
                Ok(()) => {
                    last_problem = None;
                    reconciled_view = Some(view);
                }
                Err(problem) => {
                    wait = RETRY_AFTER;
                    reconciled_view = None;
                    if last_problem.as_ref() != Some(&problem) {
                        tracing::warn!("membership reconciliation held up: {problem}");
                        last_problem = Some(problem);
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                r = roles.get() => { r?; break; }
                s = snapshots.get() => {
                    let snapshot = s?;
                    if reconciled_view != Some(membership_view(Some(&snapshot))) {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => break,
                _ = ctx.cancelled() => return Ok(()),
            }
        }
    }
}
