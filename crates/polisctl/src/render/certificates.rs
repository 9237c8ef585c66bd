//! The certificates the cluster's CAs issued, as `cluster certificates` shows them.
//! May not talk to the cluster.

use proto::api;
use serde_json::{Value, json};

use crate::output::{self, Format};

/// Seconds as a short human duration: "45s", "12m", "5h", "3d", "2y".
fn short_duration(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s if s < 2 * 365 * 86400 => format!("{}d", s / 86400),
        s => format!("{}y", s / (365 * 86400)),
    }
}

fn certificate_json(c: &api::CertificateInfo) -> Value {
    json!({
        "name": c.name,
        "kind": c.kind,
        "node": c.node_id,
        "serial": c.serial,
        "not_before_unix": c.not_before_unix,
        "not_after_unix": c.not_after_unix,
        "revoked": c.revoked,
        "current": c.current,
        "issuer": c.issuer,
    })
}

/// One row per certificate: kind, node, serial, expiry relative to `now`, revoked,
/// current.
pub(crate) fn print_certificates(list: &[api::CertificateInfo], now: u64, format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!(
            "{}",
            Value::Array(list.iter().map(certificate_json).collect())
        ),
        Format::Yaml => print!(
            "{}",
            output::yaml(&Value::Array(list.iter().map(certificate_json).collect()))
        ),
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|c| {
                    let expiry = if c.not_after_unix > now {
                        format!("in {}", short_duration(c.not_after_unix - now))
                    } else {
                        format!("expired {} ago", short_duration(now - c.not_after_unix))
                    };
                    vec![
                        c.kind.clone(),
                        if c.node_id.is_empty() {
                            "-".into()
                        } else {
                            c.node_id.clone()
                        },
                        c.serial.clone(),
                        expiry,
                        if c.revoked { "yes" } else { "no" }.into(),
                        if c.current { "*" } else { "" }.into(),
                        c.issuer.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &[
                        "KIND", "NODE", "SERIAL", "EXPIRES", "REVOKED", "CURRENT", "ISSUER"
                    ],
                    &rows
                )
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_durations() {
        for (secs, text) in [
            (5, "5s"),
            (119, "119s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
        ] {
            assert_eq!(short_duration(secs), text);
        }
    }
}
