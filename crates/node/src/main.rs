//! `polis-node`: the agent every machine of a Polis cluster runs.
//!
//! `polis-node --root ROOT --address ADDR` starts a node (`--config FILE`: flags from a
//! TOML file too, see `config_file`); `polis-node recover --root ROOT` starts a surviving
//! consensus member after its cluster lost its quorum, as the only member (see `recover`);
//! `polis-node restore --root NEWROOT --address ADDR --backup FILE` makes a new node the
//! only member of the cluster a backup was taken from (see `restore`); `polis-node
//! set-curators --root ROOT ENDPOINT...` points a stopped node at curators it cannot find
//! by itself (see `set_curators`).
//!
//! On every start the node decides once what it is (see `decision`): a node that
//! already belongs to a cluster *joins* it again; a fresh node *bootstraps* a new cluster
//! or *registers* into an existing one, as its node parameters say. Everything after
//! that decision runs as runnables under a supervisor:
//!
//! ```text
//!   root
//!   ├── cluster                  cluster manager: carries out the decision (bootstrap,
//!   │                            register, join), logs cluster state changes
//!   └── role                     role server (waits until the node belongs to a cluster)
//!       ├── controlplane         consensus members only: etcd + cluster records, curator
//!       │   ├── consensus        the etcd child process
//!       │   └── curator          leader election + gRPC API on :7835
//!       │       ├── election
//!       │       ├── nodes        node records, watched
//!       │       ├── crl          the cluster CRL, watched
//!       │       ├── health       leader: health verdicts into the records on change
//!       │       └── listener
//!       ├── rolefetch            watches this node's record and the curator list
//!       ├── heartbeat            tells the curator this node is alive, with its status;
//!       │                        Split when no curator answers for the timeout
//!       ├── renew                renews the node (and etcd peer) certificate, live
//!       ├── catchup              not Home: follows CA rotations it missed (handovers),
//!       │                        exchanges a retired CA's node certificate
//!       └── logs                 this node's log lines for the owner (NodeLogs, :7836)
//! ```
//! Every log line also goes to a bounded buffer and `ROOT/data/log/node.log`
//! (`logcapture`).
//!
//! Modules, in rooms: each folder of `src/` holds one concern, and the rooms stand in
//! layers. A module imports only from rooms below its own (and, inside its room, only
//! where that room's map draws an arrow), never upwards, so no two modules import each
//! other. Each room's `mod.rs` draws its own map.
//!
//! ```text
//!   main.rs         flags, logging, runtime, signals; wires values, settings and the
//!                   two top runnables; wipes the root after LeftCluster
//!   ─────────────── config/ ────────────────────────────────────────────────────────
//!   config_file     --config FILE: the file's keys made flags before the command
//!     │             line's (which win); clap parses both; refusals name file:line: key
//!     └──▶ flags    the command line (clap): Args, subcommands, Start (what one start
//!                   needs of them) (on data::datadev's DataDevice, process::tcp)
//!   ─────────────── runnables/ (never import each other but as drawn; they talk
//!                   through NodeValues) ─────────────────────────────────────────────
//!   roleserver      root.role: starts rolefetch, heartbeat, renew, catchup, logserver;
//!                   the control plane while the node holds ConsensusMember
//!   cluster         root.cluster: carries out the Plan (bootstrap::prepare, register)
//!   controlplane    etcd + curator; bootstrap::finish or the member checks; crlsync;
//!     │             a recover finished (restore::reissue_crls, revoke_old_leases)
//!     └──▶ peertrust    etcd peer CAs → ca.pem, etcd restarted to load them
//!   rolefetch       this node's record: roles, curators, CRL, decommission
//!   heartbeat       alive + status; Home ⇄ Split
//!   renew           node and etcd peer certificates, applied live
//!   catchup         a CA rotation missed: handovers followed, node certificate
//!                   reissued (ReissueNodeCertificate)
//!   logserver       root.role.logs: NodeLogs on :7836 (owner only) from logcapture
//!   ─────────────── start/ (once per start; never import a runnable) ───────────────
//!   recover         `polis-node recover`: its refusals (on top of preflight's), then a
//!     │             join with --force-new-cluster for one etcd start; --data-device:
//!     │             unlocked from a surviving member or the owner's backup first
//!     └──▶ preflight, restore (serve_backup: a backup's snapshot read)
//!   restore         `polis-node restore`: an empty root made the only member of a
//!     │             backup's cluster (etcdctl snapshot restore, one etcd start), then
//!     │             a join; --data-device: on a new encrypted device
//!     └──▶ preflight, bootstrap
//!   set_curators    `polis-node set-curators`: the cluster directory replaced (root
//!     │             locked, membership required); the node is not started
//!     └──▶ preflight (lock_root)
//!   preflight       every refusal before anything is written; the Plan
//!     │ ──▶ decision    the start decision (pure)
//!     │ ──▶ join        a member's identity, roles, directory, loaded and checked
//!     └──▶ bootstrap    prepare (before etcd), trace (preflight), finish (control
//!            │          plane, once etcd runs)
//!            └──▶ decision (BootstrapTrace)
//!   register        the register path (RegisterNode, CommitNode)
//!   ─────────────── data/ (the data device) ─ member/ (a consensus member's standing)
//!   datadev         --data-device: the ESP's keys, DataUnlock (waits, Split), the
//!     │             encrypted data file system mounted on data/ (datafs)
//!     └──▶ datapeers    members' cold start: esp/data-peers (the other members'
//!                   halves), the :7837 unlock listener, asking peers (no answer
//!                   final: first_accepted), the refresh loop (run by controlplane)
//!   superseded      a member of an older epoch never serves: its data dropped or held
//!     └──▶ epochs, memberbook
//!   rejoin          is this node's etcd member still a member? (JoinConsensus answer,
//!                   the pure rule `verdict`); the control plane acts on it
//!   epochs          the epoch of this node's etcd data (epoch.pb, recover.pb), its
//!                   revision, the other members' epochs asked on their node ports
//!   memberbook      data/etcd/members.pb: the etcd members last listed (kept by
//!                   controlplane; named in logserver's self-report)
//!   ─────────────── curators/ (talking to the curators) ──────────────────────────────
//!   curator_client  client with the node certificate; cluster CRL intake and saving
//!     └──▶ crlfetch the CRL before that client runs (registering, data locked): from
//!                   the parameters or the ESP's copy and from every curator known
//!   handover        the CA's handovers asked for (unverified) and followed (pure rule)
//!   retry           Backoff, ProblemLog, pause, call_until_answered
//!   ─────────────── state/ (shared values) ─ process/ (the process on its host) ──────
//!   values          NodeValues: membership, cluster state, curators, roles, CRL, ...
//!     └──▶ membership, cluster_state, staleview
//!   settings        Settings (from the flags)
//!   membership      Membership, BootstrapData, JoinData (pure data)
//!   cluster_state   ClusterState, Contact (pure)
//!   staleview       which WatchNode update may be applied: never an older revision
//!                   (pure rule; the newest applied one kept in the directory)
//!   exporter        `/metrics`: --metrics-listen and its default, the node's collectors
//!   fatal           FatalSender, LeftCluster
//!   crash           POLIS_CRASH_AFTER crash points (feature `crash-points`)
//!   tcp             --tcp-rto-max-ms: TCP retransmission backoff ceiling (one sysctl)
//!   ─────────────── disk/ (the root on disk) ─ logs/ (the node's own log lines) ─────
//!   files           peer files, PEM, node key, directory, member.pb, quota.pb
//!   datakeys        ESP files of a data device: local half, join key, pending
//!     │             cluster half, trust and CRL copies; ROOT/datafs
//!     └──▶ storage  root layout, lock, atomic writes, protobuf files
//!   logcapture      the tracing layer: every line → ring + rotated file (LogHub)
//!     └──▶ logfile (ROOT/data/log/node.log, rotated) ──▶ logring (bounded, pure)
//! ```
//!
//! Rooms, top to bottom: main → config → data; main → runnables → start → data,
//! member → curators → state → disk; process (→ disk) and logs lie below whoever uses
//! them. `scripts/check-structure` guards the layers (no import cycle).
//!
//! Log targets are module paths: a line of the register path has the target
//! `polis_node::start::register` (`POLIS_LOG=info,polis_node::start::register=debug`),
//! a room's lines all start with its path (`POLIS_LOG=info,polis_node::runnables=debug`).
//!
//! Invariants:
//! - Refusals (would-be second cluster, corrupt files, foreign address, missing etcd) are
//!   decided before anything is written, and end the process with a message and exit 1.
//!   The one exception is the root lock (`ROOT/lock`, created with the root directory if
//!   absent): it is taken before the root is read, so that two nodes never decide on one
//!   root at once; a second node on a locked root refuses, naming the running one's PID.
//! - The etcd peer and curator ports must be free at start; a port still held (e.g. by
//!   the etcd of a node killed a moment ago) is polled for a few seconds before refusing.
//! - With `--tcp-rto-max-ms`, the node's network namespace bounds TCP retransmission
//!   backoff before etcd or any connection starts (`tcp`): a healed cut resumes fast.
//! - The open-files soft limit is raised to the hard limit at start: the curator holds a
//!   descriptor per client connection (see `rpc::server::Limits`).
//! - SIGTERM/SIGINT cancel the whole tree; etcd gets SIGTERM (SIGKILL after 10 s), the
//!   curator resigns its leadership, and the process exits 0 once every runnable stopped.
//! - SIGUSR1 logs the supervisor tree.
//! - A decommissioned node stops every runnable, then wipes `data/` (keys, etcd data),
//!   its sealed configuration and directory, leaves `esp/decommissioned` saying so, and
//!   exits 0; a root holding that note refuses to start.

// The rooms (the module map above draws their layers): a room imports only from rooms
// below it.
mod config;
mod curators;
mod data;
mod disk;
mod logs;
mod member;
mod process;
mod runnables;
mod start;
mod state;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::signal::unix::{SignalKind, signal};

use crate::config::flags::{LogFormat, Start};
use crate::config::{config_file, flags};
use crate::data::datadev;
use crate::disk::datakeys;
use crate::disk::storage::Root;
use crate::logs::logcapture;
use crate::member::epochs;
use crate::process::fatal::LeftCluster;
use crate::process::{exporter, tcp};
use crate::runnables::{cluster, roleserver};
use crate::start::{preflight, recover, restore, set_curators};
use crate::state::cluster_state::ClusterState;
use crate::state::settings::Settings;
use crate::state::values::NodeValues;

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("POLIS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let stderr = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // Every line also goes to the node's own buffer and log file (NodeLogs).
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(logcapture::CaptureLayer);
    match format {
        LogFormat::Text => registry.with(stderr).init(),
        LogFormat::Json => registry
            .with(stderr.json().with_current_span(true).with_span_list(false))
            .init(),
    }
}

/// `--log-test-lines-per-second`: logs `rate` numbered lines a second, evenly.
async fn log_test(rate: u32) {
    let start = tokio::time::Instant::now();
    let mut sent: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * f64::from(rate)) as u64;
        while sent < due {
            sent += 1;
            tracing::info!("log test line {sent}");
        }
    }
}

fn main() -> ExitCode {
    let env_var = |name: &std::ffi::OsStr| std::env::var_os(name);
    let parsed = match config_file::parse(std::env::args_os().collect(), &env_var) {
        Ok(parsed) => parsed,
        Err(e) => match e.downcast::<clap::Error>() {
            // Usage, --help, --version: clap's own output and exit status.
            Ok(usage) => usage.exit(),
            Err(e) => {
                eprintln!("polis-node: {e:#}");
                return ExitCode::FAILURE;
            }
        },
    };
    let start = match flags::invocation(parsed) {
        flags::Invocation::SetCurators(a) => {
            let root = Root::new(a.root);
            return match set_curators::set_curators(&root, &a.endpoints) {
                Ok(saved) => {
                    let saved: Vec<String> = saved.iter().map(|e| e.to_string()).collect();
                    println!(
                        "{}: curators set to {}; start the node as usual",
                        root.directory().display(),
                        saved.join(", ")
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("polis-node: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        flags::Invocation::Start(start) => *start,
    };
    init_logging(start.args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("polis-node: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Lines logged before the supervisor starts belong to the root runnable too.
    let span = tracing::info_span!("runnable", dn = %"root");
    let result = runtime.block_on(tracing::Instrument::instrument(run(start), span));
    // A blocking task a stuck runnable left behind (see SHUTDOWN_BOUND) would hold a
    // plain drop of the runtime forever.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("polis-node: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How long a stopping node waits for its runnables: etcd's own stop takes up to 10 s
/// (SIGTERM, then SIGKILL); one that ignores its cancellation is named in the log and
/// left behind rather than keeping the node from stopping (a supervisor such as
/// systemd would kill it anyway, without saying what hung).
const SHUTDOWN_BOUND: Duration = Duration::from_secs(30);
/// How long the runtime then waits for blocking tasks still running.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(5);

async fn run(start: Start) -> Result<()> {
    let args = &start.args;
    if let Some(config) = &args.config {
        tracing::info!(config = %config.display(), "flags read from the configuration file too");
    }
    if args.etcd_election_timeout_ms < 5 * args.etcd_heartbeat_ms {
        bail!("--etcd-election-timeout-ms must be at least 5 times --etcd-heartbeat-ms");
    }
    let heartbeat = curator::health::Timing::new(
        Duration::from_millis(args.heartbeat_period_ms),
        Duration::from_millis(args.heartbeat_timeout_ms),
    )
    .context("--heartbeat-period-ms and --heartbeat-timeout-ms")?;
    let started_at_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // etcd runs with its own working directory: every path handed to it is absolute.
    let root = Root::new(
        std::path::absolute(&start.root)
            .with_context(|| format!("resolving node root {}", start.root.display()))?,
    );
    if let Some(ms) = args.tcp_rto_max_ms {
        tcp::set_rto_max(ms).context("--tcp-rto-max-ms")?;
        tracing::info!(
            ms,
            "TCP retransmission backoff bounded (net.ipv4.tcp_rto_max_ms)"
        );
    }
    match preflight::raise_open_files_limit() {
        Ok(limit) => tracing::info!(limit, "open files limit"),
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
    let raft_timing = consensus::RaftTiming {
        heartbeat: Duration::from_millis(args.etcd_heartbeat_ms),
        election_timeout: Duration::from_millis(args.etcd_election_timeout_ms),
    };
    let (_lock, address, plan, recovering, volume) = match (start.recover, start.address) {
        (None, Some(address)) if start.restore.is_some() => {
            let flags = restore::RestoreFlags {
                address,
                backup: start.restore.clone().expect("matched"),
                etcd_binary: args.etcd_binary.clone(),
                raft_timing,
                force: start.restore_force,
                drill: start.restore_drill,
            };
            let (lock, plan, volume) =
                restore::restore(&root, &flags, start.data_device.as_ref()).await?;
            (lock, address, plan, false, volume)
        }
        (Some(force), address) => {
            let flags = recover::RecoverFlags {
                address,
                etcd_binary: args.etcd_binary.clone(),
                force,
                data_device: start.data_device.clone(),
                backup: start.recover_backup.clone(),
                raft_timing,
            };
            let (lock, address, plan, volume) = recover::preflight(&root, &flags).await?;
            (lock, address, plan, true, volume)
        }
        (None, address) => {
            let address = address.context("--address is required")?;
            let flags = preflight::Flags {
                address,
                params: start.params.clone(),
                etcd_binary: args.etcd_binary.clone(),
            };
            let (lock, plan, volume) = match &start.data_device {
                None => {
                    let (lock, plan) = preflight::preflight(&flags, &root)?;
                    (lock, plan, None)
                }
                // The data is unlocked before the decision reads it.
                Some(device) => {
                    let lock = preflight::lock_checked(&flags, &root)?;
                    let params = flags
                        .params
                        .clone()
                        .unwrap_or_else(|| root.default_parameters());
                    // Waiting to unlock (no curator, no member answers) ends on SIGTERM
                    // like a running node: exit 0.
                    let mut term =
                        signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
                    let volume = tokio::select! {
                        v = datadev::open(&root, device, &params, flags.address) => v?,
                        _ = term.recv() => {
                            tracing::info!("SIGTERM while the data device is locked: stopping");
                            return Ok(());
                        }
                    };
                    (lock, preflight::decide_plan(&flags, &root)?, Some(volume))
                }
            };
            (lock, address, plan, false, volume)
        }
    };
    // A recover interrupted on this member is completed or rolled back before anything
    // reads its epoch (the node port advertises it).
    epochs::resume_recover(&root, recovering).context("resuming an interrupted recover")?;
    root.prepare()?;
    if let Err(e) = logcapture::hub().attach_file(&root.root) {
        tracing::warn!("cannot write the node's log file: {e}; lines are kept in memory only");
    }
    if args.log_test_lines_per_second > 0 {
        let span = tracing::info_span!(parent: None, "runnable", dn = %"root.logtest");
        tokio::spawn(tracing::Instrument::instrument(
            log_test(args.log_test_lines_per_second),
            span,
        ));
    }
    let metrics_on = !args.no_metrics;
    metrics::set_enabled(metrics_on);
    if metrics_on {
        let listen = args
            .metrics_listen
            .unwrap_or_else(|| exporter::default_listen(address));
        exporter::start(listen, &root).await?;
    }

    let values = NodeValues {
        membership: event::Value::new(),
        cluster_state: event::Value::new(),
        curators: event::Value::new(),
        roles: event::Value::new(),
        trust: rpc::TrustSlot::empty(),
        credentials: Default::default(),
        services: event::Value::new(),
        applied_view: event::Value::new(),
        local_etcd: event::Value::new(),
        held_back: event::Value::new(),
        epoch_seen: crate::state::values::saved_epoch_seen(&root)?,
        etcd_peer_cas: event::Value::new(),
        etcd_peer_trust_loaded: event::Value::new(),
        components: Default::default(),
    };
    values.services.set(Default::default());
    values.cluster_state.set(ClusterState::Unknown);
    let settings = Settings {
        root: root.clone(),
        address,
        etcd_binary: args.etcd_binary.clone(),
        raft_timing,
        curator_lease_ttl: Duration::from_secs(args.curator_lease_ttl),
        heartbeat,
        upkeep: curator::upkeep::Settings {
            period: Duration::from_millis(args.etcd_upkeep_period_ms.max(100)),
            defrag_floor_bytes: args.etcd_defrag_floor_bytes,
            history_bytes: args.etcd_history_bytes.max(1),
            history_min_age: Duration::from_millis(args.etcd_history_min_age_ms),
        },
        snapshot_bounds: if args.snapshot_short_intervals {
            proto::snapshots::Bounds::TESTING
        } else {
            proto::snapshots::Bounds::NORMAL
        },
        entry_rate: rpc::server::RateSettings::per_second(args.entry_rate_per_second),
        started_at_unix_ms,
        kubernetes_binaries: args.kubernetes_binaries.clone(),
        kubernetes_certificate_lifetime: (args.kubernetes_certificate_lifetime_s > 0)
            .then(|| Duration::from_secs(args.kubernetes_certificate_lifetime_s)),
        runtime_binaries: args.runtime_binaries.clone(),
        kubernetes_images: args.kubernetes_images.clone(),
        cni_plugins: args.cni_plugins.clone(),
    };
    // A decommissioned worker's pods go before its data does (see below).
    let worker_runc = args.runtime_binaries.join("runc");
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::unbounded_channel();
    let node_root = root.clone();
    let supervisor_config = supervisor::Config {
        on_restart: metrics_on
            .then(|| Arc::new(|dn: &str| metrics::global().runnable_restarted(dn)) as _),
        ..Default::default()
    };
    let supervisor = supervisor::Supervisor::start(supervisor_config, move |ctx| {
        let (root, plan, values, settings, fatal) = (
            root.clone(),
            plan.clone(),
            values.clone(),
            settings.clone(),
            fatal_tx.clone(),
        );
        async move {
            let cluster_values = values.clone();
            let cluster_fatal = fatal.clone();
            ctx.run("cluster", move |ctx| {
                cluster::run(
                    ctx,
                    root.clone(),
                    address,
                    plan.clone(),
                    cluster_values.clone(),
                    cluster_fatal.clone(),
                )
            })?;
            ctx.run("role", move |ctx| {
                roleserver::run(ctx, settings.clone(), values.clone(), fatal.clone())
            })?;
            ctx.signal_healthy();
            ctx.cancelled().await;
            Ok(())
        }
    });

    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigusr1 = signal(SignalKind::user_defined1()).context("installing SIGUSR1 handler")?;
    let outcome = loop {
        tokio::select! {
            _ = sigterm.recv() => { tracing::info!("SIGTERM: shutting down"); break Ok(()) }
            _ = sigint.recv() => { tracing::info!("SIGINT: shutting down"); break Ok(()) }
            _ = sigusr1.recv() => tracing::info!("supervisor tree:\n{}", supervisor.dump()),
            Some(e) = fatal_rx.recv() => break Err(e),
        }
    };
    let stuck = supervisor.shutdown_within(SHUTDOWN_BOUND).await;
    if stuck.is_empty() {
        tracing::info!("all runnables stopped");
    } else {
        tracing::error!(
            ?stuck,
            "runnables still running {SHUTDOWN_BOUND:?} after the shutdown began: stopping without them"
        );
    }
    if let Err(e) = &outcome
        && e.downcast_ref::<LeftCluster>().is_some()
    {
        // A worker's containers and their mounts would outlive the wipe (and keep the
        // data device busy): they go first.
        let worker = node_root.data().join("kubernetes-worker");
        if worker.exists() {
            tokio::task::spawn_blocking(move || {
                kubernetes::workerstate::clean_up_leftovers(&worker_runc, &worker)
            })
            .await
            .context("removing the worker's containers before the wipe")?;
        }
    }
    if let Some(volume) = volume {
        // Nothing uses the data any more: its key leaves the kernel, it is unmounted.
        logcapture::hub().detach_file();
        datadev::close(volume).await;
    }
    match outcome {
        Err(e) if e.downcast_ref::<LeftCluster>().is_some() => {
            // Every service has stopped: nothing uses the data any more.
            node_root.wipe_after_decommission(&e.to_string())?;
            datakeys::erase(&node_root)?;
            tracing::info!("{e}: its data was wiped");
            eprintln!("polis-node: {e}; its data was wiped");
            Ok(())
        }
        other => other,
    }
}
