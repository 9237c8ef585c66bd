//! The control plane of a consensus member: its etcd and its curator. The role server
//! starts it when the node has (or gains) the ConsensusMember role and stops it when the
//! role goes away; it decides once per start how this node's etcd comes up.
//!
//! ```text
//!   bootstrapping (no sealed configuration yet) ─▶ new one-member etcd ─▶ bootstrap::finish
//!   etcd data present (a member before) ─────────▶ etcd on its data ─▶ same cluster, same
//!                                                   member, same node record? ─▶ voter?
//!     (recover: --force-new-cluster, this start only; not serving and the cluster says
//!      it holds another member for this node (`rejoin`) ─▶ data wiped ─▶ restart ─▶ ↓)
//!   no etcd data (role given live) ──JoinConsensus─▶ peer files ─▶ etcd as learner
//!                                                   (serializable readiness) ─▶ promoted
//!                                                   by the leader ─▶ member.pb
//!   then: crlsync (etcd peer CRL → crl.pem, on every change), memberbook (the etcd
//!   members → data/etcd/members.pb), datapeers (encrypted data: the other members'
//!   halves into the ESP) and the curator
//! ```
//! etcd's backend quota comes from the bootstrap parameters or the JoinConsensus answer,
//! recorded in `data/etcd/quota.pb` before etcd first starts; every start uses it.
//! A learner answers no linearizable reads, so readiness is a local read and "voter" is
//! a separate wait: a linearizable read succeeds once the leader promoted it.
//!
//! The `root.role.controlplane` runnable: it publishes `NodeValues::services` (and
//! `NodeValues::local_etcd` once etcd serves, before any quorum) and makes
//! the node Home once; may not change roles or the curator list (rolefetch does), nor
//! start or stop itself (the role server does).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use consensus::{EtcdConfig, InitialClusterState, Readiness, Running, Status};
use proto::api;
use proto::config::{ConsensusMembership, SealedConfiguration};

use crate::curators::curator_client::curator_client;
use crate::curators::retry::{Answer, call_until_answered, pause};
use crate::data::datapeers;
use crate::disk::files::{
    has_etcd_data, peer_tls_files, record_quota, recorded_membership, recorded_quota,
    write_peer_files,
};
use crate::disk::storage::{Root, read_file, read_proto, write_proto};
use crate::member::epochs;
use crate::member::memberbook;
use crate::member::rejoin;
use crate::member::superseded;
use crate::process::fatal::FatalSender;
use crate::start::bootstrap::{self, Step};
use crate::state::cluster_state::Contact;
use crate::state::membership::Membership;
use crate::state::settings::Settings;
use crate::state::values::{LocalEtcd, NodeValues, RunningServices, apply_contact};

/// How this start brings up the local etcd member.
enum EtcdStart {
    /// A new one-member cluster (bootstrap).
    Bootstrap,
    /// The member this node already is (its data is on disk).
    Existing,
    /// A new learner in the running cluster: these members, this node included.
    Learner(Vec<(String, String)>),
}

fn etcd_config(
    settings: &Settings,
    node_id: &str,
    start: &EtcdStart,
    quota_backend_bytes: u64,
    recovering: bool,
) -> EtcdConfig {
    let root = &settings.root;
    let peer_url = consensus::config::peer_url(settings.address, consensus::config::PEER_PORT);
    let (initial_cluster, state, readiness) = match start {
        EtcdStart::Bootstrap => (
            vec![(node_id.to_string(), peer_url)],
            InitialClusterState::New,
            Readiness::Linearizable,
        ),
        // With existing data etcd ignores the initial cluster; "existing" makes it refuse
        // instead of silently creating a new cluster if the data were gone.
        EtcdStart::Existing => (
            vec![(node_id.to_string(), peer_url)],
            InitialClusterState::Existing,
            Readiness::Serializable,
        ),
        EtcdStart::Learner(members) => (
            members.clone(),
            InitialClusterState::Existing,
            Readiness::Serializable,
        ),
    };
    EtcdConfig {
        binary: settings.etcd_binary.clone(),
        name: node_id.to_string(),
        data_dir: root.etcd_data(),
        run_dir: root.consensus_run_dir(),
        peer_address: settings.address,
        peer_port: consensus::config::PEER_PORT,
        peer_tls: peer_tls_files(root),
        initial_cluster,
        initial_cluster_state: state,
        cluster_token: format!("polis-{node_id}"),
        timing: settings.raft_timing,
        readiness,
        quota_backend_bytes,
        // Recovery (`polis-node recover`) forces a new cluster from this member's data,
        // on every start until its claim is recorded (`epochs::resume_recover`).
        force_new_cluster: matches!(start, EtcdStart::Existing) && recovering,
    }
}

/// Asks the cluster to make this node an etcd learner; writes the peer files it gets.
async fn join_consensus(
    ctx: &supervisor::Context,
    settings: &Settings,
    values: &NodeValues,
    membership: &Membership,
) -> Result<Option<EtcdStart>> {
    let client = curator_client(settings, values)?;
    client.set_endpoints(values.curators.current().unwrap_or_default());
    let join = |channel| async move {
        api::curator_client::CuratorClient::new(channel)
            .join_consensus(api::JoinConsensusRequest {})
            .await
    };
    let joined = match call_until_answered(ctx, &client, "joining consensus", |_| false, join).await
    {
        Answer::Ok(j) => j,
        Answer::Refused(_) | Answer::Cancelled => return Ok(None),
    };
    let key = membership.key();
    // Every peer CA trusted (older curators name only the signing one): during a
    // rotation the other members may present certificates of either.
    let peer_cas = if joined.peer_trusted_cas.is_empty() {
        vec![joined.peer_ca_certificate.clone()]
    } else {
        joined.peer_trusted_cas.clone()
    };
    write_peer_files(
        &settings.root,
        key,
        &peer_cas,
        &joined.peer_certificate,
        &joined.peer_crl,
    )
    .context("writing etcd peer TLS files")?;
    tracing::info!(
        member = format!("{:x}", joined.member_id),
        members = joined.initial_cluster.len(),
        "joining consensus as an etcd learner"
    );
    // etcd upkeep: the cluster's quota, from every start of this member on (an older
    // leader that sends none: the default).
    let quota = proto::quota::effective_quota(joined.etcd_quota_bytes)
        .context("the cluster's etcd quota")?;
    record_quota(&settings.root, quota)?;
    Ok(Some(EtcdStart::Learner(
        joined
            .initial_cluster
            .into_iter()
            .map(|m| (m.name, m.peer_url))
            .collect(),
    )))
}

/// What waiting to be a voter came to.
enum VoterWait {
    Voter,
    Cancelled,
    /// The cluster holds another member (this learner) for this node: the running
    /// member is not its member any more (see `rejoin`).
    NotMember(u64, Vec<proto::config::ClusterEpoch>),
}

/// Waits until the local member answers a linearizable read: it is a voter with a
/// leader. A learner only gets there once the leader promoted it; while it waits, it asks
/// again now and then (JoinConsensus is idempotent and resumes a promotion a leader
/// change or a slow catch-up interrupted) — and the answer tells whether the running
/// member is still this node's member.
async fn wait_voter(
    ctx: &supervisor::Context,
    running: &Running,
    settings: &Settings,
    values: &NodeValues,
) -> Result<VoterWait> {
    let mut client = running.client.clone();
    let mut waited = Duration::ZERO;
    let mut next_ask = ASK_AGAIN_AFTER;
    loop {
        let probe = tokio::time::timeout(
            Duration::from_secs(2),
            client.get("\0polis-voter-probe", None),
        );
        if let Ok(Ok(_)) = probe.await {
            return Ok(VoterWait::Voter);
        }
        if waited >= next_ask {
            next_ask += ASK_AGAIN_AFTER;
            tracing::info!("this etcd member is not a voter yet; asking the cluster to promote it");
            let curators = curator_client(settings, values)?;
            curators.set_endpoints(values.curators.current().unwrap_or_default());
            let asked = curators
                .call(|channel| async move {
                    api::curator_client::CuratorClient::new(channel)
                        .join_consensus(api::JoinConsensusRequest {})
                        .await
                })
                .await;
            if let Err(e) = &asked {
                tracing::warn!("asking for promotion: {e}");
            }
            let answer = rejoin::classify(&asked);
            if let rejoin::Verdict::NotMember { learner } =
                rejoin::verdict(Some(running.member_id), answer)
            {
                return Ok(VoterWait::NotMember(learner, rejoin::epochs_of(&asked)));
            }
        }
        let step = Duration::from_millis(25);
        waited += step;
        if !pause(ctx, step).await {
            return Ok(VoterWait::Cancelled);
        }
    }
}

/// How long a member waits to become a voter before it asks the leader again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(10);

/// The `root.role.controlplane` runnable.
pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
    fatal: FatalSender,
) -> supervisor::RunnableResult {
    let membership = values.membership.watch().get().await?;
    let node_id = membership.key().node_id();
    let sealed_path = settings.root.sealed_configuration();
    // Once the sealed configuration exists, a bootstrapping process is a joined node: a
    // restarted control plane takes the join path.
    let bootstrapping = matches!(membership, Membership::Bootstrap(_)) && !sealed_path.exists();
    let sealed: Option<SealedConfiguration> = if sealed_path.exists() {
        Some(read_proto(&sealed_path, "sealed configuration")?)
    } else {
        None
    };
    let start = if bootstrapping {
        EtcdStart::Bootstrap
    } else if has_etcd_data(&settings.root) {
        EtcdStart::Existing
    } else {
        match join_consensus(&ctx, &settings, &values, &membership).await? {
            Some(s) => s,
            None => return Ok(()),
        }
    };
    if let (EtcdStart::Bootstrap, Membership::Bootstrap(b)) = (&start, &membership) {
        let configured = b
            .parameters
            .initial_cluster_configuration
            .as_ref()
            .map(|c| c.etcd_quota_bytes)
            .unwrap_or_default();
        let quota = proto::quota::effective_quota(configured).context("the etcd quota")?;
        record_quota(&settings.root, quota)?;
    }
    let quota = recorded_quota(&settings.root)?;
    // A recover whose claim is not recorded yet (on disk: it survives a crash and a
    // restart of this runnable alike) forces etcd and records the claim first.
    let recovering = epochs::recover_pending(&settings.root)?;
    let config = etcd_config(&settings, &node_id, &start, quota, recovering);
    let forcing = config.force_new_cluster;
    // A member of an older epoch never serves: asked before its etcd starts (a
    // recovering member asks while it settles, below).
    if matches!(start, EtcdStart::Existing)
        && !forcing
        && let Some(newer) = superseded::check(&settings, &values).await?
    {
        return superseded::step_down(&ctx, &settings, &values, newer).await;
    }
    let settling = forcing.then(|| {
        tokio::spawn(superseded::settle(
            settings.clone(),
            values.clone(),
            superseded::SETTLE,
        ))
    });
    let _services = ServicesStop(
        values.services.clone(),
        values.local_etcd.clone(),
        values.etcd_peer_trust_loaded.clone(),
    );
    let status = event::Value::<Status>::new();
    let etcd_status = status.clone();
    // `peertrust` restarts etcd through it, to load changed peer CAs.
    let restart_etcd = std::sync::Arc::new(tokio::sync::Notify::new());
    let etcd_restart = restart_etcd.clone();
    let force_root = settings.root.clone();
    let etcd = ctx.run_stoppable("consensus", move |ctx| {
        let (mut config, status) = (config.clone(), etcd_status.clone());
        let restart = etcd_restart.clone();
        // Forced until the claim is recorded (forcing a one-member cluster again changes
        // nothing); a restart after that runs it as usual: forcing then would remove every
        // member that joined since.
        config.force_new_cluster &= epochs::recover_pending(&force_root).unwrap_or(true);
        async move {
            consensus::run_restartable(&ctx, &config, &status, &restart).await?;
            Ok(())
        }
    })?;
    let mut status_watcher = status.watch();
    // A member on its old data asks the cluster whether it still is one while its etcd
    // does not come up (a removed member's etcd exits; see `rejoin`).
    let own = match &start {
        EtcdStart::Existing => {
            recorded_membership(&settings.root, sealed.as_ref())?.map(|m| m.etcd_member_id)
        }
        _ => None,
    };
    let asking = matches!(start, EtcdStart::Existing) && !forcing;
    let running = tokio::select! {
        s = status_watcher.get_matching(|s| matches!(s, Status::Running(_))) => match s? {
            Status::Running(r) => r,
            Status::Stopped => unreachable!("filtered for Running"),
        },
        (learner, chain) = rejoin::until_not_member(&ctx, &settings, &values, own), if asking => {
            etcd.stop().await;
            return leave_stale_member(&ctx, &settings, &values, own, learner, &chain).await;
        }
        _ = ctx.cancelled() => return Ok(()),
    };
    if forcing {
        crate::process::crash::crash_point("recover-forced");
        tracing::warn!(
            member = format!("{:x}", running.member_id),
            "recovered: this etcd member is now the only member of its cluster, with \
             everything it had committed"
        );
    }
    if let Some(settling) = settling {
        let curator_ns = running.namespaced(curator::layout::NAMESPACE);
        let epoch = record_claim(&settings, &curator_ns).await?;
        if let Ok(Some(newer)) = settling.await {
            tracing::warn!(
                own = proto::epoch::describe(&epoch),
                "another recovery made a newer epoch while this one settled: stepping down"
            );
            etcd.stop().await;
            return superseded::step_down(&ctx, &settings, &values, newer).await;
        }
    }
    set_services(&values, true, false);
    // From now on, with or without a quorum, the log port answers about this member.
    values.local_etcd.set(Some(LocalEtcd {
        client: running.client.clone(),
        quota_backend_bytes: quota,
    }));
    // The peer CAs the running etcd loaded, for the node's status and `peertrust`.
    let (loaded_values, loaded_status) = (values.clone(), status.clone());
    ctx.run("peerloaded", move |ctx| {
        crate::runnables::peertrust::publish_loaded(
            ctx,
            loaded_status.clone(),
            loaded_values.clone(),
        )
    })?;

    // The etcd peer CAs the cluster trusts, into etcd's trust file and (by a restart,
    // one member at a time) into etcd; before the member is a voter, since one that
    // missed a rotation gets there only with them.
    let (trust_settings, trust_values, trust_client) =
        (settings.clone(), values.clone(), running.client.clone());
    ctx.run("peertrust", move |ctx| {
        crate::runnables::peertrust::run(
            ctx,
            trust_settings.clone(),
            trust_values.clone(),
            trust_client.clone(),
            restart_etcd.clone(),
        )
    })?;
    if !matches!(start, EtcdStart::Bootstrap) {
        match wait_voter(&ctx, &running, &settings, &values).await? {
            VoterWait::Voter => {}
            VoterWait::Cancelled => return Ok(()),
            VoterWait::NotMember(learner, chain) => {
                let own = Some(running.member_id);
                etcd.stop().await;
                return leave_stale_member(&ctx, &settings, &values, own, learner, &chain).await;
            }
        }
    }
    let outcome = match (&membership, &start) {
        (Membership::Bootstrap(b), EtcdStart::Bootstrap) => {
            bootstrap::finish(&settings.root, settings.address, &running, b).await
        }
        _ => check_member(&settings.root, &running, &membership, sealed.as_ref()).await,
    };
    match outcome {
        Ok(()) => {}
        Err(Step::Retry(e)) => return Err(e.into()),
        Err(Step::Fatal(e)) => {
            let _ = fatal.send(e);
            ctx.cancelled().await;
            return Ok(());
        }
    }

    let crl_running = running.clone();
    let crl_path = settings.root.etcd_peer_dir().join("crl.pem");
    ctx.run("crlsync", move |ctx| {
        crate::runnables::peertrust::crl_sync(ctx, crl_running.client.clone(), crl_path.clone())
    })?;

    // The member list, recorded for a later start without a quorum (`memberbook`).
    let (book_root, book_client) = (settings.root.clone(), running.client.clone());
    ctx.run("memberbook", move |ctx| {
        memberbook::keep(ctx, book_root.clone(), book_client.clone())
    })?;

    // Encrypted data: this member keeps the other members' halves in its ESP.
    if settings.root.esp().join("data-join-key.der").exists() {
        let (peers_root, own, peers_ns) = (
            settings.root.clone(),
            node_id.clone(),
            running.namespaced(curator::layout::NAMESPACE),
        );
        ctx.run("datapeers", move |ctx| {
            datapeers::refresh(ctx, peers_root.clone(), own.clone(), peers_ns.clone())
        })?;
    }

    let curator_config = curator::service::CuratorConfig {
        node_id: node_id.clone(),
        listen: SocketAddr::new(settings.address, rpc::CURATOR_PORT),
        credentials: values.credentials.slot(&settings.root)?,
        ca_certificate: read_file(&settings.root.cluster_ca(), "cluster CA certificate")?,
        lease_ttl: settings.curator_lease_ttl,
        heartbeat: settings.heartbeat,
        etcd_quota_bytes: quota,
        etcd_run_dir: Some(settings.root.consensus_run_dir()),
        upkeep: settings.upkeep,
        snapshots: curator::service::SnapshotSettings {
            dir: Some(settings.root.snapshots()),
            bounds: settings.snapshot_bounds,
        },
        entry_rate: settings.entry_rate,
        serving: event::Value::new(),
    };
    let mut serving = curator_config.serving.watch();
    let curator_ns = running.namespaced(curator::layout::NAMESPACE);
    ctx.run("curator", move |ctx| {
        curator::service::run(ctx, curator_config.clone(), curator_ns.clone())
    })?;
    // Home only once this node's curator accepts connections (it first loads or issues
    // its curator certificate): a client told the node is Home can reach it.
    tokio::select! {
        s = serving.get_matching(|serving| *serving) => { s?; }
        _ = ctx.cancelled() => return Ok(()),
    }
    set_services(&values, true, true);
    sync_epoch(&settings, &running).await;
    // Home once, as the node enters its cluster; a split node gets back to Home only
    // through its heartbeats (a restarted control plane says nothing about contact).
    apply_contact(&values.cluster_state, Contact::Joined);
    ctx.signal_healthy();
    // The status reports whether the etcd member still runs; the other members are
    // asked for their epochs (a newer one: this member stops serving at once, and its
    // next start steps down).
    let mut watch = tokio::time::interval(superseded::WATCH_EVERY);
    loop {
        tokio::select! {
            s = status_watcher.get() => match s {
                Ok(s) => set_services(&values, matches!(s, Status::Running(_)), true),
                Err(_) => return Ok(()),
            },
            _ = watch.tick() => match superseded::check(&settings, &values).await {
                Ok(Some(newer)) => {
                    return Err(format!(
                        "a newer epoch of this cluster answers (member {} at {}): this \
                         member stops serving",
                        newer.answer.node_id, newer.ip
                    )
                    .into());
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("asking the other members for their epochs: {e:#}"),
            },
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

/// Records a recovery's claimed epoch (kept beside the data by `recover`) in the
/// now-forced etcd, once, and beside the data again with its record's revision.
async fn record_claim(
    settings: &Settings,
    curator_ns: &consensus::Namespaced,
) -> Result<proto::config::ClusterEpoch> {
    let claim = epochs::load(&settings.root)?;
    if !epochs::recover_pending(&settings.root)? {
        return Ok(claim);
    }
    // Each step is safe to repeat: a start that finds the recover unfinished on disk
    // runs them all again (`epochs::resume_recover`).
    let recorded = curator::epochs::record(curator_ns, &claim)
        .await
        .context("recording the recovered cluster's new epoch")?;
    crate::process::crash::crash_point("recover-recorded");
    // The survivor may have lagged behind CRLs others saw: new numbers past them all.
    crate::start::restore::reissue_crls(&curator_ns.client()).await?;
    crate::process::crash::crash_point("recover-crls");
    // Every lease is an election lease of a curator of before the recovery (this
    // process has none yet): all are dead by the recovery's own decision, so the
    // campaign need not wait for evidence that their holders stopped renewing.
    crate::start::restore::revoke_old_leases(curator_ns.client()).await;
    epochs::finish_recover(&settings.root, &recorded)?;
    tracing::warn!(
        epoch = proto::epoch::describe(&recorded),
        revision = recorded.record_revision,
        "this cluster's new epoch is recorded"
    );
    Ok(recorded)
}

/// Keeps beside the data the epoch its etcd holds (a member that joined a recovered or
/// restored cluster as a learner holds that cluster's epochs once it is a voter).
async fn sync_epoch(settings: &Settings, running: &Running) {
    let curator_ns = running.namespaced(curator::layout::NAMESPACE);
    let chain = match curator::epochs::chain(&curator_ns, true).await {
        Ok(chain) => chain,
        Err(e) => {
            tracing::warn!("reading the cluster's epochs: {e}");
            return;
        }
    };
    let held = proto::epoch::latest(&chain);
    match epochs::load(&settings.root) {
        Ok(kept) if proto::epoch::same(&kept, &held) || proto::epoch::newer(&kept, &held) => {}
        _ => {
            if let Err(e) = epochs::keep(&settings.root, &held) {
                tracing::warn!("{e:#}");
            }
        }
    }
}

/// The cluster answered that this node's etcd member (`own`) is no member any more
/// (see `rejoin`), and holds learner `learner` for it: with etcd stopped, its data and
/// peer credentials go (as when the role is taken, `forget_consensus`) — unless the
/// cluster's epochs (`chain`) show the data holds writes the cluster lacks: then it is
/// kept and the member holds back (`superseded::drop_or_hold`). Dropped, the control
/// plane fails and starts again without etcd data: it joins as learner `learner`.
async fn leave_stale_member(
    ctx: &supervisor::Context,
    settings: &Settings,
    values: &NodeValues,
    own: Option<u64>,
    learner: u64,
    chain: &[proto::config::ClusterEpoch],
) -> supervisor::RunnableResult {
    let own = own.map_or("unrecorded".into(), |m| format!("{m:x}"));
    let why = format!(
        "etcd member {own} is no longer a member of its cluster (removed by a recovery or \
         restore; the cluster holds learner {learner:x} for this node)"
    );
    superseded::drop_or_hold(ctx, settings, values, &why, chain).await
}

fn set_services(values: &NodeValues, etcd_member: bool, curator: bool) {
    let next = RunningServices {
        etcd_member,
        curator,
    };
    values
        .services
        .update(|c| (c != Some(&next)).then_some(next));
}

/// Reports the control plane's services as stopped when the control plane runnable
/// ends (stopped with the role, cancelled, or failed and about to restart).
struct ServicesStop(
    event::Value<RunningServices>,
    event::Value<Option<LocalEtcd>>,
    event::Value<Vec<u8>>,
);

impl Drop for ServicesStop {
    fn drop(&mut self) {
        self.0.set(RunningServices::default());
        self.1.set(None);
        self.2.set(Vec::new());
    }
}

/// The etcd we started must be this node's member of its cluster: the recorded member
/// (or, right after joining consensus, none yet: then it is recorded now), the sealed
/// cluster CA, and a node record with this node's key and address.
async fn check_member(
    root: &Root,
    running: &Running,
    membership: &Membership,
    sealed: Option<&SealedConfiguration>,
) -> Result<(), Step> {
    let sealed = sealed.ok_or_else(|| Step::Fatal(anyhow!("no sealed configuration")))?;
    match recorded_membership(root, Some(sealed))? {
        Some(m)
            if m.etcd_cluster_id != running.cluster_id || m.etcd_member_id != running.member_id =>
        {
            return Err(Step::Fatal(anyhow!(
                "etcd data is cluster {:x} member {:x}, but this node recorded cluster {:x} member {:x}; \
                 the etcd data directory does not belong to this node",
                running.cluster_id,
                running.member_id,
                m.etcd_cluster_id,
                m.etcd_member_id
            )));
        }
        Some(_) => {}
        None => {}
    }
    let curator_ns = running.namespaced(curator::layout::NAMESPACE);
    let trusted = curator::cluster_pki(&curator_ns)
        .trusted()
        .await
        .context("loading the cluster CAs")?
        .cas();
    // The CA it joined under (sealed), or, after CA rotations, one it learnt since
    // (`data/node/trust.pem`): either way a CA of this cluster.
    let learnt = crate::curators::curator_client::saved_trust(&root.cluster_trust())
        .map_err(Step::Fatal)?
        .map(|anchors| anchors.cas)
        .unwrap_or_default();
    let ours = std::iter::once(sealed.cluster_ca_certificate.clone())
        .chain(learnt)
        .any(|ca| trusted.contains(&ca));
    if !ours {
        return Err(Step::Fatal(anyhow!(
            "the cluster CAs in etcd are none of the CAs in the sealed configuration or              {}",
            root.cluster_trust().display()
        )));
    }
    match curator::load_node(&curator_ns, &sealed.node_id).await {
        Ok(Some(node))
            if node.public_key == membership.key().public_key()
                && node.address == sealed.address => {}
        Ok(Some(node)) => {
            return Err(Step::Fatal(anyhow!(
                "the cluster's record of node {} (address {}) does not match this node's key and address {}",
                sealed.node_id,
                node.address,
                sealed.address
            )));
        }
        Ok(None) => {
            return Err(Step::Fatal(anyhow!(
                "node {} has no record in the cluster",
                sealed.node_id
            )));
        }
        Err(e) => return Err(Step::Retry(e.into())),
    }
    if recorded_membership(root, Some(sealed))?.is_none() {
        write_proto(
            &root.consensus_membership(),
            &ConsensusMembership {
                etcd_cluster_id: running.cluster_id,
                etcd_member_id: running.member_id,
            },
        )
        .context("recording this node's etcd membership")?;
        tracing::info!(
            member = format!("{:x}", running.member_id),
            "this node is now a voting etcd member"
        );
    }
    Ok(())
}
