//! The etcd members as this node last listed them (`data/etcd/members.pb`), kept while
//! its etcd serves clients: a member started without a quorum names from it the peers
//! it cannot reach (its etcd's metrics give member IDs only; `logserver`).
//!
//! ```text
//!   controlplane ─▶ keep: MemberList (local, every 2 s) ─▶ members.pb when it changed
//!   logserver (no quorum) ─▶ load ─▶ consensus::selfreport::peer_view
//! ```
//! A leaf (on storage): only this file, only the local member's list.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use consensus::membership::Member;
use proto::config::{RecordedMember, RecordedMembers};

use crate::disk::storage::{Root, read_proto, write_proto};

/// How often the list is read while etcd serves clients.
const PERIOD: Duration = Duration::from_secs(2);
/// The bound on one listing.
const BOUND: Duration = Duration::from_secs(5);

pub fn path(root: &Root) -> PathBuf {
    root.etcd_members()
}

fn encode(members: &[Member]) -> RecordedMembers {
    RecordedMembers {
        members: members
            .iter()
            .map(|m| RecordedMember {
                id: m.id,
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                is_learner: m.is_learner,
            })
            .collect(),
    }
}

fn decode(recorded: RecordedMembers) -> Vec<Member> {
    recorded
        .members
        .into_iter()
        .map(|m| Member {
            id: m.id,
            name: m.name,
            peer_urls: m.peer_urls,
            is_learner: m.is_learner,
        })
        .collect()
}

/// The recorded members; none when nothing was recorded yet.
pub fn load(root: &Root) -> Result<Vec<Member>> {
    let path = path(root);
    if !path.exists() {
        return Ok(Vec::new());
    }
    Ok(decode(read_proto(&path, "recorded etcd members")?))
}

/// Records `members` (sorted by ID) when they differ from the record; true if written.
pub fn save_if_changed(root: &Root, members: &[Member]) -> Result<bool> {
    let mut members = members.to_vec();
    members.sort_by_key(|m| m.id);
    if load(root).ok().as_deref() == Some(members.as_slice()) {
        return Ok(false);
    }
    write_proto(&path(root), &encode(&members)).context("recording the etcd members")?;
    Ok(true)
}

/// The control plane's `memberbook` runnable: the record kept current while etcd serves
/// clients (MemberList is answered locally); a failed listing is tried again later.
pub async fn keep(
    ctx: supervisor::Context,
    root: Root,
    mut client: etcd_client::Client,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    loop {
        match tokio::time::timeout(BOUND, consensus::membership::members(&mut client)).await {
            Ok(Ok(members)) => {
                if save_if_changed(&root, &members)? {
                    tracing::debug!(members = members.len(), "recorded the etcd members");
                }
            }
            Ok(Err(e)) => tracing::debug!("listing the etcd members to record them: {e}"),
            Err(_) => tracing::debug!("listing the etcd members to record them: no answer"),
        }
        tokio::select! {
            _ = tokio::time::sleep(PERIOD) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_is_written_only_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().to_path_buf());
        std::fs::create_dir_all(root.data().join("etcd")).unwrap();
        assert!(load(&root).unwrap().is_empty());
        let member = |id: u64| Member {
            id,
            name: format!("polis-{id}"),
            peer_urls: vec![format!("https://127.0.0.{id}:7834")],
            is_learner: id == 3,
        };
        assert!(save_if_changed(&root, &[member(2), member(1), member(3)]).unwrap());
        assert_eq!(load(&root).unwrap(), [member(1), member(2), member(3)]);
        assert!(!save_if_changed(&root, &[member(3), member(1), member(2)]).unwrap());
        assert!(save_if_changed(&root, &[member(1)]).unwrap());
        assert_eq!(load(&root).unwrap(), [member(1)]);
    }
}
