//! The register tickets, as `cluster tickets` shows them (never a secret: the curator
//! does not have them).
//! May not talk to the cluster.

use proto::api;
use serde_json::{Value, json};

use crate::output::{self, Format};

fn ticket_json(t: &api::RegisterTicketInfo) -> Value {
    json!({
        "id": t.id,
        "created": output::utc_time(t.created_unix * 1000),
        "expires": (t.expires_unix != 0).then(|| output::utc_time(t.expires_unix * 1000)),
        "uses_left": t.uses_left,
        "created_by": t.created_by,
        "last_used": (t.last_used_unix != 0).then(|| output::utc_time(t.last_used_unix * 1000)),
    })
}

/// What a ticket's state is at `now`: usable, expired or used up.
fn state(t: &api::RegisterTicketInfo, now: u64) -> &'static str {
    if t.expires_unix != 0 && now >= t.expires_unix {
        "expired"
    } else if t.uses_left == Some(0) {
        "used up"
    } else {
        "usable"
    }
}

/// One row per ticket: id, state, created, expiry, uses left, creator.
pub(crate) fn print_tickets(list: &[api::RegisterTicketInfo], now: u64, format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{}", Value::Array(list.iter().map(ticket_json).collect())),
        Format::Yaml => print!(
            "{}",
            output::yaml(&Value::Array(list.iter().map(ticket_json).collect()))
        ),
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| {
                    vec![
                        t.id.clone(),
                        state(t, now).into(),
                        output::utc_time(t.created_unix * 1000),
                        match t.expires_unix {
                            0 => "never".into(),
                            e => output::utc_time(e * 1000),
                        },
                        t.uses_left
                            .map_or_else(|| "unlimited".into(), |u| u.to_string()),
                        t.created_by.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &[
                        "ID",
                        "STATE",
                        "CREATED",
                        "EXPIRES",
                        "USES LEFT",
                        "CREATED BY"
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

    fn ticket(expires: u64, uses: Option<u32>) -> api::RegisterTicketInfo {
        api::RegisterTicketInfo {
            id: "0a1b2c3d".into(),
            created_unix: 100,
            expires_unix: expires,
            uses_left: uses,
            created_by: "user owner".into(),
            last_used_unix: 0,
        }
    }

    #[test]
    fn states_name_why_a_ticket_stopped_working() {
        assert_eq!(state(&ticket(0, None), u64::MAX), "usable");
        assert_eq!(state(&ticket(200, Some(1)), 199), "usable");
        assert_eq!(state(&ticket(200, Some(1)), 200), "expired");
        assert_eq!(state(&ticket(0, Some(0)), 150), "used up");
    }

    #[test]
    fn json_names_no_secret_and_never_as_null() {
        let v = ticket_json(&ticket(0, None));
        assert_eq!(v["id"], "0a1b2c3d");
        assert!(v["expires"].is_null());
        assert!(v["uses_left"].is_null());
        assert_eq!(v["created"], "1970-01-01T00:01:40Z");
        assert!(v.get("secret").is_none());
    }
}
