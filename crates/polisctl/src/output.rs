//! The rendering primitives (pure): the output format flag, YAML from JSON values, plain
//! text tables, UTC times, and the escaping of what the cluster sent before it reaches a
//! terminal. May not know any command's results (that is `render`).

use std::borrow::Cow;

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

/// Whether `c` must not reach a terminal as it is: a control character (C0, DEL, C1: an
/// escape sequence could recolour, retitle, move the cursor or answer back) or a
/// bidirectional formatting character (it reorders what is shown after it).
fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with every character [`unprintable`] replaced by a visible escape (`\n`,
/// `\t`, `\r`, `\x1b`, `\u{9b}`); with `keep_lines`, newlines and tabs stay. Borrowed
/// when nothing needed escaping.
fn escape_with(text: &str, keep_lines: bool) -> Cow<'_, str> {
    let kept = |c: char| keep_lines && matches!(c, '\n' | '\t');
    if !text.chars().any(|c| unprintable(c) && !kept(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !unprintable(c) || kept(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// A string the cluster sent (a node's log line, a label, an ID, a status, a server's
/// error message, an audit entry), made safe to print as one field of a table or line:
/// every control character, newlines and tabs too, is shown as an escape. JSON output
/// needs none of this (serde escapes control characters); table and plain output
/// of anything that came from the cluster goes through here or [`escape_text`].
pub fn escape(text: &str) -> Cow<'_, str> {
    escape_with(text, false)
}

/// As [`escape`], for a whole message printed as it is (an error with its causes):
/// newlines and tabs stay, every other control character is escaped.
pub fn escape_text(text: &str) -> Cow<'_, str> {
    escape_with(text, true)
}

/// A plain text table with a header row; columns padded to their widest cell. Every
/// cell is [`escape`]d: cells hold what the cluster sent.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| escape(c).into_owned()).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
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
        out.push_str(&line(row));
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

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape("polis-1 UP"), Cow::Borrowed(_)));
        assert_eq!(escape("a\x1b[31mred\x1b[0m"), "a\\x1b[31mred\\x1b[0m");
        assert_eq!(escape("line\nfake: row\tx\r"), "line\\nfake: row\\tx\\r");
        // C1 controls (8-bit CSI, OSC), DEL, BEL, bidirectional overrides.
        assert_eq!(
            escape("\u{9b}31m\u{9d}0;t\u{7}\u{7f}\u{202e}cba"),
            "\\u{9b}31m\\u{9d}0;t\\x07\\x7f\\u{202e}cba"
        );
        // Printable text beyond ASCII is left alone.
        assert_eq!(escape("größe … 日本"), "größe … 日本");
        assert_eq!(
            escape_text("failed:\n\tcaused by \x1b]0;owned\x07"),
            "failed:\n\tcaused by \\x1b]0;owned\\x07"
        );
    }

    #[test]
    fn yaml_and_json_carry_no_raw_control_characters() {
        // Both escape by themselves: no need for `escape` in those formats.
        let v = json!({"text": "a\x1b[31mb\x07c\nd"});
        for out in [yaml(&v), v.to_string()] {
            assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        }
    }

    #[test]
    fn table_cells_are_escaped_and_aligned_as_shown() {
        let t = table(
            &["ID", "LABELS"],
            &[
                vec!["a\x1b[2J".into(), "x=1\ny=2".into()],
                vec!["b".into(), "z".into()],
            ],
        );
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert_eq!(t, "ID        LABELS\na\\x1b[2J  x=1\\ny=2\nb         z\n");
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
