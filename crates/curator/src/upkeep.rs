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

/// How often the leader's upkeep looks at the members, the database size below which
/// it never defragments, and how many bytes of history it lets etcd keep (hidden
/// polis-node flags lower them for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub period: Duration,
    pub defrag_floor_bytes: u64,
    /// Growth of the leader's etcd "in use" bytes since its low point after the last
    /// compaction past which the upkeep compacts (see [`History`]).
    pub history_bytes: u64,
    /// History younger than this is never compacted away: a watch that starts right
    /// after a read (at the read's revision + 1) or resumes after a short break finds
    /// it there.
    pub history_min_age: Duration,
}

impl Settings {
    pub const DEFAULT: Settings = Settings {
        period: Duration::from_secs(10),
        defrag_floor_bytes: 64 << 20,
        history_bytes: 16 << 20,
        history_min_age: Duration::from_secs(30),
    };
}

/// When the upkeep compacts etcd's history by its size, not its length.
///
/// etcd's own auto-compaction keeps the last 10 000 revisions, and a revision is a
/// transaction: the audit writer puts (and drops) up to a hundred entries in one. So
/// 10 000 revisions can hold hundreds of megabytes of old values, and a flood of refused
/// calls grew the database linearly until the quota. Here the bound is in bytes: once
/// the member's data in use grew by `history_bytes` over its lowest value since the last
/// compaction, history is compacted at the newest revision seen at least
/// `history_min_age` ago. That leaves the history written since (up to the revision of
/// that moment, the *head*); one follow-up compaction at the head, once it is
/// `history_min_age` old, removes it too, so a burst that ends leaves no tail behind.
/// Live data that grows (not history) makes a compaction that frees little; the low
/// point then rises with it, so it does not repeat each period.
///
/// The retained history is thus at most `history_bytes` plus what is written in
/// `history_min_age` and one period.
#[derive(Debug, Default)]
pub struct History {
    /// (when, revision) seen, oldest first; thinned to what a compaction may use.
    samples: std::collections::VecDeque<(std::time::Instant, i64)>,
    /// The lowest "in use" bytes since the last compaction (`None`: none seen since).
    low_in_use: Option<u64>,
    /// The revision last compacted at (by this upkeep).
    compacted: i64,
    /// The head when history was last compacted for its size: compacted at once it is
    /// old enough.
    follow_up: Option<i64>,
    /// What the last `observe` asked for: (revision, the head then, whether a follow-up).
    asked: Option<(i64, i64, bool)>,
}

impl History {
    /// Takes one look at the member (`now`, its revision and its bytes in use) and says
    /// at which revision to compact, if at all. The caller compacts and then calls
    /// [`History::compacted`].
    pub fn observe(
        &mut self,
        now: std::time::Instant,
        revision: i64,
        in_use: u64,
        settings: &Settings,
    ) -> Option<i64> {
        let min_age = settings.history_min_age;
        if self.samples.back().is_none_or(|(_, r)| *r != revision) {
            self.samples.push_back((now, revision));
        }
        // Keep only the newest sample old enough to compact at, and the younger ones.
        while self
            .samples
            .get(1)
            .is_some_and(|(t, _)| now.duration_since(*t) >= min_age)
        {
            self.samples.pop_front();
        }
        let low = *self
            .low_in_use
            .insert(self.low_in_use.map_or(in_use, |l| l.min(in_use)));
        let oldest = self
            .samples
            .front()
            .filter(|(when, at)| now.duration_since(*when) >= min_age && *at > self.compacted)
            .map(|(_, at)| *at);
        let at = oldest?;
        let (follow_up, due) = match self.follow_up {
            Some(head) if at >= head => (true, true),
            _ => (false, in_use.saturating_sub(low) >= settings.history_bytes),
        };
        if !due {
            return None;
        }
        self.asked = Some((at, revision, follow_up));
        Some(at)
    }

    /// The caller compacted at `revision`: the low point is measured again from here
    /// (etcd reports the freed space after its next commit).
    pub fn compacted(&mut self, revision: i64) {
        self.compacted = self.compacted.max(revision);
        self.low_in_use = None;
        match self.asked.take() {
            Some((at, head, false)) if at == revision && head > revision => {
                self.follow_up = Some(head);
            }
            _ => self.follow_up = None,
        }
    }
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
    use std::time::Instant;

    const MIB: u64 = 1 << 20;

    fn bound(bytes: u64) -> Settings {
        Settings {
            history_bytes: bytes,
            ..Settings::DEFAULT
        }
    }

    #[test]
    fn history_is_compacted_once_it_grew_by_its_bound_at_a_revision_old_enough() {
        let mut h = History::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(h.observe(at(0), 100, 4 * MIB, &bound(16 * MIB)), None);
        // Grown by less than the bound: nothing.
        assert_eq!(h.observe(at(10), 200, 19 * MIB, &bound(16 * MIB)), None);
        // Grown past it, but no revision is 30 s old yet at 20 s.
        assert_eq!(h.observe(at(20), 300, 21 * MIB, &bound(16 * MIB)), None);
        // At 40 s the revision seen at 10 s is the newest one 30 s old.
        assert_eq!(
            h.observe(at(40), 400, 22 * MIB, &bound(16 * MIB)),
            Some(200)
        );
        h.compacted(200);
        // The low point is measured again: the freed space shows; the history written
        // after revision 200 stays until the head of that moment (400) is 30 s old.
        assert_eq!(h.observe(at(50), 410, 6 * MIB, &bound(16 * MIB)), None);
        assert_eq!(h.observe(at(60), 420, 7 * MIB, &bound(16 * MIB)), None);
        assert_eq!(h.observe(at(70), 420, 7 * MIB, &bound(16 * MIB)), Some(400));
        h.compacted(400);
        // A follow-up has no follow-up of its own.
        for s in 8..20 {
            assert_eq!(
                h.observe(at(s * 10), 420 + s as i64, 3 * MIB, &bound(16 * MIB)),
                None
            );
        }
    }

    #[test]
    fn live_growth_compacts_once_then_the_low_point_follows_it() {
        let mut h = History::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(h.observe(at(0), 10, MIB, &bound(16 * MIB)), None);
        assert_eq!(h.observe(at(40), 20, 30 * MIB, &bound(16 * MIB)), Some(10));
        h.compacted(10);
        // The follow-up at the head of then (20), once it is old enough.
        assert_eq!(h.observe(at(50), 21, 30 * MIB, &bound(16 * MIB)), None);
        assert_eq!(h.observe(at(70), 22, 30 * MIB, &bound(16 * MIB)), Some(20));
        h.compacted(20);
        // Nothing was freed (the growth is live data): no compaction each period.
        for s in 8..20 {
            assert_eq!(
                h.observe(at(s * 10), 20 + s as i64, 30 * MIB, &bound(16 * MIB)),
                None
            );
        }
    }

    #[test]
    fn a_revision_compacted_already_is_not_asked_for_again() {
        let mut h = History::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(h.observe(at(0), 10, MIB, &bound(MIB)), None);
        assert_eq!(h.observe(at(31), 10, 3 * MIB, &bound(MIB)), Some(10));
        h.compacted(10);
        // No write since: still the same revision; the bytes do not fall (no commit).
        assert_eq!(h.observe(at(41), 10, 3 * MIB, &bound(MIB)), None);
        assert_eq!(h.observe(at(80), 10, 5 * MIB, &bound(MIB)), None);
    }

    use super::*;

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
