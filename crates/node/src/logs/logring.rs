//! The node's recent log lines in memory: a ring of at most `capacity` lines, each
//! numbered, and the rules readers apply (the last N, a runnable prefix, a start time;
//! a follower that fell behind the ring learns how many lines it missed).
//!
//! Pure: no I/O, no locking (`logcapture` holds the ring behind a mutex).

use std::collections::VecDeque;

/// One log line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogLine {
    pub sequence: u64,
    pub time_unix_micros: u64,
    pub level: String,
    pub runnable: String,
    pub target: String,
    pub text: String,
}

/// What a reader asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineFilter {
    pub runnable_prefix: String,
    pub since_unix_micros: u64,
}

impl LineFilter {
    pub fn matches(&self, line: &LogLine) -> bool {
        line.time_unix_micros >= self.since_unix_micros
            && line.runnable.starts_with(&self.runnable_prefix)
    }
}

/// The last `capacity` lines.
#[derive(Debug)]
pub struct Ring {
    lines: VecDeque<LogLine>,
    capacity: usize,
    next: u64,
}

impl Ring {
    pub fn new(capacity: usize) -> Ring {
        Ring {
            lines: VecDeque::with_capacity(capacity.min(1024)),
            capacity: capacity.max(1),
            next: 1,
        }
    }

    /// Appends `line`, numbering it; the oldest line goes when the ring is full.
    pub fn push(&mut self, mut line: LogLine) -> u64 {
        line.sequence = self.next;
        self.next += 1;
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
        self.next - 1
    }

    /// The sequence number the next line will get.
    pub fn next_sequence(&self) -> u64 {
        self.next
    }

    /// The last `n` lines matching `filter` (all of them when `n` is 0), oldest first.
    pub fn last(&self, n: usize, filter: &LineFilter) -> Vec<LogLine> {
        let mut out: Vec<LogLine> = self
            .lines
            .iter()
            .rev()
            .filter(|l| filter.matches(l))
            .take(if n == 0 { usize::MAX } else { n })
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// For a follower that has seen everything before `from`: how many lines it missed
    /// (they left the ring before it read them), and up to `max` lines from `from` on
    /// matching `filter`, with the sequence to read from next.
    pub fn read_from(
        &self,
        from: u64,
        max: usize,
        filter: &LineFilter,
    ) -> (u64, Vec<LogLine>, u64) {
        let oldest = self.lines.front().map_or(self.next, |l| l.sequence);
        let (dropped, from) = if from < oldest {
            (oldest - from, oldest)
        } else {
            (0, from)
        };
        let skip = (from - oldest) as usize;
        let mut next = from;
        let mut out = Vec::new();
        for line in self.lines.iter().skip(skip) {
            if out.len() == max {
                break;
            }
            next = line.sequence + 1;
            if filter.matches(line) {
                out.push(line.clone());
            }
        }
        (dropped, out, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(runnable: &str, time: u64) -> LogLine {
        LogLine {
            runnable: runnable.into(),
            time_unix_micros: time,
            text: format!("{runnable}@{time}"),
            ..Default::default()
        }
    }

    #[test]
    fn the_ring_keeps_only_its_capacity() {
        let mut ring = Ring::new(3);
        for t in 0..10 {
            ring.push(line("root", t));
        }
        let all = ring.last(0, &LineFilter::default());
        assert_eq!(
            all.iter().map(|l| l.sequence).collect::<Vec<_>>(),
            [8, 9, 10]
        );
        assert_eq!(ring.next_sequence(), 11);
    }

    #[test]
    fn last_n_and_filters() {
        let mut ring = Ring::new(10);
        for (i, r) in ["root.role.heartbeat", "root.cluster", "root.role.renew"]
            .iter()
            .cycle()
            .take(9)
            .enumerate()
        {
            ring.push(line(r, i as u64));
        }
        let f = LineFilter {
            runnable_prefix: "root.role".into(),
            since_unix_micros: 0,
        };
        let two = ring.last(2, &f);
        assert_eq!(two.len(), 2);
        assert!(two.iter().all(|l| l.runnable.starts_with("root.role")));
        assert_eq!(two[1].time_unix_micros, 8);
        let since = LineFilter {
            runnable_prefix: String::new(),
            since_unix_micros: 7,
        };
        assert_eq!(ring.last(0, &since).len(), 2);
        assert_eq!(ring.last(3, &LineFilter::default()).len(), 3);
    }

    #[test]
    fn a_follower_that_falls_behind_learns_how_many_it_missed() {
        let mut ring = Ring::new(4);
        let f = LineFilter::default();
        ring.push(line("a", 1));
        let (dropped, lines, next) = ring.read_from(1, 100, &f);
        assert_eq!((dropped, lines.len(), next), (0, 1, 2));
        // Nothing new: nothing read, same position.
        let (dropped, lines, again) = ring.read_from(next, 100, &f);
        assert_eq!((dropped, lines.len(), again), (0, 0, 2));
        for t in 2..=10 {
            ring.push(line("a", t));
        }
        // Lines 2..=6 left the ring before the follower read them.
        let (dropped, lines, next) = ring.read_from(2, 2, &f);
        assert_eq!(dropped, 5);
        assert_eq!(lines.iter().map(|l| l.sequence).collect::<Vec<_>>(), [7, 8]);
        let (dropped, lines, next) = ring.read_from(next, 100, &f);
        assert_eq!((dropped, lines.len(), next), (0, 2, 11));
    }
}
