//! The KubernetesController role on a node: the runnable the role server starts.
//!
//! ```text
//!   root.role.kubernetes ─ binaries present? ─ keys made here ─▶ curator leader:
//!     │                    IssueKubernetesCertificates (node mTLS) ─▶ files in DIR (0600)
//!     ├─▶ tokenreview        the apiserver's token webhook: who a kubelet is, from
//!     │                      Polis's records (loopback :6445)
//!     ├─▶ etcdproxy          the apiserver's etcd: namespaced (etcdproxy), DIR/etcd.sock
//!     ├─▶ apiserver          kube-apiserver on ADDRESS:6443
//!     ├─▶ controllermanager  kube-controller-manager (leader-elected among controllers)
//!     ├─▶ scheduler          kube-scheduler (leader-elected among controllers)
//!     ├─▶ rbac               once the apiserver is ready: the bindings Polis keeps
//!     └─▶ nodesync           Nodes in step with Polis: labels (polis.dev/), a Node no
//!                            worker holds drained and deleted
//!   at 2/3 of the certificates' lifetime: issued again, files replaced, components
//!   restarted one by one (the other controllers serve meanwhile)
//! ```
//! A component that exits is restarted by the supervisor with its backoff, named in
//! the log and on the node's board (`board`: its restarts and last error in the node's
//! status). Stopping this runnable (the role taken away) stops every component.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use proto::api::{self, KubernetesCertificatePurpose as Purpose};

use crate::component;
use crate::config::{self, Layout};

/// What the role server hands this runnable.
#[derive(Clone)]
pub struct ControllerSettings {
    pub node_id: String,
    pub address: IpAddr,
    /// This node's Kubernetes folder (made 0700).
    pub dir: PathBuf,
    /// The folder with kube-apiserver, kube-controller-manager, kube-scheduler, kubectl.
    pub binaries: PathBuf,
    /// The local etcd member's client socket.
    pub etcd_socket: PathBuf,
    /// The components' certificate lifetime to ask for (`None`: the curator's default).
    pub certificate_lifetime: Option<Duration>,
    /// Asks the curator leader for certificates (the node's own mTLS client).
    pub issue: Issuer,
    /// Where each component's state is kept for the node's status.
    pub board: crate::board::ComponentBoard,
    /// What Polis's records say of a kubelet (the token webhook's question).
    pub kubelet_check: crate::tokenreview::KubeletCheck,
    /// The node records, watched (Nodes kept in step: `nodesync`).
    pub nodes: crate::nodesync::PolisNodesWatch,
}

pub type Issuer = Arc<
    dyn Fn(
            api::IssueKubernetesCertificatesRequest,
        ) -> BoxFuture<'static, Result<api::IssueKubernetesCertificatesResponse, String>>
        + Send
        + Sync,
>;

/// The components, in the order they start.
const COMPONENTS: [(&str, &str); 3] = [
    ("apiserver", "kube-apiserver"),
    ("controllermanager", "kube-controller-manager"),
    ("scheduler", "kube-scheduler"),
];

/// Every purpose a controller holds, and the file stem of each.
const PURPOSES: [(Purpose, &str); 6] = [
    (Purpose::ApiserverServing, "apiserver"),
    (Purpose::ApiserverKubeletClient, "kubelet-client"),
    (Purpose::ApiserverFrontProxyClient, "front-proxy-client"),
    (Purpose::ControllerManager, "controller-manager"),
    (Purpose::Scheduler, "scheduler"),
    (Purpose::PolisNodeAdmin, "polis-admin"),
];

fn pem(tag: &str, der: &[u8]) -> String {
    ::pem::encode(&::pem::Pem::new(tag, der.to_vec()))
}

pub(crate) fn write(path: PathBuf, contents: &[u8]) -> Result<(), String> {
    privatefs::write_atomic(&path, contents).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Makes a key per purpose, asks the curator for their certificates, and writes in
/// `dir` (made 0700) the Kubernetes CA (`ca.pem`) and each purpose's `STEM.key` and
/// `STEM.pem` (each replaced atomically); returns the curator's answer.
pub(crate) async fn issue_into(
    dir: &std::path::Path,
    lifetime: Option<Duration>,
    issue: &Issuer,
    purposes: &[(Purpose, &str)],
) -> Result<api::IssueKubernetesCertificatesResponse, String> {
    privatefs::ensure_private_dir(dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
    let mut keys = Vec::new();
    let mut request = api::IssueKubernetesCertificatesRequest {
        lifetime_seconds: lifetime.map(|d| d.as_secs()).unwrap_or_default(),
        ..Default::default()
    };
    for (purpose, stem) in purposes {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .map_err(|e| format!("making the {stem} key: {e}"))?;
        request.keys.push(api::KubernetesKey {
            purpose: *purpose as i32,
            public_key: key.public_key_raw().to_vec(),
        });
        keys.push((*purpose, *stem, key));
    }
    let issued = issue(request).await?;
    write(
        dir.join("ca.pem"),
        pem("CERTIFICATE", &issued.ca_certificate).as_bytes(),
    )?;
    for (purpose, stem, key) in keys {
        let cert = issued
            .certificates
            .iter()
            .find(|c| c.purpose == purpose as i32)
            .ok_or_else(|| format!("the curator issued no {stem} certificate"))?;
        write(
            dir.join(format!("{stem}.key")),
            key.serialize_pem().as_bytes(),
        )?;
        write(
            dir.join(format!("{stem}.pem")),
            pem("CERTIFICATE", &cert.certificate).as_bytes(),
        )?;
    }
    Ok(issued)
}

/// Every file the components read (see [`issue_into`]), with the front-proxy CA, the
/// service-account key and the kubeconfigs; returns the layout and the lifetime.
async fn credentials(settings: &ControllerSettings) -> Result<(Layout, Duration), String> {
    let issued = issue_into(
        &settings.dir,
        settings.certificate_lifetime,
        &settings.issue,
        &PURPOSES,
    )
    .await?;
    let layout = Layout {
        dir: settings.dir.clone(),
        address: settings.address,
        cluster_domain: issued.cluster_domain.clone(),
    };
    write(
        layout.path("front-proxy-ca.pem"),
        pem("CERTIFICATE", &issued.front_proxy_ca_certificate).as_bytes(),
    )?;
    write(layout.path("sa.key"), &issued.service_account_key_pem)?;
    write(
        layout.path("sa.pub"),
        &issued.service_account_public_key_pem,
    )?;
    write(
        layout.path("token-webhook.kubeconfig"),
        layout.token_webhook_kubeconfig().as_bytes(),
    )?;
    for user in ["controller-manager", "scheduler", "polis-admin"] {
        write(
            layout.path(&format!("{user}.kubeconfig")),
            layout.kubeconfig(user).as_bytes(),
        )?;
    }
    Ok((layout, Duration::from_secs(issued.lifetime_seconds.max(1))))
}

/// The component runnable `program` with `args`.
pub(crate) fn component_runnable(
    binaries: PathBuf,
    program: &'static str,
    args: Vec<String>,
    board: crate::board::ComponentBoard,
) -> impl Fn(supervisor::Context) -> BoxFuture<'static, supervisor::RunnableResult> + Send + Sync {
    move |ctx| {
        let (binaries, args, board) = (binaries.clone(), args.clone(), board.clone());
        Box::pin(async move {
            ctx.signal_healthy();
            board.started(program, crate::board::now_unix_ms());
            match component::run(&binaries, program, &args, ctx.cancelled()).await {
                Ok(()) => {
                    board.stopped(program);
                    Ok(())
                }
                Err(e) => {
                    board.exited(program, &e.to_string(), crate::board::now_unix_ms());
                    Err(e.into())
                }
            }
        })
    }
}

/// Waits for this node's apiserver to be ready, then applies the bindings Polis keeps.
async fn keep_rbac(
    ctx: supervisor::Context,
    binaries: PathBuf,
    layout: Layout,
) -> supervisor::RunnableResult {
    loop {
        let probe = crate::kubectl::kubectl(&binaries, &layout, &["get", "--raw", "/readyz"], None);
        let answer = tokio::select! {
            answer = probe => answer,
            () = ctx.cancelled() => return Ok(()),
        };
        let last = match answer {
            Ok(out) if out.trim() == "ok" => break,
            Ok(out) => out,
            Err(e) => e,
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
        tracing::debug!("apiserver not ready yet: {last}");
    }
    tracing::info!("kube-apiserver is ready");
    let bindings = config::rbac_bindings();
    let apply = crate::kubectl::kubectl(
        &binaries,
        &layout,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=polis",
            "-f",
            "-",
        ],
        Some(&bindings),
    );
    tokio::select! {
        applied = apply => {
            applied.map_err(|e| format!("applying the RBAC bindings Polis keeps: {e}"))?;
        }
        () = ctx.cancelled() => return Ok(()),
    }
    tracing::info!(
        "RBAC bindings applied (polis:admins, polis:operators, polis:readers, polis:apiservers)"
    );
    ctx.signal_healthy();
    ctx.cancelled().await;
    Ok(())
}

/// The `root.role.kubernetes` runnable (see the module doc).
pub async fn run(
    ctx: supervisor::Context,
    settings: ControllerSettings,
) -> supervisor::RunnableResult {
    for program in COMPONENTS.map(|(_, p)| p).into_iter().chain(["kubectl"]) {
        if let Err(e) = component::check_binary(&settings.binaries, program) {
            // Named in the node's status too, not only in its log.
            settings
                .board
                .exited(program, &e.to_string(), crate::board::now_unix_ms());
            return Err(e.into());
        }
    }
    let (layout, lifetime) = credentials(&settings).await?;
    tracing::info!(
        lifetime_s = lifetime.as_secs(),
        "Kubernetes certificates issued"
    );
    let proxy = crate::etcdproxy::EtcdProxy::connect(&settings.etcd_socket).await?;
    let socket = layout.etcd_socket();
    ctx.run("etcdproxy", move |ctx| {
        let (proxy, socket) = (proxy.clone(), socket.clone());
        async move {
            ctx.signal_healthy();
            // Not a graceful shutdown: it would wait for every open stream (a watch of an
            // apiserver that is stopping too) and hold the role's removal with it.
            tokio::select! {
                served = proxy.serve(&socket, std::future::pending()) => served?,
                () = ctx.cancelled() => {}
            }
            Ok(())
        }
    })?;
    let start_webhook = |ctx: &supervisor::Context| {
        let (layout, check) = (layout.clone(), settings.kubelet_check.clone());
        ctx.run_stoppable("tokenreview", move |ctx| {
            let (layout, check) = (layout.clone(), check.clone());
            async move {
                let tls = crate::tokenreview::tls_config(
                    &layout.path("apiserver.pem"),
                    &layout.path("apiserver.key"),
                )?;
                let address = crate::tokenreview::webhook_address(layout.address);
                let listener = tokio::net::TcpListener::bind(address)
                    .await
                    .map_err(|e| format!("listening on {address} for the token webhook: {e}"))?;
                ctx.signal_healthy();
                tokio::select! {
                    served = crate::tokenreview::serve(listener, tls, check) => served?,
                    () = ctx.cancelled() => {}
                }
                Ok(())
            }
        })
    };
    // Before the apiserver: its first kubelet request asks it.
    let mut webhook = start_webhook(&ctx)?;
    let mut running = Vec::new();
    let start = |ctx: &supervisor::Context, name: &str, program: &'static str| {
        let args = match program {
            "kube-apiserver" => layout.apiserver_args(),
            "kube-controller-manager" => layout.controller_manager_args(),
            _ => layout.scheduler_args(),
        };
        ctx.run_stoppable(
            name,
            component_runnable(
                settings.binaries.clone(),
                program,
                args,
                settings.board.clone(),
            ),
        )
    };
    for (name, program) in COMPONENTS {
        running.push(start(&ctx, name, program)?);
    }
    let (rbac_binaries, rbac_layout) = (settings.binaries.clone(), layout.clone());
    ctx.run("rbac", move |ctx| {
        keep_rbac(ctx, rbac_binaries.clone(), rbac_layout.clone())
    })?;
    let (sync_binaries, sync_layout) = (settings.binaries.clone(), layout.clone());
    let (sync_watch, sync_check) = (settings.nodes.clone(), settings.kubelet_check.clone());
    ctx.run("nodesync", move |ctx| {
        crate::nodesync::run(
            ctx,
            sync_binaries.clone(),
            sync_layout.clone(),
            sync_watch.clone(),
            sync_check.clone(),
        )
    })?;
    ctx.signal_healthy();
    loop {
        // Renewed at 2/3 of the lifetime, as every Polis certificate.
        let renew_in = lifetime * 2 / 3;
        tokio::select! {
            _ = tokio::time::sleep(renew_in) => {}
            _ = ctx.cancelled() => break,
        }
        match credentials(&settings).await {
            Ok((_, renewed)) => {
                tracing::info!(
                    lifetime_s = renewed.as_secs(),
                    "Kubernetes certificates renewed; restarting the components"
                );
                webhook.stop().await;
                webhook = start_webhook(&ctx)?;
                for (component, (name, program)) in
                    std::mem::take(&mut running).into_iter().zip(COMPONENTS)
                {
                    component.stop().await;
                    running.push(start(&ctx, name, program)?);
                }
            }
            Err(e) => {
                tracing::warn!("renewing the Kubernetes certificates: {e}; retrying in 5 s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    _ = ctx.cancelled() => break,
                }
            }
        }
    }
    for component in running {
        component.stop().await;
    }
    webhook.stop().await;
    settings.board.clear();
    Ok(())
}
