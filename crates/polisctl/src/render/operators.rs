//! The operators, as `cluster operator list` shows them.
//! May not talk to the cluster.

use proto::api;
use serde_json::{Value, json};

use crate::output::{self, Format};

/// The first 8 bytes of a key, hex: enough to tell keys apart at a glance.
fn key_prefix(key: &[u8]) -> String {
    key.iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

fn operator_json(o: &api::OperatorInfo) -> Value {
    json!({
        "name": o.name,
        "role": o.role,
        "public_key": o.public_key.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "added": output::utc_time(o.added_unix * 1000),
        "added_by": o.added_by,
    })
}

/// One row per operator: name, role, key, added, by whom.
pub(crate) fn print_operators(list: &[api::OperatorInfo], format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{}", Value::Array(list.iter().map(operator_json).collect())),
        Format::Yaml => print!(
            "{}",
            output::yaml(&Value::Array(list.iter().map(operator_json).collect()))
        ),
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|o| {
                    vec![
                        o.name.clone(),
                        o.role.clone(),
                        key_prefix(&o.public_key),
                        output::utc_time(o.added_unix * 1000),
                        o.added_by.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(&["NAME", "ROLE", "KEY", "ADDED", "ADDED BY"], &rows)
            );
        }
    }
}
