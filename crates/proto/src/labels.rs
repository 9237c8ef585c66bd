//! Node labels: validation and application of changes (pure).
//!
//! Limits follow Metropolis: at most 128 labels per node; keys and values at most 63
//! characters; keys non-empty; both made of `[A-Za-z0-9._-]`, starting and ending with
//! an alphanumeric character (values may be empty).
//!
//! [`apply`] runs in time linear in its input: it is called on requests from the
//! network, whose lists can be as long as the server's message limit allows. An error
//! never quotes more than a bounded part of what it refuses (`echo::quoted`); only
//! keys already found well formed (at most 63 characters) are named whole.

use std::collections::{BTreeMap, HashMap, HashSet};

pub const MAX_LABELS: usize = 128;
pub const MAX_LENGTH: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// The key as [`crate::echo::quoted`] names it: cut, escaped, with its length.
    #[error(
        "invalid label key {0}: want 1-63 characters of [A-Za-z0-9._-], alphanumeric at both ends"
    )]
    InvalidKey(String),
    #[error(
        "invalid value for label {key:?}: want at most 63 characters of [A-Za-z0-9._-], alphanumeric at both ends"
    )]
    InvalidValue { key: String },
    #[error("too many labels: {count} (at most {MAX_LABELS})")]
    TooMany { count: usize },
    #[error("label {0:?} is both set and deleted")]
    Conflict(String),
}

fn well_formed(s: &str) -> bool {
    let bytes = s.as_bytes();
    let inner_ok = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    s.len() <= MAX_LENGTH
        && inner_ok
        && bytes.first().is_none_or(|b| b.is_ascii_alphanumeric())
        && bytes.last().is_none_or(|b| b.is_ascii_alphanumeric())
}

pub fn validate_key(key: &str) -> Result<(), LabelError> {
    if !key.is_empty() && well_formed(key) {
        Ok(())
    } else {
        Err(LabelError::InvalidKey(crate::echo::quoted(key)))
    }
}

pub fn validate_value(key: &str, value: &str) -> Result<(), LabelError> {
    if well_formed(value) {
        Ok(())
    } else {
        Err(LabelError::InvalidValue {
            key: key.to_string(),
        })
    }
}

/// The labels after upserting and deleting; nothing changes if any part is invalid.
/// Linear in the sizes of `current`, `upsert` and `delete`.
pub fn apply(
    current: &HashMap<String, String>,
    upsert: &BTreeMap<String, String>,
    delete: &[String],
) -> Result<HashMap<String, String>, LabelError> {
    let mut labels = current.clone();
    apply_to(&mut labels, upsert, delete)?;
    Ok(labels)
}

/// Checks a change (`upsert`, `delete`) on its own: every key and value valid, no key
/// both upserted and deleted, not more upserts than a node may hold.
pub fn validate_change(
    upsert: &BTreeMap<String, String>,
    delete: &[String],
) -> Result<(), LabelError> {
    // Every upserted key ends up in the result: more than the limit can never succeed,
    // so refuse before looking at any of them.
    if upsert.len() > MAX_LABELS {
        return Err(LabelError::TooMany {
            count: upsert.len(),
        });
    }
    for k in delete {
        validate_key(k)?;
    }
    let deleted: HashSet<&str> = delete.iter().map(String::as_str).collect();
    for (k, v) in upsert {
        validate_key(k)?;
        validate_value(k, v)?;
        if deleted.contains(k.as_str()) {
            return Err(LabelError::Conflict(k.clone()));
        }
    }
    Ok(())
}

/// Whether a valid change would change `current` (so an unchanged record need not be
/// copied to find out).
pub fn changes(
    current: &HashMap<String, String>,
    upsert: &BTreeMap<String, String>,
    delete: &[String],
) -> bool {
    delete.iter().any(|k| current.contains_key(k))
        || upsert.iter().any(|(k, v)| current.get(k) != Some(v))
}

/// [`apply`] in place: on an error `labels` may be partly changed (callers drop it).
pub fn apply_to(
    labels: &mut HashMap<String, String>,
    upsert: &BTreeMap<String, String>,
    delete: &[String],
) -> Result<(), LabelError> {
    validate_change(upsert, delete)?;
    apply_validated(labels, upsert, delete)
}

/// [`apply_to`] of a change [`validate_change`] has accepted already: only the count of
/// the result is checked.
pub fn apply_validated(
    labels: &mut HashMap<String, String>,
    upsert: &BTreeMap<String, String>,
    delete: &[String],
) -> Result<(), LabelError> {
    for k in delete {
        labels.remove(k);
    }
    for (k, v) in upsert {
        labels.insert(k.clone(), v.clone());
    }
    if labels.len() > MAX_LABELS {
        return Err(LabelError::TooMany {
            count: labels.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        let cases = [
            ("zone", "a1", true),
            ("a", "", true),
            ("rack.row-3_x", "v.1", true),
            ("", "v", false),
            ("-zone", "v", false),
            ("zone-", "v", false),
            ("zo ne", "v", false),
            ("zone", "-v", false),
            ("zone", "v/1", false),
            (&"k".repeat(63), &"v".repeat(63), true),
            (&"k".repeat(64), "v", false),
            ("k", &"v".repeat(64), false),
        ];
        for (k, v, ok) in cases {
            let upsert = BTreeMap::from([(k.to_string(), v.to_string())]);
            assert_eq!(
                apply(&HashMap::new(), &upsert, &[]).is_ok(),
                ok,
                "{k:?}={v:?}"
            );
        }
    }

    #[test]
    fn upsert_delete_and_limits() {
        let current = HashMap::from([
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]);
        let upsert = BTreeMap::from([("a".to_string(), "9".to_string())]);
        let got = apply(&current, &upsert, &["b".to_string()]).unwrap();
        assert_eq!(got, HashMap::from([("a".to_string(), "9".to_string())]));
        assert_eq!(
            apply(&current, &upsert, &["a".to_string()]),
            Err(LabelError::Conflict("a".into()))
        );
        let many: BTreeMap<_, _> = (0..=MAX_LABELS)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert!(matches!(
            apply(&HashMap::new(), &many, &[]),
            Err(LabelError::TooMany { .. })
        ));
    }

    /// Requests from the network can carry ~100k keys; the old pairwise conflict check
    /// took minutes on this input.
    #[test]
    fn huge_inputs_take_linear_time() {
        let keys: Vec<String> = (0..100_000).map(|i| format!("key-{i}")).collect();
        let upsert: BTreeMap<_, _> = keys.iter().map(|k| (k.clone(), "v".into())).collect();
        let started = std::time::Instant::now();
        assert!(matches!(
            apply(&HashMap::new(), &upsert, &keys),
            Err(LabelError::TooMany { count: 100_000 })
        ));
        let few: BTreeMap<_, _> = keys[..MAX_LABELS]
            .iter()
            .map(|k| (format!("{k}-new"), "v".into()))
            .collect();
        let current: HashMap<_, _> = keys[..MAX_LABELS]
            .iter()
            .map(|k| (k.clone(), "old".into()))
            .collect();
        let got = apply(&current, &few, &keys).unwrap();
        assert_eq!(got.len(), MAX_LABELS);
        assert!(got.keys().all(|k| k.ends_with("-new")));
        let mut conflicting = keys.clone();
        conflicting.push(format!("{}-new", keys[7]));
        assert!(matches!(
            apply(&current, &few, &conflicting),
            Err(LabelError::Conflict(_))
        ));
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
    }

    /// A 60 000-byte key of control characters used to come back whole and escaped
    /// (~300 KB) in the error, and from there into the audit log.
    #[test]
    fn a_bad_key_is_named_cut_with_its_length() {
        let key = "\u{1}".repeat(60_000);
        let upsert = BTreeMap::from([(key.clone(), "v".to_string())]);
        let err = apply(&HashMap::new(), &upsert, &[])
            .unwrap_err()
            .to_string();
        assert!(err.len() < 1000, "{} bytes", err.len());
        assert!(err.contains("(60000 bytes)"), "{err}");
        let err = apply(&HashMap::new(), &BTreeMap::new(), &[key]).unwrap_err();
        assert!(err.to_string().len() < 1000);
        // A short bad key is named whole.
        let err = validate_key("zo ne").unwrap_err().to_string();
        assert!(err.contains("\"zo ne\""), "{err}");
    }
}

/// Properties over arbitrary input (proptest): the rules above as an oracle, and what
/// `apply` accepts it accepts again.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn allowed(c: char) -> bool {
        c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
    }

    /// The module doc's rule, written out independently.
    fn key_rule(s: &str) -> bool {
        (1..=MAX_LENGTH).contains(&s.len())
            && s.chars().all(allowed)
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z0-9._-]{0,70}",
            "[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?",
            any::<String>(),
        ]
    }

    proptest! {
        #[test]
        fn keys_and_values_follow_the_rule(key in text(), value in text()) {
            prop_assert_eq!(validate_key(&key).is_ok(), key_rule(&key));
            prop_assert_eq!(
                validate_value(&key, &value).is_ok(),
                value.is_empty() || key_rule(&value)
            );
        }

        #[test]
        fn what_apply_accepts_is_valid_and_accepted_again(
            current in prop::collection::hash_map(text(), text(), 0..4),
            upsert in prop::collection::btree_map(text(), text(), 0..6),
            delete in prop::collection::vec(text(), 0..4),
        ) {
            match apply(&current, &upsert, &delete) {
                Ok(labels) => {
                    prop_assert!(labels.len() <= MAX_LABELS);
                    for (k, v) in &upsert {
                        prop_assert_eq!(labels.get(k), Some(v));
                    }
                    for k in &delete {
                        prop_assert!(!labels.contains_key(k));
                    }
                    prop_assert_eq!(apply(&labels, &upsert, &delete), Ok(labels.clone()));
                    // `changes` says, without a copy, whether the result differs.
                    prop_assert_eq!(changes(&current, &upsert, &delete), labels != current);
                    prop_assert!(!changes(&labels, &upsert, &delete));
                }
                // However large the input, an error quotes a bounded part of it.
                Err(e) => prop_assert!(e.to_string().len() < 1000, "{}", e),
            }
        }
    }
}
