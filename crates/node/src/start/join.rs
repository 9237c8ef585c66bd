//! The join path: a node that already belongs to a cluster (its sealed configuration
//! exists) loads its identity, roles and cluster directory and checks them against each
//! other, before anything runs.
//!
//! Reads only, so that a refusal changes nothing: may not write to the root or talk to
//! the cluster (its control plane or rolefetch does that once it runs).

use anyhow::{Result, bail};
use proto::config::{LocalRoles, SealedConfiguration};

use crate::disk::files::{
    PEER_FILES, has_etcd_data, read_directory, read_node_key, read_pem_certificate,
};
use crate::disk::storage::{Root, read_proto};
use crate::state::membership::JoinData;

/// Join: load the node's identity and check it against the sealed configuration (reads
/// only, so that a refusal changes nothing).
pub fn prepare(root: &Root, sealed: SealedConfiguration) -> Result<JoinData> {
    let roles = local_roles(root, &sealed)?;
    let directory = read_directory(root)?;
    let key_path = root.node_key();
    let key = read_node_key(root)?;
    if key.node_id() != sealed.node_id {
        bail!(
            "node key in {} belongs to {}, but the sealed configuration is for {}",
            key_path.display(),
            key.node_id(),
            sealed.node_id
        );
    }
    if roles.consensus_member && has_etcd_data(root) {
        for file in PEER_FILES {
            let path = root.etcd_peer_dir().join(file);
            if !path.is_file() {
                bail!("etcd peer TLS file {} is missing", path.display());
            }
        }
    } else if directory.is_empty() {
        bail!(
            "this node is not a consensus member and its cluster directory {} names no curator; \
             it cannot reach its cluster",
            root.directory().display()
        );
    }
    warn_if_expiring(root);
    tracing::info!(
        node_id = sealed.node_id,
        consensus_member = roles.consensus_member,
        "joining cluster as an existing member"
    );
    Ok(JoinData {
        key,
        sealed,
        roles,
        directory,
    })
}

/// The roles saved in the root. Roots from before roles were saved are bootstrap
/// nodes: consensus members exactly when the sealed configuration names an etcd member.
fn local_roles(root: &Root, sealed: &SealedConfiguration) -> Result<LocalRoles> {
    let path = root.local_roles();
    if path.exists() {
        read_proto(&path, "node roles")
    } else {
        Ok(LocalRoles {
            consensus_member: sealed.etcd_member_id != 0,
            ..Default::default()
        })
    }
}

/// A certificate close to its end at start means renewal (at 2/3 of its lifetime, by
/// `renew` once the node is Home) has not happened for a long while: say so loudly.
fn warn_if_expiring(root: &Root) {
    const WARN_BEFORE: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);
    let peer = read_pem_certificate(&root.etcd_peer_dir().join("cert.pem")).ok();
    let node = std::fs::read(root.node_certificate()).ok();
    for (what, der) in [("node certificate", node), ("etcd peer certificate", peer)] {
        let Some(der) = der else { continue };
        match pki::time_to_expiry(&der) {
            Ok(None) => {
                tracing::error!("the {what} has expired; clients and peers will reject this node")
            }
            Ok(Some(left)) if left < WARN_BEFORE => tracing::warn!(
                days_left = left.as_secs() / 86400,
                "the {what} expires soon; it is renewed once this node reaches a curator"
            ),
            Ok(Some(_)) => {}
            Err(e) => tracing::warn!("cannot read the {what}: {e}"),
        }
    }
}
