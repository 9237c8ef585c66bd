//! The bootstrap of a new cluster, once its etcd runs: the cluster's PKI and records
//! go into etcd, the node's credentials onto disk, and the sealed configuration last.
//!
//! ```text
//!   cluster CA, etcd peer CA (ensure) ─▶ peer + node certificates ─▶ node files
//!     ─▶ node record + initial owner + cluster configuration (one create-if-absent txn)
//!     ─▶ roles.pb, directory.pb ─▶ sealed configuration (last) ─▶ Home
//! ```
//! Every step is idempotent, so a restart of the control plane repeats it safely.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context as _, anyhow};
use consensus::Running;
use curator::BootstrapRecords;
use proto::config::{ClusterConfiguration, LocalRoles, SealedConfiguration};
use proto::state::{ConsensusMemberRole, Node, NodeRoles, NodeState};

use crate::cluster::{BootstrapData, crash_point};
use crate::storage::{Root, write_atomic, write_proto};

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

/// Writes the new cluster's state into etcd, then the sealed configuration (last).
/// Every step is idempotent, so a restart of this runnable repeats it safely.
pub async fn finish(
    root: &Root,
    address: IpAddr,
    running: &Running,
    b: &BootstrapData,
) -> Result<(), Step> {
    crash_point("etcd-ready");
    let node_id = b.key.node_id();
    let curator_ns = running.namespaced(curator::state::NAMESPACE);
    let cluster_pki = curator::cluster_pki(&curator_ns);
    let etcd_pki = pki::CaStore::new(running.namespaced("etcd-pki"));

    let (cluster_ca, _) = cluster_pki
        .ensure_ca(|| Ok(b.cluster_ca.clone()))
        .await
        .context("storing the cluster CA")?;
    let (peer_ca, _) = etcd_pki
        .ensure_ca(|| Ok(b.peer_ca.clone()))
        .await
        .context("storing the etcd peer CA")?;
    crash_point("cluster-pki");
    if cluster_ca != b.cluster_ca || peer_ca != b.peer_ca {
        return Err(Step::Fatal(anyhow!(
            "etcd already holds CAs other than the ones this bootstrap created"
        )));
    }
    etcd_pki
        .ensure_certificate(&format!("peer-{node_id}"), || {
            Ok(b.peer_certificate.clone())
        })
        .await
        .context("recording the etcd peer certificate")?;
    let node_certificate = cluster_pki
        .ensure_certificate(&format!("node-{node_id}"), || {
            cluster_ca.issue(
                &curator::state::node_certificate_template(&node_id, address),
                &b.key.public_key(),
            )
        })
        .await
        .context("issuing the node certificate")?;
    write_atomic(&root.node_certificate(), &node_certificate)
        .context("saving the node certificate")?;
    write_atomic(&root.cluster_ca(), &cluster_ca.cert_der)
        .context("saving the cluster CA certificate")?;
    crash_point("node-certificate");

    let records = BootstrapRecords {
        node: Node {
            id: node_id.clone(),
            public_key: b.key.public_key().to_vec(),
            state: NodeState::Up as i32,
            roles: Some(NodeRoles {
                consensus_member: Some(ConsensusMemberRole {}),
            }),
            address: address.to_string(),
            labels: b.parameters.labels.clone(),
        },
        owner_public_key: b.parameters.owner_public_key.clone(),
        configuration: b
            .parameters
            .initial_cluster_configuration
            .clone()
            .unwrap_or_else(|| ClusterConfiguration {
                cluster_domain: "polis.internal".into(),
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

    write_proto(
        &root.local_roles(),
        &LocalRoles {
            consensus_member: true,
        },
    )
    .context("saving the node's roles")?;
    crate::roleserver::save_directory(
        root,
        &[SocketAddr::new(address, rpc::CURATOR_PORT).to_string()],
    )?;
    let sealed = SealedConfiguration {
        node_id,
        cluster_ca_certificate: cluster_ca.cert_der.clone(),
        address: address.to_string(),
        etcd_cluster_id: running.cluster_id,
        etcd_member_id: running.member_id,
    };
    write_proto(&root.sealed_configuration(), &sealed)
        .context("writing the sealed configuration")?;
    crash_point("sealed");
    tracing::info!(
        cluster_id = format!("{:x}", running.cluster_id),
        "bootstrap complete; sealed configuration written"
    );
    Ok(())
}
