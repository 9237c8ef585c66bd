//! How many followed audit logs each caller holds open, and in all: a seat per follow,
//! taken before the follow starts and given back when its stream ends.
//!
//! Why: a follow holds an etcd watch, a task and up to a page of entries on the
//! curator that serves it, and one forwarded through a follower holds a connection of
//! its own from that follower to the leader, proven by the follower's node certificate
//! (never evicted). Since operators may follow the log, a per-source cap on the
//! follower is not enough: one operator calling through every follower from a few
//! addresses could hold every seat of the leader's listener. So the leader (or
//! whichever curator serves the follow) counts follows by the caller's identity —
//! the forwarded one for a forwarded call — and refuses past [`PER_CALLER`] for one
//! caller and [`IN_ALL`] for everyone.
//!
//! A leaf: imports nothing of the service layer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Followed audit logs one caller (an operator by name, the owner, a node) holds open.
pub const PER_CALLER: usize = 16;
/// Followed audit logs all callers hold open on one curator.
pub const IN_ALL: usize = 256;

/// The follows held open, by caller.
#[derive(Debug, Default)]
pub struct Follows {
    held: Mutex<HashMap<String, usize>>,
}

/// One follow's seat; given back when dropped.
#[derive(Debug)]
pub struct Seat {
    follows: Arc<Follows>,
    caller: String,
}

/// Why a follow was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{caller} already follows the audit log {PER_CALLER} times (the most one caller may)")]
    Caller { caller: String },
    #[error("the audit log is followed {IN_ALL} times on this curator (the most it serves)")]
    InAll,
}

/// The account a follow counts against: an operator by name (whatever its role), the
/// owner, a node by ID; anything else (not authorized to follow) in one account.
pub fn account(caller: &rpc::Identity) -> String {
    match caller {
        rpc::Identity::Operator { name, .. } => format!("operator {name}"),
        rpc::Identity::User { name, .. } => format!("user {name}"),
        rpc::Identity::Node { id, .. } => format!("node {id}"),
        _ => "other".to_string(),
    }
}

impl Follows {
    /// A seat for one more follow of `caller`, unless a cap is reached.
    pub fn take(self: &Arc<Self>, caller: &str) -> Result<Seat, Refused> {
        let mut held = self.held.lock().expect("follows lock poisoned");
        if held.values().sum::<usize>() >= IN_ALL {
            return Err(Refused::InAll);
        }
        let count = held.entry(caller.to_string()).or_default();
        if *count >= PER_CALLER {
            return Err(Refused::Caller {
                caller: caller.to_string(),
            });
        }
        *count += 1;
        Ok(Seat {
            follows: self.clone(),
            caller: caller.to_string(),
        })
    }

    /// Follows `caller` holds open now.
    #[cfg(test)]
    pub fn held_by(&self, caller: &str) -> usize {
        let held = self.held.lock().expect("follows lock poisoned");
        held.get(caller).copied().unwrap_or_default()
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut held = self.follows.held.lock().expect("follows lock poisoned");
        if let Some(count) = held.get_mut(&self.caller) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_is_held_to_its_cap_and_a_seat_given_back_makes_room() {
        let follows = Arc::new(Follows::default());
        let mut seats: Vec<Seat> = (0..PER_CALLER)
            .map(|_| follows.take("operator ada").expect("under the cap"))
            .collect();
        assert_eq!(
            follows.take("operator ada").unwrap_err(),
            Refused::Caller {
                caller: "operator ada".into()
            }
        );
        // Another caller is not held back by ada's follows.
        let other = follows.take("operator bob").expect("bob has his own cap");
        seats.pop();
        assert_eq!(follows.held_by("operator ada"), PER_CALLER - 1);
        follows.take("operator ada").expect("a seat was given back");
        drop(other);
        assert_eq!(follows.held_by("operator bob"), 0);
    }

    #[test]
    fn all_callers_together_are_held_to_the_cap_in_all() {
        let follows = Arc::new(Follows::default());
        let seats: Vec<Seat> = (0..IN_ALL)
            .map(|i| {
                follows
                    .take(&format!("node {}", i / PER_CALLER))
                    .expect("under both caps")
            })
            .collect();
        assert_eq!(follows.take("operator new").unwrap_err(), Refused::InAll);
        drop(seats);
        follows.take("operator new").expect("every seat given back");
    }

    #[test]
    fn accounts_name_operators_by_name_whatever_their_role() {
        let reader = rpc::Identity::Operator {
            name: "ada".into(),
            role: rpc::authz::OperatorRole::Reader,
            public_key: vec![1; 32],
        };
        let admin = rpc::Identity::Operator {
            name: "ada".into(),
            role: rpc::authz::OperatorRole::Admin,
            public_key: vec![2; 32],
        };
        assert_eq!(account(&reader), account(&admin));
        assert_ne!(
            account(&reader),
            account(&rpc::Identity::User {
                name: "ada".into(),
                public_key: vec![1; 32]
            })
        );
    }
}
