//! The leader's heartbeat book: this tenure's health trackers and status writes (done and
//! pending), kept in memory, and the verdict a record stores.
//!
//! ```text
//!   Heartbeat (nodes) ──▶ HealthBook::tenure(l).trackers ◀── health runnable, node_info
//! ```
//! A leaf of the service layer: may import only `election` (the tenure) and `health`
//! (the pure rules); no I/O.

use std::collections::HashMap;
use std::time::Instant;

use proto::state::{HealthVerdict, Node, NodeStatus};

use crate::election::Leadership;
use crate::health as rules;

/// The verdict stored in a record (unknown numbers read as UNKNOWN).
pub(super) fn stored_verdict(node: &Node) -> HealthVerdict {
    HealthVerdict::try_from(node.health).unwrap_or(HealthVerdict::Unknown)
}

/// The leader's heartbeat book: one [`rules::Tracker`] per node that heartbeated or was
/// evaluated, for one leadership tenure. Kept in memory only: a new tenure starts a new
/// book from the verdicts stored in the records.
#[derive(Default)]
pub(super) struct HealthBook {
    /// The tenure (election key, its revision) the trackers belong to.
    tenure: Option<(Vec<u8>, i64)>,
    current: Option<TenureBook>,
}

pub(super) struct TenureBook {
    pub(super) since: Instant,
    pub(super) trackers: HashMap<String, rules::Tracker>,
    /// When each node's status was last written in this tenure
    /// (`rules::status_write_due`).
    pub(super) status_written: HashMap<String, Instant>,
    /// Each node's latest status not yet written, waiting for its period's end
    /// (`node_status`).
    pub(super) status_pending: HashMap<String, NodeStatus>,
}

impl HealthBook {
    /// The book of `leadership`'s tenure; an older tenure's book is dropped.
    pub(super) fn tenure(&mut self, leadership: &Leadership) -> &mut TenureBook {
        let tenure = (leadership.key.clone(), leadership.revision);
        if self.tenure.as_ref() != Some(&tenure) || self.current.is_none() {
            self.tenure = Some(tenure);
            self.current = Some(TenureBook {
                since: leadership.since,
                trackers: HashMap::new(),
                status_written: HashMap::new(),
                status_pending: HashMap::new(),
            });
        }
        self.current.as_mut().expect("set above")
    }

    /// The book of `leadership`'s tenure if it is the current one (never replaces it).
    pub(super) fn current(&mut self, leadership: &Leadership) -> Option<&mut TenureBook> {
        let tenure = (leadership.key.clone(), leadership.revision);
        if self.tenure.as_ref() != Some(&tenure) {
            return None;
        }
        self.current.as_mut()
    }
}
