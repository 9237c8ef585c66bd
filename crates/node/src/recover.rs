//! `polis-node recover --root ROOT [--force]`: a stopped surviving consensus member of a
//! cluster that lost its quorum becomes its only member — etcd's `--force-new-cluster`
//! on its own data, for this one start — and then starts as usual (the Plan is an
//! ordinary join), as the only voter and curator.
//!
//! ```text
//!   root exists ─▶ root lock (refused while a node runs on it) ─▶ not decommissioned
//!   ─▶ sealed configuration ─▶ join data (address: --address or the sealed one)
//!   ─▶ holds ConsensusMember (else: a worker) ─▶ etcd data ─▶ a voter's (recorded)
//!   ─▶ etcd binary, free ports (as every member's start)
//!   ─▶ the other members' etcd peer ports: a majority answering refuses (unless --force)
//!   ─▶ Plan::Join, with `Settings::force_new_cluster` armed
//! ```
//! The other members are the ones this node last heard of from its cluster: its
//! cluster directory (`esp/directory.pb`, every UP node holding ConsensusMember, kept by
//! rolefetch), less itself; each is asked with a TCP connect to its etcd peer port.
//!
//! Reads only (besides the lock file), like preflight, whose checks it shares: may not
//! write to the root, start etcd or talk to the cluster.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use proto::config::SealedConfiguration;

use crate::crash::check_crash_points;
use crate::files::{has_etcd_data, recorded_membership};
use crate::preflight::{self, Flags, Plan};
use crate::storage::{Root, RootLock, read_proto};

/// What `recover` needs of its flags.
#[derive(Debug, Clone)]
pub struct RecoverFlags {
    /// `--address`; the sealed configuration's when absent.
    pub address: Option<IpAddr>,
    pub etcd_binary: PathBuf,
    /// `--force`: recover even while a majority of the other members answer.
    pub force: bool,
}

/// How long a peer port gets to accept a connection.
const PEER_ANSWER: Duration = Duration::from_millis(700);

/// Whether `answering` of `others` members make a majority of them: then the cluster
/// may still have its quorum, and a recovery would make a second cluster.
pub fn majority_answering(answering: usize, others: usize) -> bool {
    others > 0 && 2 * answering > others
}

/// Every check of `recover` (see the module doc); the lock, the address and the plan.
pub async fn preflight(root: &Root, flags: &RecoverFlags) -> Result<(RootLock, IpAddr, Plan)> {
    check_crash_points()?;
    if !root.root.is_dir() {
        bail!(
            "node root {} does not exist or is not a directory: recover runs on the root of a \
             stopped surviving consensus member",
            root.root.display()
        );
    }
    let lock = preflight::lock_root(root)?;
    let sealed_path = root.sealed_configuration();
    if !sealed_path.exists() {
        bail!(
            "node root {} holds no cluster membership (no sealed configuration at {}): \
             there is nothing to recover",
            root.root.display(),
            sealed_path.display()
        );
    }
    let address = match flags.address {
        Some(a) => a,
        None => {
            let sealed: SealedConfiguration = read_proto(&sealed_path, "sealed configuration")?;
            sealed.address.parse().with_context(|| {
                format!(
                    "sealed configuration in {} is corrupt (address {:?})",
                    sealed_path.display(),
                    sealed.address
                )
            })?
        }
    };
    preflight::check_address(address)?;
    let start = Flags {
        address,
        params: None,
        etcd_binary: flags.etcd_binary.clone(),
    };
    let join = preflight::load_join(&start, root)?;
    let node = join.sealed.node_id.clone();
    if !join.roles.consensus_member {
        bail!(
            "refusing to recover: node {node} is a worker (it does not hold the ConsensusMember \
             role); recover runs on a surviving consensus member, and workers return by \
             themselves"
        );
    }
    if !has_etcd_data(root) {
        bail!(
            "refusing to recover: node {node} has no etcd data at {}; recover needs a surviving \
             member's data",
            root.etcd_data().display()
        );
    }
    if recorded_membership(root, Some(&join.sealed))?.is_none() {
        bail!(
            "refusing to recover: the etcd data of node {node} is a learner's that never became \
             a voter; recover needs a surviving voter"
        );
    }
    preflight::check_member_start(&start, root, &join)?;
    let others: Vec<SocketAddr> = join
        .directory
        .iter()
        .map(|e| e.ip())
        .filter(|ip| *ip != address)
        .map(|ip| SocketAddr::new(ip, consensus::config::PEER_PORT))
        .collect();
    let answering = answering_peers(&others).await;
    if majority_answering(answering.len(), others.len()) {
        let list = answering
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        if !flags.force {
            bail!(
                "refusing to recover: {} of the {} other consensus members still answer on their \
                 etcd peer ports ({list}), so the cluster may still have its quorum and a recovery \
                 would make a second cluster; stop them, or pass --force if they are lost for good",
                answering.len(),
                others.len()
            );
        }
        tracing::warn!(
            answering = list,
            "--force: recovering although a majority of the other members answer"
        );
    }
    tracing::warn!(
        node,
        others = others.len(),
        answering = answering.len(),
        "recovering: this member's etcd becomes a one-member cluster from its own data"
    );
    Ok((lock, address, Plan::Join(Arc::new(join))))
}

/// The etcd peer endpoints of `others` that accept a TCP connection within
/// [`PEER_ANSWER`], asked all at once.
async fn answering_peers(others: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut asks = tokio::task::JoinSet::new();
    for peer in others.iter().copied() {
        asks.spawn(async move {
            let connect = tokio::net::TcpStream::connect(peer);
            matches!(tokio::time::timeout(PEER_ANSWER, connect).await, Ok(Ok(_))).then_some(peer)
        });
    }
    let mut answering = Vec::new();
    while let Some(answer) = asks.join_next().await {
        if let Ok(Some(peer)) = answer {
            answering.push(peer);
        }
    }
    answering.sort();
    answering
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_of_the_others_answering_refuses() {
        // (answering, others, refused)
        let cases = [
            (0, 0, false),
            (0, 2, false),
            (1, 2, false),
            (2, 2, true),
            (1, 4, false),
            (2, 4, false),
            (3, 4, true),
            (2, 3, true),
            (1, 3, false),
        ];
        for (answering, others, refused) in cases {
            assert_eq!(
                majority_answering(answering, others),
                refused,
                "{answering} of {others}"
            );
        }
    }

    #[tokio::test]
    async fn only_listening_peer_ports_answer() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listening = held.local_addr().unwrap();
        let closed = {
            let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            gone.local_addr().unwrap()
        };
        let answering = answering_peers(&[listening, closed]).await;
        assert_eq!(answering, vec![listening]);
        drop(held);
    }
}
