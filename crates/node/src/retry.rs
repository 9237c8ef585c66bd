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
    pub fn next(&mut self) -> Duration {
        let wait = self.policy.delay(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        wait
    }
    pub fn reset(&mut self) {
        self.attempt = 0;
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
        assert_eq!(waits[0], RETRY_MIN);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*waits.last().unwrap(), RETRY_MAX);
        b.reset();
        assert_eq!(b.next(), RETRY_MIN);
    }
}
