//! The standard process collector, read from `/proc/self` at each scrape:
//! `process_resident_memory_bytes`, `process_open_fds`, `process_cpu_seconds_total`,
//! `process_start_time_seconds` (the names every Prometheus client uses, unprefixed).
//!
//! Reads only this process's own /proc entries; may not keep state between scrapes.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What one scrape reports about the process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    pub resident_bytes: u64,
    pub cpu_seconds: f64,
    pub start_time_seconds: f64,
}

/// Parses `/proc/self/stat` (fields after the parenthesised command name, which may hold
/// spaces) with the clock tick rate, page size and the boot time (`btime` of
/// `/proc/stat`). `None` when the text is not a stat line.
pub fn parse_stat(
    stat: &str,
    ticks_per_second: f64,
    page_size: u64,
    boot_time: u64,
) -> Option<ProcessStats> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts at field 3 (state); utime is field 14, stime 15, starttime 22, rss 24.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let (utime, stime, start, rss) = (field(14)?, field(15)?, field(22)?, field(24)?);
    Some(ProcessStats {
        // Saturating, and summed as floats: a stat line is text, and a sum or product
        // that overflows is no figure.
        resident_bytes: rss.saturating_mul(page_size),
        cpu_seconds: (utime as f64 + stime as f64) / ticks_per_second,
        start_time_seconds: boot_time as f64 + start as f64 / ticks_per_second,
    })
}

/// `btime` (seconds since the epoch the machine booted) from `/proc/stat`.
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Reads this process's figures; `None` when /proc is not readable.
pub fn read() -> Option<(ProcessStats, u64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if ticks <= 0 || page <= 0 {
        return None;
    }
    let stats = parse_stat(&stat, ticks as f64, page as u64, boot)?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some((stats, fds))
}

/// Registered once in the registry; reads /proc at each scrape.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((stats, fds)) = read() else {
            return Ok(());
        };
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, v: f64| {
            let g = ConstGauge::new(v);
            let m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
            g.encode(m)
        };
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            stats.resident_bytes as f64,
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors.",
            fds as f64,
        )?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            stats.start_time_seconds,
        )?;
        let cpu = ConstCounter::new(stats.cpu_seconds);
        let m = encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?;
        cpu.encode(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_with_spaces_in_the_name() {
        let stat = "1234 (polis node) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 1000 123456789 2048 18446744073709551615";
        let s = parse_stat(stat, 100.0, 4096, 1_700_000_000).unwrap();
        assert_eq!(s.resident_bytes, 2048 * 4096);
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(parse_stat("garbage", 100.0, 4096, 0), None);
    }

    /// Found by `properties::any_stat_text_parses_or_is_refused`: an rss of 2^52 pages
    /// overflowed the byte count (a panic in debug builds); CPU times near 2^64 ticks
    /// overflowed their sum the same way.
    #[test]
    fn huge_figures_do_not_overflow() {
        let stat = "0 () S 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 4503600000000000";
        let s = parse_stat(stat, 100.0, 4096, 0).unwrap();
        assert_eq!(s.resident_bytes, u64::MAX);
        let max = u64::MAX;
        let stat = format!("0 () S 0 0 0 0 0 0 0 0 0 0 {max} {max} 0 0 0 0 0 0 0 0 1");
        let s = parse_stat(&stat, 100.0, 4096, 0).unwrap();
        assert!(s.cpu_seconds > 3e17, "{}", s.cpu_seconds);
    }

    #[test]
    fn parses_boot_time_and_reads_itself() {
        assert_eq!(
            parse_boot_time("cpu 1 2\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000)
        );
        assert_eq!(parse_boot_time("cpu 1 2\n"), None);
        let (stats, fds) = read().expect("/proc/self readable");
        assert!(stats.resident_bytes > 0 && fds > 0);
        assert!(stats.start_time_seconds > 1_600_000_000.0);
    }
}

/// Properties over arbitrary /proc text (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_stat_text_parses_or_is_refused(
            text in prop_oneof![
                any::<String>(),
                "[0-9]{1,5} \\([ a-z)]{0,10}\\) S( [0-9]{1,20}){20,24}",
            ],
        ) {
            let _ = parse_stat(&text, 100.0, 4096, 1_700_000_000);
            let _ = parse_boot_time(&text);
        }
    }
}
