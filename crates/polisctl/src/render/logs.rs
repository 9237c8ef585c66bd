//! A node's log lines as text (like its stderr), JSON lines or YAML documents, one at a
//! time so that `node logs -f` prints each as it arrives.
//! May not talk to the cluster.

use proto::api::NodeLogLine;
use serde_json::json;

use crate::output::{Format, escape, utc_time, yaml};

/// One line (or a "lines dropped" marker) in `format`.
pub(crate) fn line(l: &NodeLogLine, format: Format) -> Option<String> {
    let value = if l.dropped > 0 {
        json!({ "dropped": l.dropped })
    } else {
        json!({
            "sequence": l.sequence,
            "time": utc_time(l.time_unix_micros / 1000),
            "time_unix_micros": l.time_unix_micros,
            "level": l.level,
            "runnable": l.runnable,
            "target": l.target,
            "text": l.text,
        })
    };
    match format {
        Format::Quiet => None,
        Format::Json => Some(value.to_string()),
        Format::Yaml => Some(format!("---\n{}", yaml(&value).trim_end())),
        Format::Table if l.dropped > 0 => Some(format!(
            "… {} lines dropped (this reader fell behind the node's buffer)",
            l.dropped
        )),
        // One line each, whatever the node sent: a compromised node's escape sequences
        // or newlines (fake lines) are shown, not obeyed.
        Format::Table => Some(format!(
            "{} {:>5} {} {}: {}",
            utc_time(l.time_unix_micros / 1000),
            escape(&l.level),
            if l.runnable.is_empty() {
                "-".into()
            } else {
                escape(&l.runnable)
            },
            escape(&l.target),
            escape(&l.text)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_markers_render() {
        let l = NodeLogLine {
            sequence: 3,
            level: "INFO".into(),
            runnable: "root.role.heartbeat".into(),
            target: "polis_node::runnables::heartbeat".into(),
            text: "hello".into(),
            ..Default::default()
        };
        let text = line(&l, Format::Table).unwrap();
        assert!(
            text.contains("root.role.heartbeat") && text.ends_with("hello"),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&line(&l, Format::Json).unwrap()).unwrap();
        assert_eq!(json["sequence"], 3);
        let marker = NodeLogLine {
            dropped: 7,
            ..Default::default()
        };
        assert!(
            line(&marker, Format::Table)
                .unwrap()
                .contains("7 lines dropped")
        );
        assert_eq!(line(&marker, Format::Json).unwrap(), r#"{"dropped":7}"#);
    }

    #[test]
    fn a_nodes_escape_sequences_and_newlines_are_shown_not_obeyed() {
        let l = NodeLogLine {
            level: "INFO".into(),
            runnable: "root\x1b]0;x\x07".into(),
            target: "t".into(),
            text: "\x1b[31mred\n2024-01-01T00:00:00Z ERROR fake line".into(),
            ..Default::default()
        };
        let text = line(&l, Format::Table).unwrap();
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(
            text.contains("root\\x1b]0;x\\x07")
                && text.ends_with("\\x1b[31mred\\n2024-01-01T00:00:00Z ERROR fake line"),
            "{text}"
        );
    }
}
