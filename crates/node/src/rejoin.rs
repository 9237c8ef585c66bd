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
//! A leaf: imports only leaves below it; may not stop etcd or touch the root (the
//! control plane does both).

use std::time::Duration;

use proto::api;

use crate::curator_client::curator_client;
use crate::retry::pause;
use crate::settings::Settings;
use crate::values::NodeValues;

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

/// Asks the cluster once (bounded by [`ASK_TIMEOUT`]) for this node's membership.
pub async fn ask(settings: &Settings, values: &NodeValues) -> Answer {
    let Ok(client) = curator_client(settings, values) else {
        return Answer::Other;
    };
    client.set_endpoints(values.curators.current().unwrap_or_default());
    let call = client.call(|channel| async move {
        api::curator_client::CuratorClient::new(channel)
            .join_consensus(api::JoinConsensusRequest {})
            .await
    });
    match tokio::time::timeout(ASK_TIMEOUT, call).await {
        Ok(result) => classify(&result),
        Err(_) => Answer::Other,
    }
}

/// Resolves once the cluster answers that this node's etcd member (`own`, when known)
/// is no member any more, with the learner it holds for this node instead; asks every
/// [`ASK_AFTER`] while the caller waits for etcd. Never resolves when cancelled.
pub async fn until_not_member(
    ctx: &supervisor::Context,
    settings: &Settings,
    values: &NodeValues,
    own: Option<u64>,
) -> u64 {
    let mut said_member = false;
    loop {
        if !pause(ctx, ASK_AFTER).await {
            std::future::pending::<()>().await;
        }
        match verdict(own, ask(settings, values).await) {
            Verdict::NotMember { learner } => return learner,
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

#[cfg(test)]
mod tests {
    use super::*;

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
