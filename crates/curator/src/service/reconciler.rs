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
//!   on a change of leadership or of the node snapshot, every RECONCILE_EVERY, and
//!   RETRY_AFTER after a step that failed
//! ```
//! Every step is idempotent, so the next leader simply runs them again.
//!
//! Above `removal` (the steps) and `membership`: may not import the handlers or
//! `decommission`.

use std::sync::Arc;
use std::time::Duration;

use super::shared::Shared;
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
    loop {
        let leadership = match shared.role.current() {
            Some(Role::Leader(l)) => Some(l),
            _ => None,
        };
        let mut wait = RECONCILE_EVERY;
        if let Some(leadership) = leadership {
            match reconcile(&shared, &leadership).await {
                Ok(()) => last_problem = None,
                Err(problem) => {
                    wait = RETRY_AFTER;
                    if last_problem.as_ref() != Some(&problem) {
                        tracing::warn!("membership reconciliation held up: {problem}");
                        last_problem = Some(problem);
                    }
                }
            }
        }
        tokio::select! {
            r = roles.get() => { r?; }
            s = snapshots.get() => { s?; }
            _ = tokio::time::sleep(wait) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}
