//! The operators, as `cluster operator list` shows them: the recorded operators, and
//! the names whose removal left certificates unrevoked (state `removing`, with the
//! command that finishes it).
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

/// One listed name: a recorded operator, or a removal that did not finish.
enum Listed<'a> {
    Operator(&'a api::OperatorInfo),
    Removing(&'a api::UnfinishedRemoval),
}

impl Listed<'_> {
    fn name(&self) -> &str {
        match self {
            Listed::Operator(o) => &o.name,
            Listed::Removing(r) => &r.name,
        }
    }
}

/// Every listed name, sorted by name.
fn listed<'a>(
    operators: &'a [api::OperatorInfo],
    removing: &'a [api::UnfinishedRemoval],
) -> Vec<Listed<'a>> {
    let mut all: Vec<Listed<'a>> = operators
        .iter()
        .map(Listed::Operator)
        .chain(removing.iter().map(Listed::Removing))
        .collect();
    all.sort_by(|a, b| a.name().cmp(b.name()));
    all
}

/// What finishes the removal of `name`.
fn finish_command(name: &str) -> String {
    format!("polisctl cluster operator remove {name}")
}

/// The state of an unfinished removal, as the table shows it.
fn removing_state(r: &api::UnfinishedRemoval) -> String {
    format!(
        "removing: {} certificate(s) not yet revoked; run `{}` again",
        r.unrevoked,
        finish_command(&r.name)
    )
}

fn listed_json(l: &Listed) -> Value {
    match l {
        Listed::Operator(o) => json!({
            "name": o.name,
            "state": "active",
            "role": o.role,
            "public_key": o.public_key.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "added": output::utc_time(o.added_unix * 1000),
            "added_by": o.added_by,
        }),
        Listed::Removing(r) => json!({
            "name": r.name,
            "state": "removing",
            "unrevoked_certificates": r.unrevoked,
            "finish_with": finish_command(&r.name),
        }),
    }
}

fn listed_row(l: &Listed) -> Vec<String> {
    match l {
        Listed::Operator(o) => vec![
            o.name.clone(),
            o.role.clone(),
            key_prefix(&o.public_key),
            output::utc_time(o.added_unix * 1000),
            o.added_by.clone(),
            "active".into(),
        ],
        Listed::Removing(r) => {
            let none = || "-".to_string();
            vec![
                r.name.clone(),
                none(),
                none(),
                none(),
                none(),
                removing_state(r),
            ]
        }
    }
}

/// The listing in `format` (nothing for quiet).
fn render(
    operators: &[api::OperatorInfo],
    removing: &[api::UnfinishedRemoval],
    format: Format,
) -> String {
    let all = listed(operators, removing);
    match format {
        Format::Quiet => String::new(),
        Format::Json => format!("{}\n", Value::Array(all.iter().map(listed_json).collect())),
        Format::Yaml => output::yaml(&Value::Array(all.iter().map(listed_json).collect())),
        Format::Table => {
            let rows: Vec<Vec<String>> = all.iter().map(listed_row).collect();
            output::table(
                &["NAME", "ROLE", "KEY", "ADDED", "ADDED BY", "STATE"],
                &rows,
            )
        }
    }
}

/// One row per operator: name, role, key, added, by whom, state; and one per name
/// whose removal left certificates unrevoked (state `removing`).
pub(crate) fn print_operators(
    operators: &[api::OperatorInfo],
    removing: &[api::UnfinishedRemoval],
    format: Format,
) {
    print!("{}", render(operators, removing, format));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<api::OperatorInfo>, Vec<api::UnfinishedRemoval>) {
        let operator = |name: &str| api::OperatorInfo {
            name: name.into(),
            role: "reader".into(),
            public_key: vec![0xab; 32],
            added_unix: 1,
            added_by: "owner".into(),
        };
        let removing = api::UnfinishedRemoval {
            name: "bob".into(),
            unrevoked: 2,
        };
        (vec![operator("ada"), operator("rita")], vec![removing])
    }

    #[test]
    fn an_unfinished_removal_is_listed_by_name_with_what_finishes_it() {
        let (operators, removing) = sample();
        let table = render(&operators, &removing, Format::Table);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("STATE"), "{table}");
        assert!(
            lines[1].starts_with("ada") && lines[1].ends_with("active"),
            "{table}"
        );
        assert!(
            lines[2].starts_with("bob")
                && lines[2].contains(
                    "removing: 2 certificate(s) not yet revoked; \
                     run `polisctl cluster operator remove bob` again"
                ),
            "{table}"
        );
        assert!(lines[3].starts_with("rita"), "{table}");

        let json: Value =
            serde_json::from_str(&render(&operators, &removing, Format::Json)).unwrap();
        let names: Vec<&str> = json
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["ada", "bob", "rita"]);
        assert_eq!(json[0]["state"], "active");
        assert_eq!(json[0]["role"], "reader");
        assert_eq!(json[1]["state"], "removing");
        assert_eq!(json[1]["unrevoked_certificates"], 2);
        assert_eq!(
            json[1]["finish_with"],
            "polisctl cluster operator remove bob"
        );
        assert!(render(&operators, &removing, Format::Quiet).is_empty());
    }
}
