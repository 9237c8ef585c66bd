//! `polisctl kubernetes`: a person's way into the cluster's Kubernetes.
//!
//! - `credentials --out FILE`: a key made here, a short-lived client certificate for it
//!   from the curator (its Kubernetes group from the caller's Polis role; audited), and
//!   a kubeconfig (0600) with one context per controller, the first current.
//! - `proxy --listen ADDR`: a local TCP forwarder to the first controller's apiserver
//!   that accepts a connection (TLS passes through untouched: kubectl authenticates to
//!   the apiserver itself); a kubeconfig written with `--via ADDR` points at it and
//!   keeps working while any one controller is down, without editing it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use proto::api;

use crate::session::owner_session;

/// How often the proxy asks the curator for the controllers again.
const REFRESH: Duration = Duration::from_secs(30);

fn pem_text(tag: &str, der: &[u8]) -> String {
    pem::encode(&pem::Pem::new(tag, der.to_vec()))
}

/// The controllers' apiservers and a fresh credential.
async fn issue(
    config: &Path,
    raw_endpoints: &[String],
    lifetime: Option<Duration>,
) -> Result<(api::IssueKubernetesCredentialsResponse, String)> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
        .context("making a key for Kubernetes credentials")?;
    let request = api::IssueKubernetesCredentialsRequest {
        public_key: key.public_key_raw().to_vec(),
        lifetime_seconds: lifetime.map(|d| d.as_secs()).unwrap_or_default(),
    };
    let answer = owner_session(config, raw_endpoints)
        .await?
        .management("issuing Kubernetes credentials", |mut m| {
            let request = request.clone();
            async move { m.issue_kubernetes_credentials(request).await }
        })
        .await?;
    Ok((answer, key.serialize_pem()))
}

/// `kubernetes credentials`.
pub(crate) async fn credentials(
    config: &Path,
    raw_endpoints: &[String],
    out: &Path,
    lifetime: Option<Duration>,
    via: Option<SocketAddr>,
) -> Result<()> {
    let (answer, key_pem) = issue(config, raw_endpoints, lifetime).await?;
    if answer.apiservers.is_empty() && via.is_none() {
        bail!(
            "no node holds the KubernetesController role: add it to the consensus members \
             (polisctl node add-role ID KubernetesController)"
        );
    }
    let servers = match via {
        Some(proxy) => vec![format!("https://{proxy}")],
        None => answer.apiservers.clone(),
    };
    let text = kubernetes::config::user_kubeconfig(
        &servers,
        via.map(|_| "kubernetes"),
        &pem_text("CERTIFICATE", &answer.ca_certificate),
        &answer.user,
        &pem_text("CERTIFICATE", &answer.certificate),
        &key_pem,
    );
    privatefs::write_atomic(out, text.as_bytes())
        .with_context(|| format!("writing the kubeconfig to {}", out.display()))?;
    let expires = match pki::time_to_expiry(&answer.certificate) {
        Ok(Some(d)) => format!("{} s", d.as_secs()),
        _ => "?".into(),
    };
    eprintln!(
        "wrote {} for {} (group {}, expires in {expires}); apiservers: {}",
        out.display(),
        answer.user,
        answer.group,
        answer.apiservers.join(", ")
    );
    Ok(())
}

/// The apiservers of the UP nodes holding KubernetesController, by address.
async fn apiservers(config: &Path, raw_endpoints: &[String]) -> Result<Vec<SocketAddr>> {
    let mut list: Vec<SocketAddr> = crate::commands::node::list_nodes(config, raw_endpoints)
        .await?
        .iter()
        .filter(|n| n.state == api::NodeState::Up as i32)
        .filter(|n| {
            n.roles
                .iter()
                .any(|r| r == proto::ROLE_KUBERNETES_CONTROLLER)
        })
        .filter_map(|n| n.address.parse().ok())
        .map(|ip| SocketAddr::new(ip, kubernetes::certs::APISERVER_PORT))
        .collect();
    list.sort();
    Ok(list)
}

/// `kubernetes proxy`: runs until interrupted.
pub(crate) async fn proxy(
    config: &Path,
    raw_endpoints: &[String],
    listen: SocketAddr,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let targets = std::sync::Arc::new(std::sync::Mutex::new(
        apiservers(config, raw_endpoints).await?,
    ));
    eprintln!(
        "forwarding {listen} to the apiservers {:?} (the first that accepts)",
        targets.lock().expect("targets")
    );
    let (config, raw) = (config.to_path_buf(), raw_endpoints.to_vec());
    let refreshing = targets.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(REFRESH).await;
            match apiservers(&config, &raw).await {
                Ok(list) if !list.is_empty() => *refreshing.lock().expect("targets") = list,
                Ok(_) => {}
                Err(e) => eprintln!("refreshing the apiserver list: {e:#}"),
            }
        }
    });
    kubernetes::apiproxy::serve(listener, targets)
        .await
        .context("accepting a connection")
}
