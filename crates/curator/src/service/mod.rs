//! The curator's gRPC services and the runnable that serves them: one module per
//! service, one per runnable, the operations they share below them, and state shared
//! through [`Shared`].
//!
//! ```text
//!   root.role.controlplane.curator (run, here)
//!   ├── election     campaign → Role (Follower | Leader(Leadership))
//!   ├── nodes        one etcd watch on nodes/ → Shared::nodes (snapshot per change)
//!   ├── quorum       the local etcd member's leader, looked at every 200 ms →
//!   │                Shared::etcd_leader (without one: calls refused, `quorum`)
//!   ├── crl          one etcd watch on the cluster CAs and CRLs → Shared::trusted,
//!   │                Shared::crl (see `crl`)
//!   ├── peer-trust   one etcd watch on the etcd peer CAs → Shared::peer_trusted
//!   ├── ca-rotation  leader: moves a running CA rotation on (`ca_rotation`)
//!   ├── pki-prune    leader: forgets certificates long expired and superseded
//!   ├── decommission leader: finishes DECOMMISSIONING nodes (see `decommission`)
//!   ├── membership   leader: carries out recorded role removals (resumed after a
//!   │                failover), removes learners no record stands for (`reconciler`)
//!   ├── certificates every issued certificate, refreshed → Shared::certificates
//!   │                (expiry warnings in NodeInfo; see `certificates`)
//!   ├── health       leader: heartbeat verdicts (crate::health) → Node.health on change
//!   ├── upkeep       leader: etcd compaction under NOSPACE, defragmentation one
//!   │                member at a time (through each member's curator), disarm
//!   ├── snapshots    every curator: scheduled snapshots of its own etcd member into
//!   │                ROOT/data/snapshots, pruned past the count kept (`scheduled`)
//!   ├── curator-certificate  the curator certificate served (issued at start when
//!   │                missing; renewed when due; see `curator_certificate`)
//!   └── listener     TLS + AuthLayer → QuorumLayer → ForwardLayer → ConfirmLayer → local | aaa
//!                    | management | nodes (Curator service) | backup | audit_log;
//!                    AuditLayer → audit_writer
//! ```
//!
//! Modules top to bottom (each imports only modules below it, and the crate's own:
//! `records`, `writes`, `ticket`, `layout`, `templates`, `election`, …):
//! ```text
//!   run (this file)  wires the runnables
//!   listener         TLS, AuthLayer, ForwardLayer, every service
//!   confirm          ConfirmLayer: a read the leader answers leaves only once etcd
//!                    confirms, after the answer, that this curator still leads
//!   handlers         local (CuratorLocal), aaa (AAA), management (Management),
//!                    nodes (Curator), backup (Backup: a snapshot of this curator's
//!                    own etcd member); node_info builds their NodeInfo answers;
//!                    scheduled_api (snapshot listing, fetch, relay; the schedule)
//!                    audit_log (Audit: the log read in pages, followed);
//!                    audit_writer (behind rpc::AuditLayer: entries cut to size,
//!                    refusals counted, the log held to its budget);
//!                    unlock (DataUnlock: a node's cluster half of its data key);
//!                    node_status (Heartbeat's status into the record, once a period)
//!   runnables        snapshot (`nodes`), quorum (also its layer), crl, health, upkeep
//!                    (etcd upkeep; also
//!                    CuratorLocal.DefragmentMember's work), scheduled (scheduled
//!                    snapshots; their files listed and located)
//!   tickets          register tickets: Management's ticket calls, RegisterNode's
//!                    record creation spending one use
//!   operators        Management's operator calls; an operator's certificate (Escrow)
//!   decommission     DecommissionNode, DeleteNode and the `decommission` runnable
//!   reconciler       the `membership` runnable: recorded membership intents carried
//!                    out by the leader, orphaned learners removed
//!   removal          the role taken as a durable intent: recorded, carried out
//!                    (by the request or the reconciler), orphaned learners removed
//!   membership       etcd membership: join (learner, promotion, fenced), the role
//!                    given, the quorum probe, the retries every change goes through
//!   issuance         every certificate the curator issues to callers
//!   curator_certificate  the curator certificate this curator serves with (issued
//!                    for its own node key; only on a ConsensusMember record)
//!   fence            the guard node certificates are recorded under (exclusive
//!                    with decommission and deletion)
//!   shared           CuratorConfig, Snapshot, Shared, Services
//!   etcd_members     etcd member lookup (no changes)
//!   status           errors → Status, request and record checks (pure)
//!   health_book      this tenure's heartbeat trackers (memory only)
//!   certificates     listing, expiry view and warnings; its runnable gets what it
//!                    updates as arguments, so it needs no `Shared`
//! ```
//! Heartbeats land in this tenure's `HealthBook`; `node_infos` (ListNodes,
//! DescribeNode) reads verdicts from it, never from etcd.
//! Handlers that change state take a `Leadership` from `Shared::leadership` and write
//! through `writes` (node records) and `ticket` functions that require it, so no write
//! bypasses the election. Every certificate is issued by `issuance` (the curator's own
//! by `curator_certificate`), every etcd
//! membership change made by `membership`.
//! Streams (RegisterNode, WatchNode) are fed by the shared node snapshot, not by an etcd
//! watch per client.

mod aaa;
mod audit_log;
mod audit_writer;
mod backup;
mod ca_rotation;
pub mod certificates;
mod confirm;
mod crl;
mod curator_certificate;
mod decommission;
mod epoch_signer;
mod etcd_members;
mod fence;
mod follows;
mod health;
mod health_book;
mod issuance;
pub mod kubernetes;
mod listener;
mod local;
mod management;
mod membership;
mod node_info;
mod node_status;
mod nodes;
mod operators;
mod pki_prune;
mod quorum;
mod reconciler;
mod reissue;
mod removal;
mod scheduled;
mod scheduled_api;
mod shared;
mod snapshot;
mod status;
mod tickets;
mod unlock;
mod upkeep;
mod watchers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use consensus::Namespaced;

pub use local::{epoch_signature, member_status, peer_answers, with_peer_view};
pub use shared::{CuratorConfig, NodeSnapshot, Services, Shared, Snapshot, SnapshotSettings};

use crate::election::{self, ElectionConfig, Role};
use health_book::HealthBook;

/// The curator runnable: campaigns for leadership (`election`), keeps the node snapshot
/// (`nodes`) and serves gRPC on `config.listen` (`listener`), on every consensus member.
pub async fn run(
    ctx: supervisor::Context,
    config: CuratorConfig,
    curator: Namespaced,
) -> supervisor::RunnableResult {
    let role = event::Value::new();
    role.set(Role::Follower);
    let shared = Arc::new(Shared {
        config: config.clone(),
        curator: curator.clone(),
        role: role.clone(),
        health: Mutex::new(HealthBook::default()),
        nodes: event::Value::new(),
        nodes_live: event::Value::new(),
        etcd_leader: event::Value::new(),
        membership: Arc::new(tokio::sync::Mutex::new(())),
        crl: event::Value::new(),
        trusted: event::Value::new(),
        trusted_wire: event::Value::new(),
        peer_trusted: event::Value::new(),
        trust: rpc::TrustSlot::empty(),
        decommission_problems: Mutex::new(HashMap::new()),
        certificates: event::Value::new(),
        certificates_changed: tokio::sync::Notify::new(),
        limited_spends: tokio::sync::Mutex::new(()),
        tenure_ca: Mutex::new(None),
        tenure_configuration: Mutex::new(None),
        claims_indexed: tokio::sync::Mutex::new(None),
        scheduled: Mutex::new(Default::default()),
        handovers: tokio::sync::Mutex::new(None),
        follows: Default::default(),
        watchers: Default::default(),
    });

    let election_config = ElectionConfig {
        node_id: config.node_id.clone(),
        endpoint: config.listen.to_string(),
        ttl: config.lease_ttl,
    };
    let election_shared = shared.clone();
    ctx.run("election", move |ctx| {
        let (cfg, shared) = (election_config.clone(), election_shared.clone());
        async move {
            election::run(
                &shared.curator,
                &cfg,
                &shared.role,
                &ctx.cancellation_token(),
                || ctx.signal_healthy(),
            )
            .await?;
            Ok(())
        }
    })?;

    let quorum_shared = shared.clone();
    ctx.run("quorum", move |ctx| quorum::run(ctx, quorum_shared.clone()))?;

    let nodes_shared = shared.clone();
    ctx.run("nodes", move |ctx| snapshot::run(ctx, nodes_shared.clone()))?;

    let crl_shared = shared.clone();
    ctx.run("crl", move |ctx| crl::run(ctx, crl_shared.clone()))?;

    let peer_trust_shared = shared.clone();
    ctx.run("peer-trust", move |ctx| {
        crl::run_peer(ctx, peer_trust_shared.clone())
    })?;

    let decommission_shared = shared.clone();
    ctx.run("decommission", move |ctx| {
        decommission::run(ctx, decommission_shared.clone())
    })?;

    let membership_shared = shared.clone();
    ctx.run("membership", move |ctx| {
        reconciler::run(ctx, membership_shared.clone())
    })?;

    let certificates_shared = shared.clone();
    ctx.run("certificates", move |ctx| {
        let shared = certificates_shared.clone();
        async move {
            certificates::run(
                ctx,
                &shared.curator,
                &shared.certificates,
                &shared.certificates_changed,
            )
            .await
        }
    })?;

    let health_shared = shared.clone();
    ctx.run("health", move |ctx| health::run(ctx, health_shared.clone()))?;

    let rotation_shared = shared.clone();
    ctx.run("ca-rotation", move |ctx| {
        ca_rotation::run(ctx, rotation_shared.clone())
    })?;

    let prune_shared = shared.clone();
    ctx.run("pki-prune", move |ctx| {
        pki_prune::run(ctx, prune_shared.clone())
    })?;

    let upkeep_shared = shared.clone();
    ctx.run("upkeep", move |ctx| upkeep::run(ctx, upkeep_shared.clone()))?;

    let scheduled_shared = shared.clone();
    ctx.run("snapshots", move |ctx| {
        scheduled::run(ctx, scheduled_shared.clone())
    })?;

    // Served by the listener, kept current by the `curator-certificate` runnable.
    let served = rpc::CredentialSlot::new(
        curator_certificate::credentials(&shared)
            .await
            .map_err(|e| format!("the curator certificate: {}", e.message()))?,
    )?;
    let renewal = (shared.clone(), served.clone());
    ctx.run("curator-certificate", move |ctx| {
        curator_certificate::run(ctx, renewal.0.clone(), renewal.1.clone())
    })?;

    let listener_shared = shared.clone();
    ctx.run("listener", move |ctx| {
        let (shared, served) = (listener_shared.clone(), served.clone());
        async move { listener::serve(ctx, shared, served).await }
    })?;
    ctx.signal_healthy();
    ctx.cancelled().await;
    Ok(())
}
