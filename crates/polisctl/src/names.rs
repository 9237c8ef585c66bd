//! The operator-facing names of node states and health, both ways (pure).
//! May not talk to the cluster or print.

use anyhow::{Result, anyhow};
use proto::api::{NodeHealth, NodeState};

pub(crate) fn state_name(state: i32) -> String {
    NodeState::try_from(state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("NODE_STATE_")
                .to_string()
        })
        .unwrap_or_else(|_| format!("UNKNOWN({state})"))
}

pub(crate) fn health_name(health: i32) -> String {
    NodeHealth::try_from(health)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("NODE_HEALTH_")
                .to_string()
        })
        .unwrap_or_else(|_| format!("UNKNOWN({health})"))
}

pub(crate) fn parse_state(s: &str) -> Result<i32> {
    let name = format!("NODE_STATE_{}", s.to_ascii_uppercase());
    NodeState::from_str_name(&name)
        .map(|s| s as i32)
        .ok_or_else(|| {
            anyhow!(
                "unknown node state {s:?}; use NEW, STANDBY, UP, DECOMMISSIONING or DECOMMISSIONED"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse() {
        assert_eq!(parse_state("up").unwrap(), NodeState::Up as i32);
        assert!(parse_state("sideways").is_err());
        assert_eq!(state_name(NodeState::Up as i32), "UP");
    }
}

/// Properties over arbitrary state names (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_state_name_parses_or_is_refused(text in any::<String>()) {
            if let Ok(state) = parse_state(&text) {
                prop_assert!(NodeState::try_from(state).is_ok());
            }
        }
    }
}
