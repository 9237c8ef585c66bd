//! etcd upkeep decisions: when a member's database is defragmented, in which order, and
//! when a NOSPACE alarm may be disarmed (pure: statuses come in as arguments).
//!
//! ```text
//!   every member answered (under NOSPACE: a majority; the rest, when silent for
//!   SILENT_GRACE, is passed over), none a learner, none more than MAX_RAFT_LAG behind the leader?
//!     ─no─▶ Wait (never defragment while a member catches up)
//!     │ yes
//!   members not `done` whose file is mostly free (in use < half of the size) and over
//!   the floor — or, while NOSPACE is raised, whose file is not under DISARM_FRACTION
//!   of the quota ─▶ Defragment(first): followers by member ID, the etcd leader last —
//!   one member per step; the caller asks again afterwards
//!   none left, NOSPACE raised, every member's file under DISARM_FRACTION of the quota
//!     ─▶ Disarm;  otherwise Idle
//! ```
//! Compaction is not decided here: under NOSPACE the caller compacts first (etcd still
//! accepts compaction, not puts), which is what turns the file into free space. etcd
//! reports the space a compaction freed ("in use") only after its next write commit,
//! and under NOSPACE there is none: so then the rule is the file's size against the
//! quota, and `done` (members defragmented since the last compaction) keeps a member
//! whose data really fills the quota from being defragmented over and over.
//!
//! A leaf: may not import any other module of this crate; no I/O.

use std::time::Duration;

/// How often the leader's upkeep looks at the members, and the database size below
/// which it never defragments (hidden polis-node flags lower both for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub period: Duration,
    pub defrag_floor_bytes: u64,
}

impl Settings {
    pub const DEFAULT: Settings = Settings {
        period: Duration::from_secs(10),
        defrag_floor_bytes: 64 << 20,
    };
}

/// A member further than this many raft entries behind the leader is catching up.
pub const MAX_RAFT_LAG: u64 = 1000;

/// A NOSPACE alarm is disarmed once every member's file is below this part of the quota
/// (so the next writes do not raise it again at once).
pub const DISARM_FRACTION: (u64, u64) = (3, 4);

/// One member as its curator (or the local etcd) described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member_id: u64,
    /// `None`: its curator did not answer.
    pub status: Option<MemberState>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    /// The leader this member knows (0: none).
    pub leader_id: u64,
    pub is_learner: bool,
    pub raft_index: u64,
    pub db_size: u64,
    pub db_size_in_use: u64,
}

/// What the upkeep does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing is done while this holds (a member catching up or silent).
    Wait(String),
    Defragment(u64),
    /// Every NOSPACE alarm may be disarmed.
    Disarm,
    Idle,
}

/// Whether a member's database is worth defragmenting.
pub fn mostly_free(state: &MemberState, floor: u64) -> bool {
    state.db_size >= floor && state.db_size_in_use.saturating_mul(2) < state.db_size
}

fn roomy(state: &MemberState, quota: u64) -> bool {
    let (num, den) = DISARM_FRACTION;
    state.db_size.saturating_mul(den) < quota.saturating_mul(num)
}

/// How long a member must have been silent before a NOSPACE upkeep passes it over.
pub const SILENT_GRACE: Duration = Duration::from_secs(60);

/// The next step (see the module doc). `passed_over`: members silent for at least
/// [`SILENT_GRACE`] (the caller keeps the clock).
pub fn next_step(
    members: &[MemberView],
    no_space: bool,
    quota: u64,
    floor: u64,
    done: &std::collections::BTreeSet<u64>,
    passed_over: &std::collections::BTreeSet<u64>,
) -> Step {
    let mut states = Vec::with_capacity(members.len());
    let answered = members.iter().filter(|m| m.status.is_some()).count();
    for m in members {
        let Some(s) = &m.status else {
            // Under NOSPACE a minority silent for SILENT_GRACE does not hold the upkeep
            // back: a member gone for good could otherwise never be removed (that needs
            // a curator leader, and none is elected while writes are refused). A member
            // that comes back over the quota raises the alarm again and is
            // defragmented then. One that is only restarting is waited for.
            if no_space && passed_over.contains(&m.member_id) && answered * 2 > members.len() {
                continue;
            }
            return Step::Wait(format!("etcd member {:x} does not answer", m.member_id));
        };
        if s.is_learner {
            return Step::Wait(format!("etcd member {:x} is a learner", m.member_id));
        }
        states.push((m.member_id, s));
    }
    let leader = states
        .iter()
        .find_map(|(_, s)| (s.leader_id != 0).then_some(s.leader_id));
    let Some(leader) = leader else {
        return Step::Wait("no etcd member knows a leader".into());
    };
    let Some((_, leader_state)) = states.iter().find(|(id, _)| *id == leader) else {
        return Step::Wait(format!(
            "the etcd leader {leader:x} is not among the members"
        ));
    };
    if let Some((id, s)) = states
        .iter()
        .find(|(_, s)| s.raft_index.saturating_add(MAX_RAFT_LAG) < leader_state.raft_index)
    {
        return Step::Wait(format!(
            "etcd member {id:x} is catching up ({} of {} raft entries)",
            s.raft_index, leader_state.raft_index
        ));
    }
    let mut candidates: Vec<u64> = states
        .iter()
        .filter(|(id, s)| {
            !done.contains(id) && (mostly_free(s, floor) || (no_space && !roomy(s, quota)))
        })
        .map(|(id, _)| *id)
        .collect();
    candidates.sort_by_key(|id| (*id == leader, *id));
    if let Some(first) = candidates.first() {
        return Step::Defragment(*first);
    }
    if no_space && states.iter().all(|(_, s)| roomy(s, quota)) {
        Step::Disarm
    } else {
        Step::Idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn none() -> std::collections::BTreeSet<u64> {
        Default::default()
    }

    fn member(id: u64, leader: u64, size: u64, in_use: u64) -> MemberView {
        MemberView {
            member_id: id,
            status: Some(MemberState {
                leader_id: leader,
                is_learner: false,
                raft_index: 5000,
                db_size: size,
                db_size_in_use: in_use,
            }),
        }
    }

    #[test]
    fn followers_first_the_leader_last() {
        let members = [
            member(1, 2, 100 * MIB, 10 * MIB),
            member(2, 2, 100 * MIB, 10 * MIB),
            member(3, 2, 100 * MIB, 10 * MIB),
        ];
        assert_eq!(
            next_step(&members, false, 2048 * MIB, 64 * MIB, &none(), &none()),
            Step::Defragment(1)
        );
        // Once 1 and 3 are done, the leader's turn.
        let members = [
            member(1, 2, 10 * MIB, 10 * MIB),
            member(2, 2, 100 * MIB, 10 * MIB),
            member(3, 2, 12 * MIB, 10 * MIB),
        ];
        assert_eq!(
            next_step(&members, false, 2048 * MIB, 64 * MIB, &none(), &none()),
            Step::Defragment(2)
        );
        let members = [
            member(1, 2, 100 * MIB, 10 * MIB),
            member(2, 2, 100 * MIB, MIB),
            member(3, 2, 100 * MIB, 90 * MIB),
        ];
        assert_eq!(
            next_step(&members, false, 2048 * MIB, 64 * MIB, &none(), &none()),
            Step::Defragment(1)
        );
    }

    #[test]
    fn only_mostly_free_files_over_the_floor() {
        // Half in use: not mostly free.
        let members = [member(1, 1, 100 * MIB, 50 * MIB)];
        assert_eq!(
            next_step(&members, false, 2048 * MIB, 64 * MIB, &none(), &none()),
            Step::Idle
        );
        // Under the floor.
        let members = [member(1, 1, 32 * MIB, MIB)];
        assert_eq!(
            next_step(&members, false, 2048 * MIB, 64 * MIB, &none(), &none()),
            Step::Idle
        );
        // Under NOSPACE a file near the quota is defragmented whatever etcd says is in
        // use (it counts what a compaction freed only after the next write), once.
        let full = [member(1, 1, 39 * MIB, 38 * MIB)];
        assert_eq!(
            next_step(&full, true, 40 * MIB, 64 * MIB, &none(), &none()),
            Step::Defragment(1)
        );
        let done: std::collections::BTreeSet<u64> = [1].into();
        assert_eq!(
            next_step(&full, true, 40 * MIB, 64 * MIB, &done, &none()),
            Step::Idle
        );
    }

    #[test]
    fn never_while_a_member_catches_up() {
        let mut lagging = member(3, 2, 100 * MIB, 10 * MIB);
        if let Some(s) = &mut lagging.status {
            s.raft_index = 5000 - MAX_RAFT_LAG - 1;
        }
        let members = [
            member(1, 2, 100 * MIB, 10 * MIB),
            member(2, 2, 100 * MIB, 10 * MIB),
            lagging.clone(),
        ];
        assert!(
            matches!(next_step(&members, false, 2048 * MIB, 0, &none(), &none()), Step::Wait(w) if w.contains("catching up"))
        );
        let mut learner = member(3, 2, 1, 1);
        if let Some(s) = &mut learner.status {
            s.is_learner = true;
        }
        let members = [
            member(1, 2, 100 * MIB, 10 * MIB),
            member(2, 2, 100 * MIB, 10 * MIB),
            learner,
        ];
        assert!(
            matches!(next_step(&members, false, 2048 * MIB, 0, &none(), &none()), Step::Wait(w) if w.contains("learner"))
        );
        let silent = MemberView {
            member_id: 3,
            status: None,
        };
        let members = [
            member(1, 2, 100 * MIB, 10 * MIB),
            member(2, 2, 100 * MIB, 10 * MIB),
            silent,
        ];
        assert!(
            matches!(next_step(&members, false, 2048 * MIB, 0, &none(), &none()), Step::Wait(w) if w.contains("does not answer"))
        );
        // Under NOSPACE a minority silent for the grace is passed over: the answering
        // members are defragmented, then the alarm is disarmed; before the grace, it
        // is waited for.
        let full = [
            member(1, 2, 3 * MIB, MIB),
            member(2, 2, 3 * MIB, MIB),
            members[2].clone(),
        ];
        let silent_long: std::collections::BTreeSet<u64> = [3].into();
        assert!(matches!(
            next_step(&full, true, 2 * MIB, 0, &none(), &none()),
            Step::Wait(w) if w.contains("does not answer")
        ));
        assert_eq!(
            next_step(&full, true, 2 * MIB, 0, &none(), &silent_long),
            Step::Defragment(1)
        );
        let done: std::collections::BTreeSet<u64> = [1, 2].into();
        let freed = [
            member(1, 2, MIB, MIB),
            member(2, 2, MIB, MIB),
            members[2].clone(),
        ];
        assert_eq!(
            next_step(&freed, true, 2 * MIB, 0, &done, &silent_long),
            Step::Disarm
        );
        // A silent majority holds it back.
        let majority_silent = [freed[0].clone(), freed[2].clone(), freed[2].clone()];
        assert!(matches!(
            next_step(&majority_silent, true, 2 * MIB, 0, &done, &silent_long),
            Step::Wait(w) if w.contains("does not answer")
        ));
        let leaderless = [member(1, 0, 100 * MIB, 10 * MIB)];
        assert!(matches!(
            next_step(&leaderless, false, 2048 * MIB, 0, &none(), &none()),
            Step::Wait(_)
        ));
        // Within the lag: fine.
        if let Some(s) = &mut lagging.status {
            s.raft_index = 5000 - MAX_RAFT_LAG;
        }
        let members = [
            member(1, 2, 10 * MIB, 10 * MIB),
            member(2, 2, 10 * MIB, 10 * MIB),
            lagging,
        ];
        assert_eq!(
            next_step(&members, false, 2048 * MIB, 0, &none(), &none()),
            Step::Defragment(3)
        );
    }

    #[test]
    fn disarm_once_every_file_has_room() {
        let quota = 4 * MIB;
        let full = [
            member(1, 1, 4 * MIB, 3 * MIB),
            member(2, 1, 3 * MIB, 2 * MIB),
        ];
        // Full files are defragmented first (a follower before the leader, 1) …
        assert_eq!(
            next_step(&full, true, quota, 0, &none(), &none()),
            Step::Defragment(2)
        );
        // … and when that freed too little, nothing more happens until the next compaction.
        let done: std::collections::BTreeSet<u64> = [1, 2].into();
        assert_eq!(next_step(&full, true, quota, 0, &done, &none()), Step::Idle);
        let roomy = [member(1, 1, MIB, MIB), member(2, 1, 2 * MIB, 2 * MIB)];
        assert_eq!(
            next_step(&roomy, true, quota, 0, &none(), &none()),
            Step::Disarm
        );
        // No alarm: nothing to disarm.
        assert_eq!(
            next_step(&roomy, false, quota, 0, &none(), &none()),
            Step::Idle
        );
    }
}
