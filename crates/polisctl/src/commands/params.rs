//! `params bootstrap` and `params register`: node parameters for the first node of a
//! new cluster, and for a node registering into this one.
//! May not change the cluster: it only reads the register ticket and the cluster's
//! information.

use std::path::Path;

use anyhow::{Context, Result, bail};
use prost::Message;
use proto::api;
use proto::config::{ClusterBootstrap, ClusterConfiguration, NodeParameters, node_parameters};

use crate::config_dir::{ensure_owner_key, write_private};
use crate::session::owner_session;

/// `params bootstrap`: parameters for the first node of a new cluster owned by the key in
/// `config` (created if absent).
pub(crate) fn bootstrap(
    config: &Path,
    out: &Path,
    cluster_domain: &str,
    labels: &[(String, String)],
    node_certificate_lifetime: Option<u64>,
    owner_certificate_lifetime: Option<u64>,
    etcd_quota: Option<u64>,
) -> Result<()> {
    let configuration = ClusterConfiguration {
        cluster_domain: cluster_domain.to_string(),
        node_certificate_lifetime_seconds: node_certificate_lifetime.unwrap_or(0),
        owner_certificate_lifetime_seconds: owner_certificate_lifetime.unwrap_or(0),
        etcd_quota_bytes: etcd_quota.unwrap_or(0),
    };
    write_bootstrap_params(config, out, configuration, labels)?;
    eprintln!("wrote bootstrap parameters to {}", out.display());
    Ok(())
}

/// `params register`: parameters for a new node to register into the cluster `config`
/// owns.
pub(crate) async fn register(
    config: &Path,
    endpoints: &[String],
    out: &Path,
    labels: &[(String, String)],
) -> Result<()> {
    write_register_params(config, endpoints, out, labels.to_vec()).await?;
    eprintln!("wrote register parameters to {}", out.display());
    Ok(())
}

/// Writes bootstrap parameters for a new cluster owned by the key in `config` (created
/// if absent).
pub(crate) fn write_bootstrap_params(
    config: &Path,
    out: &Path,
    configuration: ClusterConfiguration,
    labels: &[(String, String)],
) -> Result<()> {
    let labels: std::collections::BTreeMap<String, String> = labels.iter().cloned().collect();
    proto::labels::apply(&Default::default(), &labels, &[])?;
    let key = ensure_owner_key(config)?;
    let params = NodeParameters {
        cluster: Some(node_parameters::Cluster::Bootstrap(ClusterBootstrap {
            owner_public_key: key.public_key().to_vec(),
            initial_cluster_configuration: Some(configuration),
            labels: labels.into_iter().collect(),
        })),
    };
    write_private(out, &params.encode_to_vec())
        .with_context(|| format!("writing node parameters to {}", out.display()))
}

/// Writes register parameters for a new node of the cluster `config` owns.
pub(crate) async fn write_register_params(
    config: &Path,
    endpoints: &[String],
    out: &Path,
    labels: Vec<(String, String)>,
) -> Result<()> {
    let map: std::collections::BTreeMap<String, String> = labels.iter().cloned().collect();
    proto::labels::apply(&Default::default(), &map, &[])?;
    let register = register_parameters(config, endpoints, labels).await?;
    let params = NodeParameters {
        cluster: Some(node_parameters::Cluster::Register(register)),
    };
    write_private(out, &params.encode_to_vec())
        .with_context(|| format!("writing node parameters to {}", out.display()))
}

/// `params register`: parameters that let a new node register into this cluster.
async fn register_parameters(
    config: &Path,
    raw_endpoints: &[String],
    labels: Vec<(String, String)>,
) -> Result<proto::config::ClusterRegister> {
    let session = owner_session(config, raw_endpoints).await?;
    let ticket = session
        .management("reading the register ticket", |mut m| async move {
            m.get_register_ticket(api::GetRegisterTicketRequest {})
                .await
        })
        .await?
        .ticket;
    let info = session.cluster_info().await?;
    if info.curator_endpoints.is_empty() {
        bail!("the cluster names no curator endpoints; a new node could not reach it");
    }
    Ok(proto::config::ClusterRegister {
        register_ticket: ticket,
        ca_certificate: info.ca_certificate,
        curator_endpoints: info.curator_endpoints,
        labels: labels.into_iter().collect(),
    })
}
