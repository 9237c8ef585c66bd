//! The node state machine: every change of a node record's state is defined here, as
//! one pure function the RPC handlers call before writing (no I/O).
//!
//! ```text
//!             Register         Approve          Commit
//!   (none) ───────────▶ NEW ───────────▶ STANDBY ───────────▶ UP
//!                        ▲ Register        ▲ Register, Approve   ▲ Register, Approve, Commit
//!                        └─ (no change)    └─ (no change)        └─ (no change)
//!
//!   DECOMMISSIONING, DECOMMISSIONED: every event above is refused.
//! ```
//!
//! Every event is idempotent: repeating it after a lost reply gets the same outcome
//! (`Unchanged` for a state the event already reached), which is what lets nodes and
//! operators retry any call.

use proto::state::NodeState;

/// Something that happens to a node record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A node proves its key and a valid ticket.
    Register,
    /// The owner admits a registered node.
    Approve,
    /// An approved node asks for its certificate.
    Commit,
}

/// What an allowed event does to the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The record must be created in (or moved to) this state.
    Enter(NodeState),
    /// The event already happened: nothing to write, answer as the first time.
    Unchanged,
}

/// Why an event is refused; the text is meant for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("the node is not registered")]
    NotRegistered,
    #[error(
        "the node is not approved yet (state NEW); the owner approves it with `polisctl node approve`"
    )]
    NotApproved,
    #[error("the node was decommissioned (state {0}); it cannot rejoin with this key")]
    Decommissioned(&'static str),
    #[error("the node record has an invalid state")]
    InvalidState,
}

/// The state machine. `current` is the record's state, `None` when there is no record.
pub fn transition(current: Option<NodeState>, event: Event) -> Result<Outcome, TransitionError> {
    use Event::*;
    use NodeState::*;
    use Outcome::*;
    match (current, event) {
        (None, Register) => Ok(Enter(New)),
        (None, Approve | Commit) => Err(TransitionError::NotRegistered),
        (Some(Invalid), _) => Err(TransitionError::InvalidState),
        (Some(s @ (Decommissioning | Decommissioned)), _) => {
            Err(TransitionError::Decommissioned(state_name(s)))
        }
        (Some(New), Register) => Ok(Unchanged),
        (Some(New), Approve) => Ok(Enter(Standby)),
        (Some(New), Commit) => Err(TransitionError::NotApproved),
        (Some(Standby), Register | Approve) => Ok(Unchanged),
        (Some(Standby), Commit) => Ok(Enter(Up)),
        (Some(Up), Register | Approve | Commit) => Ok(Unchanged),
    }
}

/// Upper-case name of a state, as operators see it.
pub fn state_name(state: NodeState) -> &'static str {
    match state {
        NodeState::Invalid => "INVALID",
        NodeState::New => "NEW",
        NodeState::Standby => "STANDBY",
        NodeState::Up => "UP",
        NodeState::Decommissioning => "DECOMMISSIONING",
        NodeState::Decommissioned => "DECOMMISSIONED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Event::*;
    use NodeState::*;
    use Outcome::*;

    fn check(current: Option<NodeState>, event: Event, expected: Result<Outcome, &str>) {
        let got = transition(current, event);
        match (&got, &expected) {
            (Ok(g), Ok(e)) => assert_eq!(g, e, "{current:?} {event:?}"),
            (Err(g), Err(needle)) => {
                assert!(g.to_string().contains(needle), "{current:?} {event:?}: {g}")
            }
            _ => panic!("{current:?} {event:?}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn table() {
        check(None, Register, Ok(Enter(New)));
        check(None, Approve, Err("not registered"));
        check(None, Commit, Err("not registered"));
        check(Some(New), Register, Ok(Unchanged));
        check(Some(New), Approve, Ok(Enter(Standby)));
        check(Some(New), Commit, Err("not approved"));
        check(Some(Standby), Register, Ok(Unchanged));
        check(Some(Standby), Approve, Ok(Unchanged));
        check(Some(Standby), Commit, Ok(Enter(Up)));
        check(Some(Up), Register, Ok(Unchanged));
        check(Some(Up), Approve, Ok(Unchanged));
        check(Some(Up), Commit, Ok(Unchanged));
        for s in [Decommissioning, Decommissioned] {
            for e in [Register, Approve, Commit] {
                check(Some(s), e, Err("decommissioned"));
            }
        }
        for e in [Register, Approve, Commit] {
            check(Some(Invalid), e, Err("invalid state"));
        }
    }

    #[test]
    fn every_event_is_idempotent() {
        // Applying an allowed event to the state it leads to changes nothing more.
        let states = [None, Some(New), Some(Standby), Some(Up)];
        for s in states {
            for e in [Register, Approve, Commit] {
                if let Ok(Enter(next)) = transition(s, e) {
                    assert_eq!(transition(Some(next), e), Ok(Unchanged), "{s:?} {e:?}");
                }
            }
        }
    }
}
