//! The bootstrap of a new cluster, in two halves around the start of its etcd.
//!
//! Before etcd ([`prepare`], run by the cluster manager): everything etcd needs to start
//! (node key, both CAs, the peer certificate, an empty peer CRL) goes on disk. It first
//! records its parameters in the root (`bootstrap.pb`): a crash at any later moment
//! leaves a root that resumes this same bootstrap when started with the same parameters
//! (the node key is kept; see `decision` and [`trace`], which preflight reads), and
//! refuses anything else — never a second cluster.
//!
//! Once etcd runs ([`finish`], run by the control plane): the cluster's PKI and records
//! go into etcd, the node's credentials onto disk, and the sealed configuration last.
//!
//! ```text
//!   etcd's only member is this node? ─▶ cluster CA, etcd peer CA (ensure)
//!     ─▶ peer + node certificates ─▶ node files
//!     ─▶ node record + initial owner + cluster configuration (one create-if-absent txn)
//!     ─▶ roles.pb, directory.pb ─▶ sealed configuration (last) ─▶ Home
//! ```
//! Every step is idempotent, so a restart of the control plane repeats it safely, and
//! so does a start resuming an interrupted bootstrap ([`prepare`]):
//! etcd's membership proves its data is this node's; CAs an earlier attempt stored are
//! taken from etcd (the peer CA's key exists nowhere else), and when none was stored the
//! ones made for this attempt are, and the peer files are rewritten for them. etcd data
//! from a first start that never answered (no `data/etcd/bootstrap-ready`, written
//! when it first does) is removed instead: its log may lack the cluster's first
//! membership entry, without which etcd never elects a leader.
//!
//! A start path: may not start runnables or touch shared values; it is handed a running
//! etcd by the control plane.

use std::net::IpAddr;

use anyhow::{Context as _, Result, anyhow};
use consensus::Running;
use curator::BootstrapRecords;
use identity::NodeKey;
use pki::{CA_LIFETIME, Ca};
use proto::config::{ClusterBootstrap, ClusterConfiguration, SealedConfiguration};
use proto::state::{ConsensusMemberRole, Node, NodeRoles, NodeState};

use crate::disk::files::{
    PEER_FILES, read_node_key, read_pem_certificate, save_member_files, write_peer_files,
};
use crate::disk::storage::{Root, dir_non_empty, read_file, read_proto, write_atomic, write_proto};
use crate::process::crash::crash_point;
use crate::start::decision::BootstrapTrace;
use crate::state::membership::BootstrapData;

/// A failed step is either worth retrying (etcd hiccup) or proof that this root cannot
/// come up as its cluster (mismatched identity).
pub enum Step {
    Retry(anyhow::Error),
    Fatal(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Step {
    fn from(e: E) -> Self {
        Step::Retry(e.into())
    }
}

/// Bootstrap, up to the point where etcd can start. Resumes an interrupted bootstrap
/// (the decision checked that the root holds only its state): its node key is kept;
/// while etcd has no data yet, CAs and peer files are made anew.
pub fn prepare(
    root: &Root,
    address: IpAddr,
    parameters: ClusterBootstrap,
) -> Result<BootstrapData> {
    let configuration = parameters
        .initial_cluster_configuration
        .clone()
        .unwrap_or_default();
    curator::templates::check_configuration(&configuration)
        .context("the bootstrap parameters' cluster configuration is unusable")?;
    proto::quota::effective_quota(configuration.etcd_quota_bytes)
        .context("the bootstrap parameters' etcd quota is unusable")?;
    let lifetime = curator::templates::node_certificate_lifetime(Some(&configuration));
    let record = root.bootstrap_record();
    let resumed = record.exists();
    if !resumed {
        // First, so that anything written after it is known to be this bootstrap's.
        write_proto(&record, &parameters).context("recording the bootstrap parameters")?;
    }
    let key_path = root.node_key();
    let key = if resumed && key_path.exists() {
        read_node_key(root)?
    } else {
        let key = NodeKey::generate().context("generating the node key")?;
        write_atomic(&key_path, key.pkcs8_der()).context("saving the node key")?;
        key
    };
    let node_id = key.node_id();
    let mut resumed_etcd = dir_non_empty(&root.etcd_data());
    if resumed && resumed_etcd && !root.etcd_bootstrap_ready().exists() {
        // etcd was killed before it ever answered. Its write-ahead log may exist without
        // the new cluster's first membership entry, and such a member never elects a
        // leader; nothing of this bootstrap was written into it yet (that starts once
        // etcd answers). It starts afresh: same member and cluster IDs, derived from the
        // node ID and address.
        let data = root.etcd_data();
        tracing::warn!(
            path = %data.display(),
            "etcd data of a first start that never became ready: removing it"
        );
        std::fs::remove_dir_all(&data)
            .with_context(|| format!("removing never-ready etcd data {}", data.display()))?;
        resumed_etcd = false;
    }
    if resumed {
        tracing::info!(node_id, resumed_etcd, "resuming an interrupted bootstrap");
    } else {
        tracing::info!(node_id, "bootstrapping a new cluster");
    }
    crash_point("node-key");
    // When etcd already has data, the CAs it may hold are only known once it runs;
    // these are used if it holds none (see `bootstrap::finish`).
    let cluster_ca =
        Ca::generate("Polis Cluster CA", CA_LIFETIME).context("creating the cluster CA")?;
    let peer_ca =
        Ca::generate("Polis etcd Peer CA", CA_LIFETIME).context("creating the etcd peer CA")?;
    let peer_certificate = peer_ca
        .issue(
            &curator::templates::peer_certificate_template(&node_id, address, lifetime),
            &key.public_key(),
        )
        .context("issuing the etcd peer certificate")?;
    if !resumed_etcd {
        let crl = peer_ca.crl(&[], 1).context("creating the etcd peer CRL")?;
        write_peer_files(
            root,
            &key,
            std::slice::from_ref(&peer_ca.cert_der),
            &peer_certificate.der,
            &crl,
        )
        .context("writing etcd peer TLS files")?;
    }
    crash_point("peer-files");
    Ok(BootstrapData {
        key,
        parameters,
        cluster_ca,
        peer_ca,
        peer_certificate,
        resumed_etcd,
    })
}

/// What an interrupted bootstrap left in the root, judged against `parameters` (the
/// bootstrap parameters of this start, if any); `None` when the root holds no
/// bootstrap record. Reads only.
pub fn trace(root: &Root, parameters: Option<&ClusterBootstrap>) -> Result<Option<BootstrapTrace>> {
    let record_path = root.bootstrap_record();
    if !record_path.exists() {
        return Ok(None);
    }
    let recorded: ClusterBootstrap = read_proto(&record_path, "bootstrap record")?;
    let same_parameters = parameters == Some(&recorded);
    let foreign = foreign_state(root).with_context(|| {
        format!(
            "checking what the interrupted bootstrap in {} left",
            root.root.display()
        )
    })?;
    Ok(Some(BootstrapTrace {
        same_parameters,
        foreign,
    }))
}

/// Why state in the root is not the recorded bootstrap's, if it is not.
fn foreign_state(root: &Root) -> Result<Option<String>> {
    let etcd_data = dir_non_empty(&root.etcd_data());
    let key_path = root.node_key();
    if !key_path.exists() {
        let others = [root.node_certificate(), root.cluster_ca()];
        return Ok(if etcd_data || others.iter().any(|p| p.exists()) {
            Some("etcd data or node credentials without the node key".into())
        } else {
            None
        });
    }
    let key = read_node_key(root)?;
    let public_key = key.public_key().to_vec();
    if root.node_certificate().exists() {
        let der = read_file(&root.node_certificate(), "node certificate")?;
        if pki::certificate_public_key(&der)? != public_key {
            return Ok(Some("the node certificate is for another key".into()));
        }
    }
    if etcd_data {
        for file in PEER_FILES {
            if !root.etcd_peer_dir().join(file).is_file() {
                return Ok(Some(format!("etcd data without the etcd peer file {file}")));
            }
        }
        let peer_certificate = read_pem_certificate(&root.etcd_peer_dir().join("cert.pem"))?;
        if pki::certificate_public_key(&peer_certificate)? != public_key {
            return Ok(Some("the etcd peer certificate is for another key".into()));
        }
    }
    Ok(None)
}

/// Writes the new cluster's state into etcd, then the sealed configuration (last).
/// Every step is idempotent, so a restart of this runnable repeats it safely.
pub async fn finish(
    root: &Root,
    address: IpAddr,
    running: &Running,
    b: &BootstrapData,
) -> Result<(), Step> {
    let ready_marker = root.etcd_bootstrap_ready();
    if !ready_marker.exists() {
        write_atomic(&ready_marker, b"").context("recording that etcd answered")?;
    }
    crash_point("etcd-ready");
    let node_id = b.key.node_id();
    check_only_member(running, &node_id, address).await?;
    let curator_ns = running.namespaced(curator::layout::NAMESPACE);
    let cluster_pki = curator::cluster_pki(&curator_ns);
    let etcd_pki = curator::layout::etcd_pki(running.client.clone());

    let (cluster_ca, _) = cluster_pki
        .ensure_ca(|| Ok(b.cluster_ca.clone()))
        .await
        .context("storing the cluster CA")?;
    let (peer_ca, _) = etcd_pki
        .ensure_ca(|| Ok(b.peer_ca.clone()))
        .await
        .context("storing the etcd peer CA")?;
    crash_point("cluster-pki");
    // A new etcd holds exactly the CAs just stored; other ones can only be those an
    // earlier attempt of this bootstrap stored (etcd's only member is this node).
    if !b.resumed_etcd && (cluster_ca != b.cluster_ca || peer_ca != b.peer_ca) {
        return Err(Step::Fatal(anyhow!(
            "etcd already holds CAs other than the ones this bootstrap created"
        )));
    }
    let peer_certificate = if peer_ca == b.peer_ca {
        if b.resumed_etcd {
            // etcd runs with the files of an attempt whose peer CA was never stored (its
            // key is lost): replace them with this attempt's, which are (etcd reads
            // them per handshake; a one-member cluster has no peer to lose meanwhile).
            let crl = etcd_pki.crl().await.context("loading the etcd peer CRL")?;
            write_peer_files(
                root,
                &b.key,
                std::slice::from_ref(&peer_ca.cert_der),
                &b.peer_certificate.der,
                &crl,
            )
            .context("rewriting etcd peer TLS files")?;
        }
        b.peer_certificate.clone()
    } else {
        stored_attempt_peer_certificate(root, &peer_ca, &b.key)?
    };
    etcd_pki
        .ensure_certificate(&curator::layout::peer_certificate_prefix(&node_id), || {
            Ok(peer_certificate.clone())
        })
        .await
        .context("recording the etcd peer certificate")?;
    let lifetime = curator::templates::node_certificate_lifetime(
        b.parameters.initial_cluster_configuration.as_ref(),
    );
    save_node_certificate(root, &cluster_pki, &cluster_ca, &b.key, address, lifetime).await?;
    crash_point("node-certificate");

    // An encrypted data device: its join key and cluster half (still in the ESP).
    let data = crate::disk::datakeys::registration(root).map_err(Step::Retry)?;
    let records = BootstrapRecords {
        node: Node {
            id: node_id.clone(),
            public_key: b.key.public_key().to_vec(),
            state: NodeState::Up as i32,
            roles: Some(NodeRoles {
                consensus_member: Some(ConsensusMemberRole {
                    member_id: running.member_id,
                    removal_pending: false,
                }),
                ..Default::default()
            }),
            address: address.to_string(),
            labels: b.parameters.labels.clone(),
            data_join_key: data.as_ref().map(|d| d.0.clone()).unwrap_or_default(),
            data_cluster_half: data.map(|d| d.1).unwrap_or_default(),
            ..Default::default()
        },
        owner_public_key: b.parameters.owner_public_key.clone(),
        configuration: b
            .parameters
            .initial_cluster_configuration
            .clone()
            .unwrap_or_else(|| ClusterConfiguration {
                cluster_domain: "polis.internal".into(),
                ..Default::default()
            }),
    };
    match curator::create_bootstrap_records(&curator_ns, &records).await {
        Ok(()) => {}
        Err(e @ curator::CuratorError::BootstrapConflict { .. }) => {
            return Err(Step::Fatal(e.into()));
        }
        Err(e) => {
            return Err(Step::Retry(
                anyhow::Error::from(e).context("writing the cluster records"),
            ));
        }
    }
    crash_point("records");

    save_member_files(root, address)?;
    let sealed = SealedConfiguration {
        node_id,
        cluster_ca_certificate: cluster_ca.cert_der.clone(),
        address: address.to_string(),
        etcd_cluster_id: running.cluster_id,
        etcd_member_id: running.member_id,
    };
    write_proto(&root.sealed_configuration(), &sealed)
        .context("writing the sealed configuration")?;
    // Sealed: the record of a bootstrap in progress has served its purpose.
    if let Err(e) = std::fs::remove_file(root.bootstrap_record())
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("removing {}: {e}", root.bootstrap_record().display());
    }
    crash_point("sealed");
    tracing::info!(
        cluster_id = format!("{:x}", running.cluster_id),
        "bootstrap complete; sealed configuration written"
    );
    Ok(())
}

/// The node's certificate from the cluster CA in etcd (the one recorded as
/// `node-<id>`, issued now if there is none), saved with the CA's certificate in the
/// root. Used by the bootstrap and by a restore, which both found a cluster's only node
/// before any curator runs.
pub async fn save_node_certificate(
    root: &Root,
    cluster_pki: &pki::CaStore,
    cluster_ca: &Ca,
    key: &NodeKey,
    address: IpAddr,
    lifetime: std::time::Duration,
) -> Result<()> {
    let node_id = key.node_id();
    let node_certificate = cluster_pki
        .ensure_certificate(&curator::layout::node_certificate_prefix(&node_id), || {
            cluster_ca.issue(
                &curator::templates::node_certificate_template(&node_id, address, lifetime),
                &key.public_key(),
            )
        })
        .await
        .context("issuing the node certificate")?;
    write_atomic(&root.node_certificate(), &node_certificate)
        .context("saving the node certificate")?;
    write_atomic(&root.cluster_ca(), &cluster_ca.cert_der)
        .context("saving the cluster CA certificate")
}

/// The member ID etcd 3.4 gives the founding member of a new cluster: the first 8 bytes
/// (big-endian) of SHA-1 over its sorted peer URLs, joined, and the cluster token
/// (`computeMemberId` in etcd's membership package). Polis' token names the node, so
/// the ID is this node's and no other's, whatever etcd data is found.
pub fn founding_member_id(peer_url: &str, cluster_token: &str) -> u64 {
    let input = [peer_url.as_bytes(), cluster_token.as_bytes()].concat();
    let hash = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    let mut id = [0u8; 8];
    id.copy_from_slice(&hash.as_ref()[..8]);
    u64::from_be_bytes(id)
}

/// Refuses etcd data that is not this bootstrap's: its etcd must have exactly one
/// member, the one this node founded. (Member names prove nothing: etcd overwrites a
/// member's name with the `--name` it runs with.)
async fn check_only_member(running: &Running, node_id: &str, address: IpAddr) -> Result<(), Step> {
    let members = running
        .client
        .clone()
        .member_list()
        .await
        .context("listing etcd members")?;
    let ids: Vec<u64> = members.members().iter().map(|m| m.id()).collect();
    let peer_url = consensus::config::peer_url(address, consensus::config::PEER_PORT);
    let ours = founding_member_id(&peer_url, &format!("polis-{node_id}"));
    if ids != [ours] || running.member_id != ours {
        let ids: Vec<String> = ids.iter().map(|i| format!("{i:x}")).collect();
        return Err(Step::Fatal(anyhow!(
            "refusing to resume the bootstrap: its etcd data belongs to members {ids:?}, not only \
             to the member this node {node_id} founds ({ours:x}), so a start would create a second \
             cluster; to start over, remove the root's data directory (this destroys that etcd data)"
        )));
    }
    Ok(())
}

/// The peer certificate on disk, which an earlier attempt of this bootstrap issued from
/// the peer CA it stored in etcd: checked against that CA and the node key.
fn stored_attempt_peer_certificate(
    root: &Root,
    peer_ca: &pki::Ca,
    key: &identity::NodeKey,
) -> Result<pki::Issued, Step> {
    let read = |file: &str| read_pem_certificate(&root.etcd_peer_dir().join(file));
    let (ca, der) = (read("ca.pem")?, read("cert.pem")?);
    if ca != peer_ca.cert_der
        || pki::certificate_public_key(&der).map_err(anyhow::Error::from)? != key.public_key()
    {
        return Err(Step::Fatal(anyhow!(
            "the etcd peer files in {} are not those of the peer CA stored in etcd; refusing \
             to resume the bootstrap",
            root.etcd_peer_dir().display()
        )));
    }
    let serial = pki::certificate_serial(&der).map_err(anyhow::Error::from)?;
    Ok(pki::Issued { der, serial })
}
