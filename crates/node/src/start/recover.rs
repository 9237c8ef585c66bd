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
//!   ─▶ the claim on disk (`epochs::begin_recover`) ─▶ Plan::Join, etcd forced until
//!      the claim is recorded (`epochs::resume_recover`)
//! An interrupted recover found on disk: one whose etcd may have been forced is completed
//! without new checks; one that never got that far is rolled back and checked anew.
//! ```
//! The other members are the ones this node last heard of from its cluster: its
//! cluster directory (`esp/directory.pb`, every UP node holding ConsensusMember, kept by
//! rolefetch), less itself; each is asked with a TCP connect to its etcd peer port.
//!
//! With `--data-device DEV` (an encrypted member) the data is unlocked first (after the
//! lock and the sealed configuration), without a cluster to ask:
//! ```text
//!   own half kept in the ESP (a sole member) ─▶ else the first other member's unlock
//!   listener (:7837) that answers with it ─▶ else --backup FILE, the owner's escrow:
//!   structure + SHA-256 ─▶ its CA is this node's cluster's ─▶ snapshot restored into a
//!   scratch root in /dev/shm (RAM) and served once by a throwaway etcd (restore's
//!   `serve_backup`) ─▶ the snapshot's CA is the one its header names ─▶ this node's
//!   record ─▶ its cluster half (and join key: this ESP's)
//!   ─▶ mounted (never formatted; a half not of this device refused by the kernel's key
//!      identifier) ─▶ the checks above ─▶ the half kept in the ESP (the node is about
//!      to be its cluster's only member: nobody else could answer for it at its next
//!      start), until another member keeps it
//! ```
//! Any refusal after the mount unmounts again.
//!
//! Reads only (besides the lock file, the unlock and the kept half), like preflight,
//! whose checks it shares: may not write to the root's data, start the node's etcd or
//! talk to the cluster (the other members' unlock listeners excepted).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use proto::config::{ClusterEpoch, SealedConfiguration};

use crate::data::datadev::{self, DataDevice};
use crate::disk::files::{has_etcd_data, recorded_membership};
use crate::disk::storage::{Root, RootLock, read_proto};
use crate::member::epochs;
use crate::process::crash::check_crash_points;
use crate::start::preflight::{self, Flags, Plan};
use crate::start::restore::{self, RestoreFlags};

/// What `recover` needs of its flags.
#[derive(Debug, Clone)]
pub struct RecoverFlags {
    /// `--address`; the sealed configuration's when absent.
    pub address: Option<IpAddr>,
    pub etcd_binary: PathBuf,
    /// `--force`: recover even while a majority of the other members answer.
    pub force: bool,
    /// `--data-device`: an encrypted member's data device.
    pub data_device: Option<DataDevice>,
    /// `--backup`: the owner's backup, read for this node's cluster half when no other
    /// member answers with it.
    pub backup: Option<PathBuf>,
    /// Raft timing of the throwaway etcd that reads the backup.
    pub raft_timing: consensus::RaftTiming,
}

/// What `recover` starts with: the lock, the address, the plan and the data volume
/// (with `--data-device`).
pub type Recovering = (RootLock, IpAddr, Plan, Option<datafs::Volume>);

/// Every check of `recover` (see the module doc), the data device unlocked first.
pub async fn preflight(root: &Root, flags: &RecoverFlags) -> Result<Recovering> {
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
    let Some(dev) = &flags.data_device else {
        let plan = checks(root, flags, address).await?;
        return Ok((lock, address, plan, None));
    };
    let (sealed, join, half, volume) = unlock(root, flags, dev, address).await?;
    let checked = match checks(root, flags, address).await {
        Ok(plan) => datadev::keep_own_half(root, &sealed, &join, &half).map(|()| plan),
        Err(e) => Err(e),
    };
    match checked {
        Ok(plan) => Ok((lock, address, plan, Some(volume))),
        Err(e) => {
            datadev::close(volume).await;
            Err(e)
        }
    }
}

/// The checks on the (unlocked) data: a voter's etcd data, free ports, no majority of
/// the other members answering; the join plan.
async fn checks(root: &Root, flags: &RecoverFlags, address: IpAddr) -> Result<Plan> {
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
    let member_ips: Vec<IpAddr> = join
        .directory
        .iter()
        .map(|e| e.ip())
        .filter(|ip| *ip != address)
        .collect();
    if epochs::recover_pending(root)? {
        tracing::warn!(
            node,
            "a recover of this member was interrupted after its etcd was forced: completing it"
        );
        return Ok(Plan::Join(Arc::new(join)));
    }
    // A claim never forced is withdrawn before a new one is made.
    epochs::resume_recover(root, false)?;
    let own_epoch = epochs::load(root)?;
    let etcdctl = restore::etcdctl_binary(&flags.etcd_binary);
    // What the database applied, not what the log adds: the new epoch's parent revision
    // promises what it holds (a member holding more must keep its data), and a member
    // further ahead than that refuses this recover.
    let own_revision = epochs::data_revision(&etcdctl, root)
        .with_context(|| format!("reading the revision of node {node}'s etcd data"))?
        .applied;
    let book = crate::member::memberbook::load(root)?;
    let answers = ask_members(root, &epochs::members_to_ask(&book, &member_ips, address)).await?;
    for (ip, answer) in &answers {
        match answer {
            Ok(answer) => {
                if let Some(why) = refusal(&own_epoch, own_revision, *ip, answer) {
                    bail!("refusing to recover node {node}: {why}");
                }
            }
            Err(e) => tracing::info!(member = %ip, "no answer on its node port: {e}"),
        }
    }
    let others: Vec<SocketAddr> = member_ips
        .iter()
        .map(|ip| SocketAddr::new(*ip, consensus::config::PEER_PORT))
        .collect();
    let answering = epochs::answering_peers(&others).await;
    if epochs::majority_answering(answering.len(), others.len()) {
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
    // The claim of the new epoch, kept before etcd is forced: a crash after the force
    // leaves data that says it is no longer of the old epoch.
    let claim = epochs::successor(&own_epoch, &node, "recover", own_revision);
    epochs::begin_recover(root, &own_epoch, &claim)?;
    crate::process::crash::crash_point("recover-claimed");
    tracing::warn!(
        node,
        others = others.len(),
        answering = answering.len(),
        revision = own_revision,
        epoch = proto::epoch::describe(&claim),
        "recovering: this member's etcd becomes a one-member cluster from its own data, in a \
         new epoch"
    );
    Ok(Plan::Join(Arc::new(join)))
}

/// How long each other member gets to answer on its node port.
const MEMBER_ANSWER: Duration = Duration::from_secs(2);

/// Asks the other consensus members `ips` on their node ports, with this node's
/// certificate (the node does not run: its root is locked by this command).
async fn ask_members(
    root: &Root,
    members: &[epochs::MemberToAsk],
) -> Result<Vec<epochs::MemberAnswer>> {
    let credentials = crate::state::values::NodeCredentials::default().slot(root)?;
    let ca = crate::disk::storage::read_file(&root.cluster_ca(), "cluster CA certificate")?;
    let crl = crate::curators::curator_client::saved_slot(&root.cluster_trust(), ca)?;
    let saved_crl = root.cluster_crl();
    if saved_crl.exists() {
        let der = crate::disk::storage::read_file(&saved_crl, "cluster CRL")?;
        if let Err(e) = crl.offer(&der) {
            tracing::warn!("ignoring the saved cluster CRL: {e}");
        }
    }
    Ok(epochs::ask_members(members, &crl, &credentials, MEMBER_ANSWER).await)
}

/// Why the answer of member `ip` forbids recovering this node (pure), whose data
/// belongs to `own_epoch` and reaches `own_revision`: it serves a cluster, it is of a
/// newer epoch (recovered or restored already), or its data is further ahead.
/// `--force` overrides none of these: the member is not lost, it answered.
pub fn refusal(
    own_epoch: &ClusterEpoch,
    own_revision: i64,
    ip: IpAddr,
    answer: &proto::api::GetConsensusStatusResponse,
) -> Option<String> {
    let theirs = epochs::answered_epoch(answer);
    let who = format!("member {} ({ip})", answer.node_id);
    if proto::epoch::newer(&theirs, own_epoch) {
        return Some(format!(
            "{who} is in a newer {} than this node's {}: the cluster was recovered or restored \
             there already; start this node as usual (it rejoins that cluster, keeping its data \
             if it holds writes the cluster lacks)",
            proto::epoch::describe(&theirs),
            proto::epoch::describe(own_epoch)
        ));
    }
    if answer.leader_id != 0 {
        return Some(format!(
            "{who} serves a cluster: its etcd member follows leader {:x} (revision {}, {}); \
             recover is only for a cluster that lost its quorum",
            answer.leader_id,
            answer.revision,
            proto::epoch::describe(&theirs)
        ));
    }
    if answer.revision > own_revision {
        return Some(format!(
            "{who} is further ahead: its etcd data reaches revision {}, this node's {own_revision}; \
             recover {} instead (stop this node, run recover on its root)",
            answer.revision, answer.node_id
        ));
    }
    None
}

/// An encrypted member's data device unlocked with its cluster half: from its ESP or a
/// surviving member, else from the owner's backup.
async fn unlock(
    root: &Root,
    flags: &RecoverFlags,
    dev: &DataDevice,
    address: IpAddr,
) -> Result<(
    SealedConfiguration,
    identity::NodeKey,
    datafs::Half,
    datafs::Volume,
)> {
    let (sealed, join, found) = datadev::survivor_half(root, address).await?;
    let half = match (found, &flags.backup) {
        (Some(half), _) => half,
        (None, Some(backup)) => escrow_half(flags, backup, &sealed, &join, address).await?,
        (None, None) => bail!(
            "refusing to recover node {}: no surviving peer holds this node's cluster half; \
             pass --backup FILE (a backup of this cluster, `polisctl cluster backup`, holds \
             it in the node's record)",
            sealed.node_id
        ),
    };
    let volume = datadev::open_sealed(root, dev, &sealed, &join, &half)
        .await
        .with_context(|| format!("unlocking data device {}", dev.device.display()))?;
    Ok((sealed, join, half, volume))
}

/// This node's cluster half from the owner's backup `path`: verified as a restore
/// verifies it, then its snapshot served once in a scratch root in RAM (it holds every
/// secret of the cluster) and this node's record read from it.
async fn escrow_half(
    flags: &RecoverFlags,
    path: &std::path::Path,
    sealed: &SealedConfiguration,
    join: &identity::NodeKey,
    address: IpAddr,
) -> Result<datafs::Half> {
    let backup = backup::inspect_file(path).map_err(|e| anyhow!("backup {e}"))?;
    let ours = rpc::fingerprint(&sealed.cluster_ca_certificate);
    if backup.header.ca_fingerprint != ours {
        bail!(
            "backup {} is not of this node's cluster: its cluster CA is {}, this node's is {ours}",
            path.display(),
            backup.header.ca_fingerprint
        );
    }
    preflight::check_etcd_binary(&flags.etcd_binary)?;
    let etcdctl = restore::etcdctl_binary(&flags.etcd_binary);
    preflight::check_etcd_binary(&etcdctl).context("etcdctl is needed to read a backup")?;
    preflight::check_control_plane_ports(address)?;
    let scratch = scratch_dir()?;
    let scratch_root = Root::new(scratch.path().join("root"));
    scratch_root.prepare()?;
    let restore_flags = RestoreFlags {
        address,
        backup: path.to_path_buf(),
        etcd_binary: flags.etcd_binary.clone(),
        raft_timing: flags.raft_timing,
        force: false,
        drill: false,
    };
    let reader = identity::NodeKey::generate().context("generating a throwaway key")?;
    tracing::info!(backup = %path.display(), "reading this node's cluster half from the backup");
    let record = restore::serve_backup(
        &scratch_root,
        &restore_flags,
        &backup,
        &etcdctl,
        &reader,
        async |running| {
            let curator_ns = running.namespaced(curator::layout::NAMESPACE);
            restore::backup_cluster_ca(&curator_ns, &restore_flags, &backup).await?;
            curator::records::load_node(&curator_ns, &sealed.node_id)
                .await
                .context("reading this node's record from the backup")
        },
    )
    .await?;
    drop(scratch);
    let node = record.ok_or_else(|| {
        anyhow!(
            "backup {} holds no record of node {} (taken before it joined?)",
            path.display(),
            sealed.node_id
        )
    })?;
    if node.data_cluster_half.is_empty() {
        bail!(
            "backup {}: the record of node {} holds no cluster half (taken before its data was \
             encrypted, or after it was decommissioned)",
            path.display(),
            sealed.node_id
        );
    }
    if node.data_join_key != join.public_key() {
        bail!(
            "backup {}: the record of node {} names another data join key than the one in this \
             node's ESP",
            path.display(),
            sealed.node_id
        );
    }
    datafs::Half::decode(&node.data_cluster_half).map_err(|e| {
        anyhow!(
            "backup {}: the cluster half of node {} is unusable: {e}",
            path.display(),
            sealed.node_id
        )
    })
}

/// A private scratch directory for a backup's snapshot, in RAM (/dev/shm) where there is
/// one: it holds the cluster's secrets and is removed when dropped.
fn scratch_dir() -> Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        let tmp = std::env::temp_dir();
        tracing::warn!(
            dir = %tmp.display(),
            "no /dev/shm: the backup's snapshot is read in a disk directory (removed after)"
        );
        tmp
    };
    tempfile::Builder::new()
        .prefix("polis-escrow-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a scratch directory in {}", base.display()))
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
                epochs::majority_answering(answering, others),
                refused,
                "{answering} of {others}"
            );
        }
    }

    #[test]
    fn an_answering_member_that_serves_is_newer_or_ahead_refuses() {
        let ip: IpAddr = "127.0.0.3".parse().unwrap();
        let own = ClusterEpoch::default();
        let quiet = proto::api::GetConsensusStatusResponse {
            node_id: "polis-b".into(),
            revision: 40,
            ..Default::default()
        };
        assert_eq!(refusal(&own, 40, ip, &quiet), None);
        let ahead = refusal(&own, 39, ip, &quiet).expect("further ahead refuses");
        assert!(ahead.contains("recover polis-b instead"), "{ahead}");
        let serving = proto::api::GetConsensusStatusResponse {
            leader_id: 7,
            ..quiet.clone()
        };
        let why = refusal(&own, 50, ip, &serving).expect("a serving member refuses");
        assert!(why.contains("serves a cluster"), "{why}");
        let newer = proto::api::GetConsensusStatusResponse {
            epoch: Some(epochs::successor(&own, "polis-b", "recover", 40)),
            ..quiet
        };
        let why = refusal(&own, 50, ip, &newer).expect("a newer epoch refuses");
        assert!(why.contains("newer epoch 1"), "{why}");
    }

    #[tokio::test]
    async fn only_listening_peer_ports_answer() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listening = held.local_addr().unwrap();
        let closed = {
            let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            gone.local_addr().unwrap()
        };
        let answering = epochs::answering_peers(&[listening, closed]).await;
        assert_eq!(answering, vec![listening]);
        drop(held);
    }
}
