//! The rendering primitives (pure): the output format flag, YAML from JSON values, plain
//! text tables and UTC times. May not know any command's results (that is `render`).

use clap::ValueEnum;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
    /// Print nothing (commands that other commands run as steps).
    #[value(skip)]
    Quiet,
}

/// Renders `value` as idiomatic YAML (serde_norway: plain keys, strings quoted only
/// where YAML 1.2 would read them as something else, e.g. `1.0`, `null`, `true`).
pub fn yaml(value: &Value) -> String {
    let mut out = serde_norway::to_string(value).expect("a JSON value is always valid YAML");
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// A plain text table with a header row; columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.clone()));
        out.push('\n');
    }
    out
}

/// `unix_ms` (milliseconds since the Unix epoch) as an RFC 3339 UTC time, to the second.
pub fn utc_time(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, day_secs) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml_of_nodes() {
        let v = json!([{"id": "polis-1", "roles": ["ConsensusMember"], "labels": {}, "n": 3, "ok": true}]);
        assert_eq!(
            yaml(&v),
            "- id: polis-1\n  labels: {}\n  n: 3\n  ok: true\n  roles:\n  - ConsensusMember\n"
        );
    }

    #[test]
    fn yaml_keeps_ambiguous_strings_strings() {
        // YAML 1.2 (what serde_norway reads and writes): `yes` is a string already.
        for ambiguous in ["yes", "1.0", "null", "true", "0x10", "~", "", "a: b", "- x"] {
            let v = json!({"v": ambiguous});
            let back: Value = serde_norway::from_str(&yaml(&v)).unwrap();
            assert_eq!(back, v, "{ambiguous:?} as {}", yaml(&v));
        }
        assert_eq!(
            yaml(&json!({"address": "127.0.0.4", "n": "1.0"})),
            "address: 127.0.0.4\nn: '1.0'\n"
        );
        assert_eq!(yaml(&json!([])), "[]\n");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["ID", "STATE"],
            &[
                vec!["a".into(), "UP".into()],
                vec!["long-id".into(), "NEW".into()],
            ],
        );
        assert_eq!(t, "ID       STATE\na        UP\nlong-id  NEW\n");
    }
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn utc_times() {
        for (ms, want) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400_000, "2000-02-29T00:00:00Z"),
            (1_709_251_199_999, "2024-02-29T23:59:59Z"),
            (4_102_444_800_000, "2100-01-01T00:00:00Z"),
        ] {
            assert_eq!(super::utc_time(ms), want, "{ms}");
        }
    }
}
