//! Test hook that widens a race window: `POLIS_PAUSE_AT=<point>:<ms>` makes the named
//! point wait that long, compiled in only with the `pause-points` feature (enabled by
//! polis-node's `crash-points` test feature); without it [`pause_point`] does nothing.
//! A leaf: may not import other modules of this crate.

/// Names the pause-point variable (see [`pause_point`]).
pub const PAUSE_AT_VARIABLE: &str = "POLIS_PAUSE_AT";

/// Waits as long as `POLIS_PAUSE_AT=<point>:<ms>` asks when `point` is the one named,
/// logging `detail` (e.g. the node concerned); test builds with `pause-points` only.
#[cfg(feature = "pause-points")]
pub async fn pause_point(point: &str, detail: &str) {
    let Ok(value) = std::env::var(PAUSE_AT_VARIABLE) else {
        return;
    };
    let Some((name, ms)) = value.split_once(':') else {
        return;
    };
    if name != point {
        return;
    }
    let Ok(ms) = ms.parse::<u64>() else {
        tracing::warn!(
            value,
            "{PAUSE_AT_VARIABLE} is not <point>:<ms>; not pausing"
        );
        return;
    };
    tracing::warn!(point, detail, ms, "pause point reached: pausing");
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// Without the `pause-points` feature: nothing.
#[cfg(not(feature = "pause-points"))]
#[inline(always)]
pub async fn pause_point(_point: &str, _detail: &str) {}
