//! etcd maintenance of the local member: its database sizes and raft position, the
//! cluster's alarms, compaction, defragmentation, disarming an alarm.
//!
//! Calls only, no decisions (the curator decides when, `curator::upkeep`); like the rest
//! of this crate it knows nothing of nodes or clusters.

use std::time::Duration;

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions};

use crate::ConsensusError;
use crate::client::bounded;

/// What the local member says about itself (etcd's Status, answered without a quorum).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    /// 0 when it knows no leader.
    pub leader_id: u64,
    pub raft_index: u64,
    pub is_learner: bool,
    /// Size of the database file, bytes.
    pub db_size: i64,
    /// The part of that file holding data (the rest is free pages only a
    /// defragmentation gives back).
    pub db_size_in_use: i64,
    /// The store's current revision.
    pub revision: i64,
}

/// One active alarm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alarm {
    pub member_id: u64,
    pub kind: AlarmKind,
}

/// The alarms etcd 3.4 raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmKind {
    /// The backend quota is exhausted: writes are refused until it is disarmed.
    NoSpace,
    /// A member's data differs from the others'.
    Corrupt,
}

impl AlarmKind {
    pub fn name(self) -> &'static str {
        match self {
            AlarmKind::NoSpace => "NOSPACE",
            AlarmKind::Corrupt => "CORRUPT",
        }
    }

    fn etcd(self) -> AlarmType {
        match self {
            AlarmKind::NoSpace => AlarmType::Nospace,
            AlarmKind::Corrupt => AlarmType::Corrupt,
        }
    }
}

/// The local member's status.
pub async fn status(client: &mut Client) -> Result<MemberStatus, ConsensusError> {
    let s = client.status().await?;
    let header = s.header();
    Ok(MemberStatus {
        member_id: header.map(|h| h.member_id()).unwrap_or_default(),
        leader_id: s.leader(),
        raft_index: s.raft_index(),
        is_learner: s.is_learner(),
        db_size: s.db_size(),
        db_size_in_use: s.raft_used_db_size(),
        revision: header.map(|h| h.revision()).unwrap_or_default(),
    })
}

/// The cluster's active alarms, as the local member knows them.
pub async fn alarms(client: &mut Client) -> Result<Vec<Alarm>, ConsensusError> {
    let answer = client
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await?;
    Ok(answer
        .alarms()
        .iter()
        .filter_map(|a| {
            let kind = match a.alarm() {
                AlarmType::Nospace => AlarmKind::NoSpace,
                AlarmType::Corrupt => AlarmKind::Corrupt,
                _ => return None,
            };
            Some(Alarm {
                member_id: a.member_id(),
                kind,
            })
        })
        .collect())
}

/// Disarms one alarm (etcd then accepts writes again, until the quota is hit again).
pub async fn disarm(client: &mut Client, alarm: &Alarm) -> Result<(), ConsensusError> {
    let mut options = AlarmOptions::new();
    options.with_member(alarm.member_id);
    client
        .alarm(AlarmAction::Deactivate, alarm.kind.etcd(), Some(options))
        .await?;
    Ok(())
}

/// Compacts history up to `revision` (physical: returns once the member applied it).
/// A revision compacted already is no error.
pub async fn compact(client: &mut Client, revision: i64) -> Result<(), ConsensusError> {
    match client
        .compact(revision, Some(CompactionOptions::new().with_physical()))
        .await
    {
        Ok(_) => Ok(()),
        Err(e)
            if e.to_string()
                .contains("required revision has been compacted") =>
        {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// How long a defragmentation may take: etcd rewrites the whole file (a 2 GiB database
/// takes tens of seconds on a slow disk); the member answers nothing meanwhile.
pub const DEFRAGMENT_PATIENCE: Duration = Duration::from_secs(300);

/// Defragments the local member; its (size before, size after).
pub async fn defragment(client: &mut Client) -> Result<(i64, i64), ConsensusError> {
    let before = status(client).await?.db_size;
    bounded(
        "a defragmentation",
        DEFRAGMENT_PATIENCE,
        client.defragment(),
    )
    .await?;
    let after = status(client).await?.db_size;
    Ok((before, after))
}

/// Whether an etcd error is its refusal of a write for lack of space (NOSPACE).
pub fn is_no_space(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        let text = e.to_string();
        if text.contains("database space exceeded") || text.contains("NOSPACE") {
            return true;
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_space_is_recognised_through_the_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("writing the record")]
        struct Outer(#[source] std::io::Error);
        let inner = std::io::Error::other("etcdserver: mvcc: database space exceeded");
        assert!(is_no_space(&Outer(inner)));
        let other = std::io::Error::other("etcdserver: request timed out");
        assert!(!is_no_space(&Outer(other)));
    }
}
