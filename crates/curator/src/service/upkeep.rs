//! etcd upkeep (`root.role.controlplane.curator.upkeep`): the leader keeps every
//! member's database compact and the NOSPACE alarm from lasting; every curator
//! defragments its own member when the leader asks (`defragment_own`).
//!
//! Each curator reaches only its OWN etcd member (its unix socket), and a defragmentation
//! acts on the member it is sent to, so the leader coordinates:
//! ```text
//!   leader, every period (as long as there is something to do, step after step):
//!     member list ─▶ each member's status: its own from its etcd, the others' from
//!       their curators (CuratorLocal.GetConsensusStatus, node certificate, 2 s)
//!     alarms (own etcd: the cluster's list) ─▶ NOSPACE? compact at the current revision
//!       (etcd still takes compactions then, not puts)
//!       none? history grew past its byte bound (crate::upkeep::History)? compact at a
//!       revision at least history_min_age (30 s) old
//!     crate::upkeep::next_step (pure) ─▶ Wait | Idle
//!       | Defragment(member): own member ─▶ here; another ─▶ its curator's
//!         CuratorLocal.DefragmentMember (nodes only; it checks the member ID, and that
//!         the caller is an UP consensus member) — one at a time, the etcd leader last,
//!         statuses asked again before the next one
//!       | Disarm: every NOSPACE alarm disarmed (own etcd) ─▶ writes work again
//! ```
//! A new leader starts over from the statuses: nothing is remembered between steps.
//! Under NOSPACE no curator can be elected (a campaign needs a lease and a put): while
//! no curator leads, the curator whose etcd member is etcd's leader does the upkeep.
//!
//! A runnable: imports `shared` and `status` of the service layer and the pure
//! `crate::upkeep`; may not write cluster records.

use std::sync::Arc;
use std::time::Duration;

use consensus::maintenance::{self, AlarmKind};
use proto::api;
use tonic::Status;

use super::shared::Shared;
use super::status::etcd_status;
use crate::election::{self, Role};
use crate::upkeep::{MemberState, MemberView, Step, next_step};

/// How long a member's curator gets to describe its member.
const STATUS_ANSWER: Duration = Duration::from_secs(2);

/// Held while this curator defragments its member: never two at once.
static DEFRAGMENTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let period = shared.config.upkeep.period;
    let mut memory = Memory::default();
    // However this runnable ends, the member's metrics go with it.
    let _member_metrics = MemberMetricsGuard;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
        if let Ok(own) = maintenance::status(&mut shared.curator.client()).await {
            export_member(&own);
        }
        // Steps follow each other at once while there is work (one member per step).
        for _ in 0..8 {
            if !may_run(&shared).await {
                break;
            }
            let done = tokio::select! {
                d = step(&shared, &mut memory) => d,
                _ = ctx.cancelled() => return Ok(()),
            };
            match done {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!("etcd upkeep: {}", e.message());
                    break;
                }
            }
        }
    }
}

/// Clears the member's metrics when dropped.
struct MemberMetricsGuard;

impl Drop for MemberMetricsGuard {
    fn drop(&mut self) {
        metrics::global().etcd_member.clear();
    }
}

/// This curator's etcd member in the metrics (a leader change counts when the leader
/// it knows differs from the one sampled before).
fn export_member(own: &maintenance::MemberStatus) {
    metrics::global()
        .etcd_member
        .sample(metrics::member::MemberSample {
            db_size_bytes: own.db_size,
            db_size_in_use_bytes: own.db_size_in_use,
            raft_index: own.raft_index,
            learner: own.is_learner,
            leader_id: own.leader_id,
        });
}

/// Whether this curator does the upkeep now: the leader; or, while no curator leads,
/// the curator whose etcd member is etcd's leader — under NOSPACE no curator can be
/// elected (a campaign needs a lease and a put), and someone must free the space.
async fn may_run(shared: &Shared) -> bool {
    if matches!(shared.role.current(), Some(Role::Leader(_))) {
        return true;
    }
    if !matches!(election::current_leader(&shared.curator).await, Ok(None)) {
        return false;
    }
    let mut client = shared.curator.client();
    matches!(maintenance::status(&mut client).await, Ok(s) if s.leader_id == s.member_id)
}

/// What the upkeep remembers between steps (nothing that a new leader would need).
#[derive(Default)]
struct Memory {
    /// The last reason to wait that was logged (each is logged once).
    last_wait: String,
    /// The revision this curator last compacted at (under NOSPACE).
    compacted: i64,
    /// Members defragmented since that compaction.
    done: std::collections::BTreeSet<u64>,
    /// Since when each silent member has been silent (answering ones are removed).
    silent_since: std::collections::BTreeMap<u64, std::time::Instant>,
    /// When history is compacted by its size.
    history: crate::upkeep::History,
}

/// One step; whether another should follow at once.
async fn step(shared: &Arc<Shared>, memory: &mut Memory) -> Result<bool, Status> {
    let last_wait = &mut memory.last_wait;
    let mut client = shared.curator.client();
    let own = maintenance::status(&mut client)
        .await
        .map_err(|e| etcd_status("the local etcd member's status", e))?;
    let alarms = maintenance::alarms(&mut client)
        .await
        .map_err(|e| etcd_status("listing etcd alarms", e))?;
    let no_space: Vec<_> = alarms
        .iter()
        .filter(|a| a.kind == AlarmKind::NoSpace)
        .collect();
    if !no_space.is_empty() && memory.compacted != own.revision {
        maintenance::compact(&mut client, own.revision)
            .await
            .map_err(|e| etcd_status("compacting etcd under NOSPACE", e))?;
        tracing::info!(
            revision = own.revision,
            "etcd is out of space (NOSPACE): compacted"
        );
        memory.compacted = own.revision;
        memory.done.clear();
    }
    if no_space.is_empty() {
        memory.done.clear();
        let in_use = own.db_size_in_use.max(0) as u64;
        if let Some(at) = memory.history.observe(
            std::time::Instant::now(),
            own.revision,
            in_use,
            &shared.config.upkeep,
        ) {
            maintenance::compact(&mut client, at)
                .await
                .map_err(|e| etcd_status("compacting etcd's history", e))?;
            memory.history.compacted(at);
            tracing::info!(
                revision = at,
                in_use,
                "compacted etcd's history: it grew past its byte bound"
            );
        }
    }
    let members = consensus::membership::members(&mut client)
        .await
        .map_err(|e| etcd_status("listing etcd members", e))?;
    let mut views = Vec::new();
    let mut asks = tokio::task::JoinSet::new();
    for m in &members {
        if m.id == own.member_id {
            views.push(MemberView {
                member_id: m.id,
                status: Some(state_of(&own)),
            });
            continue;
        }
        let (shared, m) = (shared.clone(), m.clone());
        asks.spawn(async move {
            let status = ask_status(&shared, &m).await;
            MemberView {
                member_id: m.id,
                status,
            }
        });
    }
    while let Some(view) = asks.join_next().await {
        if let Ok(view) = view {
            views.push(view);
        }
    }
    let quota = shared.config.etcd_quota_bytes;
    let floor = shared.config.upkeep.defrag_floor_bytes;
    let now = std::time::Instant::now();
    memory
        .silent_since
        .retain(|id, _| views.iter().any(|v| v.member_id == *id));
    for view in &views {
        if view.status.is_some() {
            memory.silent_since.remove(&view.member_id);
        } else {
            memory.silent_since.entry(view.member_id).or_insert(now);
        }
    }
    let passed_over = memory
        .silent_since
        .iter()
        .filter(|(_, since)| now.duration_since(**since) >= crate::upkeep::SILENT_GRACE)
        .map(|(id, _)| *id)
        .collect();
    match next_step(
        &views,
        !no_space.is_empty(),
        quota,
        floor,
        &memory.done,
        &passed_over,
    ) {
        Step::Wait(why) => {
            if *last_wait != why {
                tracing::info!("etcd upkeep waits: {why}");
                *last_wait = why;
            }
            Ok(false)
        }
        Step::Idle => {
            let why = if no_space.is_empty() { "" } else { "nospace" };
            if !no_space.is_empty() && *last_wait != why {
                *last_wait = why.to_string();
                tracing::warn!(
                    "etcd is still out of space (NOSPACE) after compaction and \
                     defragmentation: the data in use is close to the quota"
                );
            }
            Ok(false)
        }
        Step::Defragment(id) => {
            let (before, after) = if id == own.member_id {
                defragment_local(shared).await?
            } else {
                let m = members
                    .iter()
                    .find(|m| m.id == id)
                    .ok_or_else(|| Status::internal("planned member vanished"))?;
                defragment_remote(shared, m).await?
            };
            tracing::info!(
                member = format!("{id:x}"),
                before,
                after,
                "defragmented etcd member"
            );
            if !no_space.is_empty() {
                memory.done.insert(id);
            }
            Ok(true)
        }
        Step::Disarm => {
            for alarm in no_space {
                // Logged before the call too: etcd may apply the disarm and this
                // task be cancelled (a curator elected at once) before it answers.
                tracing::info!(
                    member = format!("{:x}", alarm.member_id),
                    "disarming etcd's NOSPACE alarm: every member has room again"
                );
                maintenance::disarm(&mut client, alarm)
                    .await
                    .map_err(|e| etcd_status("disarming the NOSPACE alarm", e))?;
                tracing::info!(
                    member = format!("{:x}", alarm.member_id),
                    "disarmed etcd's NOSPACE alarm: space was freed, writes work again"
                );
            }
            Ok(false)
        }
    }
}

fn state_of(s: &maintenance::MemberStatus) -> MemberState {
    MemberState {
        leader_id: s.leader_id,
        is_learner: s.is_learner,
        raft_index: s.raft_index,
        db_size: s.db_size.max(0) as u64,
        db_size_in_use: s.db_size_in_use.max(0) as u64,
    }
}

pub(super) async fn channel_to(
    shared: &Shared,
    m: &consensus::membership::Member,
) -> Option<tonic::transport::Channel> {
    let ip = m.peer_urls.first().and_then(|u| rpc::url_address(u))?;
    let endpoint = std::net::SocketAddr::new(ip, rpc::CURATOR_PORT);
    rpc::connect_with(
        endpoint,
        &shared.server_trust(),
        Some(&shared.config.credentials),
    )
    .await
    .ok()
}

/// A member's status as its curator gives it; `None` when it does not answer (in time)
/// or answers for another member.
async fn ask_status(shared: &Shared, m: &consensus::membership::Member) -> Option<MemberState> {
    let ask = async {
        let channel = channel_to(shared, m).await?;
        api::curator_local_client::CuratorLocalClient::new(channel)
            .get_consensus_status(api::GetConsensusStatusRequest {})
            .await
            .ok()
    };
    let a = tokio::time::timeout(STATUS_ANSWER, ask)
        .await
        .ok()??
        .into_inner();
    (a.member_id == m.id).then(|| MemberState {
        leader_id: a.leader_id,
        is_learner: a.is_learner,
        raft_index: a.raft_index,
        db_size: a.db_size.max(0) as u64,
        db_size_in_use: a.db_size_in_use.max(0) as u64,
    })
}

async fn defragment_remote(
    shared: &Shared,
    m: &consensus::membership::Member,
) -> Result<(i64, i64), Status> {
    let channel = channel_to(shared, m).await.ok_or_else(|| {
        Status::unavailable(format!(
            "the curator of etcd member {:x} does not answer",
            m.id
        ))
    })?;
    let mut local = api::curator_local_client::CuratorLocalClient::new(channel);
    let call = local.defragment_member(api::DefragmentMemberRequest { member_id: m.id });
    let answer = tokio::time::timeout(maintenance::DEFRAGMENT_PATIENCE, call)
        .await
        .map_err(|_| Status::deadline_exceeded(format!("defragmenting etcd member {:x}", m.id)))??
        .into_inner();
    Ok((answer.db_size_before, answer.db_size_after))
}

/// Defragments this curator's own member (one at a time).
async fn defragment_local(shared: &Shared) -> Result<(i64, i64), Status> {
    let _one = DEFRAGMENTING.lock().await;
    let mut client = shared.curator.client();
    maintenance::defragment(&mut client)
        .await
        .map_err(|e| etcd_status("defragmenting the local etcd member", e))
}

/// CuratorLocal.DefragmentMember: the leader's request to defragment this curator's own
/// member. The caller must be an UP consensus member, and mean this member.
pub(super) async fn defragment_own(
    shared: &Shared,
    caller: &rpc::Identity,
    member_id: u64,
) -> Result<api::DefragmentMemberResponse, Status> {
    let rpc::Identity::Node { id, .. } = caller else {
        return Err(Status::permission_denied(
            "only curators ask for a defragmentation",
        ));
    };
    if !shared.is_curator_node(id) {
        return Err(Status::permission_denied(format!(
            "node {id} is no UP consensus member"
        )));
    }
    let mut client = shared.curator.client();
    let own = maintenance::status(&mut client)
        .await
        .map_err(|e| etcd_status("the local etcd member's status", e))?;
    if own.member_id != member_id {
        return Err(Status::failed_precondition(format!(
            "this curator's etcd member is {:x}, not {member_id:x}",
            own.member_id
        )));
    }
    let (before, after) = defragment_local(shared).await?;
    Ok(api::DefragmentMemberResponse {
        db_size_before: before,
        db_size_after: after,
    })
}
