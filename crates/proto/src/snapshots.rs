//! Scheduled snapshots: the bounds and defaults of their interval and of the count
//! kept, and intervals as operators write them (`6h`, `30m`, `90s`). Shared by
//! `polisctl` (refuses bad input before sending it) and the curator (refuses it again,
//! and reads what the cluster configuration holds).
//!
//! Intervals under a minute are for tests only: the curator accepts them when its
//! polis-node was started with the hidden `--snapshot-short-intervals` flag
//! ([`Bounds::TESTING`]); every other check uses [`Bounds::NORMAL`].
//!
//! Pure: no I/O.

use std::time::Duration;

/// Every 6 hours, when the cluster configuration says 0.
pub const DEFAULT_INTERVAL_SECONDS: u64 = 6 * 3600;
/// Keep 5, when the cluster configuration says 0.
pub const DEFAULT_KEEP: u32 = 5;
/// At most this many kept per member.
pub const MAX_KEEP: u32 = 100;
/// At least one snapshot a week.
pub const MAX_INTERVAL_SECONDS: u64 = 7 * 86400;

/// The shortest interval accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min_interval_seconds: u64,
}

impl Bounds {
    /// One minute: a snapshot costs a full copy of the database.
    pub const NORMAL: Bounds = Bounds {
        min_interval_seconds: 60,
    };
    /// One second, for tests (hidden polis-node flag).
    pub const TESTING: Bounds = Bounds {
        min_interval_seconds: 1,
    };
}

/// Why an interval or a count was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("{0:?} is not an interval (write e.g. 6h, 30m, 90s or 1d)")]
    NotAnInterval(String),
    #[error("a snapshot interval of {} is too short (at least {})", show(*.0), show(*.1))]
    TooShort(u64, u64),
    #[error("a snapshot interval of {} is too long (at most {})", show(*.0), show(MAX_INTERVAL_SECONDS))]
    TooLong(u64),
    #[error("keeping {0} snapshots is out of bounds (1 to {MAX_KEEP})")]
    KeepOutOfBounds(u32),
}

/// The schedule a member follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub interval: Duration,
    pub keep: u32,
}

/// Parses `N` (seconds) or `Ns`, `Nm`, `Nh`, `Nd`.
pub fn parse_interval(text: &str) -> Result<u64, ScheduleError> {
    let bad = || ScheduleError::NotAnInterval(text.chars().take(40).collect());
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(bad()),
    };
    n.checked_mul(unit).ok_or_else(bad)
}

/// Checks an interval (seconds, not 0) against `bounds`.
pub fn check_interval(seconds: u64, bounds: Bounds) -> Result<u64, ScheduleError> {
    if seconds < bounds.min_interval_seconds {
        return Err(ScheduleError::TooShort(
            seconds,
            bounds.min_interval_seconds,
        ));
    }
    if seconds > MAX_INTERVAL_SECONDS {
        return Err(ScheduleError::TooLong(seconds));
    }
    Ok(seconds)
}

/// Checks a count kept (not 0).
pub fn check_keep(keep: u32) -> Result<u32, ScheduleError> {
    if keep == 0 || keep > MAX_KEEP {
        return Err(ScheduleError::KeepOutOfBounds(keep));
    }
    Ok(keep)
}

/// The schedule the cluster configuration's two fields mean (0: the default). A value
/// out of `bounds` (a configuration written by a test cluster, or damaged) is brought
/// within them, so a member always follows a sane schedule.
pub fn effective(interval_seconds: u64, keep: u32, bounds: Bounds) -> Schedule {
    let interval = match interval_seconds {
        0 => DEFAULT_INTERVAL_SECONDS,
        s => s.clamp(bounds.min_interval_seconds, MAX_INTERVAL_SECONDS),
    };
    let keep = match keep {
        0 => DEFAULT_KEEP,
        k => k.min(MAX_KEEP),
    };
    Schedule {
        interval: Duration::from_secs(interval),
        keep,
    }
}

/// An interval in its largest whole unit (`6h`, `90m`, `45s`).
pub fn show(seconds: u64) -> String {
    for (unit, size) in [("d", 86400), ("h", 3600), ("m", 60)] {
        if seconds >= size && seconds.is_multiple_of(size) {
            return format!("{}{unit}", seconds / size);
        }
    }
    format!("{seconds}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse() {
        assert_eq!(parse_interval("6h"), Ok(21600));
        assert_eq!(parse_interval("30m"), Ok(1800));
        assert_eq!(parse_interval("90"), Ok(90));
        assert_eq!(parse_interval("2s"), Ok(2));
        assert_eq!(parse_interval("1d"), Ok(86400));
        for bad in ["", "h", "6 h", "-1h", "1.5h", "1w", "99999999999999999999d"] {
            assert!(parse_interval(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn bounds_hold() {
        assert_eq!(check_interval(60, Bounds::NORMAL), Ok(60));
        assert_eq!(
            check_interval(2, Bounds::NORMAL),
            Err(ScheduleError::TooShort(2, 60))
        );
        assert_eq!(check_interval(2, Bounds::TESTING), Ok(2));
        assert!(check_interval(0, Bounds::TESTING).is_err());
        assert!(check_interval(MAX_INTERVAL_SECONDS + 1, Bounds::TESTING).is_err());
        assert_eq!(check_keep(5), Ok(5));
        assert!(check_keep(0).is_err());
        assert!(check_keep(MAX_KEEP + 1).is_err());
        assert_eq!(
            ScheduleError::TooShort(2, 60).to_string(),
            "a snapshot interval of 2s is too short (at least 1m)"
        );
    }

    #[test]
    fn effective_schedule() {
        let d = effective(0, 0, Bounds::NORMAL);
        assert_eq!(d.interval, Duration::from_secs(6 * 3600));
        assert_eq!(d.keep, 5);
        assert_eq!(
            effective(2, 3, Bounds::NORMAL).interval,
            Duration::from_secs(60)
        );
        assert_eq!(
            effective(2, 3, Bounds::TESTING).interval,
            Duration::from_secs(2)
        );
        assert_eq!(effective(60, 1000, Bounds::NORMAL).keep, MAX_KEEP);
    }

    #[test]
    fn intervals_show() {
        assert_eq!(show(21600), "6h");
        assert_eq!(show(5400), "90m");
        assert_eq!(show(45), "45s");
        assert_eq!(show(86400), "1d");
    }
}

/// Properties over arbitrary input (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused(text in any::<String>()) {
            let _ = parse_interval(&text);
        }

        #[test]
        fn every_interval_shows_as_one_that_parses_back(seconds in any::<u64>()) {
            let shown = show(seconds);
            prop_assert_eq!(parse_interval(&shown), Ok(seconds), "{}", shown);
        }

        #[test]
        fn every_configuration_gives_a_sane_schedule(
            interval in any::<u64>(),
            keep in any::<u32>(),
            testing in any::<bool>(),
        ) {
            let bounds = if testing { Bounds::TESTING } else { Bounds::NORMAL };
            let s = effective(interval, keep, bounds);
            let secs = s.interval.as_secs();
            prop_assert!((bounds.min_interval_seconds..=MAX_INTERVAL_SECONDS).contains(&secs));
            prop_assert!((1..=MAX_KEEP).contains(&s.keep));
            prop_assert_eq!(check_interval(secs, bounds), Ok(secs));
        }
    }
}
