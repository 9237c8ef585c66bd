//! etcd cluster membership: who the members are, adding a learner, promoting it as soon
//! as etcd allows, removing a member — and the pure rule that decides whether a removal
//! keeps a quorum.
//!
//! ```text
//!   add_learner ──▶ learner (etcd 3.4: one at a time) ──promote_when_in_sync──▶ voter
//!                         refuses promotion ("not in sync") until caught up:
//!                         retried with a short backoff, not on a fixed tick
//!   plan_removal (pure) ──ok──▶ remove ──▶ the member's etcd stops serving
//! ```

use std::time::Duration;

use etcd_client::{Client, MemberAddOptions};

use crate::ConsensusError;

/// One etcd member as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    /// The node ID; empty until a newly added member first started.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub is_learner: bool,
}

impl Member {
    fn from_etcd(m: &etcd_client::Member) -> Member {
        Member {
            id: m.id(),
            name: m.name().to_string(),
            peer_urls: m.peer_urls().to_vec(),
            is_learner: m.is_learner(),
        }
    }
}

/// Every member of the cluster.
pub async fn members(client: &mut Client) -> Result<Vec<Member>, ConsensusError> {
    let response = client.member_list().await?;
    Ok(response.members().iter().map(Member::from_etcd).collect())
}

/// Adds `peer_url` as a learner; returns it and the resulting member list.
pub async fn add_learner(
    client: &mut Client,
    peer_url: &str,
) -> Result<(Member, Vec<Member>), ConsensusError> {
    let response = client
        .member_add([peer_url], Some(MemberAddOptions::new().with_is_learner()))
        .await?;
    let added = response
        .member()
        .map(Member::from_etcd)
        .ok_or(ConsensusError::Protocol(
            "member_add answered without a member",
        ))?;
    let all = response
        .member_list()
        .iter()
        .map(Member::from_etcd)
        .collect();
    Ok((added, all))
}

/// Why promotion stopped without a voter.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error("member {0:x} is no longer in the cluster")]
    Gone(u64),
    #[error("member {id:x} did not catch up within {after:?}; last answer: {last}")]
    TimedOut {
        id: u64,
        after: Duration,
        last: String,
    },
}

/// etcd's answers to a promotion it refuses for good, compared whole: etcd 3.4.23
/// (`/usr/bin/etcd`, rpctypes `ErrGRPCMemberNotLearner` and `ErrGRPCMemberNotFound`),
/// checked with `etcdctl member promote` of a voter and of an unknown ID. Compared
/// whole because the answer to a learner not yet in sync, which is retried, starts
/// with the same words: "etcdserver: can only promote a learner member which is in
/// sync with leader".
const PROMOTE_NOT_A_LEARNER: &str = "etcdserver: can only promote a learner member";
const PROMOTE_NO_SUCH_MEMBER: &str = "etcdserver: member not found";

/// Shortest and longest pause between promotion attempts.
const PROMOTE_RETRY_MIN: Duration = Duration::from_millis(20);
const PROMOTE_RETRY_MAX: Duration = Duration::from_millis(250);

/// Promotes learner `id` as soon as etcd accepts: etcd refuses while the learner is not
/// in sync with the leader (or not started yet), so the attempt is retried with a short,
/// growing pause until `patience` runs out. A member that is already a voter counts as
/// promoted.
pub async fn promote_when_in_sync(
    client: &mut Client,
    id: u64,
    patience: Duration,
) -> Result<(), PromoteError> {
    let deadline = tokio::time::Instant::now() + patience;
    let mut pause = PROMOTE_RETRY_MIN;
    loop {
        let last = match client.member_promote(id).await {
            Ok(_) => return Ok(()),
            Err(etcd_client::Error::GRpcStatus(s)) => match s.message() {
                PROMOTE_NOT_A_LEARNER => return Ok(()),
                PROMOTE_NO_SUCH_MEMBER => return Err(PromoteError::Gone(id)),
                other => other.to_string(),
            },
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() + pause > deadline {
            return Err(PromoteError::TimedOut {
                id,
                after: patience,
                last,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 3 / 2).min(PROMOTE_RETRY_MAX);
    }
}

/// Removes member `id`.
pub async fn remove(client: &mut Client, id: u64) -> Result<(), ConsensusError> {
    client.member_remove(id).await?;
    Ok(())
}

/// Why a member may not be removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemovalRefused {
    #[error("it is the last voting member of the cluster")]
    LastVoter,
    #[error(
        "the {remaining} remaining voters need {needed} healthy ones for a quorum, but only {healthy} are healthy"
    )]
    WouldLoseQuorum {
        remaining: usize,
        needed: usize,
        healthy: usize,
    },
}

/// Decides whether removing `target` keeps the cluster able to decide (pure): learners
/// can always go; a voter only when voters remain and the healthy remaining voters
/// form a majority of the remaining ones. `healthy` tells whether a member is healthy.
pub fn plan_removal(
    members: &[Member],
    target: u64,
    healthy: impl Fn(&Member) -> bool,
) -> Result<(), RemovalRefused> {
    let Some(member) = members.iter().find(|m| m.id == target) else {
        return Ok(());
    };
    if member.is_learner {
        return Ok(());
    }
    let remaining: Vec<&Member> = members
        .iter()
        .filter(|m| !m.is_learner && m.id != target)
        .collect();
    if remaining.is_empty() {
        return Err(RemovalRefused::LastVoter);
    }
    let needed = remaining.len() / 2 + 1;
    let healthy = remaining.iter().filter(|m| healthy(m)).count();
    if healthy < needed {
        return Err(RemovalRefused::WouldLoseQuorum {
            remaining: remaining.len(),
            needed,
            healthy,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, learner: bool) -> Member {
        Member {
            id,
            name: format!("n{id}"),
            peer_urls: vec![],
            is_learner: learner,
        }
    }

    fn check(voters: u64, learners: u64, target: u64, unhealthy: &[u64], ok: bool) {
        let mut members: Vec<Member> = (1..=voters).map(|i| member(i, false)).collect();
        members.extend((100..100 + learners).map(|i| member(i, true)));
        let got = plan_removal(&members, target, |m| !unhealthy.contains(&m.id));
        assert_eq!(
            got.is_ok(),
            ok,
            "{voters} voters, {learners} learners, remove {target}, unhealthy {unhealthy:?}: {got:?}"
        );
    }

    #[test]
    fn removal_keeps_a_quorum() {
        check(1, 0, 1, &[], false); // the last voter
        check(1, 1, 100, &[], true); // a learner
        check(2, 0, 2, &[], true); // 2 → 1
        check(2, 0, 2, &[1], false); // the one left is down
        check(3, 0, 3, &[], true); // 3 → 2, both healthy
        check(3, 0, 3, &[2], false); // 3 → 2 with one down: no quorum
        check(3, 0, 2, &[2], true); // removing the one that is down
        check(5, 0, 5, &[4], true); // 5 → 4, 3 healthy of needed 3
        check(5, 0, 5, &[3, 4], false);
        check(3, 0, 42, &[], true); // not a member: nothing to refuse
    }

    #[test]
    fn refusals_explain_themselves() {
        let members = [member(1, false)];
        let e = plan_removal(&members, 1, |_| true).unwrap_err();
        assert!(e.to_string().contains("last voting member"), "{e}");
        let members = [member(1, false), member(2, false), member(3, false)];
        let e = plan_removal(&members, 3, |m| m.id == 1).unwrap_err();
        assert!(e.to_string().contains("need 2 healthy"), "{e}");
    }
}
