//! The node's own files in its root, by content: etcd peer TLS files, PEM certificates,
//! the node key, the cluster directory, the etcd member record (`member.pb`).
//!
//! On top of `storage` (paths, atomic writes, protobuf files), which it uses and never
//! extends; may not talk to the cluster or touch shared values.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context as _, Result};
use identity::NodeKey;
use proto::config::{ClusterDirectory, ConsensusMembership, SealedConfiguration};

use crate::disk::storage::{
    Root, ensure_private_dir, pem, read_file, read_proto, write_atomic, write_proto,
};

/// The etcd peer TLS files in [`Root::etcd_peer_dir`].
pub const PEER_FILES: [&str; 4] = ["key.pem", "cert.pem", "ca.pem", "crl.pem"];

/// The node key saved in the root; the error names the file.
pub fn read_node_key(root: &Root) -> Result<NodeKey> {
    let key_path = root.node_key();
    NodeKey::from_pkcs8(&read_file(&key_path, "node key")?)
        .with_context(|| format!("node key in {} is corrupt", key_path.display()))
}

/// Where etcd finds the peer TLS files of this root.
pub fn peer_tls_files(root: &Root) -> consensus::PeerTlsFiles {
    let dir = root.etcd_peer_dir();
    consensus::PeerTlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        ca: dir.join("ca.pem"),
        crl: dir.join("crl.pem"),
    }
}

/// The files a consensus member's root holds besides its credentials: its roles (a
/// consensus member) and a cluster directory naming its own curator. Written by the
/// bootstrap and the restore, before the sealed configuration.
pub fn save_member_files(root: &Root, address: std::net::IpAddr) -> Result<()> {
    write_proto(
        &root.local_roles(),
        &proto::config::LocalRoles {
            consensus_member: true,
            ..Default::default()
        },
    )
    .context("saving the node's roles")?;
    save_directory(
        root,
        &[SocketAddr::new(address, rpc::CURATOR_PORT).to_string()],
    )
}

/// Writes the etcd peer TLS files (`cas`: the peer CAs etcd trusts, DER); the CRL is
/// replaced atomically like every file.
pub fn write_peer_files(
    root: &Root,
    key: &NodeKey,
    cas: &[Vec<u8>],
    cert: &[u8],
    crl: &[u8],
) -> Result<()> {
    let dir = root.etcd_peer_dir();
    write_atomic(&dir.join("key.pem"), &pem("PRIVATE KEY", key.pkcs8_der()))?;
    write_atomic(&dir.join("cert.pem"), &pem("CERTIFICATE", cert))?;
    write_atomic(&dir.join("ca.pem"), &peer_trust_pem(cas))?;
    write_atomic(&dir.join("crl.pem"), &pem("X509 CRL", crl))?;
    Ok(())
}

/// etcd's peer trust file (`--peer-trusted-ca-file`) for `cas` (DER): one PEM block
/// each, in order.
pub fn peer_trust_pem(cas: &[Vec<u8>]) -> Vec<u8> {
    cas.iter().flat_map(|ca| pem("CERTIFICATE", ca)).collect()
}

/// The DER inside a PEM certificate file.
pub fn read_pem_certificate(path: &Path) -> Result<Vec<u8>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(pem::parse(text)
        .with_context(|| format!("{} is not PEM", path.display()))?
        .into_contents())
}

/// Parses curator endpoints as the parameters and the directory hold them.
pub fn parse_endpoints(raw: &[String]) -> Result<Vec<SocketAddr>> {
    Ok(rpc::parse_endpoints(raw)?)
}

/// The curator endpoints saved in the root's cluster directory (empty when absent).
pub fn read_directory(root: &Root) -> Result<Vec<SocketAddr>> {
    let path = root.directory();
    if !path.exists() {
        return Ok(Vec::new());
    }
    let directory: ClusterDirectory = read_proto(&path, "cluster directory")?;
    parse_endpoints(&directory.curator_endpoints)
        .with_context(|| format!("cluster directory {} is corrupt", path.display()))
}

/// Rewrites the cluster directory when it changed.
pub fn save_directory(root: &Root, endpoints: &[String]) -> Result<()> {
    let path = root.directory();
    let current: Option<ClusterDirectory> = read_proto(&path, "cluster directory").ok();
    // The applied revision stays (see `crate::state::staleview`).
    let directory = ClusterDirectory {
        curator_endpoints: endpoints.to_vec(),
        ..current.clone().unwrap_or_default()
    };
    if current.as_ref() != Some(&directory) {
        write_proto(&path, &directory).context("saving the cluster directory")?;
    }
    Ok(())
}

/// Whether the root holds etcd data (this node was a member before).
pub fn has_etcd_data(root: &Root) -> bool {
    root.etcd_data().join("member").is_dir()
}

/// The etcd member this node is, as recorded: `data/etcd/member.pb` (written when it
/// joined consensus after joining the cluster; all zeros once it left consensus, which
/// also voids the sealed IDs), else the sealed configuration (bootstrap). `None` when
/// this node is no recorded member.
pub fn recorded_membership(
    root: &Root,
    sealed: Option<&SealedConfiguration>,
) -> Result<Option<ConsensusMembership>> {
    let path = root.consensus_membership();
    if path.exists() {
        let recorded: ConsensusMembership = read_proto(&path, "consensus membership")?;
        return Ok((recorded.etcd_member_id != 0).then_some(recorded));
    }
    Ok(sealed
        .filter(|s| s.etcd_member_id != 0)
        .map(|s| ConsensusMembership {
            etcd_cluster_id: s.etcd_cluster_id,
            etcd_member_id: s.etcd_member_id,
        }))
}

/// After the ConsensusMember role was taken away and the control plane stopped: the
/// node is no etcd member any more; its etcd data and peer credentials go.
pub fn forget_consensus(root: &Root) -> Result<()> {
    for dir in [root.etcd_data(), root.etcd_peer_dir()] {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", dir.display())),
        }
    }
    // Encrypted data: a former member keeps no other member's cluster half; nor the
    // member list it named its peers by, nor the epoch of data it no longer has.
    for file in [
        root.esp().join("data-peers"),
        root.etcd_members(),
        root.etcd_epoch(),
    ] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", file.display())),
        }
    }
    // "No member" — also over a bootstrap node's sealed member ID, so that it can join
    // consensus again later as a new member.
    write_proto(
        &root.consensus_membership(),
        &ConsensusMembership::default(),
    )
    .context("recording that this node left consensus")?;
    ensure_private_dir(&root.etcd_peer_dir())?;
    Ok(())
}

/// After the ConsensusMember role was taken away: the member's scheduled snapshots go
/// (each holds every key of the cluster). Whether there were any.
pub fn forget_snapshots(root: &Root) -> Result<bool> {
    let dir = root.snapshots();
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

/// The backend quota this node's etcd member runs with, as recorded when it became a
/// member; the default for a root recorded before quotas existed.
pub fn recorded_quota(root: &Root) -> Result<u64> {
    let path = root.etcd_quota();
    if !path.exists() {
        return Ok(proto::quota::DEFAULT_QUOTA_BYTES);
    }
    let recorded: proto::config::EtcdQuota = read_proto(&path, "etcd quota")?;
    proto::quota::effective_quota(recorded.quota_backend_bytes)
        .with_context(|| format!("{} holds an unusable etcd quota", path.display()))
}

/// Records the quota this node's etcd member runs with from now on.
pub fn record_quota(root: &Root, bytes: u64) -> Result<()> {
    write_proto(
        &root.etcd_quota(),
        &proto::config::EtcdQuota {
            quota_backend_bytes: bytes,
        },
    )
    .context("recording the etcd backend quota")
}
