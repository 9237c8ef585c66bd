//! The node's cluster state (Unknown, Foreign, Trusted, Home, Split, Disowning) and the
//! contact events that move it between Home and Split: named states and their allowed
//! transitions in one place.
//!
//! Pure: no I/O, and imports no other module of this crate.

use std::fmt;

/// The cluster state as seen by this node (DESIGN.md, Lifecycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// Not yet known: the node is starting.
    Unknown,
    /// Registered with a cluster, waiting for the owner's approval.
    Foreign,
    /// Approved; committing (receiving its certificate).
    Trusted,
    /// Full member of its cluster.
    Home,
    /// A member that has lost every curator for longer than the heartbeat timeout; back
    /// to Home when contact returns.
    Split,
    /// Being decommissioned: leaving its cluster for good. Nothing moves it back.
    Disowning,
}

/// What moves a node between Home and Split (the other states are set by registration
/// and, for Disowning, by decommissioning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contact {
    /// The node belongs to its cluster: its control plane runs, or (a worker) a curator
    /// answered its node watch.
    Joined,
    /// No curator has answered a heartbeat for longer than the heartbeat timeout.
    Lost,
    /// A heartbeat was answered again.
    Restored,
}

impl ClusterState {
    /// The state after `contact`, or `None` when it stays as it is (pure). Explicitly:
    /// ```text
    ///   Unknown | Foreign | Trusted ──Joined──▶ Home ──Lost──▶ Split ──Restored──▶ Home
    ///   Disowning: nothing moves it
    /// ```
    /// Joined never ends Split (only a heartbeat answered again does, so a restarting
    /// control plane or a node watch answered by a curator without a leader cannot flip
    /// a split node back), and nothing moves a node out of Disowning.
    pub fn after(self, contact: Contact) -> Option<ClusterState> {
        use ClusterState::*;
        match (self, contact) {
            (Unknown | Foreign | Trusted, Contact::Joined) => Some(Home),
            (Home, Contact::Lost) => Some(Split),
            (Split, Contact::Restored) => Some(Home),
            _ => None,
        }
    }
}

impl fmt::Display for ClusterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_state_transitions() {
        use ClusterState::*;
        use Contact::*;
        let cases = [
            (Unknown, Joined, Some(Home)),
            (Foreign, Joined, Some(Home)),
            (Trusted, Joined, Some(Home)),
            (Home, Joined, None),
            (Split, Joined, None),
            (Disowning, Joined, None),
            (Home, Lost, Some(Split)),
            (Split, Lost, None),
            (Unknown, Lost, None),
            (Disowning, Lost, None),
            (Split, Restored, Some(Home)),
            (Home, Restored, None),
            (Unknown, Restored, None),
            (Disowning, Restored, None),
        ];
        for (state, contact, want) in cases {
            assert_eq!(state.after(contact), want, "{state} after {contact:?}");
        }
    }
}
