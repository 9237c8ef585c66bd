//! The owner's session with the cluster: loads the owner's credentials from the config
//! directory, renews the owner certificate once 2/3 of its lifetime have passed
//! (`escrow`), makes Management calls that follow the leader, refreshes the saved CRL
//! once per command, and maps failures to one-line errors (`errors`).
//! May not print results (commands and `render` do) nor parse the command line.

mod errors;
mod escrow;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use proto::api;
use tonic::transport::Channel;

use crate::config_dir::{
    ca_path, crl_path, endpoints, load_owner_key, owner_certificate_path, owner_key_path,
    pinned_cas, read_pem, remember_endpoints, saved_crl, saved_epoch, write_pem, write_pem_blocks,
};
use crate::output::escape_text;
use errors::call_failure;
pub(crate) use errors::{call_error, pinned_ca_unknown};
pub(crate) use escrow::escrow;
use escrow::{OwnerCertificate, owner_certificate_state};

/// Nodes asked for in one ListNodes call: ~20 KiB each at most (128 labels), so a
/// page stays far below the 4 MiB a client decodes.
pub(crate) const NODES_PAGE: u32 = 100;

/// The owner's connection to the cluster: pinned CA, CRL, owner certificate and key,
/// endpoints.
pub(crate) struct OwnerSession {
    client: rpc::CuratorClient,
    config: PathBuf,
    /// The CAs trusted (the signing one first) and their CRLs.
    crl: rpc::TrustSlot,
    /// Whether this session fetched the current CRL yet (once per command).
    crl_refreshed: std::sync::atomic::AtomicBool,
}

/// Loads the owner's credentials, refusing early with a useful message when they are
/// missing. An owner certificate past 2/3 of its lifetime is renewed first (AAA.Escrow
/// with the owner key) and saved atomically; when that fails, a still valid one is used
/// (with a warning), an expired one is an error.
pub(crate) async fn owner_session(config: &Path, raw_endpoints: &[String]) -> Result<OwnerSession> {
    let endpoints = endpoints(config, raw_endpoints)?;
    let mut cas = pinned_cas(config)?;
    // More than one CA pinned: a rotation was running when this configuration was last
    // used, and may have moved on (even finished) since. What the cluster trusts now is
    // asked first (no client certificate needed), so that an owner certificate of a CA
    // since replaced is renewed before it is refused.
    if cas.len() > 1 {
        match escrow::current_cas(&endpoints, saved_crl(config, &cas)?).await {
            Ok(current) if current != cas => {
                write_pem_blocks(&ca_path(config), "CERTIFICATE", &current)?;
                cas = current;
            }
            Ok(_) => {}
            Err(e) => eprintln!(
                "polisctl: warning: asking which CAs the cluster trusts: {}",
                escape_text(&format!("{e:#}"))
            ),
        }
    }
    let path = owner_certificate_path(config);
    let mut certificate =
        read_pem(&path, "CERTIFICATE", "owner certificate")?.ok_or_else(|| {
            anyhow!(
                "no owner certificate in {}; run `polisctl takeownership` first",
                config.display()
            )
        })?;
    let key_path = owner_key_path(config);
    let key = load_owner_key(&key_path)?;
    let validity = pki::Validity::of(&certificate)
        .with_context(|| format!("owner certificate {}", path.display()))?;
    let mut state = owner_certificate_state(validity, pki::unix_now());
    // A CA rotation made another CA sign (the first pinned): replaced at once.
    if state == OwnerCertificate::Fresh && !pki::issued_by(&certificate, &cas[0]) {
        state = OwnerCertificate::RenewDue;
    }
    if state != OwnerCertificate::Fresh {
        match escrow(
            &endpoints,
            &cas,
            &key,
            &key_path,
            "renewing the owner certificate",
        )
        .await
        {
            Ok(response) => {
                write_pem(&path, "CERTIFICATE", &response.owner_certificate)?;
                certificate = response.owner_certificate;
            }
            Err(e) if state == OwnerCertificate::RenewDue => {
                eprintln!(
                    "polisctl: warning: {}; using the current owner certificate",
                    escape_text(&format!("{e:#}"))
                );
            }
            Err(e) => {
                return Err(e.context(format!(
                    "the owner certificate {} has expired",
                    path.display()
                )));
            }
        }
    }
    OwnerSession::new(
        config,
        endpoints,
        &cas,
        rpc::Credentials {
            certificate,
            key_pkcs8: key.pkcs8_der().to_vec(),
        },
    )
}

impl OwnerSession {
    /// A session with these credentials, checking curators against `cas` and the saved
    /// CRLs.
    pub(crate) fn new(
        config: &Path,
        endpoints: Vec<SocketAddr>,
        cas: &[Vec<u8>],
        credentials: rpc::Credentials,
    ) -> Result<OwnerSession> {
        let crl = saved_crl(config, cas)?;
        let trust = rpc::ServerTrust::ClusterCa { trust: crl.clone() };
        Ok(OwnerSession {
            client: rpc::CuratorClient::new(endpoints, trust, Some(credentials))?
                .with_epoch(saved_epoch(config)?),
            config: config.to_path_buf(),
            crl,
            crl_refreshed: Default::default(),
        })
    }

    /// Fetches the cluster's current CAs and CRLs from the curator that answered (once
    /// per session) and saves them when they changed: how a configuration follows a CA
    /// rotation (its next session renews the owner certificate under the new CA). A
    /// failure only costs freshness: it is reported, not fatal.
    pub(crate) async fn refresh_trust(&self) {
        use std::sync::atomic::Ordering;
        if self.crl_refreshed.swap(true, Ordering::Relaxed) {
            return;
        }
        let fetched = self
            .client
            .call(|channel| async move {
                api::curator_local_client::CuratorLocalClient::new(channel)
                    .get_ca_certificate(api::GetCaCertificateRequest::default())
                    .await
            })
            .await;
        let outcome = match fetched {
            // A curator answered under the pinned CA: the pin is confirmed (the window
            // in which a handover of it is followed starts again).
            Ok(answer) => self
                .take_trust(answer)
                .and_then(|()| crate::config_dir::confirm_ca(&self.config)),
            Err(e) => Err(anyhow!("{e}")),
        };
        if let Err(e) = outcome {
            eprintln!(
                "polisctl: warning: refreshing the cluster CRL: {}",
                escape_text(&format!("{e:#}"))
            );
        }
    }

    fn take_trust(&self, answer: api::GetCaCertificateResponse) -> Result<()> {
        // Older curators name one CA and its CRL.
        let (cas, crls) = if answer.trusted_cas.is_empty() {
            (Vec::new(), vec![answer.crl])
        } else {
            (answer.trusted_cas, answer.crls)
        };
        if !cas.is_empty() && self.crl.trust(cas.clone())? {
            write_pem_blocks(&ca_path(&self.config), "CERTIFICATE", &cas)?;
            eprintln!(
                "polisctl: the cluster's CAs changed (a CA rotation); {} now pins {}",
                ca_path(&self.config).display(),
                cas.iter()
                    .map(|c| format!("SHA256:{}", rpc::fingerprint(c)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let mut changed = false;
        for crl in crls.iter().filter(|c| !c.is_empty()) {
            changed |= self.crl.offer(crl)?;
        }
        if changed {
            write_pem_blocks(
                &crl_path(&self.config),
                "X509 CRL",
                &self.crl.anchors().crls,
            )?;
        }
        Ok(())
    }

    /// A Management call, following the leader (see [`rpc::CuratorClient`]).
    pub(crate) async fn management<T, F, Fut>(&self, what: &str, call: F) -> Result<T>
    where
        F: Fn(api::management_client::ManagementClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let answer = self
            .client
            .call(|channel| call(api::management_client::ManagementClient::new(channel)))
            .await
            .map_err(|f| call_failure(what, f))?;
        self.refresh_trust().await;
        Ok(answer)
    }

    /// Every node `request` selects, asked for in pages of [`NODES_PAGE`] (one answer
    /// of a large cluster outgrows what a client decodes, 4 MiB).
    pub(crate) async fn list_nodes(
        &self,
        what: &str,
        request: api::ListNodesRequest,
    ) -> Result<Vec<api::NodeInfo>> {
        let mut nodes: Vec<api::NodeInfo> = Vec::new();
        loop {
            let page = api::ListNodesRequest {
                page_size: NODES_PAGE,
                after_id: nodes.last().map(|n| n.id.clone()).unwrap_or_default(),
                ..request.clone()
            };
            let answer = self
                .management(what, |mut m| {
                    let page = page.clone();
                    async move { m.list_nodes(page).await }
                })
                .await?;
            let progressed = answer.nodes.last().is_some_and(|n| n.id > page.after_id);
            nodes.extend(answer.nodes);
            if !answer.more {
                return Ok(nodes);
            }
            if !progressed {
                anyhow::bail!("{what}: the curator said more nodes follow but sent none");
            }
        }
    }

    /// The audit log as a stream of entries (following the leader to open it).
    pub(crate) async fn audit_log(
        &self,
        request: api::AuditLogRequest,
    ) -> Result<tonic::Streaming<api::AuditEntry>> {
        let stream = self
            .client
            .call(|channel| {
                let request = request.clone();
                async move {
                    api::audit_client::AuditClient::new(channel)
                        .audit_log(request)
                        .await
                }
            })
            .await
            .map_err(|f| call_failure("reading the audit log", f))?;
        Ok(stream)
    }

    /// Cluster information; refreshes the remembered curator endpoints on the way.
    pub(crate) async fn cluster_info(&self) -> Result<api::GetClusterInfoResponse> {
        let info = self
            .management("reading cluster info", |mut m| async move {
                m.get_cluster_info(api::GetClusterInfoRequest {}).await
            })
            .await?;
        remember_endpoints(&self.config, &info.curator_endpoints)?;
        Ok(info)
    }

    /// Management.RotateOwner: the cluster takes `new_public_key` as the owner's key and
    /// revokes every owner certificate, this session's included (so the CRL is not
    /// refreshed after it: this certificate can make no further call). Returns how many
    /// certificates were revoked.
    pub(crate) async fn rotate_owner(&self, new_public_key: Vec<u8>) -> Result<u32> {
        let answer = self
            .client
            .call(|channel| {
                let new_public_key = new_public_key.clone();
                async move {
                    api::management_client::ManagementClient::new(channel)
                        .rotate_owner(api::RotateOwnerRequest { new_public_key })
                        .await
                }
            })
            .await
            .map_err(|f| call_failure("rotating the owner key", f))?;
        Ok(answer.revoked)
    }

    /// The signing cluster CA as this session knows it (`CFG/ca.pem`, refreshed by its
    /// first call).
    pub(crate) fn pinned_ca(&self) -> Vec<u8> {
        self.crl.cas().into_iter().next().unwrap_or_default()
    }
    /// Every cluster CA this session trusts (DER), the signing one first: two while a
    /// rotation runs.
    pub(crate) fn cluster_cas(&self) -> Vec<Vec<u8>> {
        self.crl.cas()
    }
    /// The newest CRL of that CA this session has (saved, or refreshed by its first
    /// call): it lists every revocation of the cluster.
    pub(crate) fn crl(&self) -> Option<Vec<u8>> {
        self.crl.crl_of(&self.pinned_ca())
    }
    pub(crate) fn trust(&self) -> &rpc::ServerTrust {
        self.client.trust()
    }
    pub(crate) fn credentials(&self) -> rpc::Credentials {
        self.client
            .credentials()
            .expect("an owner session always has credentials")
    }

    /// The curators this session knows of.
    pub(crate) fn endpoints(&self) -> Vec<SocketAddr> {
        self.client.endpoints()
    }
}
