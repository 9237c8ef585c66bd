//! What the etcd members' own answers add up to: the member list and whether there is
//! a quorum (pure). May not talk to the cluster or print.

use proto::api;

/// Another member as an answering member sees it (its own view, from its etcd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerSeen {
    pub(crate) id: u64,
    /// Node ID and address when the answering node knows them; empty otherwise.
    pub(crate) node: String,
    pub(crate) address: String,
    pub(crate) reachable: bool,
}

/// One etcd member as `cluster status` shows it.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct MemberStatus {
    pub(crate) id: u64,
    pub(crate) node: String,
    pub(crate) learner: bool,
    pub(crate) leader: bool,
    /// The member's own answer: (raft index, raft term), if it answered.
    pub(crate) raft: Option<(u64, u64)>,
    /// Its database file size and the part in use, bytes, if it answered.
    pub(crate) db: Option<(i64, i64)>,
    /// Its own view of the other members, if it answered with one.
    pub(crate) peers: Option<Vec<PeerSeen>>,
    /// It answered from etcd's metrics alone (no quorum since its etcd started): its raft
    /// term is unknown (etcd's metrics do not hold it).
    pub(crate) from_metrics: bool,
    /// The cluster epoch its data belongs to, if it answered.
    pub(crate) epoch: Option<proto::config::ClusterEpoch>,
}

/// An answer's peer view, addresses taken from the peer URLs.
fn peers_seen(a: &api::GetConsensusStatusResponse) -> Option<Vec<PeerSeen>> {
    a.peers_known.then(|| {
        a.peers
            .iter()
            .map(|p| PeerSeen {
                id: p.member_id,
                node: p.node_id.clone(),
                address: rpc::url_address(&p.peer_url)
                    .map(|ip| ip.to_string())
                    .unwrap_or_default(),
                reachable: p.reachable,
            })
            .collect()
    })
}

/// Every active etcd alarm any member reported, once: (member ID, alarm name).
pub(crate) fn alarms(answers: &[api::GetConsensusStatusResponse]) -> Vec<(u64, String)> {
    let mut all: std::collections::BTreeSet<(u64, String)> = Default::default();
    for a in answers {
        for alarm in &a.alarms {
            all.insert((alarm.member_id, alarm.alarm.clone()));
        }
    }
    all.into_iter().collect()
}

/// Whether the members that answer (and do not hold back) are more than one cluster
/// (pure): different etcd clusters or different epochs of one. The line that says so.
pub(crate) fn split(answers: &[api::GetConsensusStatusResponse]) -> Option<String> {
    let mut clusters: std::collections::BTreeMap<(u64, u64, String), Vec<String>> =
        Default::default();
    for a in answers.iter().filter(|a| a.held_back.is_empty()) {
        let epoch = a.epoch.clone().unwrap_or_default();
        let (at, by) = proto::epoch::id(&epoch);
        clusters
            .entry((a.cluster_id, at, by.to_string()))
            .or_default()
            .push(a.node_id.clone());
    }
    if clusters.len() < 2 {
        return None;
    }
    let described: Vec<String> = clusters
        .iter()
        .map(|((cluster, _, _), nodes)| {
            let epoch = answers
                .iter()
                .find(|a| a.node_id == nodes[0])
                .and_then(|a| a.epoch.clone())
                .unwrap_or_default();
            format!(
                "{} in etcd cluster {cluster:x}, {}",
                nodes.join(", "),
                proto::epoch::describe(&epoch)
            )
        })
        .collect();
    Some(format!(
        "TWO CLUSTERS: the members answer as {} different clusters: {}",
        clusters.len(),
        described.join("; ")
    ))
}

/// The members that hold back (a newer epoch exists; they keep data it lacks): a line
/// each, saying why (pure).
pub(crate) fn held_back(answers: &[api::GetConsensusStatusResponse]) -> Vec<String> {
    answers
        .iter()
        .filter(|a| !a.held_back.is_empty())
        .map(|a| format!("node {}: {}", a.node_id, a.held_back))
        .collect()
}

/// A running cluster CA rotation, as the curators that answered follow it (pure): one
/// line naming each phase seen (curators follow the stored phase within moments of each
/// other), or none when every one says settled or nothing (answered without a curator).
pub(crate) fn ca_rotation(answers: &[api::GetConsensusStatusResponse]) -> Vec<String> {
    let line = |phase: fn(&api::GetConsensusStatusResponse) -> &str, what: &str, flag: &str| {
        let mut phases: Vec<&str> = answers
            .iter()
            .map(phase)
            .filter(|p| !p.is_empty() && *p != "settled")
            .collect();
        phases.sort_unstable();
        phases.dedup();
        (!phases.is_empty()).then(|| {
            format!(
                "{what} rotation is running (phase {}): `polisctl cluster ca{flag}` shows what \
                 it waits for; the nodes that hold it up carry a warning",
                phases.join(" / ")
            )
        })
    };
    line(|a| &a.ca_rotation_phase, "a cluster CA", "")
        .into_iter()
        .chain(line(
            |a| &a.etcd_peer_ca_rotation_phase,
            "an etcd peer CA",
            " --etcd-peer",
        ))
        .collect()
}

/// What the cluster status adds up to (pure): the members, and whether the voters that
/// answered agree on a leader and are a majority of all voters.
pub(crate) fn summarize(answers: &[api::GetConsensusStatusResponse]) -> (Vec<MemberStatus>, bool) {
    let mut members: std::collections::BTreeMap<u64, MemberStatus> = Default::default();
    for a in answers {
        for m in &a.members {
            members.entry(m.id).or_insert(MemberStatus {
                id: m.id,
                node: m.name.clone(),
                learner: m.is_learner,
                ..Default::default()
            });
        }
    }
    // The leader most answering voters name.
    let mut votes: std::collections::BTreeMap<u64, usize> = Default::default();
    for a in answers.iter().filter(|a| !a.is_learner && a.leader_id != 0) {
        *votes.entry(a.leader_id).or_default() += 1;
    }
    let leader = votes.iter().max_by_key(|(_, n)| **n).map(|(id, _)| *id);
    for a in answers {
        if let Some(m) = members.get_mut(&a.member_id) {
            m.raft = Some((a.raft_index, a.raft_term));
            m.db = Some((a.db_size, a.db_size_in_use));
            m.peers = peers_seen(a);
            m.from_metrics = a.from_metrics;
            m.epoch = Some(a.epoch.clone().unwrap_or_default());
            m.learner = a.is_learner;
            if m.node.is_empty() {
                m.node = a.node_id.clone();
            }
        }
    }
    if let Some(l) = leader.and_then(|l| members.get_mut(&l)) {
        l.leader = true;
    }
    let voters = members.values().filter(|m| !m.learner).count();
    let agreeing = answers
        .iter()
        .filter(|a| !a.is_learner && Some(a.leader_id) == leader && a.leader_id != 0)
        .count();
    let quorum = voters > 0 && agreeing > voters / 2;
    (members.into_values().collect(), quorum)
}

/// Why the control plane is not yet what `cluster launch` promises (pure), or `None` when
/// it is: every expected member answered through its own curator, says of itself that it
/// votes, is a voter in every answering member's view, and no member failed to answer.
/// A leader's view alone is not enough: a member promoted there may still see itself as a
/// learner, and its curator starts only after it has applied the promotion.
pub(crate) fn not_ready(
    answers: &[api::GetConsensusStatusResponse],
    curators_answering: &[String],
    unreachable: &[String],
    expected: &[String],
) -> Option<String> {
    if let Some(first) = unreachable.first() {
        return Some(format!("not every member answers: {first}"));
    }
    for id in expected {
        if !curators_answering.contains(id) {
            return Some(format!("the curator of {id} does not answer yet"));
        }
        match answers.iter().find(|a| &a.node_id == id) {
            Some(own) if own.is_learner => {
                return Some(format!("{id} still sees itself as a learner"));
            }
            Some(own) if own.leader_id == 0 => return Some(format!("{id} knows no leader")),
            Some(_) => {}
            None => return Some(format!("{id} did not answer")),
        }
        for a in answers {
            match a.members.iter().find(|m| &m.name == id) {
                Some(m) if !m.is_learner => {}
                Some(_) => return Some(format!("{} sees {id} as a learner", a.node_id)),
                None => return Some(format!("{} does not list {id} as a member", a.node_id)),
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(
        member: u64,
        leader: u64,
        learner: bool,
        members: &[(u64, bool)],
    ) -> api::GetConsensusStatusResponse {
        api::GetConsensusStatusResponse {
            node_id: format!("n{member}"),
            member_id: member,
            cluster_id: 1,
            leader_id: leader,
            raft_index: 10,
            raft_term: 2,
            is_learner: learner,
            members: members
                .iter()
                .map(|(id, learner)| api::ConsensusMember {
                    id: *id,
                    name: format!("n{id}"),
                    peer_urls: vec![],
                    is_learner: *learner,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_running_ca_rotation_is_named_with_every_phase_seen() {
        let three = [(1, false), (2, false), (3, false)];
        let mut answers = vec![
            answer(1, 1, false, &three),
            answer(2, 1, false, &three),
            answer(3, 1, false, &three),
        ];
        assert!(ca_rotation(&answers).is_empty());
        answers[0].ca_rotation_phase = "settled".into();
        assert!(ca_rotation(&answers).is_empty());
        answers[1].ca_rotation_phase = "reissuing".into();
        answers[2].ca_rotation_phase = "introduced".into();
        let lines = ca_rotation(&answers);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("phase introduced / reissuing"),
            "{lines:?}"
        );
        answers[2].ca_rotation_phase = "reissuing".into();
        answers[0].etcd_peer_ca_rotation_phase = "introduced".into();
        let lines = ca_rotation(&answers);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("phase reissuing)"), "{lines:?}");
        assert!(lines[1].starts_with("an etcd peer CA"), "{lines:?}");
        assert!(lines[1].contains("cluster ca --etcd-peer"), "{lines:?}");
    }

    #[test]
    fn different_epochs_or_etcd_clusters_are_two_clusters_unless_held_back() {
        let three = [(1, false), (2, false), (3, false)];
        let same = [answer(1, 1, false, &three), answer(2, 1, false, &three)];
        assert_eq!(split(&same), None);
        let recovered = proto::config::ClusterEpoch {
            number: 1,
            made_unix_ms: 7,
            made_by: "n2".into(),
            kind: "recover".into(),
            ..Default::default()
        };
        let mut forked = same.clone();
        forked[1].epoch = Some(recovered);
        let line = split(&forked).expect("two epochs are two clusters");
        assert!(line.starts_with("TWO CLUSTERS"), "{line}");
        assert!(line.contains("n1") && line.contains("n2"), "{line}");
        forked[0].held_back = "holding back: a newer epoch".into();
        assert_eq!(split(&forked), None);
        assert_eq!(
            held_back(&forked),
            vec!["node n1: holding back: a newer epoch"]
        );
        let mut other_etcd = same.clone();
        other_etcd[1].cluster_id = 2;
        assert!(split(&other_etcd).is_some());
    }

    #[test]
    fn cluster_status_needs_a_majority_of_voters_agreeing_on_a_leader() {
        let three = [(1, false), (2, false), (3, false)];
        // All three answer and agree.
        let (members, quorum) = summarize(&[
            answer(1, 1, false, &three),
            answer(2, 1, false, &three),
            answer(3, 1, false, &three),
        ]);
        assert!(quorum);
        assert_eq!(
            members
                .iter()
                .filter(|m| m.leader)
                .map(|m| m.id)
                .collect::<Vec<_>>(),
            [1]
        );
        // Two of three agree: still a quorum; the silent one shows as not answering.
        let (members, quorum) =
            summarize(&[answer(1, 1, false, &three), answer(2, 1, false, &three)]);
        assert!(quorum);
        assert!(members.iter().any(|m| m.id == 3 && m.raft.is_none()));
        // One of three answers: no quorum.
        assert!(!summarize(&[answer(1, 1, false, &three)]).1);
        // Nobody knows a leader: no quorum.
        assert!(!summarize(&[answer(1, 0, false, &three), answer(2, 0, false, &three)]).1);
        // A learner's answer does not count towards the quorum.
        let with_learner = [(1, false), (2, false), (3, true)];
        assert!(
            !summarize(&[
                answer(1, 1, false, &with_learner),
                answer(3, 1, true, &with_learner)
            ])
            .1
        );
        assert!(summarize(&[]).0.is_empty());
    }

    #[test]
    fn each_member_keeps_its_own_view_of_its_peers() {
        let three = [(1, false), (2, false), (3, false)];
        let mut alone = answer(1, 0, false, &three);
        alone.from_metrics = true;
        alone.peers_known = true;
        alone.peers = vec![
            api::PeerReachability {
                member_id: 2,
                node_id: "n2".into(),
                peer_url: "https://127.0.0.2:7834".into(),
                reachable: true,
            },
            api::PeerReachability {
                member_id: 3,
                node_id: String::new(),
                peer_url: String::new(),
                reachable: false,
            },
        ];
        let (members, _) = summarize(&[alone, answer(2, 0, false, &three)]);
        assert!(members[0].from_metrics);
        assert_eq!(
            members[0].peers.as_deref(),
            Some(
                &[
                    PeerSeen {
                        id: 2,
                        node: "n2".into(),
                        address: "127.0.0.2".into(),
                        reachable: true,
                    },
                    PeerSeen {
                        id: 3,
                        node: String::new(),
                        address: String::new(),
                        reachable: false,
                    },
                ][..]
            )
        );
        // An answer without a peer view (an older node): none shown, not "none reachable".
        assert_eq!(members[1].peers, None);
        assert!(!members[1].from_metrics);
        assert_eq!(members[2].peers, None);
    }

    #[test]
    fn sizes_and_alarms_come_from_each_member() {
        let three = [(1, false), (2, false), (3, false)];
        let mut a1 = answer(1, 1, false, &three);
        a1.db_size = 4 << 20;
        a1.db_size_in_use = 1 << 20;
        let nospace = |m| api::ConsensusAlarm {
            member_id: m,
            alarm: "NOSPACE".into(),
        };
        a1.alarms = vec![nospace(1), nospace(2)];
        let mut a2 = answer(2, 1, false, &three);
        a2.alarms = vec![nospace(2), nospace(1)];
        let (members, _) = summarize(&[a1.clone(), a2.clone()]);
        assert_eq!(members[0].db, Some((4 << 20, 1 << 20)));
        assert_eq!(members[2].db, None);
        assert_eq!(
            alarms(&[a1, a2]),
            [(1, "NOSPACE".to_string()), (2, "NOSPACE".to_string())]
        );
    }

    fn ready_answer(
        node: &str,
        learner: bool,
        members: &[(&str, bool)],
    ) -> api::GetConsensusStatusResponse {
        api::GetConsensusStatusResponse {
            node_id: node.into(),
            leader_id: 1,
            is_learner: learner,
            members: members
                .iter()
                .map(|(name, learner)| api::ConsensusMember {
                    name: (*name).into(),
                    is_learner: *learner,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn launch_waits_until_every_member_votes_in_every_view_and_its_curator_answers() {
        let expected: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let all = ["a", "b", "c"].map(String::from).to_vec();
        let voters = [("a", false), ("b", false), ("c", false)];
        let good: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| ready_answer(n, false, &voters))
            .collect();
        assert_eq!(not_ready(&good, &all, &[], &expected), None);

        // The case seen: the leader counts c a voter, c has not applied it yet.
        let mut lagging = good.clone();
        lagging[2] = ready_answer("c", true, &[("a", false), ("b", false), ("c", true)]);
        let why = not_ready(&lagging, &all, &[], &expected).unwrap();
        assert!(why.contains("c still sees itself as a learner"), "{why}");

        // c answered only on its node port: its curator is not up.
        let ab = ["a", "b"].map(String::from).to_vec();
        let why = not_ready(&good, &ab, &[], &expected).unwrap();
        assert!(why.contains("curator of c"), "{why}");

        let unreachable = vec!["127.0.0.4:7835: Connection refused".to_string()];
        let why = not_ready(&good, &all, &unreachable, &expected).unwrap();
        assert!(why.contains("Connection refused"), "{why}");

        // A member one view lacks or holds as a learner.
        let mut partial = good.clone();
        partial[0] = ready_answer("a", false, &[("a", false), ("b", false)]);
        let why = not_ready(&partial, &all, &[], &expected).unwrap();
        assert!(why.contains("a does not list c"), "{why}");
        let mut stale = good;
        stale[1] = ready_answer("b", false, &[("a", false), ("b", false), ("c", true)]);
        let why = not_ready(&stale, &all, &[], &expected).unwrap();
        assert!(why.contains("b sees c as a learner"), "{why}");
    }
}
