//! The role server: runs the services the node's roles call for.
//!
//! ```text
//!   cluster manager ──Membership──▶ role server
//!                                     │ while the roles hold ConsensusMember (see controlplane):
//!                                     ├─▶ controlplane ──▶ consensus (etcd: bootstrap, existing
//!                                     │                    member, or new learner), crlsync,
//!                                     │                    curator (election + gRPC :7835)
//!                                     ├─▶ rolefetch ── Curator.WatchNode (stream, node certificate):
//!                                     │                 own state and roles, curator list →
//!                                     │                 cluster directory (esp/directory.pb);
//!                                     │                 a worker is Home once a curator answers
//!                                     ├─▶ heartbeat ── waits for Home ── Curator.Heartbeat(status)
//!                                     │                 every period (5 s): address, version,
//!                                     │                 etcd member / curator running, start
//!                                     │                 time; no answer for longer than the
//!                                     │                 timeout (15 s) → Split, answered → Home
//!                                     ├─▶ renew ── node (and etcd peer) certificate renewed at
//!                                     │            2/3 of its lifetime, applied live (see renew)
//!                                     └─▶ logs ── this node's log lines (NodeLogs, :7836,
//!                                                  owner only; see logserver)
//! ```
//! Every call to the cluster goes through one leader-aware `rpc::CuratorClient` over the
//! curators this node knows (`NodeValues::curators`: its own first, then the directory).
//! Roles are live: rolefetch saves the roles the cluster gives this node
//! (`data/node/roles.pb`) and publishes them (`NodeValues::roles`); the role server
//! starts the control plane when ConsensusMember appears and stops it — then wipes the
//! node's etcd data and peer credentials — when it goes (`supervisor::Stoppable`), but
//! only once etcd's member list, read with a quorum, confirms that this node's member
//! is gone (`rejoin::until_absent`): until then etcd keeps running and its data stays.
//!
//! It only orchestrates: the runnables live in their own modules (`controlplane`,
//! `rolefetch`, `heartbeat`, `renew`), the client in `curator_client`; nothing imports
//! the role server.

use crate::curators::curator_client::load_saved_crl;
use crate::disk::files::{forget_consensus, forget_snapshots, has_etcd_data, recorded_membership};
use crate::disk::storage::read_proto;
use crate::member::rejoin::{self, OwnMember};
use crate::process::fatal::FatalSender;
use crate::runnables::{heartbeat, renew, rolefetch};
use crate::state::settings::Settings;
use crate::state::values::NodeValues;

/// This node's etcd member as its root records it (see `rejoin::OwnMember`).
fn own_member(settings: &Settings, values: &NodeValues) -> anyhow::Result<OwnMember> {
    let sealed_path = settings.root.sealed_configuration();
    let sealed: Option<proto::config::SealedConfiguration> = if sealed_path.exists() {
        Some(read_proto(&sealed_path, "sealed configuration")?)
    } else {
        None
    };
    let recorded = recorded_membership(&settings.root, sealed.as_ref())?
        .map(|m| (m.etcd_cluster_id, m.etcd_member_id));
    let name = values
        .membership
        .current()
        .map(|m| m.key().node_id())
        .unwrap_or_default();
    Ok(OwnMember { recorded, name })
}

/// What the Kubernetes controller runnable needs of this node: its identity, folders,
/// its etcd member's socket, and a way to ask the curator leader for certificates.
fn kubernetes_settings(
    settings: &Settings,
    values: &NodeValues,
) -> anyhow::Result<kubernetes::controller::ControllerSettings> {
    let node_id = values
        .membership
        .current()
        .map(|m| m.key().node_id())
        .unwrap_or_default();
    let (issue_settings, issue_values) = (settings.clone(), values.clone());
    let issue: kubernetes::controller::Issuer = std::sync::Arc::new(move |request| {
        let (settings, values) = (issue_settings.clone(), issue_values.clone());
        Box::pin(async move {
            let client = crate::curators::curator_client::curator_client(&settings, &values)
                .map_err(|e| format!("{e:#}"))?;
            client
                .call(|channel| {
                    let request = request.clone();
                    async move {
                        proto::api::curator_client::CuratorClient::new(channel)
                            .issue_kubernetes_certificates(request)
                            .await
                    }
                })
                .await
                .map_err(|e| format!("asking the curator for Kubernetes certificates: {e}"))
        })
    });
    let etcd_socket = settings
        .root
        .consensus_run_dir()
        .join(consensus::config::CLIENT_SOCKET_NAME);
    Ok(kubernetes::controller::ControllerSettings {
        kubelet_check: kubelet_check(etcd_socket.clone()),
        nodes: polis_nodes(etcd_socket),
        node_id,
        address: settings.address,
        dir: settings.root.data().join("kubernetes"),
        binaries: settings.kubernetes_binaries.clone(),
        etcd_socket: settings
            .root
            .consensus_run_dir()
            .join(consensus::config::CLIENT_SOCKET_NAME),
        certificate_lifetime: settings.kubernetes_certificate_lifetime,
        issue,
        board: values.components.clone(),
    })
}

/// The token webhook's question, answered from the node records through this
/// member's etcd with a quorum read (a member cut off answers nothing: it fails closed):
/// node `id`'s newest kubelet token hash while it is UP and holds KubernetesWorker.
fn kubelet_check(etcd_socket: std::path::PathBuf) -> kubernetes::tokenreview::KubeletCheck {
    let client = std::sync::Arc::new(tokio::sync::OnceCell::new());
    std::sync::Arc::new(move |id: String| {
        let (client, socket) = (client.clone(), etcd_socket.clone());
        Box::pin(async move {
            let curator_ns = client
                .get_or_try_init(|| async {
                    consensus::client::connect_unix(&socket)
                        .await
                        .map(|c| consensus::Namespaced::new(c, curator::layout::NAMESPACE))
                })
                .await
                .map_err(|e| format!("connecting to the local etcd member: {e}"))?;
            let node = curator::records::load_node(curator_ns, &id)
                .await
                .map_err(|e| format!("reading node {id}'s record: {e}"))?;
            Ok(node.and_then(|n| {
                let up = curator::records::node_state(&n) == proto::state::NodeState::Up;
                let worker = n.roles.and_then(|r| r.kubernetes_worker)?;
                (up && !worker.kubelet_token_sha256.is_empty())
                    .then_some(worker.kubelet_token_sha256)
            }))
        })
    })
}

/// The node records, watched through this member's etcd (a watch that requires a
/// leader: a member cut off ends it), as Kubernetes' node sync reads them.
fn polis_nodes(etcd_socket: std::path::PathBuf) -> kubernetes::nodesync::PolisNodesWatch {
    use kubernetes::nodesync::PolisNode;
    std::sync::Arc::new(move || {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let socket = etcd_socket.clone();
        tokio::spawn(async move {
            let curator_ns = match consensus::client::connect_unix(&socket).await {
                Ok(client) => consensus::Namespaced::new(client, curator::layout::NAMESPACE),
                Err(e) => {
                    let _ = tx.send(Err(format!("connecting to etcd: {e}"))).await;
                    return;
                }
            };
            let mut watched = curator::records::watch_nodes(&curator_ns, |nodes, _, _| {
                nodes
                    .values()
                    .map(|n| PolisNode {
                        id: n.id.clone(),
                        worker: curator::records::node_state(n) == proto::state::NodeState::Up
                            && n.roles
                                .as_ref()
                                .is_some_and(|r| r.kubernetes_worker.is_some()),
                        labels: n
                            .labels
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    })
                    .collect::<Vec<_>>()
            });
            loop {
                let update = tokio::select! {
                    update = watched.recv() => update,
                    () = tx.closed() => return,
                };
                let update = match update {
                    Some(update) => update.map_err(|e| e.to_string()),
                    None => return,
                };
                let ended = update.is_err();
                if tx.send(update).await.is_err() || ended {
                    return;
                }
            }
        });
        rx
    })
}

/// What the Kubernetes worker runnable needs of this node (see `kubernetes_settings`).
fn worker_settings(
    settings: &Settings,
    values: &NodeValues,
) -> anyhow::Result<kubernetes::worker::WorkerSettings> {
    let controller = kubernetes_settings(settings, values)?;
    Ok(kubernetes::worker::WorkerSettings {
        node_id: controller.node_id,
        address: settings.address,
        dir: settings.root.data().join("kubernetes-worker"),
        binaries: settings.kubernetes_binaries.clone(),
        runtime: settings.runtime_binaries.clone(),
        cni_bin: settings.cni_plugins.clone(),
        images: Some(settings.kubernetes_images.clone()).filter(|p| p.is_dir()),
        certificate_lifetime: settings.kubernetes_certificate_lifetime,
        issue: controller.issue,
        board: values.components.clone(),
        leaving: Default::default(),
    })
}

/// The `root.role` runnable: waits until the node belongs to a cluster, then runs
/// rolefetch, heartbeat and renew, and the control plane while the roles call for it.
pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
    fatal: FatalSender,
) -> supervisor::RunnableResult {
    // A registering node waits here until it belongs to the cluster.
    let mut membership_watcher = values.membership.watch();
    tokio::select! {
        m = membership_watcher.get() => { m?; }
        _ = ctx.cancelled() => return Ok(()),
    };
    load_saved_crl(&settings, &values)?;
    let (fetch_settings, fetch_values, fetch_fatal) =
        (settings.clone(), values.clone(), fatal.clone());
    ctx.run("rolefetch", move |ctx| {
        rolefetch::run(
            ctx,
            fetch_settings.clone(),
            fetch_values.clone(),
            fetch_fatal.clone(),
        )
    })?;
    let (heartbeat_settings, heartbeat_values) = (settings.clone(), values.clone());
    ctx.run("heartbeat", move |ctx| {
        heartbeat::run(ctx, heartbeat_settings.clone(), heartbeat_values.clone())
    })?;
    let (renew_settings, renew_values) = (settings.clone(), values.clone());
    ctx.run("renew", move |ctx| {
        renew::run(ctx, renew_settings.clone(), renew_values.clone())
    })?;
    let (catchup_settings, catchup_values) = (settings.clone(), values.clone());
    ctx.run("catchup", move |ctx| {
        crate::runnables::catchup::run(ctx, catchup_settings.clone(), catchup_values.clone())
    })?;
    let (logs_settings, logs_values) = (settings.clone(), values.clone());
    ctx.run("logs", move |ctx| {
        crate::runnables::logserver::run(ctx, logs_settings.clone(), logs_values.clone())
    })?;
    ctx.signal_healthy();

    // The control plane follows the ConsensusMember role, live; Kubernetes' control
    // plane the KubernetesController role, while this node is a consensus member.
    let mut controlplane: Option<supervisor::Stoppable> = None;
    let mut kubernetes: Option<supervisor::Stoppable> = None;
    // The worker runnable, and its flag telling it, when stopped, that the role went.
    let mut worker: Option<(supervisor::Stoppable, kubernetes::worker::Leaving)> = None;
    let mut roles = values.roles.watch();
    let mut came_back = None;
    loop {
        let current = match came_back.take() {
            Some(r) => r,
            None => tokio::select! {
                r = roles.get() => r?,
                _ = ctx.cancelled() => return Ok(()),
            },
        };
        let wants_kubernetes = current.kubernetes_controller && current.consensus_member;
        match (wants_kubernetes, kubernetes.is_some()) {
            (true, false) => {
                tracing::info!("this node is a Kubernetes controller: starting its components");
                let settings = kubernetes_settings(&settings, &values)?;
                kubernetes = Some(ctx.run_stoppable("kubernetes", move |ctx| {
                    kubernetes::controller::run(ctx, settings.clone())
                })?);
            }
            (false, true) => {
                tracing::info!(
                    "the KubernetesController role was taken away: stopping its components"
                );
                if let Some(k) = kubernetes.take() {
                    k.stop().await;
                }
            }
            _ => {}
        }
        match (current.kubernetes_worker, worker.is_some()) {
            (true, false) => {
                tracing::info!(
                    "this node is a Kubernetes worker: starting containerd and the kubelet"
                );
                let settings = worker_settings(&settings, &values)?;
                let leaving = settings.leaving.clone();
                let runnable = ctx.run_stoppable("kubeworker", move |ctx| {
                    kubernetes::worker::run(ctx, settings.clone())
                })?;
                worker = Some((runnable, leaving));
            }
            (false, true) => {
                tracing::info!(
                    "the KubernetesWorker role was taken away: stopping the kubelet, the \
                     pods and containerd, removing the worker's files"
                );
                if let Some((w, leaving)) = worker.take() {
                    leaving.leave();
                    w.stop().await;
                }
            }
            _ => {}
        }
        let worker_folder = settings.root.data().join("kubernetes-worker");
        if !current.kubernetes_worker && worker.is_none() && worker_folder.exists() {
            // The role went while this node was down, or its runnable stopped before
            // its own teardown (a start that failed): remove what the worker left.
            let runc = settings.runtime_binaries.join("runc");
            tokio::task::spawn_blocking(move || {
                kubernetes::workerstate::clean_up_leftovers(&runc, &worker_folder)
            })
            .await
            .map_err(|e| anyhow::anyhow!("removing what a worker left: {e}"))?;
        }
        match (current.consensus_member, controlplane.is_some()) {
            (true, false) => {
                tracing::info!("this node is a consensus member: starting its control plane");
                let (settings, values, fatal) = (settings.clone(), values.clone(), fatal.clone());
                controlplane = Some(ctx.run_stoppable("controlplane", move |ctx| {
                    crate::runnables::controlplane::run(
                        ctx,
                        settings.clone(),
                        values.clone(),
                        fatal.clone(),
                    )
                })?);
            }
            (false, running) => {
                if running || has_etcd_data(&settings.root) {
                    // The role's going is a curator's word: etcd's own member list, read
                    // with a quorum, must no longer hold this node's member (`rejoin`).
                    let own = own_member(&settings, &values)?;
                    tokio::select! {
                        () = rejoin::until_absent(&ctx, &settings, &values, &own) => {}
                        r = roles.get_matching(|r| r.consensus_member) => {
                            tracing::info!("the ConsensusMember role is back: keeping consensus");
                            came_back = Some(r?);
                            continue;
                        }
                        _ = ctx.cancelled() => return Ok(()),
                    }
                }
                if let Some(plane) = controlplane.take() {
                    tracing::info!(
                        "the ConsensusMember role was taken away: stopping etcd and the curator"
                    );
                    plane.stop().await;
                }
                if running || has_etcd_data(&settings.root) {
                    forget_consensus(&settings.root)?;
                    tracing::info!("left consensus: etcd data and peer credentials removed");
                }
                // Scheduled snapshots hold the cluster's CA keys: a worker keeps none
                // (an operator may demote a member; the keys are for admins only).
                if forget_snapshots(&settings.root)? {
                    tracing::info!("left consensus: its scheduled snapshots removed");
                }
            }
            (true, true) => {}
        }
    }
}
