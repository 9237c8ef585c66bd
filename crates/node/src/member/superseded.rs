//! A consensus member of an older cluster epoch (`proto::epoch`) never serves: before
//! its etcd starts, while a recovered member settles, and every few seconds while it
//! serves, it asks the other members on their node ports which epoch they are in; once
//! one answers a newer epoch, this member stops its etcd and curator and either drops its
//! data to rejoin as a learner — only when the newer epoch holds everything it has — or
//! holds back: keeps its data, serves nothing, and says why on its node port (`cluster
//! status`) and in its log, until an operator decides.
//!
//! ```text
//!   newer epoch answered ─▶ etcd stopped ─▶ own epoch + data revision (etcdctl)
//!     ─▶ proto::epoch::may_drop(own, revision, newer member's chain)
//!          yes ─▶ forget_consensus ─▶ control plane restarts: JoinConsensus, learner
//!          no  ─▶ held back (NodeValues::held_back) until the node is stopped
//! ```
//! A leaf: imports only leaves below it; may not start etcd (the control plane does).

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use proto::api;

use crate::disk::files::forget_consensus;
use crate::member::epochs;
use crate::state::settings::Settings;

use crate::state::values::{HeldBack, NodeValues};

/// How long a recovered member keeps asking the others before its curator serves: two
/// recovers started at about the same time see each other's claims within it.
pub const SETTLE: Duration = Duration::from_millis(1500);
/// How often a serving member asks the others.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);
/// How long one member gets to answer.
const ASK_BOUND: Duration = Duration::from_secs(1);
/// Pause between asks while settling.
const SETTLE_PAUSE: Duration = Duration::from_millis(200);

/// A member that answered with a newer epoch than this node's.
#[derive(Debug, Clone)]
pub struct Newer {
    pub ip: IpAddr,
    pub answer: api::GetConsensusStatusResponse,
}

impl Newer {
    fn describe(&self) -> String {
        format!(
            "member {} ({}) is in {}",
            self.answer.node_id,
            self.ip,
            proto::epoch::describe(&epochs::answered_epoch(&self.answer))
        )
    }
}

/// The other consensus members this node knows: its member book's (by node ID), else
/// its directory's curators (by address).
fn other_members(settings: &Settings, values: &NodeValues) -> Result<Vec<epochs::MemberToAsk>> {
    let directory: Vec<IpAddr> = values
        .curators
        .current()
        .unwrap_or_default()
        .iter()
        .map(|c| c.ip())
        .collect();
    let book = crate::member::memberbook::load(&settings.root)?;
    Ok(epochs::members_to_ask(&book, &directory, settings.address))
}

/// Asks the other members once; the first with a newer epoch than this node's data.
pub async fn check(settings: &Settings, values: &NodeValues) -> Result<Option<Newer>> {
    let members = other_members(settings, values)?;
    if members.is_empty() {
        return Ok(None);
    }
    let own = epochs::load(&settings.root)?;
    let credentials = values.credentials.slot(&settings.root)?;
    let trust = crate::curators::curator_client::trust(settings, values)?;
    let answers = epochs::ask_members(&members, &trust, &credentials, ASK_BOUND).await;
    Ok(
        epochs::newer_member(&own, &answers).map(|(ip, answer)| Newer {
            ip,
            answer: answer.clone(),
        }),
    )
}

/// Asks the other members until `within` has passed (at least once): the first newer.
pub async fn settle(settings: Settings, values: NodeValues, within: Duration) -> Option<Newer> {
    let until = tokio::time::Instant::now() + within;
    loop {
        match check(&settings, &values).await {
            Ok(Some(newer)) => return Some(newer),
            Ok(None) => {}
            Err(e) => tracing::warn!("asking the other members for their epochs: {e:#}"),
        }
        if tokio::time::Instant::now() + SETTLE_PAUSE > until {
            return None;
        }
        tokio::time::sleep(SETTLE_PAUSE).await;
    }
}

/// What a member that saw `newer` does, its etcd stopped (see the module doc). Returns
/// an error once its data is dropped (the control plane then starts again and joins as
/// a learner); holding back, it returns only when cancelled.
pub async fn step_down(
    ctx: &supervisor::Context,
    settings: &Settings,
    values: &NodeValues,
    newer: Newer,
) -> supervisor::RunnableResult {
    // A member answering without its etcd serving names only its own epoch.
    let chain = if newer.answer.epoch_chain.is_empty() {
        vec![epochs::answered_epoch(&newer.answer)]
    } else {
        newer.answer.epoch_chain.clone()
    };
    drop_or_hold(ctx, settings, values, &newer.describe(), &chain).await
}

/// Drops this node's etcd data (etcd stopped) when the cluster whose epochs are `chain`
/// holds everything in it, and fails so that the control plane joins again as a
/// learner; otherwise holds back until cancelled. `why` says what made it ask.
pub async fn drop_or_hold(
    ctx: &supervisor::Context,
    settings: &Settings,
    values: &NodeValues,
    why: &str,
    chain: &[proto::config::ClusterEpoch],
) -> supervisor::RunnableResult {
    let own = epochs::load(&settings.root)?;
    let etcdctl = settings.etcd_binary.with_file_name("etcdctl");
    // The log's writes count: dropping data whose database lags its log would drop
    // writes the cluster acknowledged.
    let revision = epochs::data_revision(&etcdctl, &settings.root)
        .context("reading the revision of this node's etcd data")?
        .bound();
    let latest = proto::epoch::describe(&proto::epoch::latest(chain));
    match proto::epoch::may_drop(&own, revision, chain) {
        Ok(()) => {
            forget_consensus(&settings.root)
                .context("removing the etcd data of a member its cluster no longer has")?;
            tracing::warn!(
                own = proto::epoch::describe(&own),
                cluster = latest,
                revision,
                "{why}: this node's etcd data holds nothing the cluster lacks; it was removed, \
                 the node rejoins as a learner"
            );
            Err(format!("{why}; this node's etcd data was removed, rejoining as a learner").into())
        }
        Err(keep) => {
            let reason = format!(
                "holding back: {why}; this node's {} is not served and its data is kept, \
                 because {keep}. To give it up: stop the node, move ROOT/data/etcd aside, start \
                 it (it joins as a learner); to keep it instead, stop the members of {latest} \
                 and recover this node",
                proto::epoch::describe(&own)
            );
            tracing::error!("{reason}");
            values.held_back.set(Some(HeldBack { reason, revision }));
            ctx.cancelled().await;
            values.held_back.set(None);
            Ok(())
        }
    }
}
