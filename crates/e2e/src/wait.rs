//! Waiting: the default deadline and polling a condition until it holds.
//!
//! A leaf: may not start processes or know about nodes; waiting is polling with a
//! deadline, nothing sleeps and hopes.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Generous default for anything a test waits for.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Polls `cond` until it holds or `timeout` passes.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
