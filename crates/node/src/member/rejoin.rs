//! A consensus member whose etcd data may be stale: is this node's etcd member still a
//! member of its cluster? Asked of the cluster, answered only positively.
//!
//! ```text
//!   etcd on this node's data not running for ASK_AFTER (a removed member's etcd exits:
//!   "the member has been permanently removed from the cluster"; after a restore it is
//!   refused as from another cluster) ─▶ Curator.JoinConsensus (to the leader)
//!     answer: learner L, L ≠ the member this data belongs to ─▶ NotMember (wipe, rejoin)
//!     answer: "still etcd voter" / learner = this member ───────▶ Member (keep waiting)
//!     no answer, timeout, any other refusal ────────────────────▶ Unknown (keep waiting)
//! ```
//! The rule (`verdict`, pure): data is dropped only on the leader's positive answer
//! that the cluster's etcd membership — read after a linearizable read, so it holds
//! every committed change — has no voter for this node and a learner other than the
//! member this data belongs to. The leader refuses JoinConsensus to a node it still
//! holds as a voter, so a partitioned member, or one whose peers are down, never gets
//! such an answer; silence is never an answer. A node without the ConsensusMember role
//! is refused too: rolefetch makes it a worker instead.
//!
//! The same care when the ConsensusMember role goes away (`until_absent`, rule
//! `listing`, pure): the role server drops etcd data only once etcd's member list, read
//! by some curator right after a linearizable read through its member (etcd 3.4 serves
//! MemberList from a member's applied state; after a quorum read that state holds every
//! committed membership change), no longer holds this node's member. The role's going
//! is a curator's word (its view may be old); the list is etcd's.
//!
//! A leaf: imports only leaves below it; may not stop etcd or touch the root (the
//! control plane and the role server do both).

use std::time::Duration;

use proto::api;
use proto::config::ClusterEpoch;

use crate::curators::curator_client::curator_client;
use crate::curators::retry::pause;
use crate::state::settings::Settings;
use crate::state::values::NodeValues;

/// How long this node's etcd may not run before the cluster is asked.
pub const ASK_AFTER: Duration = Duration::from_secs(3);
/// How long one question may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the cluster's leader answered to JoinConsensus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A learner for this node (added now, or before).
    Learner(u64),
    /// This node is still an etcd voter (the leader refuses to add another member).
    StillVoter,
    /// No answer, or a refusal that says nothing about membership.
    Other,
}

/// Whether this node's etcd data still belongs to a member of its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Member,
    /// Not a member: the cluster has learner `learner` for this node instead.
    NotMember {
        learner: u64,
    },
    Unknown,
}

/// The rule. `own`: the member the local etcd data belongs to, when known (the running
/// member's ID, else the recorded voter's). Unknown (data of a learner that was never
/// promoted, or promoted just before a crash): a learner answer still means the cluster
/// holds no voter for this node — the leader refuses a node it holds as a voter — and a
/// non-voter's data holds no vote, so it may go.
pub fn verdict(own: Option<u64>, answer: Answer) -> Verdict {
    match answer {
        Answer::Learner(l) if Some(l) == own => Verdict::Member,
        Answer::Learner(l) => Verdict::NotMember { learner: l },
        Answer::StillVoter => Verdict::Member,
        Answer::Other => Verdict::Unknown,
    }
}

/// Classifies a JoinConsensus outcome (see `curator::service::membership::join`).
pub fn classify(result: &Result<api::JoinConsensusResponse, rpc::CallError>) -> Answer {
    match result {
        Ok(r) => Answer::Learner(r.member_id),
        Err(rpc::CallError::Status(s))
            if s.code() == tonic::Code::FailedPrecondition
                && s.message().contains("is still etcd voter") =>
        {
            Answer::StillVoter
        }
        Err(_) => Answer::Other,
    }
}

/// The cluster's epochs a JoinConsensus answer named (empty: a refusal, or none since
/// the bootstrap).
pub fn epochs_of(result: &Result<api::JoinConsensusResponse, rpc::CallError>) -> Vec<ClusterEpoch> {
    match result {
        Ok(r) => r.epochs.clone(),
        Err(_) => Vec::new(),
    }
}

/// Asks the cluster once (bounded by [`ASK_TIMEOUT`]) for this node's membership; with
/// the cluster's epochs.
pub async fn ask(settings: &Settings, values: &NodeValues) -> (Answer, Vec<ClusterEpoch>) {
    let Ok(client) = curator_client(settings, values) else {
        return (Answer::Other, Vec::new());
    };
    client.set_endpoints(values.curators.current().unwrap_or_default());
    let call = client.call(|channel| async move {
        api::curator_client::CuratorClient::new(channel)
            .join_consensus(api::JoinConsensusRequest {})
            .await
    });
    match tokio::time::timeout(ASK_TIMEOUT, call).await {
        Ok(result) => (classify(&result), epochs_of(&result)),
        Err(_) => (Answer::Other, Vec::new()),
    }
}

/// Resolves once the cluster answers that this node's etcd member (`own`, when known)
/// is no member any more, with the learner it holds for this node instead (and the
/// cluster's epochs); asks every [`ASK_AFTER`] while the caller waits for etcd. Never
/// resolves when cancelled.
pub async fn until_not_member(
    ctx: &supervisor::Context,
    settings: &Settings,
    values: &NodeValues,
    own: Option<u64>,
) -> (u64, Vec<ClusterEpoch>) {
    let mut said_member = false;
    loop {
        if !pause(ctx, ASK_AFTER).await {
            std::future::pending::<()>().await;
        }
        let (answer, epochs) = ask(settings, values).await;
        match verdict(own, answer) {
            Verdict::NotMember { learner } => return (learner, epochs),
            Verdict::Member if !said_member => {
                said_member = true;
                tracing::info!(
                    "etcd is not serving yet; the cluster still holds this node as a member"
                );
            }
            Verdict::Member | Verdict::Unknown => {}
        }
    }
}

/// Who this node's etcd member is, as far as its root knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnMember {
    /// The recorded member (voter) and its etcd cluster; `None`: never recorded (a
    /// learner not yet promoted): then the member is looked for by name.
    pub recorded: Option<(u64, u64)>,
    /// The member name: the node ID.
    pub name: String,
}

/// What etcd's member list says of this node's member once its role went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Not listed, in a member list read with a quorum: its data may go.
    Absent,
    /// Still listed (as `member`), read with a quorum: the "no role" is not (yet) etcd's.
    Present { member: u64 },
    /// No answer read with a quorum.
    Unknown,
}

/// The rule (pure): only answers whose member list was read right after a linearizable
/// read count (`quorum_read`); of those, the newest (highest raft index) decides. Listed
/// means the recorded member ID in the recorded cluster, or, unrecorded, a member named
/// after this node. Another etcd cluster (a restored one) does not list this member.
pub fn listing(own: &OwnMember, answers: &[api::GetConsensusStatusResponse]) -> Listing {
    let Some(newest) = answers
        .iter()
        .filter(|a| a.quorum_read && a.leader_id != 0)
        .max_by_key(|a| a.raft_index)
    else {
        return Listing::Unknown;
    };
    let listed = newest.members.iter().find(|m| match own.recorded {
        Some((cluster, member)) => newest.cluster_id == cluster && m.id == member,
        None => m.name == own.name,
    });
    match listed {
        Some(m) => Listing::Present { member: m.id },
        None => Listing::Absent,
    }
}

/// Asks every curator this node knows, each bounded by [`ASK_TIMEOUT`], for its etcd
/// member's status (GetConsensusStatus: member list read after a quorum read).
async fn consensus_statuses(
    settings: &Settings,
    values: &NodeValues,
) -> Vec<api::GetConsensusStatusResponse> {
    let Ok(client) = curator_client(settings, values) else {
        return Vec::new();
    };
    let credentials = client.credentials();
    let mut answers = Vec::new();
    for endpoint in values.curators.current().unwrap_or_default() {
        let ask = async {
            let channel = rpc::connect(endpoint, client.trust(), credentials.as_ref()).await?;
            let answer = api::curator_local_client::CuratorLocalClient::new(channel)
                .get_consensus_status(api::GetConsensusStatusRequest {})
                .await?;
            anyhow::Ok(answer.into_inner())
        };
        match tokio::time::timeout(ASK_TIMEOUT, ask).await {
            Ok(Ok(answer)) => answers.push(answer),
            Ok(Err(e)) => tracing::debug!(%endpoint, "asking for the etcd member list: {e}"),
            Err(_) => tracing::debug!(%endpoint, "asking for the etcd member list: timed out"),
        }
    }
    answers
}

/// Resolves once etcd's member list, read with a quorum (see [`listing`]), no longer
/// holds this node's member: only then may its etcd data go. Asks every [`ASK_AFTER`]
/// meanwhile, saying once why it keeps the data. Never resolves when cancelled.
pub async fn until_absent(
    ctx: &supervisor::Context,
    settings: &Settings,
    values: &NodeValues,
    own: &OwnMember,
) {
    let mut said = None;
    loop {
        let answers = consensus_statuses(settings, values).await;
        let verdict = listing(own, &answers);
        match verdict {
            Listing::Absent => {
                tracing::info!(
                    "etcd confirms it: this node's etcd member is not in the member list \
                     (read with a quorum)"
                );
                return;
            }
            Listing::Present { member } if said != Some(verdict) => tracing::warn!(
                member = format!("{member:x}"),
                "the ConsensusMember role was taken away, but etcd still lists this node's \
                 member (read with a quorum): keeping etcd running and its data; asking again \
                 every {ASK_AFTER:?}"
            ),
            Listing::Unknown if said != Some(verdict) => tracing::warn!(
                "the ConsensusMember role was taken away, but no curator could confirm with a \
                 quorum read that this node's etcd member left: keeping its etcd data; asking \
                 again every {ASK_AFTER:?}"
            ),
            _ => {}
        }
        said = Some(verdict);
        if !pause(ctx, ASK_AFTER).await {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(
        cluster: u64,
        raft_index: u64,
        quorum: bool,
        members: &[(u64, &str)],
    ) -> api::GetConsensusStatusResponse {
        api::GetConsensusStatusResponse {
            cluster_id: cluster,
            leader_id: if quorum { 1 } else { 0 },
            raft_index,
            quorum_read: quorum,
            members: members
                .iter()
                .map(|(id, name)| api::ConsensusMember {
                    id: *id,
                    name: name.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_quorum_read_without_the_member_lets_data_go() {
        let own = OwnMember {
            recorded: Some((10, 7)),
            name: "polis-me".into(),
        };
        let with = answer(10, 5, true, &[(7, "polis-me"), (8, "polis-b")]);
        let without = answer(10, 9, true, &[(8, "polis-b")]);
        let stale_without = answer(10, 3, false, &[(8, "polis-b")]);
        assert_eq!(listing(&own, &[]), Listing::Unknown);
        // A member without a leader (or whose quorum read failed) is no evidence.
        assert_eq!(
            listing(&own, std::slice::from_ref(&stale_without)),
            Listing::Unknown
        );
        assert_eq!(
            listing(&own, &[with.clone(), stale_without]),
            Listing::Present { member: 7 }
        );
        assert_eq!(
            listing(&own, std::slice::from_ref(&without)),
            Listing::Absent
        );
        // The newest quorum read decides.
        assert_eq!(
            listing(&own, &[with.clone(), without.clone()]),
            Listing::Absent
        );
        let newer_with = answer(10, 12, true, &[(7, "polis-me")]);
        assert_eq!(
            listing(&own, &[without, newer_with]),
            Listing::Present { member: 7 }
        );
        // Another etcd cluster (restored) does not hold this member, whatever its IDs.
        assert_eq!(
            listing(&own, &[answer(11, 5, true, &[(7, "polis-me")])]),
            Listing::Absent
        );
        // Unrecorded (a learner never promoted): by name.
        let unrecorded = OwnMember {
            recorded: None,
            name: "polis-me".into(),
        };
        assert_eq!(
            listing(&unrecorded, &[with]),
            Listing::Present { member: 7 }
        );
        assert_eq!(
            listing(&unrecorded, &[answer(10, 5, true, &[(8, "polis-b")])]),
            Listing::Absent
        );
    }

    #[test]
    fn only_a_positive_answer_says_not_member() {
        let cases = [
            // (own member, answer, verdict)
            (
                Some(7),
                Answer::Learner(9),
                Verdict::NotMember { learner: 9 },
            ),
            (None, Answer::Learner(9), Verdict::NotMember { learner: 9 }),
            (Some(9), Answer::Learner(9), Verdict::Member),
            (Some(7), Answer::StillVoter, Verdict::Member),
            (None, Answer::StillVoter, Verdict::Member),
            (Some(7), Answer::Other, Verdict::Unknown),
            (None, Answer::Other, Verdict::Unknown),
        ];
        for (own, answer, expected) in cases {
            assert_eq!(verdict(own, answer), expected, "{own:?} {answer:?}");
        }
    }

    #[test]
    fn refusals_and_silence_are_no_answer() {
        let status = |code, msg: &str| Err(rpc::CallError::Status(tonic::Status::new(code, msg)));
        let voter = status(
            tonic::Code::FailedPrecondition,
            "node polis-1 is still etcd voter 7 but has no etcd data; take its role",
        );
        assert_eq!(classify(&voter), Answer::StillVoter);
        for other in [
            status(tonic::Code::FailedPrecondition, "node polis-1 is not UP"),
            status(
                tonic::Code::FailedPrecondition,
                "node polis-1 does not hold the ConsensusMember role",
            ),
            status(tonic::Code::Unavailable, "no curator answered"),
            status(tonic::Code::DeadlineExceeded, "timed out"),
        ] {
            assert_eq!(classify(&other), Answer::Other);
        }
        let learner = Ok(api::JoinConsensusResponse {
            member_id: 5,
            ..Default::default()
        });
        assert_eq!(classify(&learner), Answer::Learner(5));
    }
}
