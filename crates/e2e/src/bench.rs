//! Benchmark statistics (pure) and the timed client loop the API benchmarks share.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// CPU time (user + system) of process `pid` so far, from `/proc/PID/stat`.
pub fn cpu_time(pid: i32) -> anyhow::Result<Duration> {
    use anyhow::Context;
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let (_, rest) = stat
        .rsplit_once(") ")
        .with_context(|| format!("{path}: no ') ' after the command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; `rest` starts at field 3.
    let field = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .with_context(|| format!("{path}: fewer than {} fields", i + 3))?
            .parse::<u64>()
            .with_context(|| format!("{path}: field {} is no number", i + 3))
    };
    let ticks = field(11)? + field(12)?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// The median of benchmark samples.
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

/// The benches' `[SECONDS_PER_MEASUREMENT] [ROUNDS]` arguments (program name skipped),
/// defaulted where absent; ROUNDS is held to 1..=20, SECONDS is left to the caller's
/// bounds.
pub fn seconds_and_rounds(
    mut args: impl Iterator<Item = String>,
    default_seconds: f64,
    default_rounds: usize,
) -> anyhow::Result<(f64, usize)> {
    use anyhow::Context;
    let seconds = match args.next() {
        Some(a) => a
            .parse()
            .with_context(|| format!("SECONDS_PER_MEASUREMENT must be a number, not {a:?}"))?,
        None => default_seconds,
    };
    let rounds: usize = match args.next() {
        Some(a) => a
            .parse()
            .with_context(|| format!("ROUNDS must be a number, not {a:?}"))?,
        None => default_rounds,
    };
    Ok((seconds, rounds.clamp(1, 20)))
}

/// What [`timed_calls`] counted, summed over clients (and over measurements by
/// [`Calls::merge`]).
#[derive(Debug, Default)]
pub struct Calls {
    /// Calls that returned `Ok`.
    pub ok: usize,
    /// Calls that returned `Err` (counted, never retried).
    pub failed: usize,
    /// How long each call took, ok or failed, in no particular order.
    pub latencies: Vec<Duration>,
    /// The first error a client saw, as text.
    pub first_error: Option<String>,
}

impl Calls {
    /// All calls made, ok or failed.
    pub fn total(&self) -> usize {
        self.ok + self.failed
    }

    /// Adds `other`'s counts and latencies; keeps the first error seen.
    pub fn merge(&mut self, other: Calls) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.latencies.extend(other.latencies);
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Runs `call(client, worker, i)` in a loop on every client (each in its own task;
/// `worker` is the client's index, `i` the call's) until `duration` has passed, at most
/// `max_calls` times per client (a bound on a runaway loop); returns what was counted,
/// summed over clients. A call started before the deadline is finished and counted.
pub async fn timed_calls<C, F, Fut, E>(
    clients: &[C],
    duration: Duration,
    max_calls: usize,
    call: F,
) -> Calls
where
    C: Clone + Send + 'static,
    F: Fn(C, usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display,
{
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .enumerate()
        .map(|(worker, client)| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut calls = Calls::default();
                for i in 0..max_calls {
                    let t = Instant::now();
                    if t >= deadline {
                        break;
                    }
                    let outcome = call(client.clone(), worker, i).await;
                    calls.latencies.push(t.elapsed());
                    match outcome {
                        Ok(()) => calls.ok += 1,
                        Err(e) => {
                            calls.failed += 1;
                            calls.first_error.get_or_insert_with(|| e.to_string());
                        }
                    }
                }
                calls
            })
        })
        .collect();
    let mut total = Calls::default();
    for t in tasks {
        total.merge(t.await.expect("a benchmark client panicked"));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn seconds_and_rounds_default_bound_and_name_bad_input() {
        let args = |v: &[&str]| {
            v.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into_iter()
        };
        assert_eq!(seconds_and_rounds(args(&[]), 5.0, 3).unwrap(), (5.0, 3));
        assert_eq!(
            seconds_and_rounds(args(&["0.3"]), 5.0, 3).unwrap(),
            (0.3, 3)
        );
        assert_eq!(
            seconds_and_rounds(args(&["1", "99"]), 5.0, 3).unwrap(),
            (1.0, 20)
        );
        assert_eq!(
            seconds_and_rounds(args(&["1", "0"]), 5.0, 3).unwrap(),
            (1.0, 1)
        );
        let e = seconds_and_rounds(args(&["x"]), 5.0, 3).unwrap_err();
        assert!(
            e.to_string().contains("SECONDS_PER_MEASUREMENT") && e.to_string().contains("\"x\""),
            "{e}"
        );
        let e = seconds_and_rounds(args(&["1", "-2"]), 5.0, 3).unwrap_err();
        assert!(
            e.to_string().contains("ROUNDS") && e.to_string().contains("\"-2\""),
            "{e}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timed_calls_counts_ok_and_failed_per_worker_and_stops_at_max_calls() {
        // Worker 1 fails every odd call; the loop ends at max_calls long before the
        // deadline.
        let calls = timed_calls(
            &[(), (), ()],
            Duration::from_secs(60),
            10,
            |_, w, i| async move {
                if w == 1 && i % 2 == 1 {
                    Err(format!("worker {w} call {i}"))
                } else {
                    Ok(())
                }
            },
        )
        .await;
        assert_eq!((calls.ok, calls.failed, calls.total()), (25, 5, 30));
        assert_eq!(calls.latencies.len(), 30);
        assert_eq!(calls.first_error.as_deref(), Some("worker 1 call 1"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timed_calls_stops_at_the_deadline() {
        let started = Instant::now();
        let calls = timed_calls(
            &[()],
            Duration::from_millis(50),
            usize::MAX,
            |_, _, _| async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok::<_, String>(())
            },
        )
        .await;
        assert!(calls.ok > 0 && calls.failed == 0);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "ran past the deadline"
        );
    }
}
