//! Operators (named users with a role): the rules for their names and how many a
//! cluster holds, shared by polisctl, the curator and every certificate check (pure).
//!
//! A name is 1–32 characters of `[a-z0-9_-]`, starting with a letter. It may not be
//! `owner` (the owner's certificates are named so) nor start with `polis-` (node IDs).
//! No `.`: certificates are recorded as `operator-<name>.<serial>`, so no name's
//! certificates share a prefix with another name's.

/// At most this many operators (besides the owner) in a cluster.
pub const MAX_OPERATORS: usize = 256;

/// The longest operator name.
pub const MAX_NAME_LENGTH: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperatorNameError {
    /// The name as [`crate::echo::quoted`] names it.
    #[error(
        "invalid operator name {0}: want 1-32 characters of [a-z0-9_-], starting with a letter"
    )]
    Malformed(String),
    #[error("the operator name {0:?} is reserved")]
    Reserved(String),
}

/// Checks an operator name (see the module documentation).
pub fn validate_name(name: &str) -> Result<(), OperatorNameError> {
    let well_formed = !name.is_empty()
        && name.len() <= MAX_NAME_LENGTH
        && name.as_bytes()[0].is_ascii_lowercase()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !well_formed {
        return Err(OperatorNameError::Malformed(crate::echo::quoted(name)));
    }
    if name == "owner" || name.starts_with("polis-") {
        return Err(OperatorNameError::Reserved(name.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["ada", "a", "rita-2", "ops_team", &"a".repeat(32)] {
            assert_eq!(validate_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "Ada",
            "1ada",
            "-ada",
            "ada.b",
            "ada b",
            "ada:b",
            "äda",
            &"a".repeat(33),
        ] {
            assert!(
                matches!(validate_name(bad), Err(OperatorNameError::Malformed(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            validate_name("owner"),
            Err(OperatorNameError::Reserved(_))
        ));
        assert!(matches!(
            validate_name("polis-0123"),
            Err(OperatorNameError::Reserved(_))
        ));
    }
}
