//! A node's reported status into its record: at most one write per heartbeat period per
//! node (`health::status_write_due`), the latest change within a period written at its
//! end, so that the record always ends with the last status a node reported.
//!
//! ```text
//!   Heartbeat: status ≠ snapshot's ─▶ decide (under the health lock)
//!       due ─▶ Now: written by the handler
//!       not due, nothing pending ─▶ Later(at): pending kept, one task writes the latest
//!                                   pending status at `at` (the period's end)
//!       not due, already pending ─▶ the pending status replaced; nothing else
//! ```
//! A node heartbeating as fast as it can with a new status each time thus costs etcd
//! one write per period, and every WatchNode stream one wake-up. The deferred task
//! writes only for the tenure it was scheduled in (the book of another tenure is not
//! touched; its write is guarded by the leadership anyway).
//!
//! May import only `shared`, `health_book` and `status` of the service layer.

use std::sync::Arc;
use std::time::Instant;

use proto::state::NodeStatus;
use tonic::Status;

use super::health_book::TenureBook;
use super::shared::Shared;
use super::status::node_update_status;
use crate::election::Leadership;
use crate::error::NodeUpdateError;
use crate::health::{Timing, status_write_due};
use crate::writes;

/// What a heartbeat's changed status gets.
#[derive(Debug, PartialEq)]
pub(super) enum StatusWrite {
    /// Nothing to write now (unchanged, or pending for the period's end).
    None,
    /// Written by the handler, now.
    Now(NodeStatus),
    /// Pending: a task writes the latest pending status at this instant.
    Later(Instant),
}

/// Decides, under the health lock, what becomes of node `id`'s `changed` status at
/// `now`.
pub(super) fn decide(
    book: &mut TenureBook,
    id: &str,
    changed: Option<NodeStatus>,
    now: Instant,
    timing: &Timing,
) -> StatusWrite {
    let Some(status) = changed else {
        return StatusWrite::None;
    };
    let last = book.status_written.get(id).copied();
    if status_write_due(last, now, timing) {
        book.status_written.insert(id.to_string(), now);
        book.status_pending.remove(id);
        return StatusWrite::Now(status);
    }
    match (book.status_pending.insert(id.to_string(), status), last) {
        (None, Some(last)) => StatusWrite::Later(last + timing.period()),
        // A task is already scheduled (or, without a last write, none is needed: the
        // write was due).
        _ => StatusWrite::None,
    }
}

/// Writes `status` into node `id`'s record (nothing when it holds it already).
pub(super) async fn record(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
    status: NodeStatus,
) -> Result<(), Status> {
    let written = writes::modify_node(&shared.curator, leadership, id, |current| {
        let node = current.ok_or_else(|| NodeUpdateError::NotFound(id.to_string()))?;
        if node.status.as_ref() == Some(&status) {
            return Ok(None);
        }
        let mut node = node.clone();
        node.status = Some(status.clone());
        Ok(Some(node))
    })
    .await;
    match written {
        Ok(_) => tracing::debug!(node = id, ?status, "node status recorded"),
        // etcd upkeep: the heartbeat itself counted (the tracker); the status is
        // recorded by a later heartbeat once etcd has space again, so NOSPACE does not
        // make every node believe it is split.
        Err(NodeUpdateError::Curator(crate::error::CuratorError::NoSpace)) => {
            tracing::debug!(node = id, "node status not recorded: etcd is out of space")
        }
        Err(e) => return Err(node_update_status(e)),
    }
    Ok(())
}

/// Writes node `id`'s pending status at `at` (see [`decide`]), in a task of its own.
pub(super) fn record_later(shared: Arc<Shared>, leadership: Leadership, id: String, at: Instant) {
    tokio::spawn(async move {
        tokio::time::sleep_until(at.into()).await;
        let status = {
            let mut book = shared.health.lock().expect("health lock poisoned");
            let Some(book) = book.current(&leadership) else {
                return;
            };
            let Some(status) = book.status_pending.remove(&id) else {
                return;
            };
            book.status_written.insert(id.clone(), Instant::now());
            status
        };
        if let Err(e) = record(&shared, &leadership, &id, status).await {
            tracing::debug!(node = id, "a deferred node status was not recorded: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;

    fn status(version: &str) -> NodeStatus {
        NodeStatus {
            version: version.into(),
            ..Default::default()
        }
    }

    fn book(since: Instant) -> TenureBook {
        TenureBook {
            since,
            trackers: HashMap::new(),
            status_written: HashMap::new(),
            status_pending: HashMap::new(),
        }
    }

    #[test]
    fn one_write_now_then_the_latest_change_at_the_periods_end() {
        let timing = Timing::DEFAULT;
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = book(t0);
        assert_eq!(decide(&mut b, "n", None, t0, &timing), StatusWrite::None);
        assert_eq!(
            decide(&mut b, "n", Some(status("a")), t0, &timing),
            StatusWrite::Now(status("a"))
        );
        // Changes within the period: one task scheduled, for the period's end; the
        // latest change is what it will write.
        assert_eq!(
            decide(&mut b, "n", Some(status("b")), at(10), &timing),
            StatusWrite::Later(at(5_000))
        );
        assert_eq!(
            decide(&mut b, "n", Some(status("c")), at(20), &timing),
            StatusWrite::None
        );
        assert_eq!(b.status_pending["n"], status("c"));
        // Another node has its own period.
        assert_eq!(
            decide(&mut b, "m", Some(status("x")), at(30), &timing),
            StatusWrite::Now(status("x"))
        );
        // A heartbeat once the period is over writes at once and clears what pended.
        assert_eq!(
            decide(&mut b, "n", Some(status("d")), at(5_000), &timing),
            StatusWrite::Now(status("d"))
        );
        assert!(b.status_pending.is_empty());
    }
}
