//! The KubernetesWorker role on a node: the runnable the role server starts.
//!
//! ```text
//!   root.role.kubeworker ─ programs present? ─ kubelet keys made here ─▶ curator
//!     │   leader: IssueKubernetesCertificates (node mTLS; KubernetesWorker only):
//!     │   the kubelet's serving certificate, its token towards the apiservers
//!     │   (`kubelet_token`: system:node:<id>, checked by Polis on every uncached
//!     │   request), the controllers' apiservers ─▶ files in DIR (0600): certificate,
//!     │   token, kubeconfig,
//!     │   containerd.toml, kubelet.yaml, cni/10-polis.conflist
//!     ├─▶ apiproxy     127.0.0.1:6444 (a loopback node: its address) → the first
//!     │                controller's apiserver that accepts
//!     ├─▶ containerd   its own root, state and socket under DIR
//!     ├─▶ images       every OCI archive of the node's image folder imported (once
//!     │                containerd answers): the pause image among them
//!     └─▶ kubelet      named after the Polis node, at its address
//!   at 2/3 of the certificates' lifetime: issued again, files replaced, the kubelet
//!   restarted (containerd and the pods keep running)
//! ```
//! Stopping this runnable because polis-node stops stops the kubelet and containerd;
//! the containers and their shims outlive them (they are not children of containerd)
//! until containerd, started again, takes them back. Stopping it because the role was
//! taken away (`Leaving`) also stops every pod (SIGTERM, then SIGKILL after 30 s) and
//! removes the worker's folder: keys, token, containers, images (`workerstate`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::api::KubernetesCertificatePurpose as Purpose;

use crate::component;
use crate::controller::{Issuer, component_runnable, issue_into, write};
use crate::workerconfig::{WorkerLayout, api_proxy, cni_loopback_conflist};

/// What the role server hands this runnable.
#[derive(Clone)]
pub struct WorkerSettings {
    pub node_id: String,
    pub address: IpAddr,
    /// This node's worker folder (made 0700).
    pub dir: PathBuf,
    /// The folder with kubelet (the Kubernetes programs).
    pub binaries: PathBuf,
    /// The folder with containerd, containerd-shim-runc-v2, runc and ctr
    /// (`scripts/runtime-binaries`).
    pub runtime: PathBuf,
    /// The CNI plugins (Debian's containernetworking-plugins: /usr/lib/cni).
    pub cni_bin: PathBuf,
    /// OCI image archives (`*.tar`) imported into containerd at start, if any.
    pub images: Option<PathBuf>,
    /// The kubelet's certificate lifetime to ask for (`None`: the curator's default).
    pub certificate_lifetime: Option<Duration>,
    pub issue: Issuer,
    pub board: crate::board::ComponentBoard,
    /// Set by the role server before it stops this runnable because the role went
    /// (not because polis-node stops).
    pub leaving: Leaving,
}

/// Whether the worker is being stopped for good: the role was taken away. Then its
/// pods are stopped and its folder (keys, token, containers, images) removed; a
/// polis-node that merely stops leaves the pods running.
#[derive(Clone, Debug, Default)]
pub struct Leaving(Arc<std::sync::atomic::AtomicBool>);

impl Leaving {
    pub fn leave(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_leaving(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The kubelet's certificate, and its file stem (towards the apiservers the kubelet
/// holds a token, not a certificate: `kubelet_token`).
const PURPOSES: [(Purpose, &str); 1] = [(Purpose::KubeletServing, "kubelet")];

/// The programs a worker runs, and the folder setting each comes from.
fn programs(settings: &WorkerSettings) -> [(PathBuf, &'static str); 6] {
    [
        (settings.binaries.clone(), "kubelet"),
        (settings.binaries.clone(), "kubectl"),
        (settings.runtime.clone(), "containerd"),
        (settings.runtime.clone(), "containerd-shim-runc-v2"),
        (settings.runtime.clone(), "runc"),
        (settings.runtime.clone(), "ctr"),
    ]
}

fn layout(settings: &WorkerSettings) -> WorkerLayout {
    WorkerLayout {
        dir: settings.dir.clone(),
        address: settings.address,
        node_id: settings.node_id.clone(),
        runtime: settings.runtime.clone(),
        cni_bin: settings.cni_bin.clone(),
    }
}

/// The kubelet's certificates and every file the worker's programs read; the
/// controllers' apiservers and the certificates' lifetime.
async fn credentials(settings: &WorkerSettings) -> Result<(Vec<SocketAddr>, Duration), String> {
    let issued = issue_into(
        &settings.dir,
        settings.certificate_lifetime,
        &settings.issue,
        &PURPOSES,
    )
    .await?;
    let layout = layout(settings);
    if issued.kubelet_token.is_empty() {
        return Err("the curator issued no kubelet token (an older curator?)".into());
    }
    write(
        layout.path("kubelet.token"),
        issued.kubelet_token.as_bytes(),
    )?;
    // An older polis-node's kubelet client certificate: never again (not revocable).
    for stale in ["kubelet-client.pem", "kubelet-client.key"] {
        let _ = std::fs::remove_file(layout.path(stale));
    }
    for sub in ["containerd", "cni", "kubelet"] {
        privatefs::ensure_private_dir(&layout.path(sub))
            .map_err(|e| format!("making {}: {e}", layout.path(sub).display()))?;
    }
    write(
        layout.path("kubelet.kubeconfig"),
        layout.kubelet_kubeconfig().as_bytes(),
    )?;
    write(
        layout.path("kubelet.yaml"),
        layout.kubelet_config().as_bytes(),
    )?;
    write(
        layout.path("containerd.toml"),
        layout.containerd_config().as_bytes(),
    )?;
    write(
        layout.path("cni/10-polis.conflist"),
        cni_loopback_conflist().as_bytes(),
    )?;
    let apiservers = issued
        .apiservers
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    Ok((
        apiservers,
        Duration::from_secs(issued.lifetime_seconds.max(1)),
    ))
}

/// Imports every `*.tar` of `images` into containerd's Kubernetes namespace, once
/// containerd answers (bounded: 60 s).
async fn import_images(settings: &WorkerSettings, layout: &WorkerLayout) -> Result<(), String> {
    let Some(images) = &settings.images else {
        return Ok(());
    };
    let mut archives: Vec<PathBuf> = std::fs::read_dir(images)
        .map_err(|e| format!("reading the image folder {}: {e}", images.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .collect();
    archives.sort();
    let ctr = settings.runtime.join("ctr");
    let socket = layout.containerd_socket();
    // The socket file may be a killed containerd's: wait until one answers on it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answered = tokio::process::Command::new(&ctr)
            .arg(format!("--address={}", socket.display()))
            // Not `version`: it succeeds without a server.
            .args(["-n", "k8s.io", "images", "ls", "-q"])
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("running {}: {e}", ctr.display()))?;
        if answered.status.success() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "containerd never answered on {} within 60 s: {}",
                socket.display(),
                String::from_utf8_lossy(&answered.stderr).trim()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for archive in archives {
        let out = tokio::process::Command::new(&ctr)
            .arg(format!("--address={}", socket.display()))
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&archive)
            .output()
            .await
            .map_err(|e| format!("running {}: {e}", ctr.display()))?;
        if !out.status.success() {
            return Err(format!(
                "importing {}: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        tracing::info!(image = %archive.display(), "image imported");
    }
    Ok(())
}

/// The `root.role.kubeworker` runnable (see the module doc).
pub async fn run(ctx: supervisor::Context, settings: WorkerSettings) -> supervisor::RunnableResult {
    for (dir, program) in programs(&settings) {
        if let Err(e) = component::check_binary(&dir, program) {
            settings
                .board
                .exited(program, &e.to_string(), crate::board::now_unix_ms());
            return Err(e.into());
        }
    }
    let (apiservers, lifetime) = credentials(&settings).await?;
    tracing::info!(
        lifetime_s = lifetime.as_secs(),
        apiservers = ?apiservers,
        "kubelet certificates issued"
    );
    let layout = layout(&settings);
    let targets = Arc::new(Mutex::new(apiservers));
    let proxy_address = api_proxy(settings.address);
    let proxy_targets = targets.clone();
    ctx.run("apiproxy", move |ctx| {
        let targets = proxy_targets.clone();
        async move {
            let listener = tokio::net::TcpListener::bind(proxy_address)
                .await
                .map_err(|e| {
                    format!("listening on {proxy_address} for the kubelet's apiserver: {e}")
                })?;
            ctx.signal_healthy();
            tokio::select! {
                served = crate::apiproxy::serve(listener, targets) => served?,
                () = ctx.cancelled() => {}
            }
            Ok(())
        }
    })?;
    let containerd = ctx.run_stoppable(
        "containerd",
        component_runnable(
            settings.runtime.clone(),
            "containerd",
            layout.containerd_args(),
            settings.board.clone(),
        ),
    )?;
    if let Err(e) = import_images(&settings, &layout).await {
        settings
            .board
            .exited("images", &e, crate::board::now_unix_ms());
        return Err(e.into());
    }
    let start_kubelet = |ctx: &supervisor::Context| {
        ctx.run_stoppable(
            "kubelet",
            component_runnable(
                settings.binaries.clone(),
                "kubelet",
                layout.kubelet_args(),
                settings.board.clone(),
            ),
        )
    };
    let mut kubelet = start_kubelet(&ctx)?;
    let (status_binaries, status_layout, status_board) = (
        settings.binaries.clone(),
        layout.clone(),
        settings.board.clone(),
    );
    ctx.run("nodestate", move |ctx| {
        crate::workerstate::report(
            ctx,
            status_binaries.clone(),
            status_layout.clone(),
            status_board.clone(),
        )
    })?;
    ctx.signal_healthy();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(lifetime * 2 / 3) => {}
            _ = ctx.cancelled() => break,
        }
        match credentials(&settings).await {
            Ok((apiservers, _)) => {
                if !apiservers.is_empty() {
                    *targets.lock().expect("targets lock") = apiservers;
                }
                tracing::info!("kubelet certificates renewed; restarting the kubelet");
                kubelet.stop().await;
                kubelet = start_kubelet(&ctx)?;
            }
            Err(e) => {
                tracing::warn!("renewing the kubelet certificates: {e}; retrying in 5 s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    _ = ctx.cancelled() => break,
                }
            }
        }
    }
    kubelet.stop().await;
    if settings.leaving.is_leaving() {
        crate::workerstate::stop_pods(&settings.runtime, &layout).await;
    }
    containerd.stop().await;
    if settings.leaving.is_leaving() {
        crate::workerstate::remove_folder(&settings.dir);
    }
    settings.board.clear();
    Ok(())
}
