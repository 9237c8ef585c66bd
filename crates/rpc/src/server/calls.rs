//! Calls in flight on one connection, and when the last one started or ended: what
//! decides whether a connection is idle.
//!
//! A leaf (besides [`Limits`]): may not touch sockets.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::limits::Limits;

/// Calls in flight on one connection, and when the last one started or ended.
#[derive(Debug)]
pub(crate) struct Calls {
    in_flight: AtomicUsize,
    /// `None` until the first call starts.
    last: Mutex<Option<Instant>>,
}

impl Calls {
    pub(super) fn new() -> Calls {
        Calls {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(None),
        }
    }

    fn touch(&self) {
        *self.last.lock().expect("calls lock poisoned") = Some(Instant::now());
    }

    pub(super) fn start(self: &Arc<Calls>) -> CallGuard {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.touch();
        CallGuard(self.clone())
    }

    /// When the connection becomes closable for idleness: `None` while a call is in
    /// flight.
    pub(super) fn idle_deadline(&self, accepted: Instant, limits: &Limits) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(match *self.last.lock().expect("calls lock poisoned") {
            None => accepted + limits.first_call_timeout,
            Some(last) => last + limits.idle_timeout,
        })
    }
}

/// One call in flight: counted until dropped.
pub(super) struct CallGuard(Arc<Calls>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
