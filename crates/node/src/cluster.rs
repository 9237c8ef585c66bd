//! The cluster manager: carries out the start decision and hands the result to the
//! role server.
//!
//! ```text
//!   main (preflight) ──Plan──▶ cluster manager ──Membership──▶ role server / controlplane
//!                                     │                              │
//!                                     └──── logs every change of ◀───┘ ClusterState
//! ```
//! Bootstrap prepares everything etcd needs to start (node key, both CAs, the peer
//! certificate, an empty peer CRL) on disk; the sealed configuration is only written by
//! the control plane once the cluster records are in etcd. It first records its
//! parameters in the root (`bootstrap.pb`): a crash at any later moment leaves a root
//! that resumes this same bootstrap when started with the same parameters (the node key
//! is kept; see `decision` and `bootstrap`), and refuses anything else — never a second
//! cluster.
//! Register (see `register`) runs here to its end (approval may take hours) and then
//! hands the role server the same data a join would.

use std::net::IpAddr;
use std::sync::Arc;

use std::net::SocketAddr;

use anyhow::{Context as _, Result, bail};
use identity::NodeKey;
use pki::{CA_LIFETIME, Ca, Issued};
use proto::config::{
    ClusterBootstrap, ClusterDirectory, ClusterRegister, LocalRoles, SealedConfiguration,
};

use crate::decision::{BootstrapTrace, ClusterState, Contact};
use crate::storage::{Root, dir_non_empty, pem, read_file, read_proto, write_atomic, write_proto};

/// What main decided and validated before the supervisor started.
#[derive(Debug, Clone)]
pub enum Plan {
    Bootstrap(ClusterBootstrap),
    /// Register parameters and where they came from (for messages).
    Register(Arc<ClusterRegister>, String),
    /// Join data is loaded and checked in preflight: it is only reads.
    Join(Arc<JoinData>),
}

/// Data for the role server: who this node is and how it belongs to its cluster.
#[derive(Debug, Clone)]
pub enum Membership {
    Bootstrap(Arc<BootstrapData>),
    Join(Arc<JoinData>),
}

impl Membership {
    pub fn key(&self) -> &NodeKey {
        match self {
            Membership::Bootstrap(b) => &b.key,
            Membership::Join(j) => &j.key,
        }
    }

    /// Whether this node runs etcd and a curator.
    pub fn consensus_member(&self) -> bool {
        match self {
            Membership::Bootstrap(_) => true,
            Membership::Join(j) => j.roles.consensus_member,
        }
    }
}

#[derive(Debug)]
pub struct BootstrapData {
    pub key: NodeKey,
    pub parameters: ClusterBootstrap,
    pub cluster_ca: Ca,
    pub peer_ca: Ca,
    pub peer_certificate: Issued,
    /// An earlier attempt of this bootstrap left etcd data: etcd starts with that
    /// attempt's peer files, and `bootstrap::finish` takes the CAs it stored, if any.
    pub resumed_etcd: bool,
}

#[derive(Debug)]
pub struct JoinData {
    pub key: NodeKey,
    pub sealed: SealedConfiguration,
    /// Roles as last seen from the cluster.
    pub roles: LocalRoles,
    /// Curators as last seen from the cluster.
    pub directory: Vec<SocketAddr>,
}

/// Shared values of one node.
#[derive(Clone)]
pub struct NodeValues {
    pub membership: event::Value<Membership>,
    pub cluster_state: event::Value<ClusterState>,
    /// The cluster's curators as this node last learned them (cluster directory).
    pub curators: event::Value<Vec<SocketAddr>>,
    /// The node's roles: from the root at start, then as the cluster changes them.
    pub roles: event::Value<LocalRoles>,
    /// The newest cluster CRL seen (saved in `data/node/crl.der`): every call to a
    /// curator checks the curator's certificate against it.
    pub crl: rpc::CrlSlot,
    /// The node certificate and key every curator client and the curator's server use,
    /// loaded from the root once it holds them; replaced live on renewal (see
    /// `crate::renew`).
    pub credentials: NodeCredentials,
    /// Which of the node's services run (set by the control plane), for its status.
    pub services: event::Value<RunningServices>,
}

/// The node's credentials, shared by every user in the process: loaded from the root on
/// first use (a bootstrapping node writes its certificate only in `bootstrap::finish`).
#[derive(Clone, Default)]
pub struct NodeCredentials(std::sync::Arc<std::sync::Mutex<Option<rpc::CredentialSlot>>>);

impl NodeCredentials {
    /// The slot, loading it from `root` the first time.
    pub fn slot(&self, root: &crate::storage::Root) -> Result<rpc::CredentialSlot> {
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

/// Names the crash-point variable (see [`crash_point`]).
pub const CRASH_AFTER_VARIABLE: &str = "POLIS_CRASH_AFTER";

/// Test hook for crash safety, compiled in only with the `crash-points` feature (test
/// builds; release builds carry none of it): when `POLIS_CRASH_AFTER` names `step`, the
/// process kills itself with SIGKILL right after that step, exactly like `kill -9` (no
/// cleanup runs). Bootstrap steps: node-key, peer-files, etcd-ready, cluster-pki,
/// node-certificate, records, sealed. Register steps: register-key, register-foreign,
/// register-trusted, register-committed, register-credentials, register-sealed.
#[cfg(feature = "crash-points")]
pub fn crash_point(step: &str) {
    if std::env::var_os(CRASH_AFTER_VARIABLE).is_some_and(|v| v == step) {
        tracing::warn!(step, "{CRASH_AFTER_VARIABLE}: killing this process");
        // SAFETY: kill(2) on our own pid.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn crash_point(_step: &str) {}

/// Checked in preflight: a crash point that was asked for is armed (and says so, the
/// line tests wait for), or the start is refused, so that a test never passes because
/// the binary silently ignored its crash point.
pub fn check_crash_points() -> Result<()> {
    let Some(step) = std::env::var_os(CRASH_AFTER_VARIABLE) else {
        return Ok(());
    };
    if cfg!(feature = "crash-points") {
        tracing::warn!(step = %step.to_string_lossy(), "crash point armed");
        Ok(())
    } else {
        bail!(
            "{CRASH_AFTER_VARIABLE} is set, but this polis-node was built without crash points; \
             build it with `--features node/crash-points` (scripts/test does) or unset the variable"
        )
    }
}

/// Writes the etcd peer TLS files; the CRL is replaced atomically like every file.
pub fn write_peer_files(
    root: &Root,
    key: &NodeKey,
    ca: &[u8],
    cert: &[u8],
    crl: &[u8],
) -> Result<()> {
    let dir = root.etcd_peer_dir();
    write_atomic(&dir.join("key.pem"), &pem("PRIVATE KEY", key.pkcs8_der()))?;
    write_atomic(&dir.join("cert.pem"), &pem("CERTIFICATE", cert))?;
    write_atomic(&dir.join("ca.pem"), &pem("CERTIFICATE", ca))?;
    write_atomic(&dir.join("crl.pem"), &pem("X509 CRL", crl))?;
    Ok(())
}

/// The public key a PEM certificate file is for.
fn pem_certificate_key(path: &std::path::Path) -> Result<Vec<u8>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let der = pem::parse(text)
        .with_context(|| format!("{} is not PEM", path.display()))?
        .into_contents();
    Ok(pki::certificate_public_key(&der)?)
}

/// What an interrupted bootstrap left in the root, judged against `parameters` (the
/// bootstrap parameters of this start, if any); `None` when the root holds no
/// bootstrap record. Reads only.
pub fn bootstrap_trace(
    root: &Root,
    parameters: Option<&ClusterBootstrap>,
) -> Result<Option<BootstrapTrace>> {
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
    let key = NodeKey::from_pkcs8(&read_file(&key_path, "node key")?)
        .with_context(|| format!("node key in {} is corrupt", key_path.display()))?;
    let public_key = key.public_key().to_vec();
    if root.node_certificate().exists() {
        let der = read_file(&root.node_certificate(), "node certificate")?;
        if pki::certificate_public_key(&der)? != public_key {
            return Ok(Some("the node certificate is for another key".into()));
        }
    }
    if etcd_data {
        for file in ["key.pem", "cert.pem", "ca.pem", "crl.pem"] {
            if !root.etcd_peer_dir().join(file).is_file() {
                return Ok(Some(format!("etcd data without the etcd peer file {file}")));
            }
        }
        if pem_certificate_key(&root.etcd_peer_dir().join("cert.pem"))? != public_key {
            return Ok(Some("the etcd peer certificate is for another key".into()));
        }
    }
    Ok(None)
}

/// Bootstrap, up to the point where etcd can start. Resumes an interrupted bootstrap
/// (the decision checked that the root holds only its state): its node key is kept;
/// while etcd has no data yet, CAs and peer files are made anew.
pub fn prepare_bootstrap(
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
    let lifetime = curator::templates::node_certificate_lifetime(Some(&configuration));
    let record = root.bootstrap_record();
    let resumed = record.exists();
    if !resumed {
        // First, so that anything written after it is known to be this bootstrap's.
        write_proto(&record, &parameters).context("recording the bootstrap parameters")?;
    }
    let key_path = root.node_key();
    let key = if resumed && key_path.exists() {
        NodeKey::from_pkcs8(&read_file(&key_path, "node key")?)
            .with_context(|| format!("node key in {} is corrupt", key_path.display()))?
    } else {
        let key = NodeKey::generate().context("generating the node key")?;
        write_atomic(&key_path, key.pkcs8_der()).context("saving the node key")?;
        key
    };
    let node_id = key.node_id();
    let resumed_etcd = dir_non_empty(&root.etcd_data());
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
        write_peer_files(root, &key, &peer_ca.cert_der, &peer_certificate.der, &crl)
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

/// Join: load the node's identity and check it against the sealed configuration (reads
/// only, so that a refusal changes nothing).
pub fn prepare_join(root: &Root, sealed: SealedConfiguration) -> Result<JoinData> {
    let roles = local_roles(root, &sealed)?;
    let directory = read_directory(root)?;
    let key_path = root.node_key();
    let key = NodeKey::from_pkcs8(&read_file(&key_path, "node key")?)
        .with_context(|| format!("node key in {} is corrupt", key_path.display()))?;
    if key.node_id() != sealed.node_id {
        bail!(
            "node key in {} belongs to {}, but the sealed configuration is for {}",
            key_path.display(),
            key.node_id(),
            sealed.node_id
        );
    }
    if roles.consensus_member && crate::controlplane::has_etcd_data(root) {
        for file in ["key.pem", "cert.pem", "ca.pem", "crl.pem"] {
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
        })
    }
}

/// The curator endpoints saved in the root's cluster directory (empty when absent).
pub fn read_directory(root: &Root) -> Result<Vec<SocketAddr>> {
    let path = root.directory();
    if !path.exists() {
        return Ok(Vec::new());
    }
    let directory: ClusterDirectory = read_proto(&path, "cluster directory")?;
    crate::register::parse_endpoints(&directory.curator_endpoints)
        .with_context(|| format!("cluster directory {} is corrupt", path.display()))
}

/// Certificates are not renewed yet: say so loudly well before they run out.
fn warn_if_expiring(root: &Root) {
    const WARN_BEFORE: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);
    let peer = std::fs::read_to_string(root.etcd_peer_dir().join("cert.pem"))
        .ok()
        .and_then(|t| pem::parse(t).ok())
        .map(|p| p.into_contents());
    let node = std::fs::read(root.node_certificate()).ok();
    for (what, der) in [("node certificate", node), ("etcd peer certificate", peer)] {
        let Some(der) = der else { continue };
        match pki::time_to_expiry(&der) {
            Ok(None) => {
                tracing::error!("the {what} has expired; clients and peers will reject this node")
            }
            Ok(Some(left)) if left < WARN_BEFORE => tracing::warn!(
                days_left = left.as_secs() / 86400,
                "the {what} expires soon and is not renewed automatically yet"
            ),
            Ok(Some(_)) => {}
            Err(e) => tracing::warn!("cannot read the {what}: {e}"),
        }
    }
}

/// The node's roles from the role names the API uses.
pub fn roles_from_names(names: &[String]) -> LocalRoles {
    LocalRoles {
        consensus_member: names.iter().any(|r| r == proto::ROLE_CONSENSUS_MEMBER),
    }
}

/// Where this node looks for curators first: its own (a consensus member runs one),
/// then the cluster directory.
fn initial_curators(membership: &Membership, address: IpAddr) -> Vec<SocketAddr> {
    let mut endpoints = Vec::new();
    if membership.consensus_member() {
        endpoints.push(SocketAddr::new(address, rpc::CURATOR_PORT));
    }
    if let Membership::Join(j) = membership {
        for e in &j.directory {
            if !endpoints.contains(e) {
                endpoints.push(*e);
            }
        }
    }
    endpoints
}

/// The `root.cluster` runnable body: carry out the plan, then log cluster state changes.
pub async fn run(
    ctx: supervisor::Context,
    root: Root,
    address: IpAddr,
    plan: Plan,
    values: NodeValues,
    fatal: tokio::sync::mpsc::UnboundedSender<anyhow::Error>,
) -> supervisor::RunnableResult {
    // Logged from a runnable of its own: registration keeps this one busy for as long
    // as the owner takes to approve, and its states must show meanwhile.
    let logged = values.cluster_state.clone();
    ctx.run("state", move |ctx| {
        let mut state = logged.watch();
        async move {
            ctx.signal_healthy();
            loop {
                tokio::select! {
                    s = state.get() => match s {
                        Ok(s) => tracing::info!(cluster_state = %s, "cluster state changed"),
                        Err(_) => return Ok(()),
                    },
                    _ = ctx.cancelled() => return Ok(()),
                }
            }
        }
    })?;
    if values.membership.current().is_none() {
        let membership = match plan {
            Plan::Bootstrap(p) => {
                prepare_bootstrap(&root, address, p).map(|b| Membership::Bootstrap(Arc::new(b)))
            }
            Plan::Register(params, what) => {
                match crate::register::register(
                    &ctx,
                    &root,
                    address,
                    &params,
                    &what,
                    &values.cluster_state,
                )
                .await
                {
                    Ok(Some(j)) => Ok(Membership::Join(Arc::new(j))),
                    Ok(None) => return Ok(()),
                    Err(e) => Err(e),
                }
            }
            Plan::Join(j) => Ok(Membership::Join(j)),
        };
        match membership {
            Ok(m) => {
                values.curators.set(initial_curators(&m, address));
                values.roles.set(LocalRoles {
                    consensus_member: m.consensus_member(),
                });
                values.membership.set(m);
            }
            Err(e) => {
                // The decision is once per start: a failed attempt is not retried.
                let _ = fatal.send(e.context("cluster manager"));
                ctx.signal_done();
                return Ok(());
            }
        }
    }
    ctx.signal_healthy();
    ctx.cancelled().await;
    Ok(())
}
