//! `--data-device DEV`: the node's `data/` on an encrypted file system (see `datafs`),
//! unlocked before anything reads it, with a key of two halves (issue 18).
//!
//! ```text
//!   no sealed configuration (registering):  ESP keys loaded or created (datakeys);
//!                                           device formatted when empty (with
//!                                           --data-device-format: unless it is this
//!                                           node's own);
//!                                           RegisterNode hands the cluster its half
//!   sealed (a member of a cluster):         DataUnlock.UnlockData with the join key, to
//!                                           the curators in the directory (CA pinned from
//!                                           the sealed configuration, CRL: the ESP's copy
//!                                           or newer from any curator, `crlfetch`); none
//!                                           answers → Split, waiting; every curator
//!                                           untrusted: the CA's handovers followed
//!                                           (`handover`: a rotation missed while off);
//!                                           refused (or untrusted without a handover,
//!                                           revoked) → exit 1
//!   both:                                   key = HKDF(local ‖ cluster) → datafs::open
//! ```
//! A consensus member also asks the other members' unlock listeners (`datapeers`: their
//! ESPs keep its half), so members cold-start each other before any etcd runs; every
//! node with the flag serves that listener from the start. A member's answer is only
//! taken once the device took its half (the kernel's key identifier): a wrong one is
//! passed over and the next member asked (`datapeers::first_accepted`). A bootstrapping node marks its
//! device with a name of its own (`esp/data-bootstrap-cluster`; the CA does not exist
//! yet), records its half in its first record, and keeps the half in its ESP until
//! another member's listener answers with it: a one-member cluster unlocks alone.
//!
//! Two more ways in, for the start paths that make a sole member (issue 18, escrow):
//! `recover --data-device` unlocks a sealed member with a half found by `survivor_half`
//! (its ESP, else the other members' listeners, asked once) or read by `recover` from
//! the owner's backup (`open_sealed`), then keeps it like a first node
//! (`keep_own_half`); `restore --data-device` creates a new node's keys and device marked
//! for the backup's cluster (`open_restoring`). `close` locks and unmounts again when
//! they refuse.
//!
//! A start path: runs once before the start decision; may not start runnables.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use identity::NodeKey;
use proto::api;
use proto::config::{NodeParameters, SealedConfiguration, node_parameters};

use crate::curators::crlfetch;
use crate::curators::handover;
use crate::curators::retry::{Backoff, ProblemLog};
use crate::data::datapeers;
use crate::disk::datakeys;
use crate::disk::files::read_directory;
use crate::disk::storage::{Root, read_proto};

/// `--data-device` and `--data-device-format`.
#[derive(Debug, Clone)]
pub struct DataDevice {
    pub device: PathBuf,
    pub format: bool,
}

/// The owner a data file system is marked for: the cluster (by its CA) and the node (by
/// its join key).
fn owner(ca_der: &[u8], join: &NodeKey) -> datafs::Owner {
    named_owner(cluster_name(&rpc::fingerprint(ca_der)), join)
}

/// The marker's cluster name of the cluster whose CA has `fingerprint` (hex SHA-256, as
/// a backup's header names it).
pub fn cluster_name(fingerprint: &str) -> String {
    format!("ca-{}", fingerprint.get(..16).unwrap_or(fingerprint))
}

fn named_owner(cluster: String, join: &NodeKey) -> datafs::Owner {
    datafs::Owner {
        cluster,
        node: join.node_id(),
    }
}

/// Unlocks and mounts the data device on `data/`; `params` is where the node parameters
/// are (only read by a node that has not joined yet); the members' unlock listener runs
/// on `address` from before the unlock on.
pub async fn open(
    root: &Root,
    dev: &DataDevice,
    params: &Path,
    address: std::net::IpAddr,
) -> Result<datafs::Volume> {
    privatefs::ensure_private_dir(&root.esp())?;
    let sealed_path = root.sealed_configuration();
    if sealed_path.exists() {
        let sealed: SealedConfiguration = read_proto(&sealed_path, "sealed configuration")?;
        let join = datakeys::read_join_key(root)?;
        let local = datafs::halffile::load(&datakeys::local_half(root))?;
        datapeers::listen(root, address, &join).await?;
        let owner = sealed_owner(root, &sealed, &join)?;
        let volume = match datakeys::read_pending(root)? {
            // Sealed moments ago: the cluster keeps the same half since RegisterNode (a
            // first node: until another member keeps it).
            Some(half) => {
                let never = datafs::FormatPolicy::Never;
                mount(root, dev, owner, &local, &half, never).await?
            }
            None => unlock(root, dev, &sealed, &join, owner, &local).await?,
        };
        if !datakeys::is_bootstrap(root) {
            datakeys::forget_pending(root)?;
        }
        return Ok(volume);
    }
    let (owner, local, cluster, format) = {
        let parameters: NodeParameters = read_proto(params, "node parameters")
            .context("--data-device on a node that has not joined needs its node parameters (bootstrap or register)")?;
        let keys = datakeys::load_or_create(root)?;
        let owner = match parameters.cluster {
            Some(node_parameters::Cluster::Register(r)) => owner(&r.ca_certificate, &keys.join),
            Some(node_parameters::Cluster::Bootstrap(b)) => named_owner(
                datakeys::bootstrap_cluster_name(root, &b.owner_public_key)?,
                &keys.join,
            ),
            None => bail!(
                "node parameters at {} name no cluster action",
                params.display()
            ),
        };
        datapeers::listen(root, address, &keys.join).await?;
        // Never the node's own file system: a resumed first start keeps what it wrote.
        let format = if dev.format {
            datafs::FormatPolicy::UnlessOwn
        } else {
            datafs::FormatPolicy::IfEmpty
        };
        (owner, keys.local, keys.cluster, format)
    };
    mount(root, dev, owner, &local, &cluster, format).await
}

/// The owner a sealed node's data file system is marked for: the name in its ESP when it
/// kept one (a first node of its cluster), else its cluster's CA.
fn sealed_owner(
    root: &Root,
    sealed: &SealedConfiguration,
    join: &NodeKey,
) -> Result<datafs::Owner> {
    Ok(if datakeys::is_bootstrap(root) {
        named_owner(datakeys::bootstrap_cluster_name(root, &[])?, join)
    } else {
        owner(&sealed.cluster_ca_certificate, join)
    })
}

/// `key = HKDF(local ‖ cluster)`, then `datafs::open` of the device on `data/`.
async fn mount(
    root: &Root,
    dev: &DataDevice,
    owner: datafs::Owner,
    local: &datafs::Half,
    cluster: &datafs::Half,
    format: datafs::FormatPolicy,
) -> Result<datafs::Volume> {
    let key = datafs::DataKey::derive(local, cluster);
    let (device, fs_dir, data_dir) = (dev.device.clone(), datakeys::fs_dir(root), root.data());
    let volume = tokio::task::spawn_blocking(move || {
        datafs::open(
            &datafs::Spec {
                device: &device,
                fs_dir: &fs_dir,
                data_dir: &data_dir,
                owner: &owner,
                format,
            },
            &key,
        )
    })
    .await
    .context("opening the data device")?
    .with_context(|| format!("opening data device {}", dev.device.display()))?;
    if volume.formatted() {
        tracing::info!(device = %dev.device.display(), "formatted the encrypted data device");
    }
    tracing::info!(device = %dev.device.display(), "data device unlocked and mounted");
    Ok(volume)
}

/// `polis-node recover --data-device`: a stopped member's half without a cluster to ask:
/// kept in its ESP (a sole member's), else from the first other member whose unlock
/// listener answers (asked once each); None when neither has it. Starts this node's
/// own listener (the other survivors may need the halves it keeps).
pub async fn survivor_half(
    root: &Root,
    address: std::net::IpAddr,
) -> Result<(SealedConfiguration, NodeKey, Option<datafs::Half>)> {
    let sealed: SealedConfiguration =
        read_proto(&root.sealed_configuration(), "sealed configuration")?;
    let join = datakeys::read_join_key(root)?;
    datafs::halffile::load(&datakeys::local_half(root))?;
    datapeers::listen(root, address, &join).await?;
    if let Some(half) = datakeys::read_pending(root)? {
        return Ok((sealed, join, Some(half)));
    }
    let credentials = rpc::self_signed(&join).context("creating the join key's certificate")?;
    let peers = datapeers::load(root)?;
    // The first usable answer: `recover` mounts with it (a wrong one is refused there).
    let half = from_peers(
        &peers,
        &credentials,
        &sealed,
        &mut Vec::new(),
        async |half| Ok(Some(half)),
    )
    .await?;
    Ok((sealed, join, half))
}

/// A sealed node's device unlocked with `cluster` (recover): never formatted; a half
/// that is not this device's is refused by the kernel's key identifier.
pub async fn open_sealed(
    root: &Root,
    dev: &DataDevice,
    sealed: &SealedConfiguration,
    join: &NodeKey,
    cluster: &datafs::Half,
) -> Result<datafs::Volume> {
    let local = datafs::halffile::load(&datakeys::local_half(root))?;
    let owner = sealed_owner(root, sealed, join)?;
    mount(
        root,
        dev,
        owner,
        &local,
        cluster,
        datafs::FormatPolicy::Never,
    )
    .await
}

/// After a recover: the node is its cluster's only member, and no ESP but its own can
/// answer for its half any more. Kept there as a first node keeps it (the marker's name
/// with it), until another member's listener answers with it (`datapeers`).
pub fn keep_own_half(
    root: &Root,
    sealed: &SealedConfiguration,
    join: &NodeKey,
    cluster: &datafs::Half,
) -> Result<()> {
    let owner = sealed_owner(root, sealed, join)?;
    datakeys::keep_own_half(root, &owner.cluster, cluster)
}

/// `polis-node restore --data-device`: a new node's keys created in its ESP (as a
/// registering node's), the device formatted when empty (or with --data-device-format,
/// unless it is this node's own) and marked for the backup's cluster (by the CA
/// fingerprint its header names), the own half kept in the ESP as a first node keeps it.
/// Returns the volume and the record's data fields (join key, cluster half).
pub async fn open_restoring(
    root: &Root,
    dev: &DataDevice,
    ca_fingerprint: &str,
    address: std::net::IpAddr,
) -> Result<(datafs::Volume, Vec<u8>, Vec<u8>)> {
    privatefs::ensure_private_dir(&root.esp())?;
    let keys = datakeys::load_or_create(root)?;
    let owner = named_owner(cluster_name(ca_fingerprint), &keys.join);
    datakeys::keep_own_half(root, &owner.cluster, &keys.cluster)?;
    datapeers::listen(root, address, &keys.join).await?;
    let format = if dev.format {
        datafs::FormatPolicy::UnlessOwn
    } else {
        datafs::FormatPolicy::IfEmpty
    };
    let volume = mount(root, dev, owner, &keys.local, &keys.cluster, format).await?;
    Ok((
        volume,
        keys.join.public_key().to_vec(),
        keys.cluster.encode(),
    ))
}

/// Locks and unmounts `volume` (a refused recover or restore leaves nothing mounted);
/// a failure is logged, the refusal that led here is what the caller reports.
pub async fn close(volume: datafs::Volume) {
    match tokio::task::spawn_blocking(move || volume.close()).await {
        Ok(Ok(())) => tracing::info!("data device locked and unmounted"),
        Ok(Err(e)) => tracing::error!("closing the data device: {e}"),
        Err(e) => tracing::error!("closing the data device: {e}"),
    }
}

/// [`handover::follow`], its refusal logged: whether the slot trusts another CA now.
fn follow_logged(slot: &rpc::TrustSlot, answer: &api::GetCaCertificateResponse) -> bool {
    handover::follow(slot, answer).unwrap_or_else(|e| {
        tracing::warn!("not following the cluster CA's handovers: {e:#}");
        false
    })
}

/// Whether a refusal can never turn into an answer by retrying.
fn permanent(e: &rpc::CallError) -> bool {
    use tonic::Code;
    e.all_untrusted()
        || matches!(e, rpc::CallError::Status(s)
            if matches!(s.code(), Code::PermissionDenied | Code::InvalidArgument | Code::Unauthenticated))
}

/// The first of `peers`' (the other members' unlock listeners) halves that `accept`
/// takes (see `datapeers::first_accepted`; `refused` carries the halves it did not take
/// from one round to the next); None when none does.
async fn from_peers<T>(
    peers: &[datapeers::Peer],
    credentials: &rpc::Credentials,
    sealed: &SealedConfiguration,
    refused: &mut Vec<Vec<u8>>,
    accept: impl AsyncFnMut(datafs::Half) -> Result<Option<T>>,
) -> Result<Option<T>> {
    datapeers::first_accepted(
        peers,
        &sealed.node_id,
        datapeers::PEERS_TIMEOUT,
        refused,
        async |peer| datapeers::ask(peer, credentials).await,
        accept,
    )
    .await
}

/// Whether opening the device failed because the key is not its key (a wrong cluster
/// half): the kernel's key identifier differs.
fn wrong_key(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<datafs::Error>(),
            Some(datafs::Error::WrongKey { .. })
        )
    })
}

/// The device unlocked with the cluster half from the first other member whose half it
/// takes, else from any curator in the directory; waits (Split) while none answers.
async fn unlock(
    root: &Root,
    dev: &DataDevice,
    sealed: &SealedConfiguration,
    join: &NodeKey,
    owner: datafs::Owner,
    local: &datafs::Half,
) -> Result<datafs::Volume> {
    let endpoints = read_directory(root)?;
    if endpoints.is_empty() {
        bail!(
            "no curator endpoints in {} to unlock the data device from",
            root.directory().display()
        );
    }
    let credentials = rpc::self_signed(join).context("creating the join key's certificate")?;
    // data/node/crl.der is on the locked device: the ESP's copy, and whatever newer one
    // a curator hands out (asked again before every round).
    let ca = &sealed.cluster_ca_certificate;
    let crl = crate::curators::curator_client::saved_slot(&datakeys::trust_copy(root), ca.clone())?;
    crlfetch::offer_esp_copy(root, &crl)?;
    let client = rpc::CuratorClient::new(
        endpoints.clone(),
        rpc::ServerTrust::ClusterCa { trust: crl.clone() },
        Some(credentials.clone()),
    )
    .context("loading the join key's certificate")?;
    // A member: the other members' listeners keep its half (before any etcd runs).
    let peers = datapeers::load(root)?;
    let mut backoff = Backoff::default();
    let mut problems = ProblemLog::default();
    let mut split = false;
    let mut refused = Vec::new();
    let never = datafs::FormatPolicy::Never;
    loop {
        // A member's half is verified by the device itself: opened, or passed over.
        let try_half =
            async |half: datafs::Half| match mount(root, dev, owner.clone(), local, &half, never)
                .await
            {
                Ok(volume) => Ok(Some(volume)),
                Err(e) if wrong_key(&e) => Ok(None),
                Err(e) => Err(e),
            };
        if let Some(volume) =
            from_peers(&peers, &credentials, sealed, &mut refused, try_half).await?
        {
            problems.resolved("a member answered");
            return Ok(volume);
        }
        crlfetch::gather(&crl, &endpoints).await;
        let answer = client
            .call(|channel| async move {
                api::data_unlock_client::DataUnlockClient::new(channel)
                    .unlock_data(api::UnlockDataRequest {})
                    .await
            })
            .await;
        match answer {
            Ok(a) => {
                if a.node_id != sealed.node_id {
                    bail!(
                        "the cluster answered with the data key of node {}, not of this node {}",
                        a.node_id,
                        sealed.node_id
                    );
                }
                problems.resolved("a curator answered");
                let half = datafs::Half::decode(&a.cluster_half)
                    .map_err(|e| anyhow!("the cluster sent an unusable cluster half: {e}"))?;
                return mount(root, dev, owner, local, &half, never).await;
            }
            Err(e) if e.revoked_server() && e.all_untrusted() => bail!(
                "no curator in {} may be trusted, and one presents a revoked certificate \
                 (a node removed from the cluster): point this node at the cluster's \
                 current curators (polis-node set-curators): {e}",
                root.directory().display()
            ),
            // A CA rotation this node missed while it was off: the curators present a
            // CA it does not trust yet. Followed in memory when the handovers lead
            // there from a CA it trusts (the half is checked by the device anyway);
            // the running node saves it (`catchup`).
            Err(e)
                if e.all_untrusted()
                    && handover::ask(&endpoints)
                        .await
                        .is_some_and(|answer| follow_logged(&crl, &answer)) =>
            {
                problems.resolved("followed the cluster CA's handovers");
            }
            Err(e) if permanent(&e) => {
                bail!("the cluster refuses to unlock this node's data device: {e}")
            }
            Err(e) => {
                if !split {
                    split = true;
                    tracing::warn!(
                        cluster_state = "Split",
                        "no curator answers to unlock the data device; waiting"
                    );
                }
                problems.problem(format!("unlocking the data device: {e}"));
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_names_the_cluster_ca_and_the_join_key() {
        let join = NodeKey::generate().unwrap();
        let a = owner(b"ca one", &join);
        assert_eq!(a.node, join.node_id());
        assert!(
            a.cluster.starts_with("ca-") && a.cluster.len() == 3 + 16,
            "{}",
            a.cluster
        );
        assert_ne!(a.cluster, owner(b"ca two", &join).cluster);
        assert!(a.validate().is_ok());
    }

    #[test]
    fn a_backups_header_names_the_markers_cluster() {
        let join = NodeKey::generate().unwrap();
        let ca = b"some cluster CA certificate";
        assert_eq!(
            cluster_name(&rpc::fingerprint(ca)),
            owner(ca, &join).cluster
        );
    }

    #[test]
    fn only_refusals_are_permanent() {
        use tonic::{Code, Status};
        let status = |c| rpc::CallError::Status(Status::new(c, "x"));
        assert!(permanent(&status(Code::PermissionDenied)));
        assert!(!permanent(&status(Code::Unavailable)));
        assert!(!permanent(&rpc::CallError::Unreachable(vec![])));
    }
}
