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
//!                                           the sealed configuration); none answers →
//!                                           Split, waiting; refused → exit 1
//!   both:                                   key = HKDF(local ‖ cluster) → datafs::open
//! ```
//! A bootstrapping node refuses the flag: its cluster half would live in its own etcd,
//! inside the data it unlocks (members' cold start is a later stage of issue 18).
//!
//! A start path: runs once before the start decision; may not start runnables.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use identity::NodeKey;
use proto::api;
use proto::config::{NodeParameters, SealedConfiguration, node_parameters};

use crate::datakeys;
use crate::files::read_directory;
use crate::retry::{Backoff, ProblemLog};
use crate::storage::{Root, read_proto};

/// `--data-device` and `--data-device-format`.
#[derive(Debug, Clone)]
pub struct DataDevice {
    pub device: PathBuf,
    pub format: bool,
}

/// The owner a data file system is marked for: the cluster (by its CA) and the node (by
/// its join key).
fn owner(ca_der: &[u8], join: &NodeKey) -> datafs::Owner {
    let digest = ring::digest::digest(&ring::digest::SHA256, ca_der);
    datafs::Owner {
        cluster: format!("ca-{}", hex::encode(&digest.as_ref()[..8])),
        node: join.node_id(),
    }
}

/// Unlocks and mounts the data device on `data/`; `params` is where the node parameters
/// are (only read by a node that has not joined yet).
pub async fn open(root: &Root, dev: &DataDevice, params: &Path) -> Result<datafs::Volume> {
    privatefs::ensure_private_dir(&root.esp())?;
    let sealed_path = root.sealed_configuration();
    let (ca, join, local, cluster, format) = if sealed_path.exists() {
        let sealed: SealedConfiguration = read_proto(&sealed_path, "sealed configuration")?;
        let join = datakeys::read_join_key(root)?;
        let local = datafs::halffile::load(&datakeys::local_half(root))?;
        let cluster = match datakeys::read_pending(root)? {
            // Sealed moments ago: the cluster keeps the same half since RegisterNode.
            Some(half) => half,
            None => unlock(root, &sealed, &join).await?,
        };
        let ca = sealed.cluster_ca_certificate;
        (ca, join, local, cluster, datafs::FormatPolicy::Never)
    } else {
        let parameters: NodeParameters = read_proto(params, "node parameters")
            .context("--data-device on a node that has not joined needs register parameters")?;
        let register = match parameters.cluster {
            Some(node_parameters::Cluster::Register(r)) => r,
            Some(node_parameters::Cluster::Bootstrap(_)) => bail!(
                "--data-device is not available to a bootstrapping node yet: its cluster half \
                 would live in its own etcd, inside the data it unlocks (start the first node \
                 without it; register the others with it)"
            ),
            None => bail!(
                "node parameters at {} name no cluster action",
                params.display()
            ),
        };
        let keys = datakeys::load_or_create(root)?;
        // Never the node's own file system: a resumed first start keeps what it wrote.
        let format = if dev.format {
            datafs::FormatPolicy::UnlessOwn
        } else {
            datafs::FormatPolicy::IfEmpty
        };
        (
            register.ca_certificate,
            keys.join,
            keys.local,
            keys.cluster,
            format,
        )
    };
    let owner = owner(&ca, &join);
    let key = datafs::DataKey::derive(&local, &cluster);
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
    if sealed_path.exists() {
        datakeys::forget_pending(root)?;
    }
    tracing::info!(device = %dev.device.display(), "data device unlocked and mounted");
    Ok(volume)
}

/// Whether a refusal can never turn into an answer by retrying.
fn permanent(e: &rpc::CallError) -> bool {
    use tonic::Code;
    e.all_untrusted()
        || matches!(e, rpc::CallError::Status(s)
            if matches!(s.code(), Code::PermissionDenied | Code::InvalidArgument | Code::Unauthenticated))
}

/// The cluster half from any curator in the directory; waits (Split) while none answers.
async fn unlock(root: &Root, sealed: &SealedConfiguration, join: &NodeKey) -> Result<datafs::Half> {
    let endpoints = read_directory(root)?;
    if endpoints.is_empty() {
        bail!(
            "no curator endpoints in {} to unlock the data device from",
            root.directory().display()
        );
    }
    let client = rpc::CuratorClient::new(
        endpoints,
        rpc::ServerTrust::PinnedCa(sealed.cluster_ca_certificate.clone()),
        Some(rpc::self_signed(join).context("creating the join key's certificate")?),
    )
    .context("loading the join key's certificate")?;
    let mut backoff = Backoff::default();
    let mut problems = ProblemLog::default();
    let mut split = false;
    loop {
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
                return datafs::Half::decode(&a.cluster_half)
                    .map_err(|e| anyhow!("the cluster sent an unusable cluster half: {e}"));
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
    fn only_refusals_are_permanent() {
        use tonic::{Code, Status};
        let status = |c| rpc::CallError::Status(Status::new(c, "x"));
        assert!(permanent(&status(Code::PermissionDenied)));
        assert!(!permanent(&status(Code::Unavailable)));
        assert!(!permanent(&rpc::CallError::Unreachable(vec![])));
    }
}
