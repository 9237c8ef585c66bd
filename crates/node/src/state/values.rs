//! The node's shared values: what its runnables publish and watch (membership, cluster
//! state, curators, roles, CRL, credentials, running services).
//!
//! Holds values, not behaviour: may not talk to the curator or start anything; reads
//! only the node certificate and key, once, for the credentials.

use std::net::SocketAddr;

use anyhow::{Context as _, Result};
use proto::config::LocalRoles;

use crate::disk::storage::{Root, read_file};
use crate::state::cluster_state::{ClusterState, Contact};
use crate::state::membership::Membership;
use crate::state::staleview::AppliedView;

/// Shared values of one node.
#[derive(Clone)]
pub struct NodeValues {
    pub membership: event::Value<Membership>,
    pub cluster_state: event::Value<ClusterState>,
    /// The cluster's curators as this node last learned them (cluster directory).
    pub curators: event::Value<Vec<SocketAddr>>,
    /// The node's roles: from the root at start, then as the cluster changes them.
    pub roles: event::Value<LocalRoles>,
    /// The cluster CA (adopted from `data/node/ca.der` on first use,
    /// `curator_client::trust`) and the newest cluster CRL seen (saved in
    /// `data/node/crl.der`): every call to a curator checks the curator's certificate
    /// against them.
    pub trust: rpc::TrustSlot,
    /// The node certificate and key every curator client and the curator's server use,
    /// loaded from the root once it holds them; replaced live on renewal (see
    /// `crate::runnables::renew`).
    pub credentials: NodeCredentials,
    /// Which of the node's services run (set by the control plane), for its status.
    pub services: event::Value<RunningServices>,
    /// The newest WatchNode update applied (see `crate::state::staleview`); loaded from the
    /// directory by rolefetch at its start.
    pub applied_view: event::Value<AppliedView>,
    /// A client of this node's own etcd member while it runs (set by the control plane
    /// once etcd serves, before any quorum): the log port answers GetConsensusStatus
    /// from it (see `crate::runnables::logserver`). `None` when it does not run.
    pub local_etcd: event::Value<Option<LocalEtcd>>,
    /// Set while this consensus member does not serve because a newer epoch of its
    /// cluster exists (see `crate::member::superseded`): the log port answers it.
    pub held_back: event::Value<Option<HeldBack>>,
    /// The newest cluster epoch this node's curator clients have seen (saved in
    /// `data/node/epoch-seen`): answers of curators of an older one are refused.
    pub epoch_seen: rpc::epoch::EpochSlot,
    /// The etcd peer CAs trusted now (DER), the signing one first, as the newest WatchNode
    /// update named them (consensus members; empty until one did): `crate::runnables::peertrust`
    /// keeps etcd's trust file equal to them.
    pub etcd_peer_cas: event::Value<Vec<Vec<u8>>>,
    /// The peer trust file (PEM) as this node's running etcd loaded it at its start (set
    /// by the control plane; empty while no etcd runs): etcd trusts exactly these.
    pub etcd_peer_trust_loaded: event::Value<Vec<u8>>,
    /// The Kubernetes components this node runs for its roles, and how they fare
    /// (reported with its heartbeats).
    pub components: kubernetes::board::ComponentBoard,
}

/// The epoch slot of a node, holding what `root` saved, saving every newer epoch. A
/// malformed file (a disk error, a hand edit) does not keep the node from starting: it
/// is moved aside (`epoch-seen.malformed`, kept for whoever looks into it), said so,
/// and the node takes the epoch its curators answer with from then on.
pub fn saved_epoch_seen(root: &Root) -> Result<rpc::epoch::EpochSlot> {
    let path = root.node_dir().join("epoch-seen");
    let seen = match std::fs::read(&path) {
        Ok(bytes) => {
            let parsed = std::str::from_utf8(&bytes)
                .ok()
                .and_then(rpc::epoch::from_saved_text);
            if parsed.is_none() {
                let aside = path.with_file_name("epoch-seen.malformed");
                std::fs::rename(&path, &aside).with_context(|| {
                    format!(
                        "moving the malformed saved cluster epoch {} aside to {}",
                        path.display(),
                        aside.display()
                    )
                })?;
                tracing::error!(
                    path = %path.display(),
                    aside = %aside.display(),
                    "the saved cluster epoch is malformed: moved aside; this node takes the \
                     epoch its curators answer with from now on (until then it cannot tell a \
                     superseded curator from a current one)"
                );
            }
            parsed
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let save = std::sync::Arc::new(move |epoch: &proto::config::ClusterEpoch| {
        let line = rpc::epoch::saved_text(epoch);
        match crate::disk::storage::write_atomic(&path, line.as_bytes()) {
            Ok(()) => tracing::info!(
                epoch = proto::epoch::describe(epoch),
                "a curator answered from a newer cluster epoch: older ones are refused from now on"
            ),
            Err(e) => tracing::warn!("saving the cluster epoch seen: {e:#}"),
        }
    });
    Ok(rpc::epoch::EpochSlot::new(seen, Some(save)))
}

/// Why a member holds back, and the revision its (kept) etcd data reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBack {
    pub reason: String,
    pub revision: i64,
}

/// A client of the local etcd member, and the backend quota it runs with.
#[derive(Clone)]
pub struct LocalEtcd {
    pub client: etcd_client::Client,
    pub quota_backend_bytes: u64,
}

/// The node's credentials, shared by every user in the process: loaded from the root on
/// first use (a bootstrapping node writes its certificate only in `bootstrap::finish`).
#[derive(Clone, Default)]
pub struct NodeCredentials(std::sync::Arc<std::sync::Mutex<Option<rpc::CredentialSlot>>>);

impl NodeCredentials {
    /// The slot, loading it from `root` the first time.
    pub fn slot(&self, root: &Root) -> Result<rpc::CredentialSlot> {
        let mut loaded = self.0.lock().expect("credentials lock poisoned");
        if let Some(slot) = loaded.as_ref() {
            return Ok(slot.clone());
        }
        let slot = rpc::CredentialSlot::new(rpc::Credentials {
            certificate: read_file(&root.node_certificate(), "node certificate")?,
            key_pkcs8: read_file(&root.node_key(), "node key")?,
        })
        .context("loading the node certificate and key")?;
        *loaded = Some(slot.clone());
        Ok(slot)
    }
}

/// The node's services that run now (reported with its heartbeats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunningServices {
    /// Its etcd member runs (and has not stopped since).
    pub etcd_member: bool,
    /// Its curator was started (it serves once it has a listener).
    pub curator: bool,
}

/// Moves the node's cluster state by `contact` ([`ClusterState::after`]), atomically;
/// true when it changed.
pub fn apply_contact(state: &event::Value<ClusterState>, contact: Contact) -> bool {
    state.update(|current| {
        current
            .copied()
            .unwrap_or(ClusterState::Unknown)
            .after(contact)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_saved_epoch_is_moved_aside_and_the_node_starts() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().join("root"));
        std::fs::create_dir_all(root.node_dir()).unwrap();
        let path = root.node_dir().join("epoch-seen");
        for junk in [b"9-x-recover-polis\n".as_slice(), &[0xff, 0xfe, 0x00]] {
            std::fs::write(&path, junk).unwrap();
            let slot = saved_epoch_seen(&root).expect("the node starts");
            assert_eq!(slot.current(), None);
            assert!(!path.exists());
            let aside = root.node_dir().join("epoch-seen.malformed");
            assert_eq!(std::fs::read(&aside).unwrap(), junk);
        }
        // A well-formed one is taken as it is.
        let epoch = proto::config::ClusterEpoch {
            number: 2,
            made_unix_ms: 5,
            kind: "restore".into(),
            made_by: "polis-a".into(),
            ..Default::default()
        };
        std::fs::write(&path, rpc::epoch::saved_text(&epoch)).unwrap();
        assert_eq!(saved_epoch_seen(&root).unwrap().current(), Some(epoch));
    }
}
