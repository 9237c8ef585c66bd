//! Scheduled snapshots, the decisions: how a snapshot file is named (so names sort by
//! time and show the revision), the strict pattern a name must match before it is ever
//! joined to a directory (no path traversal), which files are pruned, and when the next
//! snapshot is due (pure: times and listings come in as arguments).
//!
//! ```text
//!   snapshot-<taken at, ms since the Unix epoch, 16 digits>-r<revision>.polisbak
//! ```
//! A leaf: may not import any other module of this crate; no I/O.

use std::time::Duration;

const PREFIX: &str = "snapshot-";
const SUFFIX: &str = ".polisbak";
const TIME_DIGITS: usize = 16;

/// One snapshot, as its name describes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SnapshotName {
    pub taken_at_unix_ms: u64,
    pub revision: i64,
}

impl SnapshotName {
    /// The file name.
    pub fn file_name(&self) -> String {
        format!(
            "{PREFIX}{:0width$}-r{}{SUFFIX}",
            self.taken_at_unix_ms,
            self.revision,
            width = TIME_DIGITS
        )
    }

    /// Parses a file name; `None` for anything that is not exactly such a name (hidden
    /// temporary files, paths, other files).
    pub fn parse(name: &str) -> Option<SnapshotName> {
        let rest = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
        let (time, revision) = rest.split_once("-r")?;
        let digits = |s: &str, max: usize| {
            !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit())
        };
        if time.len() != TIME_DIGITS || !digits(time, TIME_DIGITS) || !digits(revision, 18) {
            return None;
        }
        let parsed = SnapshotName {
            taken_at_unix_ms: time.parse().ok()?,
            revision: revision.parse().ok()?,
        };
        // Exactly one spelling per snapshot (no leading zeros in the revision).
        (parsed.file_name() == name).then_some(parsed)
    }
}

/// The names to delete so that only the newest `keep` remain.
pub fn to_prune(mut names: Vec<SnapshotName>, keep: u32) -> Vec<SnapshotName> {
    names.sort();
    let excess = names.len().saturating_sub(keep as usize);
    names.truncate(excess);
    names
}

/// How long until the next snapshot is due: the newest one's time plus the interval;
/// after a failed attempt, no sooner than `retry` after it (a lasting failure does not
/// turn into a busy loop). Zero: due now.
pub fn due_in(
    now_unix_ms: u64,
    newest_unix_ms: Option<u64>,
    last_failure_unix_ms: Option<u64>,
    interval: Duration,
    retry: Duration,
) -> Duration {
    let at = |base: u64, d: Duration| base.saturating_add(d.as_millis() as u64);
    let mut due = newest_unix_ms.map_or(0, |n| at(n, interval));
    if let Some(f) = last_failure_unix_ms {
        due = due.max(at(f, retry.min(interval)));
    }
    Duration::from_millis(due.saturating_sub(now_unix_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_time() {
        let a = SnapshotName {
            taken_at_unix_ms: 1_700_000_000_000,
            revision: 42,
        };
        assert_eq!(a.file_name(), "snapshot-0001700000000000-r42.polisbak");
        assert_eq!(SnapshotName::parse(&a.file_name()), Some(a.clone()));
        let b = SnapshotName {
            taken_at_unix_ms: 1_700_000_000_001,
            revision: 7,
        };
        assert!(a.file_name() < b.file_name());
    }

    #[test]
    fn only_strict_names_parse() {
        for bad in [
            "",
            "../snapshot-0001700000000000-r42.polisbak",
            "snapshot-0001700000000000-r42.polisbak/..",
            "/etc/passwd",
            "snapshot-1700000000000-r42.polisbak",
            "snapshot-0001700000000000-r042.polisbak",
            "snapshot-0001700000000000-r.polisbak",
            "snapshot-0001700000000000-r-1.polisbak",
            "snapshot-000170000000000x-r42.polisbak",
            ".snapshot-0001700000000000-r42.polisbak.abc.tmp",
            "snapshot-0001700000000000-r42.polisbak.tmp",
        ] {
            assert_eq!(SnapshotName::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn pruning_keeps_the_newest() {
        let n = |t| SnapshotName {
            taken_at_unix_ms: t,
            revision: 1,
        };
        assert_eq!(
            to_prune(vec![n(3), n(1), n(2), n(5), n(4)], 3),
            vec![n(1), n(2)]
        );
        assert!(to_prune(vec![n(1)], 3).is_empty());
    }

    #[test]
    fn due_times() {
        let h = Duration::from_secs(3600);
        let m = Duration::from_secs(60);
        assert_eq!(due_in(1000, None, None, h, m), Duration::ZERO);
        assert_eq!(
            due_in(1000, Some(500), None, h, m),
            Duration::from_millis(3_599_500)
        );
        assert_eq!(due_in(4_000_000, Some(0), None, h, m), Duration::ZERO);
        // A failure 10 s ago: retry in 50 s even though the interval has passed.
        assert_eq!(
            due_in(4_000_000, Some(0), Some(3_990_000), h, m),
            Duration::from_secs(50)
        );
        // A short interval bounds the retry.
        let s2 = Duration::from_secs(2);
        assert_eq!(
            due_in(10_000, None, Some(9_000), s2, m),
            Duration::from_secs(1)
        );
    }
}

/// Properties over arbitrary names (proptest): a name that parses is one plain file
/// name, spelled one way, before it is ever joined to a directory.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn names_round_trip(taken_at_unix_ms in 0u64..10_000_000_000_000_000, revision in 0i64..1_000_000_000_000_000_000) {
            let name = SnapshotName { taken_at_unix_ms, revision };
            prop_assert_eq!(SnapshotName::parse(&name.file_name()), Some(name));
        }

        #[test]
        fn only_exact_names_parse(
            text in prop_oneof![
                any::<String>(),
                "snapshot-[0-9]{15,17}-r[-+0-9]{0,20}\\.polisbak",
                "(\\.\\./)?snapshot-[0-9/.]{16}-r[0-9]{1,3}\\.polisbak[/.]?",
            ],
        ) {
            if let Some(name) = SnapshotName::parse(&text) {
                prop_assert!(!text.contains('/') && !text.starts_with('.'));
                prop_assert_eq!(name.file_name(), text);
            }
        }
    }
}
