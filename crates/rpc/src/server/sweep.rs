//! Connections closed once the certificate they were opened with no longer verifies:
//! its CA retired by a rotation, its serial revoked (a removed operator, a deleted
//! node), or its time run out. Every call is checked on its own (`auth`), but a
//! stream opened before the change (a followed audit log, a WatchNode) would otherwise
//! go on for as long as the connection does, and the connection would keep its seat.
//!
//! ```text
//!   AuthLayer, a call with a certificate ─▶ Sweeper::register(connection, chain)
//!                                           (once per connection; weak: no seat kept)
//!   sweeper task, every CHECK: the anchors (trust source) changed, or FULL passed ─▶
//!     each registered connection's leaf classified again under them: Invalid ─▶
//!     the connection evicted (closed at its next read; its streams end with it) —
//!     at once when no call is in flight on it, else after GRACE (30 s), so that a call
//!     under way ends with its own answer
//! ```
//! Only what verified before and does not now is closed: a self-signed caller (a
//! registering node, an unlocking one) stays self-signed under any anchors.
//!
//! A leaf below `auth` (which owns it, and re-exports [`TrustSource`]): may not
//! authorize.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, UnixTime};

use super::calls::Calls;
use crate::authz::Identity;
use crate::tls::{Anchors, Authenticator};

/// Fetches what callers' certificates are checked against now: the cluster CAs
/// trusted and their current CRLs (an error when a CRL is not known yet).
pub type TrustSource =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Anchors, String>> + Send>> + Send + Sync>;

/// How often the anchors are looked at.
const CHECK: Duration = Duration::from_secs(2);
/// How long calls in flight on a connection to be closed get to finish: the longest a
/// unary call may take on a curator (its request timeout), so that every call under
/// way ends with its own answer; a stream ends with the connection then.
const GRACE: Duration = Duration::from_secs(30);
/// How often every connection is classified again although the anchors did not change
/// (a certificate that expired meanwhile).
const FULL: Duration = Duration::from_secs(30);

/// The connections whose callers showed a certificate, checked again as trust changes.
pub(super) struct Sweeper {
    connections: Mutex<Vec<Entry>>,
    started: OnceLock<()>,
}

struct Entry {
    calls: Weak<Calls>,
    chain: Arc<Vec<CertificateDer<'static>>>,
}

impl Sweeper {
    pub(super) fn new() -> Arc<Sweeper> {
        Arc::new(Sweeper {
            connections: Mutex::new(Vec::new()),
            started: OnceLock::new(),
        })
    }

    /// Keeps `calls`' connection (its caller showed `chain`) to be checked again; the
    /// first registration starts the task (a runtime is running then).
    pub(super) fn register(
        self: &Arc<Sweeper>,
        calls: &Arc<Calls>,
        chain: &Arc<Vec<CertificateDer<'static>>>,
        authenticator: &Arc<Authenticator>,
        trust: &TrustSource,
    ) {
        if !calls.mark_swept() {
            return;
        }
        {
            let mut connections = self.connections.lock().expect("sweeper lock poisoned");
            // Bounded by the connections alive: the gone ones go before each addition.
            connections.retain(|e| e.calls.strong_count() > 0);
            connections.push(Entry {
                calls: Arc::downgrade(calls),
                chain: chain.clone(),
            });
        }
        self.started.get_or_init(|| {
            tokio::spawn(run(
                Arc::downgrade(self),
                authenticator.clone(),
                trust.clone(),
            ));
        });
    }

    /// Classifies every registered connection's leaf under `anchors` at `now`; evicts
    /// those that do not verify. Returns how many it evicted.
    pub(super) fn sweep(
        &self,
        authenticator: &Authenticator,
        anchors: &Anchors,
        now: UnixTime,
    ) -> usize {
        let mut connections = self.connections.lock().expect("sweeper lock poisoned");
        connections.retain(|e| e.calls.strong_count() > 0);
        let mut evicted = 0;
        for entry in connections.iter() {
            let (Some(calls), Some(leaf)) = (entry.calls.upgrade(), entry.chain.first()) else {
                continue;
            };
            if let Identity::Invalid { reason } = authenticator.classify(Some(leaf), anchors, now) {
                tracing::info!(
                    "closing a connection whose certificate no longer verifies: {reason}"
                );
                evict_after_grace(&calls);
                evicted += 1;
            }
        }
        // Evicted ones, and those whose eviction is under way, are not looked at again.
        connections.retain(|e| {
            e.calls
                .upgrade()
                .is_some_and(|c| !c.is_evicted() && !c.is_doomed())
        });
        evicted
    }
}

/// Evicts `calls`' connection now when no call is in flight on it; otherwise after
/// [`GRACE`], so that a call under way (a renewal racing the revocation that made its
/// certificate invalid) ends with its own answer rather than a cut connection, while a
/// stream still ends within the grace.
fn evict_after_grace(calls: &Arc<Calls>) {
    use super::admission::Occupant as _;
    calls.doom();
    if !calls.busy() {
        calls.evict();
        return;
    }
    let weak = Arc::downgrade(calls);
    tokio::spawn(async move {
        tokio::time::sleep(GRACE).await;
        if let Some(calls) = weak.upgrade() {
            calls.evict();
        }
    });
}

/// The task: ends once every `AuthLayer` holding the sweeper is gone.
async fn run(sweeper: Weak<Sweeper>, authenticator: Arc<Authenticator>, trust: TrustSource) {
    let mut last: Option<Anchors> = None;
    let mut last_full = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(CHECK).await;
        let Some(sweeper) = sweeper.upgrade() else {
            return;
        };
        let Ok(anchors) = trust().await else {
            continue;
        };
        let changed = last.as_ref() != Some(&anchors);
        if !changed && last_full.elapsed() < FULL {
            continue;
        }
        last_full = tokio::time::Instant::now();
        let evicted = sweeper.sweep(&authenticator, &anchors, UnixTime::now());
        if evicted > 0 {
            tracing::warn!(
                evicted,
                trust_changed = changed,
                "closed connections whose certificates no longer verify"
            );
        }
        last = Some(anchors);
    }
}
