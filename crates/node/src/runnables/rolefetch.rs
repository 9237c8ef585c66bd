//! The `root.role.rolefetch` runnable: watches this node's record and the curator list
//! (Curator.WatchNode, a stream authenticated with the node certificate).
//!
//! ```text
//!   WatchNode ── older record revision than applied (staleview) ──▶ refused, logged once
//!             ──▶ curator list ──▶ cluster directory (esp/directory.pb), NodeValues::curators
//!             ──▶ cluster CRL  ──▶ NodeValues::crl, data/node/crl.der
//!             ──▶ roles        ──▶ data/node/roles.pb, then NodeValues::roles
//!             ──▶ DECOMMISSIONING / DECOMMISSIONED ──▶ Disowning / LeftCluster
//!   a worker is Home once a curator answers for it
//! ```
//! Publishes what the cluster says of this node; may not start or stop services (the
//! role server follows `NodeValues::roles`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::curators::curator_client::{apply_trust, curator_client, offer_crl};
use crate::curators::retry::{Backoff, ProblemLog, pause};
use crate::disk::files::save_directory;
use crate::disk::storage::{write_atomic, write_proto};
use crate::process::fatal::{FatalSender, LeftCluster};
use crate::state::cluster_state::{ClusterState, Contact};
use crate::state::membership::{preferred_order, roles_from_names};
use crate::state::settings::Settings;
use crate::state::staleview::{self, AppliedView};
use crate::state::values::{NodeValues, apply_contact};

/// Watches this node's record and the curator list (Curator.WatchNode): keeps the
/// cluster directory current, makes a worker Home once a curator answers for it, and
/// carries out a decommission: DECOMMISSIONING makes the node Disowning; DECOMMISSIONED,
/// or its certificate refused as revoked while Disowning, ends the node
/// ([`LeftCluster`]).
pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
    fatal: FatalSender,
) -> supervisor::RunnableResult {
    // Runs from the start on consensus members too: a member whose role was taken while
    // it was down learns it here (its own control plane may never come up).
    values.membership.watch().get().await?;
    let mut client = curator_client(&settings, &values)?;
    ctx.signal_healthy();
    // Whether the node watch was renewed because this node's etcd member stopped.
    let mut resynced = false;
    let mut problems = ProblemLog::default();
    let mut backoff = Backoff::default();
    let own = SocketAddr::new(settings.address, rpc::CURATOR_PORT);
    if values.applied_view.current().is_none()
        && let Some(view) = staleview::load(&settings.root)
    {
        values.applied_view.set(view);
    }
    loop {
        // Other curators first: this node's own curator answers from its own etcd
        // member, which is the one that stops serving when the node leaves consensus.
        let mut endpoints = values.curators.current().unwrap_or_default();
        if let Some(at) = endpoints.iter().position(|e| *e == own) {
            let mine = endpoints.remove(at);
            endpoints.push(mine);
        }
        client.set_endpoints(endpoints);
        let call = client.call(|channel| async move {
            proto::api::curator_client::CuratorClient::new(channel)
                .watch_node(proto::api::WatchNodeRequest {})
                .await
        });
        let mut stream = tokio::select! {
            r = call => match r {
                Ok(s) => s,
                Err(rpc::CallError::Status(status)) if rpc::is_revoked(&status) => {
                    // Node certificates are revoked only when the node is decommissioned
                    // or deleted.
                    let node_id = node_id(&values).await?;
                    if disowning(&settings, &values) {
                        tracing::info!("this node's certificate was revoked: decommission complete");
                        let _ = fatal.send(LeftCluster { node_id }.into());
                    } else {
                        let _ = fatal.send(anyhow::anyhow!(
                            "the cluster refuses this node's certificate as revoked: node {node_id} was \
                             decommissioned or deleted while it was down, and cannot rejoin its cluster. \
                             Its data is kept in {}; to use this machine in a cluster again, remove it \
                             and register the machine anew",
                            settings.root.root.display()
                        ));
                    }
                    ctx.cancelled().await;
                    return Ok(());
                }
                Err(e) => {
                    problems.problem(format!("watching this node's record: {e}"));
                    if !pause(&ctx, backoff.next()).await {
                        return Ok(());
                    }
                    continue;
                }
            },
            _ = ctx.cancelled() => return Ok(()),
        };
        problems.resolved("watching this node's record again");
        if let Some(curator) = client.current() {
            tracing::info!(%curator, "watching this node's record through curator {curator}");
        }
        backoff.reset();
        // Test builds may feed a stale update first (see `crash::stale_update`).
        let mut injected = crate::process::crash::stale_update();
        // The curator list last saved from this stream: every update carries it, and
        // reading the directory file to find it unchanged cost a file read per update.
        let mut saved_endpoints: Option<Vec<String>> = None;
        let mut held = false;
        loop {
            if held && crate::process::crash::stale_hold() {
                held = false;
                tracing::warn!(
                    "holding the injected update for {:?}",
                    crate::process::crash::STALE_HOLD
                );
                if !pause(&ctx, crate::process::crash::STALE_HOLD).await {
                    return Ok(());
                }
            }
            let update = if let Some(stale) = injected.take() {
                held = true;
                Ok(Some(stale))
            } else {
                tokio::select! {
                u = stream.message() => u,
                _ = own_etcd_gone(&values, &mut resynced) => {
                    // Removed from consensus, its etcd stopped: the news of the role going
                    // may be stuck with this node's own curator, or with a stream that
                    // predates it. Ask the other curators afresh (a new client: the one
                    // that answered last is tried first otherwise).
                    problems.problem(
                        "this node's etcd member stopped while it holds the ConsensusMember role; \
                         asking the other curators for its record"
                            .into(),
                    );
                    client = curator_client(&settings, &values)?;
                    break;
                }
                _ = ctx.cancelled() => return Ok(()),
                }
            };
            let Ok(Some(update)) = update else {
                problems.problem("the curator closed the node watch".into());
                break;
            };
            // A curator whose view is older than one already applied is not believed.
            let view = AppliedView::of(&update);
            let applied = values.applied_view.current();
            if staleview::is_stale(applied, view) {
                // Logged once per applied revision, not per refused update.
                problems.problem(format!(
                    "refused a stale update of this node's record: the curator's view is \
                     older than revision {} already applied",
                    applied.map_or(0, |a| a.revision)
                ));
                continue;
            }
            let listed: Vec<SocketAddr> = update
                .curator_endpoints
                .iter()
                .filter_map(|e| rpc::parse_endpoint(e).ok())
                .collect();
            let mut endpoints = preferred_order(settings.address, &listed);
            if !endpoints.is_empty() {
                if saved_endpoints.as_ref() != Some(&update.curator_endpoints) {
                    let (root, listed) = (settings.root.clone(), update.curator_endpoints.clone());
                    off_runtime(move || save_directory(&root, &listed)).await?;
                    saved_endpoints = Some(update.curator_endpoints.clone());
                }
                if roles_need_control_plane(&values) && !endpoints.contains(&own) {
                    endpoints.insert(0, own);
                }
                if values.curators.current().as_ref() != Some(&endpoints) {
                    tracing::info!(curators = ?endpoints, "curator directory updated");
                    values.curators.set(endpoints);
                }
            }
            if !update.cluster_cas.is_empty() {
                apply_trust(
                    &settings,
                    &values,
                    &update.cluster_cas,
                    &update.cluster_crls,
                )?;
            }
            if !update.cluster_crl.is_empty() {
                offer_crl(&settings, &values, &update.cluster_crl, true)?;
            }
            let peer_cas: Vec<Vec<u8>> = update.etcd_peer_cas.iter().map(|c| c.to_vec()).collect();
            if !peer_cas.is_empty() && values.etcd_peer_cas.current().as_ref() != Some(&peer_cas) {
                values.etcd_peer_cas.set(peer_cas);
            }
            match proto::api::NodeState::try_from(update.state) {
                Ok(proto::api::NodeState::Decommissioning) => enter_disowning(&settings, &values)?,
                Ok(proto::api::NodeState::Decommissioned) => {
                    enter_disowning(&settings, &values)?;
                    let node_id = node_id(&values).await?;
                    let _ = fatal.send(LeftCluster { node_id }.into());
                    ctx.cancelled().await;
                    return Ok(());
                }
                _ => {}
            }
            let roles = roles_from_names(&update.roles);
            if values.roles.current().as_ref() != Some(&roles) {
                // Saved first: a restart starts the services these roles call for.
                write_proto(&settings.root.local_roles(), &roles)
                    .context("saving the node's roles")?;
                tracing::info!(consensus_member = roles.consensus_member, "roles changed");
                values.roles.set(roles);
            }
            if applied != Some(view) {
                let root = settings.root.clone();
                off_runtime(move || staleview::save(&root, view)).await?;
                values.applied_view.set(view);
            }
            problems.resolved("applying this node's record again");
            // A worker enters its cluster here (a consensus member in its control
            // plane); only heartbeats move a node between Home and Split.
            if !roles_need_control_plane(&values) {
                apply_contact(&values.cluster_state, Contact::Joined);
            }
        }
        if !pause(&ctx, backoff.next()).await {
            return Ok(());
        }
    }
}

/// The node is being decommissioned: Disowning, recorded in the root (so that a restart
/// before the end still knows it), logged once.
fn enter_disowning(settings: &Settings, values: &NodeValues) -> Result<()> {
    if values.cluster_state.current() == Some(ClusterState::Disowning) {
        return Ok(());
    }
    write_atomic(&settings.root.disowning_marker(), b"")
        .context("recording that this node is being decommissioned")?;
    tracing::info!("this node is being decommissioned: leaving the cluster");
    values.cluster_state.set(ClusterState::Disowning);
    Ok(())
}

/// Whether this node knows it is being decommissioned (now or before a restart).
fn disowning(settings: &Settings, values: &NodeValues) -> bool {
    values.cluster_state.current() == Some(ClusterState::Disowning)
        || settings.root.disowning_marker().exists()
}

async fn node_id(values: &NodeValues) -> Result<String> {
    Ok(values.membership.watch().get().await?.key().node_id())
}

/// How long a consensus member's etcd may be down before rolefetch stops trusting its
/// current node watch (see [`own_etcd_gone`]).
const OWN_ETCD_GRACE: Duration = Duration::from_secs(5);

/// Resolves once this node holds the ConsensusMember role but its etcd member has not
/// run for [`OWN_ETCD_GRACE`] (it was removed from consensus, or is failing); never on a
/// worker. Once per stop of the etcd member: `fired` remembers that it resolved, until
/// the member runs again.
async fn own_etcd_gone(values: &NodeValues, fired: &mut bool) {
    let mut services = values.services.watch();
    loop {
        if *fired {
            if services.get_matching(|s| s.etcd_member).await.is_err() {
                std::future::pending::<()>().await;
            }
            *fired = false;
        }
        if services.get_matching(|s| !s.etcd_member).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(OWN_ETCD_GRACE).await;
        if values.services.current().is_some_and(|s| !s.etcd_member)
            && roles_need_control_plane(values)
        {
            *fired = true;
            return;
        }
    }
}

/// Whether the node's current roles call for a control plane (whose curator is local).
fn roles_need_control_plane(values: &NodeValues) -> bool {
    values.roles.current().is_some_and(|r| r.consensus_member)
}

/// Runs file I/O that syncs (an fsync per record update of this node) on the blocking
/// pool: a runtime worker waiting for the disk would hold up the curator's calls served
/// by the same process.
async fn off_runtime(io: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    tokio::task::spawn_blocking(io)
        .await
        .context("a file write of the role fetcher was cancelled")?
}
