//! The `root.role.heartbeat` runnable: tells the curator every heartbeat period that
//! this node is alive, with its status, and moves the node between Home and Split by
//! whether curators answer.
//!
//! ```text
//!   waits for Home (or Split) ── Curator.Heartbeat(status) every period (5 s): address,
//!   version, etcd member / curator running, start time; no answer for longer than the
//!   timeout (15 s) → Split, answered → Home; failed → retry after ≤ 500 ms; the first
//!   answered after failures → the next after ≤ 500 ms too (confirms the node back)
//! ```
//! Only heartbeats move a node between Home and Split. May not change any other shared
//! value, or write to the root.

use std::time::{Duration, Instant};

use proto::state::NodeStatus;

use crate::curators::curator_client::curator_client;
use crate::curators::retry::pause;
use crate::state::cluster_state::{ClusterState, Contact};
use crate::state::settings::Settings;
use crate::state::values::{NodeValues, apply_contact};

/// Tells the curator every heartbeat period that this node is alive, with its status;
/// publishes Split when no curator has answered for longer than the heartbeat timeout,
/// and Home again once one answers (`ClusterState::after`).
pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
) -> supervisor::RunnableResult {
    // Home, or Split when this runnable restarts while the node is split.
    let mut state = values.cluster_state.watch();
    tokio::select! {
        s = state.get_matching(|s| matches!(s, ClusterState::Home | ClusterState::Split)) => { s?; }
        _ = ctx.cancelled() => return Ok(()),
    }
    let client = curator_client(&settings, &values)?;
    ctx.signal_healthy();
    let timing = settings.heartbeat;
    let bounds = HeartbeatBounds::new(&timing);
    // When the current run of failed heartbeats began: time without contact counts only
    // while this loop tries (a node that was itself frozen is not split by that).
    let mut failing_since: Option<Instant> = None;
    let mut failures = 0u32;
    loop {
        client.set_endpoints(values.curators.current().unwrap_or_default());
        let request = proto::api::HeartbeatRequest {
            status: Some(node_status(&settings, &values)),
        };
        let attempted = Instant::now();
        let call = client.call(|channel| {
            let request = request.clone();
            async move {
                let mut curator = proto::api::curator_client::CuratorClient::new(channel);
                tokio::time::timeout(bounds.attempt, curator.heartbeat(request))
                    .await
                    .unwrap_or_else(|_| {
                        Err(tonic::Status::unavailable(
                            "the curator did not answer in time",
                        ))
                    })
            }
        });
        let sent = match tokio::time::timeout(bounds.call, call).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no curator answered within {:?}", bounds.call)),
        };
        let wait = match sent {
            Ok(_) => {
                failing_since = None;
                if apply_contact(&values.cluster_state, Contact::Restored) {
                    tracing::info!(curator = ?client.current(), "a curator answers heartbeats again: back Home");
                } else if failures >= 3 {
                    tracing::info!(curator = ?client.current(), "heartbeats reach the curator again");
                }
                // The first heartbeat answered after failures is confirmed at once: the
                // curator calls a timed-out node healthy on its second heartbeat, and a
                // node back from a partition should not wait a whole period for it.
                let confirm = failures > 0;
                failures = 0;
                if confirm {
                    bounds.retry
                } else {
                    timing.period()
                }
            }
            Err(e) => {
                failures += 1;
                let silent = failing_since.get_or_insert(attempted).elapsed();
                if silent > timing.timeout() && apply_contact(&values.cluster_state, Contact::Lost)
                {
                    tracing::warn!(
                        "no curator has answered a heartbeat for {silent:?} (timeout {:?}): split from the cluster; last error: {e}",
                        timing.timeout()
                    );
                } else if failures % 10 == 3 {
                    // The curator may still be electing a leader: retry soon, and only
                    // complain when it persists.
                    tracing::warn!("heartbeat failed {failures} times in a row: {e}");
                }
                bounds.retry
            }
        };
        if !pause(&ctx, wait).await {
            return Ok(());
        }
    }
}

/// Time bounds of the heartbeat loop, from the heartbeat timing.
#[derive(Debug, Clone, Copy)]
struct HeartbeatBounds {
    /// One curator gets this long to answer (a stopped one would otherwise hold the
    /// heartbeat for the channel's 30 s).
    attempt: Duration,
    /// One heartbeat, across every curator and the client's retries.
    call: Duration,
    /// Pause after a failed heartbeat, and after the first answered one that follows
    /// failures (so that a returning node is confirmed healthy quickly).
    retry: Duration,
}

impl HeartbeatBounds {
    fn new(timing: &curator::health::Timing) -> HeartbeatBounds {
        HeartbeatBounds {
            attempt: (timing.timeout() / 4).max(Duration::from_millis(500)),
            call: timing.timeout() / 2,
            retry: timing.period().min(Duration::from_millis(500)),
        }
    }
}

/// What this node reports of itself with each heartbeat.
fn node_status(settings: &Settings, values: &NodeValues) -> NodeStatus {
    let services = values.services.current().unwrap_or_default();
    let certificate = values
        .credentials
        .slot(&settings.root)
        .map(|slot| slot.credentials().certificate)
        .unwrap_or_default();
    let (trusted_ca_fingerprints, certificate_ca_fingerprint) =
        crate::curators::curator_client::trust_report(values, &certificate);
    let (etcd_loaded_peer_ca_fingerprints, etcd_peer_certificate_ca_fingerprint) =
        crate::runnables::peertrust::report(settings, values);
    NodeStatus {
        address: settings.address.to_string(),
        version: crate::process::crash::reported_version(),
        etcd_member_running: services.etcd_member,
        curator_running: services.curator,
        started_at_unix_ms: settings.started_at_unix_ms,
        trusted_ca_fingerprints,
        certificate_ca_fingerprint,
        etcd_loaded_peer_ca_fingerprints,
        etcd_peer_certificate_ca_fingerprint,
        services: values.components.snapshot(),
        kubernetes_node: values.components.kubernetes_node(),
    }
}
