//! Cluster epochs (`config::ClusterEpoch`): which of two epochs is the later, how one
//! is named to people, and the rule that decides whether a former member's etcd data may
//! be dropped so that it joins a cluster of a newer epoch. Pure: the node, the curator
//! and polisctl share it.
//!
//! ```text
//!   bootstrap (implicit) ──recover──▶ epoch 1 ──restore──▶ epoch 2 …
//!        │ parent_revision: the last revision of the parent's history the child holds
//!        └──recover (concurrent, another node)──▶ epoch 1' (a sibling: the later wins)
//! ```
//! A member's data may go only when everything in it is in the cluster it joins: its
//! epoch is the cluster's, or the cluster continued its epoch from a revision at least
//! as high as the member's data, or (a sibling recovered at the same time) it wrote
//! nothing after its own epoch began and the cluster's sibling started from at least
//! as far.

use crate::config::ClusterEpoch;

/// An epoch's identity, as its record in etcd is keyed: (made_unix_ms, made_by).
pub fn id(epoch: &ClusterEpoch) -> (u64, &str) {
    (epoch.made_unix_ms, epoch.made_by.as_str())
}

/// The order of epochs: the chain's first (`number`: a child is always one past its
/// parent), the clock only between siblings (two recoveries of the same parent), the
/// node last. A wall clock is not an order: a recover on a machine whose clock ran
/// fast must not outrank the epochs that continue it.
pub fn order(epoch: &ClusterEpoch) -> (u64, u64, &str) {
    (epoch.number, epoch.made_unix_ms, epoch.made_by.as_str())
}

/// The identity of the epoch `epoch` continues.
pub fn parent_id(epoch: &ClusterEpoch) -> (u64, &str) {
    (epoch.parent_made_unix_ms, epoch.parent_made_by.as_str())
}

/// The kind of a drill's epoch (`polis-node restore --drill`): a rehearsal restored
/// beside the live cluster from its backup. Clients never take one for the other: a
/// client that has seen one line of epochs refuses the other's answers.
pub const DRILL: &str = "drill";

/// Whether `epoch` is a drill's (see [`DRILL`]).
pub fn is_drill(epoch: &ClusterEpoch) -> bool {
    epoch.kind == DRILL
}

/// Whether `epoch` is the bootstrap's (no recover or restore since).
pub fn is_bootstrap(epoch: &ClusterEpoch) -> bool {
    order(epoch) == (0, 0, "")
}

/// Whether `a` and `b` are the same epoch.
pub fn same(a: &ClusterEpoch, b: &ClusterEpoch) -> bool {
    order(a) == order(b)
}

/// Whether `a` is later than `b`: a member of `b` that sees `a` must not serve.
pub fn newer(a: &ClusterEpoch, b: &ClusterEpoch) -> bool {
    order(a) > order(b)
}

/// The latest epoch of `chain` (the bootstrap's when it is empty).
pub fn latest(chain: &[ClusterEpoch]) -> ClusterEpoch {
    chain
        .iter()
        .max_by(|a, b| order(a).cmp(&order(b)))
        .cloned()
        .unwrap_or_default()
}

/// The epoch a recover or restore (`kind`) by node `made_by` at `now_unix_ms` (the
/// maker's clock) starts after `parent`, whose history it holds up to `parent_revision`.
/// Later than its parent whatever the clocks say: one past it in the chain, and made at
/// least a millisecond after it (as CRL numbers are: `max(now, parent + 1)`).
pub fn successor(
    parent: &ClusterEpoch,
    now_unix_ms: u64,
    made_by: &str,
    kind: &str,
    parent_revision: i64,
) -> ClusterEpoch {
    ClusterEpoch {
        number: parent.number + 1,
        made_unix_ms: now_unix_ms.max(parent.made_unix_ms.saturating_add(1)),
        made_by: made_by.to_string(),
        // A drill's line stays a drill's, whatever continues it.
        kind: if is_drill(parent) { DRILL } else { kind }.to_string(),
        parent_made_unix_ms: parent.made_unix_ms,
        parent_made_by: parent.made_by.clone(),
        parent_number: parent.number,
        parent_revision,
        record_revision: 0,
    }
}

/// One line for people, e.g. `epoch 2 (restore on polis-ab…, 1764138000123)`.
pub fn describe(epoch: &ClusterEpoch) -> String {
    if is_bootstrap(epoch) {
        return "epoch 0 (the bootstrap's)".to_string();
    }
    format!(
        "epoch {} ({} on {} at {} ms)",
        epoch.number, epoch.kind, epoch.made_by, epoch.made_unix_ms
    )
}

/// Why a former member keeps its etcd data instead of dropping it to join a cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Keep {
    #[error(
        "its data reaches revision {own_revision}, but {} continued its {} only up to \
         revision {parent_revision}: it holds writes the cluster lacks",
        describe(.child), describe(.own)
    )]
    Ahead {
        own: Box<ClusterEpoch>,
        own_revision: i64,
        child: Box<ClusterEpoch>,
        parent_revision: i64,
    },
    #[error(
        "its {} was made at the same time as the cluster's {} and holds writes of its own \
         (revision {own_revision}) or more of their common history",
        describe(.own), describe(.sibling)
    )]
    Sibling {
        own: Box<ClusterEpoch>,
        own_revision: i64,
        sibling: Box<ClusterEpoch>,
    },
    #[error("its {} is not in the cluster's history (latest: {})", describe(.own), describe(.latest))]
    Unrelated {
        own: Box<ClusterEpoch>,
        latest: Box<ClusterEpoch>,
    },
}

/// The rule (see the module doc): may a member whose data belongs to `own` and reaches
/// `own_revision` drop it to join a cluster whose epochs are `chain`?
pub fn may_drop(own: &ClusterEpoch, own_revision: i64, chain: &[ClusterEpoch]) -> Result<(), Keep> {
    let latest = latest(chain);
    if same(own, &latest) {
        return Ok(());
    }
    let known = is_bootstrap(own) || chain.iter().any(|e| same(e, own));
    if known {
        // The chain is linear: exactly one epoch continued this one.
        let Some(child) = chain.iter().find(|e| parent_id(e) == id(own)) else {
            return Err(Keep::Unrelated {
                own: Box::new(own.clone()),
                latest: Box::new(latest),
            });
        };
        if own_revision <= child.parent_revision {
            return Ok(());
        }
        return Err(Keep::Ahead {
            own: Box::new(own.clone()),
            own_revision,
            child: Box::new(child.clone()),
            parent_revision: child.parent_revision,
        });
    }
    let Some(sibling) = chain.iter().find(|e| parent_id(e) == parent_id(own)) else {
        return Err(Keep::Unrelated {
            own: Box::new(own.clone()),
            latest: Box::new(latest),
        });
    };
    // Nothing written in its own epoch (past its record, or, unrecorded, past where it
    // began), and no more of the parent's history than the sibling took.
    let own_limit = match own.record_revision {
        0 => own.parent_revision,
        r => r,
    };
    if own_revision <= own_limit && own.parent_revision <= sibling.parent_revision {
        return Ok(());
    }
    Err(Keep::Sibling {
        own: Box::new(own.clone()),
        own_revision,
        sibling: Box::new(sibling.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(
        number: u64,
        at: u64,
        by: &str,
        parent: &ClusterEpoch,
        parent_revision: i64,
    ) -> ClusterEpoch {
        let epoch = ClusterEpoch {
            record_revision: parent_revision + 1,
            ..successor(parent, at, by, "recover", parent_revision)
        };
        assert_eq!(epoch.number, number);
        epoch
    }

    #[test]
    fn a_child_is_later_than_its_parent_whatever_the_clocks_say() {
        let boot = ClusterEpoch::default();
        // The first recover ran on a machine whose clock was an hour fast.
        let fast = successor(&boot, 3_600_000 + 1_000, "polis-a", "recover", 10);
        // The next one, on a correct clock, continues it.
        let child = successor(&fast, 2_000, "polis-b", "recover", 40);
        assert!(newer(&child, &fast), "{child:?} vs {fast:?}");
        assert!(child.made_unix_ms > fast.made_unix_ms);
        assert_eq!(latest(&[child.clone(), fast.clone()]), child);
        assert_eq!(latest(&[fast.clone(), child.clone()]), child);
        // A grandchild of the chain outranks a sibling made later by the clock.
        let sibling = successor(&boot, 9_000_000, "polis-c", "recover", 10);
        assert!(newer(&child, &sibling));
        // The drop rule follows the chain: a member of the fast epoch holding writes the
        // child lacks keeps them; one holding no more drops.
        let chain = [fast.clone(), child.clone()];
        assert!(matches!(
            may_drop(&fast, 41, &chain),
            Err(Keep::Ahead { .. })
        ));
        assert_eq!(may_drop(&fast, 40, &chain), Ok(()));
        // The fast epoch is not "the latest": a member of it is not the cluster's.
        assert!(!same(&fast, &latest(&chain)));
    }

    #[test]
    fn later_made_wins_and_the_node_breaks_ties() {
        let boot = ClusterEpoch::default();
        let a = epoch(1, 100, "polis-a", &boot, 10);
        let b = epoch(1, 100, "polis-b", &boot, 10);
        let c = epoch(1, 101, "polis-a", &boot, 10);
        assert!(newer(&a, &boot) && newer(&b, &a) && newer(&c, &b));
        assert!(!newer(&a, &a) && same(&a, &a.clone()));
        assert_eq!(latest(&[a.clone(), c.clone(), b.clone()]), c);
        assert!(is_bootstrap(&latest(&[])));
    }

    #[test]
    fn a_member_of_the_current_epoch_may_always_drop() {
        let boot = ClusterEpoch::default();
        assert_eq!(may_drop(&boot, 1_000, &[]), Ok(()));
        let one = epoch(1, 5, "polis-a", &boot, 10);
        assert_eq!(may_drop(&one, 1_000, std::slice::from_ref(&one)), Ok(()));
    }

    #[test]
    fn a_parent_member_drops_only_what_the_child_holds() {
        let boot = ClusterEpoch::default();
        let one = epoch(1, 5, "polis-a", &boot, 10);
        let two = epoch(2, 9, "polis-b", &one, 40);
        let chain = [one.clone(), two.clone()];
        assert_eq!(may_drop(&boot, 10, &chain), Ok(()));
        assert!(matches!(
            may_drop(&boot, 11, &chain),
            Err(Keep::Ahead {
                parent_revision: 10,
                ..
            })
        ));
        assert_eq!(may_drop(&one, 40, &chain), Ok(()));
        let kept = may_drop(&one, 41, &chain).unwrap_err();
        assert!(kept.to_string().contains("revision 41"), "{kept}");
    }

    #[test]
    fn a_sibling_drops_only_when_it_wrote_nothing_and_had_no_more_history() {
        let boot = ClusterEpoch::default();
        let winner = epoch(1, 6, "polis-a", &boot, 20);
        let chain = [winner.clone()];
        let equal = epoch(1, 5, "polis-b", &boot, 20);
        assert_eq!(may_drop(&equal, 21, &chain), Ok(()));
        assert!(matches!(
            may_drop(&equal, 22, &chain),
            Err(Keep::Sibling { .. })
        ));
        let ahead = epoch(1, 5, "polis-b", &boot, 25);
        assert!(matches!(
            may_drop(&ahead, 26, &chain),
            Err(Keep::Sibling { .. })
        ));
        let unrecorded = ClusterEpoch {
            record_revision: 0,
            ..equal.clone()
        };
        assert_eq!(may_drop(&unrecorded, 20, &chain), Ok(()));
        assert!(may_drop(&unrecorded, 21, &chain).is_err());
    }

    #[test]
    fn an_epoch_outside_the_history_is_kept() {
        let boot = ClusterEpoch::default();
        let stranger_parent = epoch(1, 3, "polis-x", &boot, 5);
        let stranger = epoch(2, 4, "polis-y", &stranger_parent, 7);
        let chain = [epoch(1, 6, "polis-a", &boot, 20)];
        assert!(matches!(
            may_drop(&stranger, 7, &chain),
            Err(Keep::Unrelated { .. })
        ));
    }
}

/// Properties over arbitrary epochs (proptest): `newer` is a strict order, `latest` its
/// maximum, and the drop rule decides without panicking.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn epoch() -> impl Strategy<Value = ClusterEpoch> {
        (
            0u64..4,
            0u64..4,
            "[ab]?",
            0u64..4,
            "[ab]?",
            -2i64..6,
            -2i64..6,
        )
            .prop_map(
                |(number, at, by, parent_at, parent_by, parent_revision, record_revision)| {
                    ClusterEpoch {
                        number,
                        made_unix_ms: at,
                        made_by: by,
                        kind: "recover".into(),
                        parent_made_unix_ms: parent_at,
                        parent_made_by: parent_by,
                        parent_number: 0,
                        parent_revision,
                        record_revision,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn newer_is_a_strict_order(a in epoch(), b in epoch(), c in epoch()) {
            prop_assert!(!newer(&a, &a));
            prop_assert!(!(newer(&a, &b) && newer(&b, &a)));
            if newer(&a, &b) && newer(&b, &c) {
                prop_assert!(newer(&a, &c));
            }
            prop_assert_eq!(same(&a, &b), !newer(&a, &b) && !newer(&b, &a));
        }

        #[test]
        fn latest_is_never_older_than_any(chain in prop::collection::vec(epoch(), 0..6)) {
            let l = latest(&chain);
            prop_assert!(chain.iter().all(|e| !newer(e, &l)));
        }

        #[test]
        fn the_latest_epoch_may_always_drop_and_others_are_decided(
            own in epoch(),
            revision in -2i64..8,
            chain in prop::collection::vec(epoch(), 0..6),
        ) {
            prop_assert_eq!(may_drop(&latest(&chain), revision, &chain), Ok(()));
            if let Err(keep) = may_drop(&own, revision, &chain) {
                prop_assert!(!keep.to_string().is_empty());
            }
        }
    }
}
