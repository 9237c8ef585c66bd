//! Node health from heartbeats, with hysteresis (pure: time comes in as arguments).
//!
//! Metropolis' heartbeat period equals its timeout, so a node whose heartbeat arrives a
//! little late flips to unhealthy and back. Here the period is well under the timeout
//! ([`Timing`] refuses less than three heartbeats per timeout), and a verdict needs more
//! to leave HEARTBEAT_TIMEOUT than to enter it:
//!
//! ```text
//!                 first heartbeat                  no heartbeat for `timeout`
//!   UNKNOWN ───────────────────────────▶ HEALTHY ──────────────────────────────▶ HEARTBEAT_TIMEOUT
//!      │                                    ▲                                        │
//!      │ no heartbeat for `timeout`         │ RECOVERY_HEARTBEATS (2) heartbeats,    │
//!      └────────────────────────────────────┼─ each within `timeout` of the previous ┘
//!                       (to HEARTBEAT_TIMEOUT)
//! ```
//! - A node that is back for good recovers at its second heartbeat, which it sends a
//!   retry pause (≤ 500 ms) after the first one answered following failures
//!   (`node::runnables::heartbeat`); a node that only gets through now and then (gaps
//!   longer than the timeout) stays HEARTBEAT_TIMEOUT instead of alternating.
//! - "No heartbeat for `timeout`" counts from the latest of the last heartbeat, the
//!   start of the observer's tenure and the moment the tenure began watching the node: a
//!   new leader, which has seen no heartbeat yet, keeps the verdict its predecessor
//!   stored in the record until it has itself watched for one timeout, so a failover
//!   flips nobody; and a node enrolled long after the tenure began gets a whole timeout
//!   for its first heartbeat too (counting from the tenure start timed out every node
//!   enrolled more than one timeout into it before it could heartbeat).
//! - Only UP nodes have a verdict; the others are UNKNOWN.
//! - A node's status is written at most once per period ([`status_write_due`]).

use std::time::{Duration, Instant};

use proto::state::HealthVerdict;

/// Consecutive heartbeats (each within the timeout of the previous one) that bring a
/// timed-out node back to HEALTHY.
pub const RECOVERY_HEARTBEATS: u32 = 2;

/// The least number of heartbeat periods in one timeout.
pub const MIN_PERIODS_PER_TIMEOUT: u32 = 3;

/// How often nodes heartbeat, and after how long without one the curator says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    period: Duration,
    timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "the heartbeat timeout ({timeout:?}) must be at least {MIN_PERIODS_PER_TIMEOUT} heartbeat periods ({period:?} each), so that one late heartbeat does not time a node out"
    )]
    TimeoutTooShort { period: Duration, timeout: Duration },
    #[error("the heartbeat period must be at least 100 ms (got {0:?})")]
    PeriodTooShort(Duration),
}

impl Timing {
    /// Production values: a heartbeat every 5 s, timed out after 15 s (three missed
    /// heartbeats; longer than a curator failover, ~3 s lease plus election, with room
    /// for the heartbeats retried meanwhile).
    pub const DEFAULT: Timing = Timing {
        period: Duration::from_secs(5),
        timeout: Duration::from_secs(15),
    };

    pub fn new(period: Duration, timeout: Duration) -> Result<Timing, TimingError> {
        if period < Duration::from_millis(100) {
            return Err(TimingError::PeriodTooShort(period));
        }
        if timeout < period * MIN_PERIODS_PER_TIMEOUT {
            return Err(TimingError::TimeoutTooShort { period, timeout });
        }
        Ok(Timing { period, timeout })
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Default for Timing {
    fn default() -> Timing {
        Timing::DEFAULT
    }
}

/// Whether a node's changed status may be written at `now`, its last status write in
/// this tenure at `last`: at most once per heartbeat period. A node whose status
/// changes on every heartbeat (a hostile or broken one heartbeating as fast as it can)
/// thus costs etcd one write per period, and so every WatchNode stream one wake-up,
/// however fast it calls; a change within a period is written at its end
/// (`service::node_status`), so the record still ends with the last status reported.
pub fn status_write_due(last: Option<Instant>, now: Instant, timing: &Timing) -> bool {
    last.is_none_or(|last| now.saturating_duration_since(last) >= timing.period)
}

/// What one leader tenure knows of one node's heartbeats, and its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracker {
    verdict: HealthVerdict,
    /// When this tenure began watching the node (its first evaluation or heartbeat).
    watched_from: Instant,
    last: Option<Instant>,
    /// Heartbeats in a row, each within the timeout of the previous one.
    streak: u32,
}

impl Tracker {
    /// A tracker for a tenure that has seen no heartbeat of the node and begins watching
    /// it at `now`: starts from the verdict stored in the record.
    pub fn new(stored: HealthVerdict, now: Instant) -> Tracker {
        Tracker {
            verdict: stored,
            watched_from: now,
            last: None,
            streak: 0,
        }
    }

    pub fn verdict(&self) -> HealthVerdict {
        self.verdict
    }

    /// The last heartbeat this tenure saw.
    pub fn last(&self) -> Option<Instant> {
        self.last
    }

    /// A heartbeat arrived at `now`.
    pub fn heartbeat(&mut self, now: Instant, timing: &Timing) {
        let steady = self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) <= timing.timeout);
        self.streak = if steady { self.streak + 1 } else { 1 };
        self.last = Some(now);
        self.verdict = match self.verdict {
            HealthVerdict::HeartbeatTimeout if self.streak < RECOVERY_HEARTBEATS => {
                HealthVerdict::HeartbeatTimeout
            }
            _ => HealthVerdict::Healthy,
        };
    }

    /// The verdict at `now`, for a tenure that began at `tenure_start`.
    pub fn evaluate(
        &mut self,
        now: Instant,
        tenure_start: Instant,
        timing: &Timing,
    ) -> HealthVerdict {
        let since = self.last.unwrap_or(self.watched_from).max(tenure_start);
        if now.saturating_duration_since(since) > timing.timeout {
            self.verdict = HealthVerdict::HeartbeatTimeout;
            self.streak = 0;
        }
        self.verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HealthVerdict::{Healthy, HeartbeatTimeout, Unknown};

    fn timing() -> Timing {
        Timing::new(Duration::from_secs(5), Duration::from_secs(15)).unwrap()
    }

    #[test]
    fn a_status_is_written_at_most_once_per_period() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(status_write_due(None, t0, &timing()), "the first change");
        // A flood: one write per period, whatever the rate of calls.
        let mut last = None;
        let mut writes = 0;
        for ms in (0..20_000).step_by(10) {
            if status_write_due(last, at(ms), &timing()) {
                last = Some(at(ms));
                writes += 1;
            }
        }
        assert_eq!(writes, 4, "20 s of calls every 10 ms");
        // An honest node heartbeats a period after its last write: written then.
        assert!(status_write_due(Some(t0), at(5_000), &timing()));
        assert!(!status_write_due(Some(t0), at(4_999), &timing()));
        // A clock that went backwards writes nothing early.
        assert!(!status_write_due(Some(at(1_000)), t0, &timing()));
    }

    enum Step {
        /// A heartbeat at this second.
        Beat(u64),
        /// Evaluate at this second: expect this verdict.
        At(u64, HealthVerdict),
    }
    use Step::{At, Beat};

    /// Runs `steps` from a tracker starting at `stored`, with the tenure starting at 0.
    fn check(stored: HealthVerdict, steps: &[Step]) {
        check_watched_from(stored, 0, steps)
    }

    /// Runs `steps` from a tracker starting at `stored` whose node the tenure (starting
    /// at 0) began watching at second `watched_from`.
    fn check_watched_from(stored: HealthVerdict, watched_from: u64, steps: &[Step]) {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut tracker = Tracker::new(stored, s(watched_from));
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Beat(at) => tracker.heartbeat(s(at), &timing()),
                At(at, want) => assert_eq!(
                    tracker.evaluate(s(at), t0, &timing()),
                    want,
                    "step {i} (at {at} s) from {stored:?}"
                ),
            }
        }
    }

    #[test]
    fn verdicts() {
        // A new node: unknown until its first heartbeat, then healthy.
        check(Unknown, &[At(1, Unknown), Beat(2), At(2, Healthy)]);
        // Never heartbeats: timed out once the tenure has watched for a timeout.
        check(Unknown, &[At(15, Unknown), At(16, HeartbeatTimeout)]);
        // A new leader keeps the stored verdict for one timeout: no flip on failover.
        check(Healthy, &[At(14, Healthy), Beat(14), At(28, Healthy)]);
        check(HeartbeatTimeout, &[At(10, HeartbeatTimeout)]);
        check(Healthy, &[At(15, Healthy), At(16, HeartbeatTimeout)]);
        // Steady heartbeats stay healthy; a late one within the timeout changes nothing.
        check(
            Healthy,
            &[Beat(0), Beat(5), Beat(19), At(20, Healthy), At(34, Healthy)],
        );
        // Silence longer than the timeout: timed out.
        check(
            Healthy,
            &[Beat(0), At(15, Healthy), At(16, HeartbeatTimeout)],
        );
    }

    #[test]
    fn a_node_enrolled_late_in_a_tenure_gets_a_whole_timeout() {
        // UP 40 s into the tenure, no heartbeat yet: not timed out at once.
        check_watched_from(Unknown, 40, &[At(41, Unknown), At(55, Unknown)]);
        check_watched_from(Unknown, 40, &[Beat(44), At(44, Healthy), At(58, Healthy)]);
        // It still times out when it never heartbeats.
        check_watched_from(Unknown, 40, &[At(56, HeartbeatTimeout)]);
    }

    #[test]
    fn recovery_needs_steady_heartbeats() {
        // One heartbeat after a timeout is not enough; the second (within the timeout
        // of the first) is.
        check(
            Healthy,
            &[
                Beat(0),
                At(16, HeartbeatTimeout),
                Beat(30),
                At(30, HeartbeatTimeout),
                Beat(35),
                At(35, Healthy),
            ],
        );
        // A node that gets through only now and then never alternates.
        let mut steps = vec![Beat(0)];
        for round in 1..10u64 {
            let beat = round * 20;
            steps.push(At(beat - 1, HeartbeatTimeout));
            steps.push(Beat(beat));
            steps.push(At(beat, HeartbeatTimeout));
        }
        check(Healthy, &steps);
        // A timed-out verdict inherited from the last leader also needs two.
        check(
            HeartbeatTimeout,
            &[Beat(1), At(1, HeartbeatTimeout), Beat(6), At(6, Healthy)],
        );
    }

    #[test]
    fn timing_is_validated() {
        let ms = Duration::from_millis;
        assert!(Timing::new(ms(5000), ms(15000)).is_ok());
        assert!(Timing::new(ms(500), ms(1500)).is_ok());
        assert!(matches!(
            Timing::new(ms(5000), ms(5000)),
            Err(TimingError::TimeoutTooShort { .. })
        ));
        assert!(matches!(
            Timing::new(ms(5000), ms(14999)),
            Err(TimingError::TimeoutTooShort { .. })
        ));
        assert!(matches!(
            Timing::new(ms(50), ms(1000)),
            Err(TimingError::PeriodTooShort(_))
        ));
        assert_eq!(Timing::default(), Timing::new(ms(5000), ms(15000)).unwrap());
    }
}
