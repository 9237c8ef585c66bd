//! What one connection's parts share about it: the calls in flight and when the last
//! one started or ended (whether it is idle), whether its latest call showed a node's or
//! an admin's identity (proven), and whether the listener evicted it to make room for a newcomer.
//!
//! A leaf (besides [`Limits`] and the admission table's [`Occupant`]): may not touch
//! sockets.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::time::Instant;

use super::admission::{Demotions, Occupant};
use super::limits::Limits;

/// One connection's calls in flight, its proof, and its eviction.
#[derive(Debug)]
pub(crate) struct Calls {
    in_flight: AtomicUsize,
    /// `None` until the first call starts.
    last: Mutex<Option<Instant>>,
    /// Who proved it (see `set_proven`).
    proven: Mutex<Option<Arc<str>>>,
    /// Told when `proven` goes from some to none (the seat table's).
    demotions: Arc<Demotions>,
    evicted: AtomicBool,
    /// Whether the sweeper keeps this connection (`sweep`): registered once.
    swept: AtomicBool,
    /// Whether the sweeper decided to close it (after a grace when busy).
    doomed: AtomicBool,
    /// Whoever waits for the connection's bytes (the handshake, then the connection's
    /// reads): woken by an eviction.
    waiter: Mutex<Option<Waker>>,
}

impl Calls {
    /// A connection seated in the table that `demotions` belongs to.
    pub(super) fn new(demotions: Arc<Demotions>) -> Calls {
        Calls {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(None),
            proven: Mutex::new(None),
            demotions,
            evicted: AtomicBool::new(false),
            swept: AtomicBool::new(false),
            doomed: AtomicBool::new(false),
            waiter: Mutex::new(None),
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

    /// Whether the latest call on this connection was made with a node's or an admin's
    /// certificate: while it was, the connection is neither evicted nor counted against
    /// its source. Once one no longer is (its certificate was revoked), the connection
    /// counts again; it is not closed here (the call's answer is still to be sent).
    /// `by`: the identity of that certificate (`None`: not a node's or an admin's).
    pub(super) fn set_proven(&self, by: Option<Arc<str>>) {
        let was = std::mem::replace(
            &mut *self.proven.lock().expect("calls lock poisoned"),
            by.clone(),
        );
        if was.is_some() && was != by {
            self.demotions.raise();
        }
    }

    /// Closes the connection at its next read (the listener needs its seat).
    pub(super) fn evict(&self) {
        self.evicted.store(true, Ordering::SeqCst);
        if let Some(waker) = self.waiter.lock().expect("calls lock poisoned").take() {
            waker.wake();
        }
    }

    /// Whether the connection was evicted (it closes at its next read).
    pub(super) fn is_evicted(&self) -> bool {
        self.evicted.load(Ordering::SeqCst)
    }

    /// Marks the connection as one the sweeper closes (see `sweep`).
    pub(super) fn doom(&self) {
        self.doomed.store(true, Ordering::SeqCst);
    }

    pub(super) fn is_doomed(&self) -> bool {
        self.doomed.load(Ordering::SeqCst)
    }

    /// True the first time only: the sweeper registers a connection once.
    pub(super) fn mark_swept(&self) -> bool {
        !self.swept.swap(true, Ordering::SeqCst)
    }

    /// Ready once the connection is evicted; registers `cx` to be woken otherwise.
    pub(super) fn poll_evicted(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.evicted.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        *self.waiter.lock().expect("calls lock poisoned") = Some(cx.waker().clone());
        // An eviction between the check and the registration found no waker.
        if self.evicted.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// Resolves once the connection is evicted.
    pub(super) async fn evicted(&self) {
        std::future::poll_fn(|cx| self.poll_evicted(cx)).await
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

impl Occupant for Arc<Calls> {
    fn prover(&self) -> Option<Arc<str>> {
        self.proven.lock().expect("calls lock poisoned").clone()
    }
    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) > 0
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
