//! Retrying calls to the cluster: backoff, pauses that end on cancellation, and problem
//! logs that speak once per change, for every runnable and start path that waits on
//! curators.
//!
//! Generic over what is retried: may not know about node roles, files or values, and
//! imports no other module of this crate.

use std::time::Duration;

/// Retry pacing towards unreachable curators.
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Logs a problem when it differs from the last one logged: a node retrying for hours
/// says so once per change, not once per attempt.
#[derive(Default)]
pub struct ProblemLog {
    last: Option<String>,
}

impl ProblemLog {
    pub fn problem(&mut self, what: String) {
        if self.last.as_deref() != Some(what.as_str()) {
            tracing::warn!("{what}; retrying");
            self.last = Some(what);
        }
    }
    pub fn resolved(&mut self, what: &str) {
        if self.last.take().is_some() {
            tracing::info!("{what}");
        }
    }
}

/// Exponential backoff between [`RETRY_MIN`] and [`RETRY_MAX`]: the supervisor's policy,
/// with the attempt count kept here.
pub struct Backoff {
    policy: supervisor::Backoff,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            policy: supervisor::Backoff {
                initial: RETRY_MIN,
                max: RETRY_MAX,
                multiplier: 2.0,
            },
            attempt: 0,
        }
    }
}

impl Backoff {
    /// The next pause: the policy's, jittered (see [`jittered`]).
    pub fn next(&mut self) -> Duration {
        let wait = self.policy.delay(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        jittered(wait, random_unit())
    }
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Between half and all of `wait` (`unit` in 0..=1 picks where): a fleet that lost its
/// curators at the same moment (a control-plane restart) comes back spread over the
/// interval, not in lockstep at every step of the backoff.
fn jittered(wait: Duration, unit: f64) -> Duration {
    wait.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
}

/// A uniformly random number in 0..=1 (the system source; a constant if it fails,
/// which only loses the spread).
fn random_unit() -> f64 {
    let mut bytes = [0u8; 4];
    match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes) {
        Ok(()) => f64::from(u32::from_le_bytes(bytes)) / f64::from(u32::MAX),
        Err(_) => 1.0,
    }
}

/// Sleeps unless cancelled first; false when cancelled.
pub async fn pause(ctx: &supervisor::Context, wait: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(wait) => true,
        _ = ctx.cancelled() => false,
    }
}

/// How [`call_until_answered`] ended.
pub enum Answer<T> {
    Ok(T),
    /// A refusal `permanent` deemed final.
    Refused(rpc::CallError),
    Cancelled,
}

/// Makes `call` through `client` until a curator answers it: failures are retried with
/// backoff and logged once per change (as `what: …`); those `permanent` says no retry
/// can fix end it. Follows the endpoints the client holds.
pub async fn call_until_answered<T, F, Fut>(
    ctx: &supervisor::Context,
    client: &rpc::CuratorClient,
    what: &str,
    permanent: impl Fn(&rpc::CallError) -> bool,
    call: F,
) -> Answer<T>
where
    F: Fn(tonic::transport::Channel) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut problems = ProblemLog::default();
    let mut backoff = Backoff::default();
    loop {
        let outcome = tokio::select! {
            r = client.call(&call) => r,
            _ = ctx.cancelled() => return Answer::Cancelled,
        };
        match outcome {
            Ok(answer) => {
                problems.resolved(&format!("{what}: a curator answered"));
                return Answer::Ok(answer);
            }
            Err(e) if permanent(&e) => return Answer::Refused(e),
            Err(e) => {
                problems.problem(format!("{what}: {e}"));
                if !pause(ctx, backoff.next()).await {
                    return Answer::Cancelled;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_a_ceiling_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<Duration> = (0..10).map(|_| b.next()).collect();
        // Each within the jitter band of its step: half to all of the policy's pause.
        assert!(
            waits[0] >= RETRY_MIN / 2 && waits[0] <= RETRY_MIN,
            "{waits:?}"
        );
        assert!(
            waits.iter().all(|w| *w <= RETRY_MAX) && *waits.last().unwrap() >= RETRY_MAX / 2,
            "{waits:?}"
        );
        b.reset();
        assert!(b.next() <= RETRY_MIN);
    }

    #[test]
    fn jitter_spreads_retries_over_half_the_pause() {
        let wait = Duration::from_secs(10);
        assert_eq!(jittered(wait, 0.0), Duration::from_secs(5));
        assert_eq!(jittered(wait, 1.0), wait);
        assert_eq!(jittered(wait, 7.0), wait, "out-of-range units are clamped");
        // A fleet's pauses for one step: spread, not all the same.
        let mut b = Backoff::default();
        let firsts: std::collections::BTreeSet<Duration> = (0..50)
            .map(|_| {
                b.reset();
                b.next()
            })
            .collect();
        assert!(firsts.len() > 10, "{firsts:?}");
    }
}
