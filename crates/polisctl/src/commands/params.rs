//! `params bootstrap` and `params register`: node parameters for the first node of a
//! new cluster, and for a node registering into this one.
//! Changes the cluster only by creating a register ticket (`params register`); reads the
//! cluster's information.

use std::path::Path;

use anyhow::{Context, Result, bail};
use prost::Message;
use proto::api;
use proto::config::{ClusterBootstrap, ClusterConfiguration, NodeParameters, node_parameters};

use crate::config_dir::{ensure_owner_key, write_private};
use crate::output::escape;
use crate::session::owner_session;

/// The cluster configuration `params bootstrap` was given (None: the default).
pub(crate) struct BootstrapSettings<'a> {
    pub(crate) cluster_domain: &'a str,
    pub(crate) node_certificate_lifetime: Option<u64>,
    pub(crate) owner_certificate_lifetime: Option<u64>,
    pub(crate) etcd_quota: Option<u64>,
    pub(crate) snapshot_interval: Option<u64>,
    pub(crate) snapshot_keep: Option<u32>,
    pub(crate) audit_max_entries: Option<u64>,
    pub(crate) audit_max_bytes: Option<u64>,
}

/// `params bootstrap`: parameters for the first node of a new cluster owned by the key in
/// `config` (created if absent).
pub(crate) fn bootstrap(
    config: &Path,
    out: &Path,
    labels: &[(String, String)],
    settings: BootstrapSettings<'_>,
) -> Result<()> {
    let configuration = ClusterConfiguration {
        cluster_domain: settings.cluster_domain.to_string(),
        node_certificate_lifetime_seconds: settings.node_certificate_lifetime.unwrap_or(0),
        owner_certificate_lifetime_seconds: settings.owner_certificate_lifetime.unwrap_or(0),
        etcd_quota_bytes: settings.etcd_quota.unwrap_or(0),
        snapshot_interval_seconds: settings.snapshot_interval.unwrap_or(0),
        snapshot_keep: settings.snapshot_keep.unwrap_or(0),
        audit_max_entries: settings.audit_max_entries.unwrap_or(0),
        audit_max_bytes: settings.audit_max_bytes.unwrap_or(0),
    };
    write_bootstrap_params(config, out, configuration, labels)?;
    eprintln!("wrote bootstrap parameters to {}", out.display());
    Ok(())
}

/// The register ticket `params register` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TicketSettings {
    /// 0: never expires.
    pub(crate) ttl_seconds: u64,
    /// None: unlimited.
    pub(crate) uses: Option<u32>,
}

impl Default for TicketSettings {
    /// What `params register` asks for without flags: 24 hours, unlimited uses.
    fn default() -> Self {
        TicketSettings {
            ttl_seconds: 24 * 3600,
            uses: None,
        }
    }
}

/// `params register`: parameters for a new node to register into the cluster `config`
/// owns, with a new ticket.
pub(crate) async fn register(
    config: &Path,
    endpoints: &[String],
    out: &Path,
    labels: &[(String, String)],
    ticket: TicketSettings,
) -> Result<()> {
    let id = write_register_params_with(config, endpoints, out, labels.to_vec(), ticket).await?;
    // The ticket ID is the cluster's answer.
    let id = escape(&id);
    eprintln!(
        "wrote register parameters to {} (register ticket {id}; `polisctl cluster ticket revoke {id}` revokes it)",
        out.display()
    );
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

/// Writes register parameters for a new node of the cluster `config` owns, with a new
/// ticket of the default lifetime.
pub(crate) async fn write_register_params(
    config: &Path,
    endpoints: &[String],
    out: &Path,
    labels: Vec<(String, String)>,
) -> Result<()> {
    write_register_params_with(config, endpoints, out, labels, TicketSettings::default())
        .await
        .map(|_| ())
}

/// Writes register parameters with a new ticket as `ticket` asks; returns its id.
async fn write_register_params_with(
    config: &Path,
    endpoints: &[String],
    out: &Path,
    labels: Vec<(String, String)>,
    ticket: TicketSettings,
) -> Result<String> {
    let map: std::collections::BTreeMap<String, String> = labels.iter().cloned().collect();
    proto::labels::apply(&Default::default(), &map, &[])?;
    let (register, id) = register_parameters(config, endpoints, labels, ticket).await?;
    let params = NodeParameters {
        cluster: Some(node_parameters::Cluster::Register(register)),
    };
    write_private(out, &params.encode_to_vec())
        .with_context(|| format!("writing node parameters to {}", out.display()))?;
    Ok(id)
}

/// `params register`: parameters that let a new node register into this cluster.
/// The parameters and the id of their ticket.
async fn register_parameters(
    config: &Path,
    raw_endpoints: &[String],
    labels: Vec<(String, String)>,
    settings: TicketSettings,
) -> Result<(proto::config::ClusterRegister, String)> {
    let session = owner_session(config, raw_endpoints).await?;
    // Read first: a ticket is created only once the parameters can be written.
    let info = session.cluster_info().await?;
    let created = session
        .management("creating a register ticket", |mut m| async move {
            m.create_register_ticket(api::CreateRegisterTicketRequest {
                ttl_seconds: settings.ttl_seconds,
                uses: settings.uses.unwrap_or(0),
            })
            .await
        })
        .await?;
    let id = created.info.map(|i| i.id).unwrap_or_default();
    let mut register = register_from(&session.pinned_ca(), info, created.ticket, labels)?;
    // The new node refuses curators this CRL revokes (a removed member's address among
    // the endpoints), even before it reaches one that hands out a newer CRL.
    register.crl = session.crl().unwrap_or_default();
    Ok((register, id))
}

/// Register parameters from a curator's answer: the CA a new node pins is the one this
/// owner pinned (`CFG/ca.pem`), never one a server handed out; an answer naming another
/// CA is refused.
fn register_from(
    pinned_ca: &[u8],
    info: api::GetClusterInfoResponse,
    ticket: Vec<u8>,
    labels: Vec<(String, String)>,
) -> Result<proto::config::ClusterRegister> {
    if info.ca_certificate != pinned_ca {
        bail!(
            "the curator answered with a cluster CA other than the pinned one (ca.pem in the \
             config directory); refusing to write parameters that would trust it"
        );
    }
    if info.curator_endpoints.is_empty() {
        bail!("the cluster names no curator endpoints; a new node could not reach it");
    }
    Ok(proto::config::ClusterRegister {
        register_ticket: ticket,
        ca_certificate: pinned_ca.to_vec(),
        curator_endpoints: info.curator_endpoints,
        labels: labels.into_iter().collect(),
        crl: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ca: &[u8]) -> api::GetClusterInfoResponse {
        api::GetClusterInfoResponse {
            ca_certificate: ca.to_vec(),
            curator_endpoints: vec!["127.0.0.2:7835".into()],
            ..Default::default()
        }
    }

    #[test]
    fn register_parameters_pin_the_owners_ca_never_the_servers() {
        let params = register_from(b"pinned", info(b"pinned"), vec![7; 32], vec![]).unwrap();
        assert_eq!(params.ca_certificate, b"pinned");
        let err = register_from(b"pinned", info(b"another"), vec![7; 32], vec![]).unwrap_err();
        assert!(
            err.to_string().contains("other than the pinned one"),
            "{err}"
        );
    }
}
