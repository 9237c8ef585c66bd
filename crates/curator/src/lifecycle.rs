//! The node state machine: every change of a node record's state is defined here, as
//! one pure function the RPC handlers call before writing (no I/O).
//!
//! ```text
//!             Register         Approve          Commit
//!   (none) ───────────▶ NEW ───────────▶ STANDBY ───────────▶ UP
//!                        ▲ Register        ▲ Register, Approve   ▲ Register, Approve, Commit
//!                        └─ (no change)    └─ (no change)        └─ (no change)
//!                        │                 │                     │ Decommission (owner)
//!                        │ Delete          │ Delete              ▼
//!                        ▼                 ▼               DECOMMISSIONING ◀─ Decommission
//!                     (tombstone)       (tombstone)              │ Finish (leader: out of
//!                                                                ▼ consensus, revoked)
//!                                     (tombstone) ◀── Delete ── DECOMMISSIONED ◀─ Decommission,
//!                                                                                 Finish
//!   DECOMMISSIONING, DECOMMISSIONED: Register, Approve and Commit are refused.
//!   UP, DECOMMISSIONING: Delete is refused (decommission first).
//! ```
//! A deleted record leaves a tombstone (see `state::delete_node`): the key never
//! registers again.
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
    /// The owner takes an UP node out of the cluster.
    Decommission,
    /// The leader has taken the node out of consensus and revoked its certificates.
    FinishDecommission,
    /// The owner removes the record of a node that is not (or no longer) part of the
    /// cluster.
    Delete,
}

/// What an allowed event does to the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The record must be created in (or moved to) this state.
    Enter(NodeState),
    /// The event already happened: nothing to write, answer as the first time.
    Unchanged,
    /// The record must be removed (leaving a tombstone).
    Remove,
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
    #[error(
        "the node is not UP (state {0}); only UP nodes are decommissioned, a node that never \
         joined is deleted instead (`polisctl node delete`)"
    )]
    NotUp(&'static str),
    #[error("the node is {0}, not being decommissioned")]
    NotDecommissioning(&'static str),
    #[error(
        "the node is {0}; decommission it first (`polisctl node decommission`), then delete it"
    )]
    StillMember(&'static str),
}

/// The state machine. `current` is the record's state, `None` when there is no record.
pub fn transition(current: Option<NodeState>, event: Event) -> Result<Outcome, TransitionError> {
    use Event::*;
    use NodeState::*;
    use Outcome::*;
    match (current, event) {
        (None, Register) => Ok(Enter(New)),
        (None, _) => Err(TransitionError::NotRegistered),
        (Some(Invalid), _) => Err(TransitionError::InvalidState),
        (Some(Up), Decommission) => Ok(Enter(Decommissioning)),
        (Some(Decommissioning | Decommissioned), Decommission) => Ok(Unchanged),
        (Some(s @ (New | Standby)), Decommission) => Err(TransitionError::NotUp(state_name(s))),
        (Some(Decommissioning), FinishDecommission) => Ok(Enter(Decommissioned)),
        (Some(Decommissioned), FinishDecommission) => Ok(Unchanged),
        (Some(s), FinishDecommission) => Err(TransitionError::NotDecommissioning(state_name(s))),
        (Some(New | Standby | Decommissioned), Delete) => Ok(Remove),
        (Some(s @ (Up | Decommissioning)), Delete) => {
            Err(TransitionError::StillMember(state_name(s)))
        }
        (Some(s @ (Decommissioning | Decommissioned)), Register | Approve | Commit) => {
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
        check(Some(Up), Decommission, Ok(Enter(Decommissioning)));
        check(Some(Decommissioning), Decommission, Ok(Unchanged));
        check(Some(Decommissioned), Decommission, Ok(Unchanged));
        check(Some(New), Decommission, Err("deleted instead"));
        check(Some(Standby), Decommission, Err("not UP (state STANDBY)"));
        check(None, Decommission, Err("not registered"));
        check(
            Some(Decommissioning),
            FinishDecommission,
            Ok(Enter(Decommissioned)),
        );
        check(Some(Decommissioned), FinishDecommission, Ok(Unchanged));
        check(
            Some(Up),
            FinishDecommission,
            Err("not being decommissioned"),
        );
        check(None, FinishDecommission, Err("not registered"));
        for s in [New, Standby, Decommissioned] {
            check(Some(s), Delete, Ok(Remove));
        }
        for s in [Up, Decommissioning] {
            check(Some(s), Delete, Err("decommission it first"));
        }
        check(None, Delete, Err("not registered"));
        for e in ALL {
            check(Some(Invalid), e, Err("invalid state"));
        }
    }

    const ALL: [Event; 6] = [
        Register,
        Approve,
        Commit,
        Decommission,
        FinishDecommission,
        Delete,
    ];

    #[test]
    fn a_decommissioned_node_never_comes_back() {
        // No event leads out of DECOMMISSIONED except its removal.
        for e in ALL {
            match transition(Some(Decommissioned), e) {
                Ok(Enter(s)) => panic!("{e:?} leads from DECOMMISSIONED to {s:?}"),
                Ok(Unchanged | Remove) | Err(_) => {}
            }
        }
    }

    #[test]
    fn every_event_is_idempotent() {
        // Applying an allowed event to the state it leads to changes nothing more.
        let states = [
            None,
            Some(New),
            Some(Standby),
            Some(Up),
            Some(Decommissioning),
            Some(Decommissioned),
        ];
        for s in states {
            for e in ALL {
                if let Ok(Enter(next)) = transition(s, e) {
                    assert_eq!(transition(Some(next), e), Ok(Unchanged), "{s:?} {e:?}");
                }
            }
        }
    }
}
