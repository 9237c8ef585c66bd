//! Audit entries as table rows, JSON lines or YAML documents (one entry at a time, so
//! `cluster audit -f` prints each as it arrives).
//! May not talk to the cluster.

use proto::api::AuditEntry;
use serde_json::json;

use crate::output::{Format, escape, utc_time, yaml};

/// The table header, printed once before the first row.
pub(crate) fn header(format: Format) -> Option<String> {
    (format == Format::Table).then(|| {
        format!(
            "{:<20}  {:<40}  {:<22}  {:<36}  {:<40}  RESULT",
            "TIME", "WHO", "SOURCE", "METHOD", "TARGET"
        )
    })
}

/// One entry in `format`.
pub(crate) fn entry(e: &AuditEntry, format: Format) -> Option<String> {
    let time = utc_time(e.time_unix_micros / 1000);
    let mut result = if e.code == 0 {
        "OK".to_string()
    } else {
        format!("{}: {}", e.code_name, e.message)
    };
    // Refused calls are counted per caller, RPC and code: one entry for many calls.
    if e.count > 1 {
        result = format!(
            "{result} (×{} calls since {})",
            e.count,
            utc_time(e.first_time_unix_micros / 1000)
        );
    }
    let value = json!({
        "time": time,
        "time_unix_micros": e.time_unix_micros,
        "identity_kind": e.identity_kind,
        "identity": e.identity,
        "source_address": e.source_address,
        "curator": e.curator,
        "method": e.method,
        "target": e.target,
        "code": e.code,
        "code_name": e.code_name,
        "message": e.message,
        "key": e.key,
        "count": e.count.max(1),
        "first_time_unix_micros": if e.count > 0 { e.first_time_unix_micros } else { e.time_unix_micros },
    });
    match format {
        Format::Quiet => None,
        Format::Json => Some(value.to_string()),
        Format::Yaml => Some(format!("---\n{}", yaml(&value).trim_end())),
        Format::Table => {
            let method = e.method.rsplit('/').next().unwrap_or(&e.method);
            Some(format!(
                "{:<20}  {:<40}  {:<22}  {:<36}  {:<40}  {}",
                time,
                escape(&format!("{} {}", e.identity_kind, e.identity)),
                escape(&e.source_address),
                escape(method),
                escape(&e.target),
                escape(&result)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_render_in_every_format() {
        let e = AuditEntry {
            time_unix_micros: 1_000_000,
            identity_kind: "owner".into(),
            identity: "serial 01".into(),
            method: "/polis.api.Management/ApproveNode".into(),
            target: "polis-a".into(),
            code: 5,
            code_name: "NotFound".into(),
            message: "no such node".into(),
            ..Default::default()
        };
        let row = entry(&e, Format::Table).unwrap();
        assert!(
            row.contains("ApproveNode") && row.contains("NotFound: no such node"),
            "{row}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&entry(&e, Format::Json).unwrap()).unwrap();
        assert_eq!(json["target"], "polis-a");
        assert_eq!(json["code"], 5);
        assert!(entry(&e, Format::Yaml).unwrap().starts_with("---\n"));
        assert!(header(Format::Json).is_none());
        assert_eq!(json["count"], 1);
    }

    #[test]
    fn counted_refusals_show_their_count() {
        let e = AuditEntry {
            time_unix_micros: 11_000_000,
            first_time_unix_micros: 1_000_000,
            count: 300,
            identity_kind: "node".into(),
            identity: "polis-w".into(),
            method: "/polis.api.Management/ApproveNode".into(),
            code: 7,
            code_name: "PermissionDenied".into(),
            message: "no".into(),
            ..Default::default()
        };
        let row = entry(&e, Format::Table).unwrap();
        assert!(
            row.contains("PermissionDenied: no (×300 calls since"),
            "{row}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&entry(&e, Format::Json).unwrap()).unwrap();
        assert_eq!(json["count"], 300);
        assert_eq!(json["first_time_unix_micros"], 1_000_000);
    }

    #[test]
    fn escape_sequences_in_entries_are_shown_not_obeyed() {
        let e = AuditEntry {
            identity: "serial \x1b[2J".into(),
            method: "/polis.api.Management/UpdateNodeLabels".into(),
            target: "polis-\x1b[31m".into(),
            code: 3,
            code_name: "InvalidArgument".into(),
            message: "bad\u{9b}1m".into(),
            ..Default::default()
        };
        let row = entry(&e, Format::Table).unwrap();
        assert!(!row.chars().any(char::is_control), "{row:?}");
        assert!(
            row.contains("polis-\\x1b[31m") && row.contains("bad\\u{9b}1m"),
            "{row}"
        );
    }
}
