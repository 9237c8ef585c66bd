//! Talking to curators: ownership, cluster information and node management.

use std::io::{BufRead, IsTerminal, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use identity::NodeKey;
use proto::api::{self, NodeHealth, NodeState};
use proto::state::NodeStatus;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::output::{self, Format};
use crate::{load_owner_key, owner_key_path, write_private};

/// How the operator approves the cluster CA on first contact.
pub enum CaApproval {
    Accept,
    Fingerprint(String),
    Ask,
}

fn owner_certificate_path(config: &Path) -> PathBuf {
    config.join("owner.pem")
}

fn ca_path(config: &Path) -> PathBuf {
    config.join("ca.pem")
}

/// The newest cluster CRL polisctl has seen: curators' certificates are checked
/// against it, so that a removed node cannot pose as one.
fn crl_path(config: &Path) -> PathBuf {
    config.join("crl.pem")
}

/// A CRL slot holding the saved CRL, if it checks out against `ca`.
fn saved_crl(config: &Path, ca: &[u8]) -> Result<rpc::CrlSlot> {
    let slot = rpc::CrlSlot::new();
    if let Some(crl) = read_pem(&crl_path(config), "X509 CRL", "cluster CRL")? {
        slot.offer(ca, &crl).with_context(|| {
            format!(
                "the saved cluster CRL {} is not this cluster's; remove it",
                crl_path(config).display()
            )
        })?;
    }
    Ok(slot)
}

fn read_pem(path: &Path, tag: &str, what: &str) -> Result<Option<Vec<u8>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {what} {}", path.display())),
    };
    let parsed = pem::parse(&text)
        .with_context(|| format!("{what} {} is not a PEM file", path.display()))?;
    if parsed.tag() != tag {
        bail!(
            "{what} {} holds a {}, not a {tag}",
            path.display(),
            parsed.tag()
        );
    }
    Ok(Some(parsed.into_contents()))
}

fn write_pem(path: &Path, tag: &str, der: &[u8]) -> Result<()> {
    write_private(path, pem::encode(&pem::Pem::new(tag, der)).as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn endpoints_path(config: &Path) -> PathBuf {
    config.join("endpoints")
}

fn parse_endpoints(raw: &[String]) -> Result<Vec<SocketAddr>> {
    Ok(rpc::parse_endpoints(raw)?)
}

/// The curators to talk to: `--endpoints` when given, else those remembered in the
/// config directory (written by `takeownership`, refreshed from the cluster).
fn endpoints(config: &Path, raw: &[String]) -> Result<Vec<SocketAddr>> {
    if !raw.is_empty() {
        return parse_endpoints(raw);
    }
    let path = endpoints_path(config);
    let remembered = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if remembered.is_empty() {
        bail!(
            "no curator endpoint given and none remembered in {}; pass --endpoints IP[:PORT]",
            path.display()
        );
    }
    parse_endpoints(&remembered).with_context(|| format!("{} is corrupt", path.display()))
}

/// Remembers the cluster's curators in the config directory (when they changed).
fn remember_endpoints(config: &Path, endpoints: &[String]) -> Result<()> {
    if endpoints.is_empty() {
        return Ok(());
    }
    let path = endpoints_path(config);
    let text = format!(
        "# curator endpoints, refreshed by polisctl from the cluster\n{}\n",
        endpoints.join("\n")
    );
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
        write_private(&path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Connects to the first reachable endpoint.
async fn connect(
    endpoints: &[SocketAddr],
    trust: &rpc::ServerTrust,
    credentials: Option<&rpc::Credentials>,
) -> Result<Channel> {
    let mut last = None;
    for e in endpoints {
        match rpc::connect(*e, trust, credentials).await {
            Ok(c) => return Ok(c),
            Err(err) => last = Some(err),
        }
    }
    Err(last
        .map(anyhow::Error::from)
        .unwrap_or_else(|| anyhow!("no endpoints")))
}

/// One-line description of a failed call.
fn call_error(what: &str, status: tonic::Status) -> anyhow::Error {
    use tonic::Code;
    let kind = match status.code() {
        Code::PermissionDenied => "permission denied",
        Code::Unauthenticated => "not authenticated",
        Code::NotFound => "not found",
        Code::InvalidArgument => "invalid argument",
        Code::Unavailable => "unavailable",
        Code::DeadlineExceeded => "timed out",
        _ => "failed",
    };
    anyhow!("{what}: {kind}: {}", status.message())
}

fn normalize_fingerprint(f: &str) -> String {
    f.trim()
        .trim_start_matches("SHA256:")
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase()
}

fn approve_ca(fingerprint: &str, approval: &CaApproval) -> Result<()> {
    match approval {
        CaApproval::Accept => Ok(()),
        CaApproval::Fingerprint(expected) => {
            if normalize_fingerprint(expected) == fingerprint {
                Ok(())
            } else {
                bail!(
                    "CA fingerprint mismatch: the cluster presents SHA256:{fingerprint}, expected {}",
                    expected.trim()
                )
            }
        }
        CaApproval::Ask => {
            if !std::io::stdin().is_terminal() {
                bail!(
                    "the cluster CA (SHA256:{fingerprint}) is not pinned yet and there is no terminal to confirm it; \
                     pass --accept-ca or --ca-fingerprint HEX"
                );
            }
            eprint!(
                "The cluster CA certificate has SHA-256 fingerprint\n  {fingerprint}\nPin it and continue? [y/N] "
            );
            std::io::stderr().flush().ok();
            let mut answer = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut answer)
                .context("reading the answer")?;
            if matches!(answer.trim(), "y" | "Y" | "yes" | "YES") {
                Ok(())
            } else {
                bail!("CA not accepted; nothing changed")
            }
        }
    }
}

pub async fn take_ownership(
    config: &Path,
    raw_endpoints: &[String],
    approval: CaApproval,
) -> Result<()> {
    let endpoints = endpoints(config, raw_endpoints)?;
    let key_path = owner_key_path(config);
    if !key_path.exists() {
        bail!(
            "no owner key at {}; it is created by `polisctl params bootstrap` for the cluster you own",
            key_path.display()
        );
    }
    let key = load_owner_key(&key_path)?;

    // First contact: fetch the CA over TLS without trusting the server yet.
    let channel = connect(&endpoints, &rpc::ServerTrust::FirstUse, None).await?;
    let ca = api::curator_local_client::CuratorLocalClient::new(channel)
        .get_ca_certificate(api::GetCaCertificateRequest {})
        .await
        .map_err(|s| call_error("fetching the cluster CA", s))?
        .into_inner()
        .ca_certificate;
    let fingerprint = rpc::fingerprint(&ca);
    match read_pem(&ca_path(config), "CERTIFICATE", "pinned CA")? {
        Some(pinned) if pinned == ca => {}
        Some(pinned) => bail!(
            "CA fingerprint mismatch: {} pins SHA256:{}, but the endpoint presents SHA256:{fingerprint}",
            ca_path(config).display(),
            rpc::fingerprint(&pinned)
        ),
        None => approve_ca(&fingerprint, &approval)?,
    }

    // Now with the CA pinned: prove the owner key and receive a certificate.
    let response = escrow(&endpoints, &ca, &key, &key_path, "taking ownership").await?;
    write_pem(&ca_path(config), "CERTIFICATE", &ca)?;
    write_pem(
        &owner_certificate_path(config),
        "CERTIFICATE",
        &response.owner_certificate,
    )?;
    // Remember the cluster's curators, so that later commands need no --endpoints.
    let session = OwnerSession::new(
        config,
        endpoints,
        ca.clone(),
        rpc::Credentials {
            certificate: response.owner_certificate.clone(),
            key_pkcs8: key.pkcs8_der().to_vec(),
        },
    )?;
    session.cluster_info().await?;
    println!("Took ownership of the cluster (CA SHA256:{fingerprint}).");
    println!(
        "Owner certificate: {}",
        owner_certificate_path(config).display()
    );
    Ok(())
}

/// The owner's connection to the cluster: pinned CA, CRL, owner certificate and key,
/// endpoints.
pub(crate) struct OwnerSession {
    client: rpc::CuratorClient,
    config: PathBuf,
    ca: Vec<u8>,
    crl: rpc::CrlSlot,
    /// Whether this session fetched the current CRL yet (once per command).
    crl_refreshed: std::sync::atomic::AtomicBool,
}

/// Proves the owner key (self-signed certificate) and receives a new owner certificate:
/// taking ownership, and renewing the owner certificate.
async fn escrow(
    endpoints: &[SocketAddr],
    ca: &[u8],
    key: &NodeKey,
    key_path: &Path,
    what: &str,
) -> Result<api::EscrowResponse> {
    let self_signed = rpc::self_signed(key)?;
    let trust = rpc::ServerTrust::PinnedCa(ca.to_vec());
    let public_key = key.public_key().to_vec();
    let client = rpc::CuratorClient::new(endpoints.to_vec(), trust, Some(self_signed))?;
    let response = client
        .call(|channel| {
            let public_key = public_key.clone();
            async move {
                api::aaa_client::AaaClient::new(channel)
                    .escrow(api::EscrowRequest { public_key })
                    .await
            }
        })
        .await
        .map_err(|f| match f {
            rpc::CallError::Status(s) if s.code() == tonic::Code::PermissionDenied => anyhow!(
                "{what}: permission denied: the key in {} is not this cluster's owner key",
                key_path.display()
            ),
            other => call_failure(what, other),
        })?;
    if response.ca_certificate != ca {
        bail!("the curator answered with a different CA than it presented; refusing");
    }
    Ok(response)
}

/// What to do with the stored owner certificate at `now` (Unix seconds): renew it once
/// 2/3 of its lifetime have passed (as nodes do), and refuse to go on without a
/// renewal once it has expired.
#[derive(Debug, PartialEq, Eq)]
enum OwnerCertificate {
    Fresh,
    RenewDue,
    Expired,
}

fn owner_certificate_state(validity: pki::Validity, now: u64) -> OwnerCertificate {
    if now >= validity.not_after {
        OwnerCertificate::Expired
    } else if now >= validity.renew_at() {
        OwnerCertificate::RenewDue
    } else {
        OwnerCertificate::Fresh
    }
}

/// Loads the owner's credentials, refusing early with a useful message when they are
/// missing. An owner certificate past 2/3 of its lifetime is renewed first (AAA.Escrow
/// with the owner key) and saved atomically; when that fails, a still valid one is used
/// (with a warning), an expired one is an error.
pub(crate) async fn owner_session(config: &Path, raw_endpoints: &[String]) -> Result<OwnerSession> {
    let endpoints = endpoints(config, raw_endpoints)?;
    let ca = read_pem(&ca_path(config), "CERTIFICATE", "pinned CA")?.ok_or_else(|| {
        anyhow!(
            "no pinned cluster CA in {}; run `polisctl takeownership` first",
            config.display()
        )
    })?;
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
    let state = owner_certificate_state(validity, pki::unix_now());
    if state != OwnerCertificate::Fresh {
        match escrow(
            &endpoints,
            &ca,
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
                eprintln!("polisctl: warning: {e:#}; using the current owner certificate");
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
        ca,
        rpc::Credentials {
            certificate,
            key_pkcs8: key.pkcs8_der().to_vec(),
        },
    )
}

impl OwnerSession {
    fn new(
        config: &Path,
        endpoints: Vec<SocketAddr>,
        ca: Vec<u8>,
        credentials: rpc::Credentials,
    ) -> Result<OwnerSession> {
        let crl = saved_crl(config, &ca)?;
        let trust = rpc::ServerTrust::ClusterCa {
            ca: ca.clone(),
            crl: crl.clone(),
        };
        Ok(OwnerSession {
            client: rpc::CuratorClient::new(endpoints, trust, Some(credentials))?,
            config: config.to_path_buf(),
            ca,
            crl,
            crl_refreshed: Default::default(),
        })
    }

    /// Fetches the cluster's current CRL from the curator that answered (once per
    /// session) and saves it when it is newer than the saved one. A failure only costs
    /// freshness: it is reported, not fatal.
    async fn refresh_crl(&self) {
        use std::sync::atomic::Ordering;
        if self.crl_refreshed.swap(true, Ordering::Relaxed) {
            return;
        }
        let fetched = self
            .client
            .call(|channel| async move {
                api::curator_local_client::CuratorLocalClient::new(channel)
                    .get_ca_certificate(api::GetCaCertificateRequest {})
                    .await
            })
            .await;
        let outcome = match fetched {
            Ok(answer) if answer.crl.is_empty() => Ok(()),
            Ok(answer) => match self.crl.offer(&self.ca, &answer.crl) {
                Ok(true) => write_pem(&crl_path(&self.config), "X509 CRL", &answer.crl),
                Ok(false) => Ok(()),
                Err(e) => Err(e.into()),
            },
            Err(e) => Err(anyhow!("{e}")),
        };
        if let Err(e) = outcome {
            eprintln!("polisctl: warning: refreshing the cluster CRL: {e:#}");
        }
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
        self.refresh_crl().await;
        Ok(answer)
    }

    /// Cluster information; refreshes the remembered curator endpoints on the way.
    async fn cluster_info(&self) -> Result<api::GetClusterInfoResponse> {
        let info = self
            .management("reading cluster info", |mut m| async move {
                m.get_cluster_info(api::GetClusterInfoRequest {}).await
            })
            .await?;
        remember_endpoints(&self.config, &info.curator_endpoints)?;
        Ok(info)
    }
}

/// One-line description of a failed call through the curator client.
fn call_failure(what: &str, failure: rpc::CallError) -> anyhow::Error {
    match failure {
        rpc::CallError::Unreachable(_) if failure.revoked_server() => anyhow!(
            "{what}: {failure}; a revoked certificate belongs to a node removed from the cluster: \
             name the cluster's current curators with --endpoints"
        ),
        rpc::CallError::Unreachable(_) if failure.all_untrusted() => anyhow!(
            "{what}: {failure}; the pinned CA is not this cluster's (another cluster at these endpoints?)"
        ),
        rpc::CallError::Unreachable(_) => anyhow!("{what}: {failure}"),
        rpc::CallError::Status(s) => call_error(what, s),
    }
}

pub(crate) fn state_name(state: i32) -> String {
    NodeState::try_from(state)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("NODE_STATE_")
                .to_string()
        })
        .unwrap_or_else(|_| format!("UNKNOWN({state})"))
}

fn health_name(health: i32) -> String {
    NodeHealth::try_from(health)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("NODE_HEALTH_")
                .to_string()
        })
        .unwrap_or_else(|_| format!("UNKNOWN({health})"))
}

fn parse_state(s: &str) -> Result<i32> {
    let name = format!("NODE_STATE_{}", s.to_ascii_uppercase());
    NodeState::from_str_name(&name)
        .map(|s| s as i32)
        .ok_or_else(|| {
            anyhow!(
                "unknown node state {s:?}; use NEW, STANDBY, UP, DECOMMISSIONING or DECOMMISSIONED"
            )
        })
}

fn node_json(n: &api::NodeInfo) -> Value {
    let labels: serde_json::Map<String, Value> = n
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({
        "id": n.id,
        "state": state_name(n.state),
        "roles": n.roles,
        "address": n.address,
        "health": health_name(n.health),
        "labels": labels,
        "public_key": hex_encode(&n.public_key),
        "time_since_heartbeat_ms": n.time_since_heartbeat_ms,
        "decommission_progress": n.decommission_progress,
        "warnings": n.warnings,
        "status": n.status.as_ref().map(status_json),
    })
}

/// The services a node reported running.
fn services(status: &NodeStatus) -> Vec<&'static str> {
    let mut running = Vec::new();
    if status.etcd_member_running {
        running.push("etcd-member");
    }
    if status.curator_running {
        running.push("curator");
    }
    running
}

fn status_json(status: &NodeStatus) -> Value {
    json!({
        "address": status.address,
        "version": status.version,
        "services": services(status),
        "etcd_member_running": status.etcd_member_running,
        "curator_running": status.curator_running,
        "started_at_unix_ms": status.started_at_unix_ms,
        "started_at": output::utc_time(status.started_at_unix_ms),
    })
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn print_node_list(nodes: &[api::NodeInfo], format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{}", Value::Array(nodes.iter().map(node_json).collect())),
        Format::Yaml => print!(
            "{}",
            output::yaml(&Value::Array(nodes.iter().map(node_json).collect()))
        ),
        Format::Table => {
            let rows: Vec<Vec<String>> = nodes
                .iter()
                .map(|n| {
                    let mut labels: Vec<String> =
                        n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    labels.sort();
                    let state = if n.decommission_progress.is_empty() {
                        state_name(n.state)
                    } else {
                        format!("{} ({})", state_name(n.state), n.decommission_progress)
                    };
                    vec![
                        n.id.clone(),
                        state,
                        health_name(n.health),
                        n.address.clone(),
                        n.roles.join(","),
                        labels.join(","),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &["ID", "STATE", "HEALTH", "ADDRESS", "ROLES", "LABELS"],
                    &rows
                )
            );
            for n in nodes {
                for w in &n.warnings {
                    println!("warning: node {}: {w}", n.id);
                }
            }
        }
    }
}

/// Every node, as the cluster lists it.
pub async fn list_nodes(config: &Path, raw_endpoints: &[String]) -> Result<Vec<api::NodeInfo>> {
    Ok(owner_session(config, raw_endpoints)
        .await?
        .management("listing nodes", |mut m| async move {
            m.list_nodes(api::ListNodesRequest::default()).await
        })
        .await?
        .nodes)
}

/// The IDs of the nodes in `state` (any state when `None`).
pub async fn list_ids(
    config: &Path,
    raw_endpoints: &[String],
    state: Option<&str>,
) -> Result<Vec<String>> {
    let state = state.map(parse_state).transpose()?;
    Ok(list_nodes(config, raw_endpoints)
        .await?
        .into_iter()
        .filter(|n| state.is_none_or(|s| n.state == s))
        .map(|n| n.id)
        .collect())
}

pub async fn node_list(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
    state: Option<&str>,
    role: Option<&str>,
    labels: &[(String, String)],
) -> Result<()> {
    let request = api::ListNodesRequest {
        state: state.map(parse_state).transpose()?.unwrap_or(0),
        role: role.unwrap_or_default().to_string(),
        labels: labels.iter().cloned().collect(),
    };
    let nodes = owner_session(config, raw_endpoints)
        .await?
        .management("listing nodes", |mut m| {
            let request = request.clone();
            async move { m.list_nodes(request).await }
        })
        .await?
        .nodes;
    print_node_list(&nodes, format);
    Ok(())
}

fn print_node(node: &api::NodeInfo, format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{}", node_json(node)),
        Format::Yaml => print!("{}", output::yaml(&node_json(node))),
        Format::Table => {
            let mut labels: Vec<String> = node
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            labels.sort();
            let heartbeat = node
                .time_since_heartbeat_ms
                .map(|ms| format!("{:.1} s ago", ms as f64 / 1000.0))
                .unwrap_or_else(|| "never (since the current leader took over)".into());
            println!("ID:          {}", node.id);
            println!("State:       {}", state_name(node.state));
            println!("Health:      {}", health_name(node.health));
            println!("Heartbeat:   {heartbeat}");
            println!("Address:     {}", node.address);
            println!("Roles:       {}", node.roles.join(", "));
            println!("Labels:      {}", labels.join(", "));
            println!("Public key:  {}", hex_encode(&node.public_key));
            if !node.decommission_progress.is_empty() {
                println!("Decommission: {}", node.decommission_progress);
            }
            for w in &node.warnings {
                println!("Warning:     {w}");
            }
            match &node.status {
                None => println!("Status:      not reported yet"),
                Some(status) => {
                    let running = services(status);
                    println!("Status:");
                    println!("  Address:   {}", status.address);
                    println!("  Version:   {}", status.version);
                    println!(
                        "  Services:  {}",
                        if running.is_empty() {
                            "none".to_string()
                        } else {
                            running.join(", ")
                        }
                    );
                    println!(
                        "  Started:   {}",
                        output::utc_time(status.started_at_unix_ms)
                    );
                }
            }
        }
    }
}

pub async fn node_describe(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
    id: &str,
) -> Result<()> {
    let node = owner_session(config, raw_endpoints)
        .await?
        .management(&format!("describing node {id}"), |mut m| async move {
            m.describe_node(api::DescribeNodeRequest { id: id.to_string() })
                .await
        })
        .await?;
    print_node(&node, format);
    Ok(())
}

/// Label changes from the command line: labels to set and keys to remove.
#[derive(Debug, Default, PartialEq)]
pub struct LabelChanges {
    pub upsert: Vec<(String, String)>,
    pub delete: Vec<String>,
}

/// Splits `KEY=VALUE` (set) and `KEY-` (remove) arguments.
pub fn parse_label_changes(changes: &[String]) -> Result<LabelChanges> {
    let LabelChanges {
        mut upsert,
        mut delete,
    } = LabelChanges::default();
    for c in changes {
        if let Some((k, v)) = c.split_once('=') {
            upsert.push((k.to_string(), v.to_string()));
        } else if let Some(k) = c.strip_suffix('-') {
            delete.push(k.to_string());
        } else {
            bail!("label change {c:?} is neither KEY=VALUE nor KEY-");
        }
    }
    Ok(LabelChanges { upsert, delete })
}

pub async fn node_label(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
    id: &str,
    changes: &[String],
) -> Result<()> {
    let LabelChanges { upsert, delete } = parse_label_changes(changes)?;
    for (k, v) in &upsert {
        proto::labels::validate_key(k)?;
        proto::labels::validate_value(k, v)?;
    }
    for k in &delete {
        proto::labels::validate_key(k)?;
    }
    let request = api::UpdateNodeLabelsRequest {
        id: id.to_string(),
        upsert: upsert.into_iter().collect(),
        delete,
    };
    let response = owner_session(config, raw_endpoints)
        .await?
        .management(&format!("labelling node {id}"), |mut m| {
            let request = request.clone();
            async move { m.update_node_labels(request).await }
        })
        .await?;
    if let Some(node) = response.node {
        print_node(&node, format);
    }
    Ok(())
}

pub async fn cluster_info(config: &Path, raw_endpoints: &[String], format: Format) -> Result<()> {
    let info = owner_session(config, raw_endpoints)
        .await?
        .cluster_info()
        .await?;
    let fingerprint = rpc::fingerprint(&info.ca_certificate);
    let domain = info
        .cluster_configuration
        .map(|c| c.cluster_domain)
        .unwrap_or_default();
    let value = json!({
        "ca_fingerprint": fingerprint,
        "cluster_domain": domain,
        "curator_endpoints": info.curator_endpoints,
        "node_count": info.node_count,
    });
    match format {
        Format::Quiet => {}
        Format::Json => println!("{value}"),
        Format::Yaml => print!("{}", output::yaml(&value)),
        Format::Table => {
            println!("CA fingerprint:    SHA256:{fingerprint}");
            println!("Cluster domain:    {domain}");
            println!("Curators:          {}", info.curator_endpoints.join(", "));
            println!("Nodes:             {}", info.node_count);
        }
    }
    Ok(())
}

/// `params register`: parameters that let a new node register into this cluster.
pub async fn register_parameters(
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

/// `cluster rotate-ticket`.
pub async fn rotate_ticket(config: &Path, raw_endpoints: &[String]) -> Result<()> {
    owner_session(config, raw_endpoints)
        .await?
        .management("rotating the register ticket", |mut m| async move {
            m.rotate_register_ticket(api::RotateRegisterTicketRequest {})
                .await
        })
        .await?;
    println!(
        "Replaced the register ticket. Parameters made with the old one no longer let new nodes register; \
         nodes that already registered can still be approved."
    );
    Ok(())
}

/// `node approve`: approves each node (NEW → STANDBY); every ID is tried, and the
/// command fails if any approval failed.
pub async fn node_approve(
    config: &Path,
    raw_endpoints: &[String],
    ids: &[String],
    all_new: bool,
) -> Result<()> {
    let session = owner_session(config, raw_endpoints).await?;
    let mut ids = ids.to_vec();
    if all_new {
        let new = session
            .management("listing new nodes", |mut m| async move {
                m.list_nodes(api::ListNodesRequest {
                    state: NodeState::New as i32,
                    ..Default::default()
                })
                .await
            })
            .await?
            .nodes;
        if new.is_empty() && ids.is_empty() {
            println!("No nodes wait for approval.");
            return Ok(());
        }
        ids.extend(new.into_iter().map(|n| n.id));
    }
    if ids.is_empty() {
        bail!("name the nodes to approve, or pass --all-new");
    }
    ids.dedup();
    let mut failed = 0;
    for id in &ids {
        if let Err(e) = identity::validate_node_id(id) {
            eprintln!("polisctl: approving {id}: {e}");
            failed += 1;
            continue;
        }
        let outcome = session
            .management(&format!("approving node {id}"), |mut m| async move {
                m.approve_node(api::ApproveNodeRequest { id: id.clone() })
                    .await
            })
            .await;
        match outcome {
            Ok(r) => {
                let state = r.node.map(|n| state_name(n.state)).unwrap_or_default();
                println!("approved {id} ({state})");
            }
            Err(e) => {
                eprintln!("polisctl: {e:#}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} approvals failed", ids.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_changes() {
        let LabelChanges {
            upsert: u,
            delete: d,
        } = parse_label_changes(&["a=1".into(), "b-".into(), "c=".into()]).unwrap();
        assert_eq!(u, vec![("a".into(), "1".into()), ("c".into(), "".into())]);
        assert_eq!(d, vec!["b".to_string()]);
        assert!(parse_label_changes(&["bad".into()]).is_err());
    }

    #[test]
    fn fingerprints_normalize() {
        assert_eq!(normalize_fingerprint("SHA256:AB:cd"), "abcd");
        assert!(approve_ca("abcd", &CaApproval::Fingerprint("AB:CD".into())).is_ok());
        let err = approve_ca("abcd", &CaApproval::Fingerprint("ffff".into())).unwrap_err();
        assert!(err.to_string().contains("mismatch"));
    }

    fn answer(
        member: u64,
        leader: u64,
        learner: bool,
        members: &[(u64, bool)],
    ) -> api::GetConsensusStatusResponse {
        api::GetConsensusStatusResponse {
            node_id: format!("n{member}"),
            member_id: member,
            cluster_id: 1,
            leader_id: leader,
            raft_index: 10,
            raft_term: 2,
            is_learner: learner,
            members: members
                .iter()
                .map(|(id, learner)| api::ConsensusMember {
                    id: *id,
                    name: format!("n{id}"),
                    peer_urls: vec![],
                    is_learner: *learner,
                })
                .collect(),
        }
    }

    #[test]
    fn cluster_status_needs_a_majority_of_voters_agreeing_on_a_leader() {
        let three = [(1, false), (2, false), (3, false)];
        // All three answer and agree.
        let (members, quorum) = summarize(&[
            answer(1, 1, false, &three),
            answer(2, 1, false, &three),
            answer(3, 1, false, &three),
        ]);
        assert!(quorum);
        assert_eq!(
            members
                .iter()
                .filter(|m| m.leader)
                .map(|m| m.id)
                .collect::<Vec<_>>(),
            [1]
        );
        // Two of three agree: still a quorum; the silent one shows as not answering.
        let (members, quorum) =
            summarize(&[answer(1, 1, false, &three), answer(2, 1, false, &three)]);
        assert!(quorum);
        assert!(members.iter().any(|m| m.id == 3 && m.raft.is_none()));
        // One of three answers: no quorum.
        assert!(!summarize(&[answer(1, 1, false, &three)]).1);
        // Nobody knows a leader: no quorum.
        assert!(!summarize(&[answer(1, 0, false, &three), answer(2, 0, false, &three)]).1);
        // A learner's answer does not count towards the quorum.
        let with_learner = [(1, false), (2, false), (3, true)];
        assert!(
            !summarize(&[
                answer(1, 1, false, &with_learner),
                answer(3, 1, true, &with_learner)
            ])
            .1
        );
        assert!(summarize(&[]).0.is_empty());
    }

    #[test]
    fn owner_certificates_renew_at_two_thirds() {
        let b = pki::BACKDATE.as_secs();
        let v = pki::Validity {
            not_before: 1000 - b,
            not_after: 1030,
        };
        for (now, expected) in [
            (1000, OwnerCertificate::Fresh),
            (1019, OwnerCertificate::Fresh),
            (1020, OwnerCertificate::RenewDue),
            (1029, OwnerCertificate::RenewDue),
            (1030, OwnerCertificate::Expired),
        ] {
            assert_eq!(owner_certificate_state(v, now), expected, "{now}");
        }
    }

    #[test]
    fn short_durations() {
        for (secs, text) in [
            (5, "5s"),
            (119, "119s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
        ] {
            assert_eq!(short_duration(secs), text);
        }
    }

    #[test]
    fn states_parse() {
        assert_eq!(parse_state("up").unwrap(), NodeState::Up as i32);
        assert!(parse_state("sideways").is_err());
        assert_eq!(state_name(NodeState::Up as i32), "UP");
    }
}

/// `cluster certificates`: every certificate the cluster's CAs issued.
pub async fn certificates(config: &Path, raw_endpoints: &[String], format: Format) -> Result<()> {
    let list = owner_session(config, raw_endpoints)
        .await?
        .management("listing certificates", |mut m| async move {
            m.list_certificates(api::ListCertificatesRequest {}).await
        })
        .await?
        .certificates;
    print_certificates(&list, pki::unix_now(), format);
    Ok(())
}

/// Seconds as a short human duration: "45s", "12m", "5h", "3d", "2y".
fn short_duration(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s if s < 2 * 365 * 86400 => format!("{}d", s / 86400),
        s => format!("{}y", s / (365 * 86400)),
    }
}

fn certificate_json(c: &api::CertificateInfo) -> Value {
    json!({
        "name": c.name,
        "kind": c.kind,
        "node": c.node_id,
        "serial": c.serial,
        "not_before_unix": c.not_before_unix,
        "not_after_unix": c.not_after_unix,
        "revoked": c.revoked,
        "current": c.current,
    })
}

fn print_certificates(list: &[api::CertificateInfo], now: u64, format: Format) {
    match format {
        Format::Quiet => {}
        Format::Json => println!(
            "{}",
            Value::Array(list.iter().map(certificate_json).collect())
        ),
        Format::Yaml => print!(
            "{}",
            output::yaml(&Value::Array(list.iter().map(certificate_json).collect()))
        ),
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|c| {
                    let expiry = if c.not_after_unix > now {
                        format!("in {}", short_duration(c.not_after_unix - now))
                    } else {
                        format!("expired {} ago", short_duration(now - c.not_after_unix))
                    };
                    vec![
                        c.kind.clone(),
                        if c.node_id.is_empty() {
                            "-".into()
                        } else {
                            c.node_id.clone()
                        },
                        c.serial.clone(),
                        expiry,
                        if c.revoked { "yes" } else { "no" }.into(),
                        if c.current { "*" } else { "" }.into(),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &["KIND", "NODE", "SERIAL", "EXPIRES", "REVOKED", "CURRENT"],
                    &rows
                )
            );
        }
    }
}

/// `node add-role` / `node remove-role`.
pub async fn node_roles(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
    id: &str,
    add: Vec<String>,
    remove: Vec<String>,
) -> Result<()> {
    identity::validate_node_id(id)?;
    let request = api::UpdateNodeRolesRequest {
        id: id.to_string(),
        add,
        remove,
    };
    let response = owner_session(config, raw_endpoints)
        .await?
        .management(&format!("changing the roles of node {id}"), |mut m| {
            let request = request.clone();
            async move { m.update_node_roles(request).await }
        })
        .await?;
    if let Some(node) = response.node {
        print_node(&node, format);
    }
    Ok(())
}

/// One etcd member as `cluster status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberStatus {
    pub id: u64,
    pub node: String,
    pub learner: bool,
    pub leader: bool,
    /// The member's own answer: (raft index, raft term), if it answered.
    pub raft: Option<(u64, u64)>,
}

/// What the cluster status adds up to (pure): the members, and whether the voters that
/// answered agree on a leader and are a majority of all voters.
pub fn summarize(answers: &[api::GetConsensusStatusResponse]) -> (Vec<MemberStatus>, bool) {
    let mut members: std::collections::BTreeMap<u64, MemberStatus> = Default::default();
    for a in answers {
        for m in &a.members {
            members.entry(m.id).or_insert(MemberStatus {
                id: m.id,
                node: m.name.clone(),
                learner: m.is_learner,
                leader: false,
                raft: None,
            });
        }
    }
    // The leader most answering voters name.
    let mut votes: std::collections::BTreeMap<u64, usize> = Default::default();
    for a in answers.iter().filter(|a| !a.is_learner && a.leader_id != 0) {
        *votes.entry(a.leader_id).or_default() += 1;
    }
    let leader = votes.iter().max_by_key(|(_, n)| **n).map(|(id, _)| *id);
    for a in answers {
        if let Some(m) = members.get_mut(&a.member_id) {
            m.raft = Some((a.raft_index, a.raft_term));
            m.learner = a.is_learner;
            if m.node.is_empty() {
                m.node = a.node_id.clone();
            }
        }
    }
    if let Some(l) = leader.and_then(|l| members.get_mut(&l)) {
        l.leader = true;
    }
    let voters = members.values().filter(|m| !m.learner).count();
    let agreeing = answers
        .iter()
        .filter(|a| !a.is_learner && Some(a.leader_id) == leader && a.leader_id != 0)
        .count();
    let quorum = voters > 0 && agreeing > voters / 2;
    (members.into_values().collect(), quorum)
}

/// `cluster status`: asks every curator's own etcd member (no quorum needed to answer),
/// shows the members, and fails when there is no quorum.
pub async fn cluster_status(config: &Path, raw_endpoints: &[String], format: Format) -> Result<()> {
    let (members, quorum, unreachable) = consensus_status(config, raw_endpoints).await?;
    // Node warnings need the leader, so only with a quorum; their absence is no error.
    let warnings: Vec<String> = if quorum {
        match list_nodes(config, raw_endpoints).await {
            Ok(nodes) => nodes
                .iter()
                .flat_map(|n| {
                    n.warnings
                        .iter()
                        .map(move |w| format!("node {}: {w}", n.id))
                })
                .collect(),
            Err(e) => vec![format!("could not list nodes for their warnings: {e:#}")],
        }
    } else {
        Vec::new()
    };
    print_status(&members, quorum, &unreachable, &warnings, format);
    if !quorum {
        bail!("the cluster has no etcd quorum");
    }
    Ok(())
}

/// The node IDs of the etcd voters, as the curators' own members report them.
pub async fn voters(config: &Path, raw_endpoints: &[String]) -> Result<Vec<String>> {
    let (members, _, _) = consensus_status(config, raw_endpoints).await?;
    Ok(members
        .into_iter()
        .filter(|m| !m.learner && m.raft.is_some())
        .map(|m| m.node)
        .collect())
}

/// Asks every curator it can find for its own etcd member's view.
async fn consensus_status(
    config: &Path,
    raw_endpoints: &[String],
) -> Result<(Vec<MemberStatus>, bool, Vec<String>)> {
    let session = owner_session(config, raw_endpoints).await?;
    let mut to_ask: Vec<SocketAddr> = session.client.endpoints();
    let mut asked = Vec::new();
    let mut answers: Vec<api::GetConsensusStatusResponse> = Vec::new();
    let mut unreachable = Vec::new();
    while let Some(endpoint) = to_ask.pop() {
        if asked.contains(&endpoint) {
            continue;
        }
        asked.push(endpoint);
        let answer = async {
            let channel = rpc::connect(endpoint, session.trust(), Some(&session.credentials()))
                .await
                .map_err(|e| e.to_string())?;
            api::curator_local_client::CuratorLocalClient::new(channel)
                .get_consensus_status(api::GetConsensusStatusRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.message().to_string())
        };
        match tokio::time::timeout(std::time::Duration::from_secs(5), answer).await {
            Ok(Ok(a)) => {
                // Every member runs a curator on its peer address.
                for m in &a.members {
                    for url in &m.peer_urls {
                        if let Some(ip) = rpc::url_address(url) {
                            to_ask.push(SocketAddr::new(ip, rpc::CURATOR_PORT));
                        }
                    }
                }
                answers.push(a);
            }
            Ok(Err(e)) => unreachable.push(format!("{endpoint}: {e}")),
            Err(_) => unreachable.push(format!("{endpoint}: no answer within 5 s")),
        }
    }
    let (members, quorum) = summarize(&answers);
    Ok((members, quorum, unreachable))
}

fn print_status(
    members: &[MemberStatus],
    quorum: bool,
    unreachable: &[String],
    warnings: &[String],
    format: Format,
) {
    let rows: Vec<Value> = members
        .iter()
        .map(|m| {
            json!({
                "member_id": format!("{:x}", m.id),
                "node": m.node,
                "role": if m.learner { "learner" } else { "voter" },
                "leader": m.leader,
                "raft_index": m.raft.map(|r| r.0),
                "raft_term": m.raft.map(|r| r.1),
                "answered": m.raft.is_some(),
            })
        })
        .collect();
    let value = json!({
        "quorum": quorum,
        "members": rows,
        "unreachable": unreachable,
        "warnings": warnings,
    });
    match format {
        Format::Quiet => {}
        Format::Json => println!("{value}"),
        Format::Yaml => print!("{}", output::yaml(&value)),
        Format::Table => {
            let table: Vec<Vec<String>> = members
                .iter()
                .map(|m| {
                    vec![
                        format!("{:x}", m.id),
                        if m.node.is_empty() {
                            "(not started)".into()
                        } else {
                            m.node.clone()
                        },
                        if m.learner { "learner" } else { "voter" }.into(),
                        if m.leader { "*" } else { "" }.into(),
                        m.raft
                            .map(|r| r.0.to_string())
                            .unwrap_or_else(|| "-".into()),
                        if m.raft.is_some() { "yes" } else { "NO" }.into(),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &["MEMBER", "NODE", "ROLE", "LEADER", "RAFT INDEX", "ANSWERS"],
                    &table
                )
            );
            for u in unreachable {
                println!("unreachable: {u}");
            }
            println!("quorum: {}", if quorum { "yes" } else { "NO" });
            for w in warnings {
                println!("warning: {w}");
            }
        }
    }
}

impl OwnerSession {
    fn trust(&self) -> &rpc::ServerTrust {
        self.client.trust()
    }
    fn credentials(&self) -> rpc::Credentials {
        self.client
            .credentials()
            .expect("an owner session always has credentials")
    }
}
