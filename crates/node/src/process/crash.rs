//! Crash points: the `POLIS_CRASH_AFTER` test hook that kills the process right after a
//! named step of bootstrap or registration, to prove both resume safely; the
//! `POLIS_TEST_STALE_NO_ROLE` hook that feeds rolefetch a stale update; and
//! `POLIS_TEST_REPORTED_VERSION`, the version a node reports (version-skew tests); and
//! `POLIS_TEST_CLOCK_OFFSET_MS`, a wall clock that runs fast for the epochs this node
//! makes (a recover on a machine whose clock was wrong).
//!
//! The hook itself is compiled in only with the `crash-points` cargo feature (test
//! builds); without it [`crash_point`] is an empty inline function and
//! [`check_crash_points`] refuses a start that asks for one. A leaf: may not import
//! any other module of this crate.

use anyhow::{Result, bail};

/// Names the crash-point variable (see [`crash_point`]).
pub const CRASH_AFTER_VARIABLE: &str = "POLIS_CRASH_AFTER";

/// Test hook for crash safety, compiled in only with the `crash-points` feature (test
/// builds; release builds carry none of it): when `POLIS_CRASH_AFTER` names `step`, the
/// process kills itself with SIGKILL right after that step, exactly like `kill -9` (no
/// cleanup runs). Bootstrap steps: node-key, peer-files, etcd-ready, cluster-pki,
/// node-certificate, records, sealed. Register steps: register-key, register-foreign,
/// register-trusted, register-committed, register-credentials, register-sealed.
#[cfg(feature = "crash-points")]
pub fn crash_point(step: &str) {
    if std::env::var_os(CRASH_AFTER_VARIABLE).is_some_and(|v| v == step) {
        tracing::warn!(step, "{CRASH_AFTER_VARIABLE}: killing this process");
        // SAFETY: kill(2) on our own pid.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn crash_point(_step: &str) {}

/// Names the stale-update variable (see [`stale_update`]).
pub const STALE_UPDATE_VARIABLE: &str = "POLIS_TEST_STALE_NO_ROLE";

/// The `POLIS_TEST_STALE_NO_ROLE` value that makes the stale update unordered.
pub const UNORDERED: &str = "unordered";

/// Test hook for stale views, compiled in only with the `crash-points` feature: when
/// `POLIS_TEST_STALE_NO_ROLE` is set, rolefetch takes this update first on every node
/// watch, as a curator with an old view would send it: state UP, no role, record
/// revision 1 (older than anything a node applied once it was UP), no etcd cluster named.
/// With the value `unordered` it names another etcd cluster (1), so that the revision
/// check cannot order it and the node applies it, and rolefetch holds it for
/// [`STALE_HOLD`] before it reads on: the "no role" reaches the role server, which must
/// not wipe etcd data on it (etcd still lists the member).
#[cfg(feature = "crash-points")]
pub fn stale_update() -> Option<proto::api::WatchNodeUpdate> {
    let value = std::env::var_os(STALE_UPDATE_VARIABLE)?;
    Some(proto::api::WatchNodeUpdate {
        state: proto::api::NodeState::Up as i32,
        record_revision: 1,
        record_etcd_cluster: if value == UNORDERED { 1 } else { 0 },
        ..Default::default()
    })
}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn stale_update() -> Option<proto::api::WatchNodeUpdate> {
    None
}

/// How long rolefetch holds an unordered stale update (see [`stale_update`]).
pub const STALE_HOLD: std::time::Duration = std::time::Duration::from_secs(8);

/// Whether rolefetch holds the injected update before reading on (see [`stale_update`]).
pub fn stale_hold() -> bool {
    cfg!(feature = "crash-points")
        && std::env::var_os(STALE_UPDATE_VARIABLE).is_some_and(|v| v == UNORDERED)
}

/// Checked in preflight: a crash point that was asked for is armed (and says so, the
/// line tests wait for), or the start is refused, so that a test never passes because
/// the binary silently ignored its crash point. The same for the stale-update hook and
/// the reported version.
pub fn check_crash_points() -> Result<()> {
    for (variable, hook) in [
        (STALE_UPDATE_VARIABLE, "stale-update hook"),
        (REPORTED_VERSION_VARIABLE, "reported version"),
        (CLOCK_OFFSET_VARIABLE, "epoch clock offset"),
    ] {
        if std::env::var_os(variable).is_some() {
            if !cfg!(feature = "crash-points") {
                bail!(
                    "{variable} is set, but this polis-node was built without crash points; \
                     build it with `--features node/crash-points` or unset the variable"
                );
            }
            tracing::warn!("{variable}: {hook} armed");
        }
    }
    let Some(step) = std::env::var_os(CRASH_AFTER_VARIABLE) else {
        return Ok(());
    };
    if cfg!(feature = "crash-points") {
        tracing::warn!(step = %step.to_string_lossy(), "crash point armed");
        Ok(())
    } else {
        bail!(
            "{CRASH_AFTER_VARIABLE} is set, but this polis-node was built without crash points; \
             build it with `--features node/crash-points` (scripts/test does) or unset the variable"
        )
    }
}

/// Names the variable that makes a test build report another version (see
/// [`reported_version`]).
pub const REPORTED_VERSION_VARIABLE: &str = "POLIS_TEST_REPORTED_VERSION";

/// The version this node reports with its heartbeats: its own; in test builds with
/// `crash-points`, `POLIS_TEST_REPORTED_VERSION` when set (a node of another version,
/// for the version-skew tests).
#[cfg(feature = "crash-points")]
pub fn reported_version() -> String {
    std::env::var(REPORTED_VERSION_VARIABLE)
        .unwrap_or_else(|_| env!("CARGO_PKG_VERSION").to_string())
}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn reported_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// Names the variable that makes a test build's epoch clock run fast (see
/// [`epoch_clock_offset_ms`]).
pub const CLOCK_OFFSET_VARIABLE: &str = "POLIS_TEST_CLOCK_OFFSET_MS";

/// Milliseconds added to the wall clock when this node stamps a new epoch: 0; in test
/// builds with `crash-points`, `POLIS_TEST_CLOCK_OFFSET_MS` when set (a machine whose
/// clock ran fast).
#[cfg(feature = "crash-points")]
pub fn epoch_clock_offset_ms() -> u64 {
    std::env::var(CLOCK_OFFSET_VARIABLE)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn epoch_clock_offset_ms() -> u64 {
    0
}
