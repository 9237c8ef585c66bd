//! `polis-node`: the agent every machine of a Polis cluster runs.
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
//!       └── heartbeat            tells the curator this node is alive, with its status;
//!                                Split when no curator answers for the timeout
//! ```
//!
//! Invariants:
//! - Refusals (would-be second cluster, corrupt files, foreign address, missing etcd) are
//!   decided before anything is written, and end the process with a message and exit 1.
//!   The one exception is the root lock (`ROOT/lock`, created with the root directory if
//!   absent): it is taken before the root is read, so that two nodes never decide on one
//!   root at once; a second node on a locked root refuses, naming the running one's PID.
//! - The etcd peer and curator ports must be free at start; a port still held (e.g. by
//!   the etcd of a node killed a moment ago) is polled for a few seconds before refusing.
//! - The open-files soft limit is raised to the hard limit at start: the curator holds a
//!   descriptor per client connection (see `rpc::server::Limits`).
//! - SIGTERM/SIGINT cancel the whole tree; etcd gets SIGTERM (SIGKILL after 10 s), the
//!   curator resigns its leadership, and the process exits 0 once every runnable stopped.
//! - SIGUSR1 logs the supervisor tree.
//! - A decommissioned node stops every runnable, then wipes `data/` (keys, etcd data),
//!   its sealed configuration and directory, leaves `esp/decommissioned` saying so, and
//!   exits 0; a root holding that note refuses to start.

mod bootstrap;
mod cluster;
mod controlplane;
mod decision;
mod register;
mod renew;
mod roleserver;
mod storage;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, ValueEnum};
use proto::config::{ClusterRegister, NodeParameters, SealedConfiguration, node_parameters};
use tokio::signal::unix::{SignalKind, signal};

use crate::cluster::{NodeValues, Plan};
use crate::decision::{ClusterState, Decision, ParametersKind, RootFacts, decide};
use crate::storage::{Root, RootLock, read_proto};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Runs a Polis node.
#[derive(Debug, Parser)]
#[command(name = "polis-node", version)]
struct Args {
    /// Node root directory (created 0700 if absent).
    #[arg(long)]
    root: PathBuf,
    /// This node's address; peers and clients reach it here. Must be on this machine.
    #[arg(long)]
    address: IpAddr,
    /// Node parameters file [default: ROOT/esp/parameters.pb]. Only read by a node
    /// that does not belong to a cluster yet.
    #[arg(long)]
    params: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// The etcd binary (Debian: apt-get install etcd-server).
    #[arg(long, env = "POLIS_ETCD_BINARY", default_value = consensus::config::DEFAULT_ETCD_BINARY)]
    etcd_binary: PathBuf,
    /// etcd raft heartbeat interval in milliseconds.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(10..=5000))]
    etcd_heartbeat_ms: u64,
    /// etcd raft election timeout in milliseconds (at least 5 heartbeats).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..=50000))]
    etcd_election_timeout_ms: u64,
    /// TTL of the curator's leadership lease, in seconds: how long a dead leader blocks
    /// failover.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=60))]
    curator_lease_ttl: u64,
    /// How often this node heartbeats, in milliseconds (for tests; every node of a
    /// cluster must use the same period and timeout).
    #[arg(long, hide = true, default_value_t = curator::health::Timing::DEFAULT.period().as_millis() as u64)]
    heartbeat_period_ms: u64,
    /// After how long without a heartbeat the curator (on this node, when it leads)
    /// reports a node as timed out, and this node calls itself Split when no curator
    /// answered its heartbeats, in milliseconds (for tests; at least 3 periods).
    #[arg(long, hide = true, default_value_t = curator::health::Timing::DEFAULT.timeout().as_millis() as u64)]
    heartbeat_timeout_ms: u64,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("POLIS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
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
    let result = runtime.block_on(tracing::Instrument::instrument(run(args), span));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("polis-node: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Fails unless `address` is assigned to an interface of this machine.
fn check_address(address: IpAddr) -> Result<()> {
    match std::net::TcpListener::bind((address, 0)) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
            bail!("address {address} is not present on this machine (no interface has it)")
        }
        Err(e) => Err(e).with_context(|| format!("checking address {address}")),
    }
}

/// How long a start waits for a port that is still in use.
const PORT_WAIT: Duration = Duration::from_secs(3);

/// Fails unless `port` can be bound on `address` within `wait`. A port in use is polled:
/// right after `kill -9` the dying etcd holds the peer port for a few milliseconds.
fn check_port_free(address: IpAddr, port: u16, what: &str, wait: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match std::net::TcpListener::bind((address, port)) {
            Ok(_) => return Ok(()),
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "{what} port {address}:{port} is not available (is another node running there?)"
                    )
                });
            }
        }
    }
}

/// Raises the open-files soft limit to the hard limit: every curator connection is a
/// descriptor, and the default soft limit (often 1024) is far below what a curator
/// serving a thousand nodes needs. Returns the limit now in force.
fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}

/// The ports a consensus member listens on: etcd peers and the curator.
fn check_control_plane_ports(address: IpAddr) -> Result<()> {
    check_port_free(
        address,
        consensus::config::PEER_PORT,
        "etcd peer",
        PORT_WAIT,
    )?;
    check_port_free(address, rpc::CURATOR_PORT, "curator", PORT_WAIT)
}

fn check_etcd_binary(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        _ => Err(consensus::ConsensusError::BinaryMissing { path: path.into() }.into()),
    }
}

/// Everything that can refuse the start, before anything is written (but the root lock,
/// which the returned plan must be carried out under).
fn preflight(args: &Args, root: &Root) -> Result<(RootLock, Plan)> {
    check_address(args.address)?;
    cluster::check_crash_points()?;
    if root.root.exists() && !root.root.is_dir() {
        bail!("node root {} is not a directory", root.root.display());
    }
    let lock = root.lock()?;
    let marker = root.decommissioned_marker();
    if marker.exists() {
        let note = std::fs::read_to_string(&marker).unwrap_or_default();
        bail!(
            "{}; this root holds nothing of it any more. To use this machine in a cluster again, \
             remove {} and start it with new register parameters",
            note.trim_end_matches(['.', '\n']),
            marker.display()
        );
    }
    Ok((lock, decide_plan(args, root)?))
}

fn decide_plan(args: &Args, root: &Root) -> Result<Plan> {
    let sealed_path = root.sealed_configuration();
    let params_path = args
        .params
        .clone()
        .unwrap_or_else(|| root.default_parameters());
    let sealed_present = sealed_path.exists();
    let parameters: Option<NodeParameters> = if sealed_present {
        None
    } else if args.params.is_some() || params_path.exists() {
        Some(read_proto(&params_path, "node parameters")?)
    } else {
        None
    };
    let cluster_state = root.cluster_state_present();
    let facts = RootFacts {
        sealed_configuration: sealed_present.then(|| sealed_path.clone()),
        etcd_data: cluster_state.contains(&root.etcd_data()),
        cluster_state,
        parameters: parameters.as_ref().map(|p| match p.cluster {
            Some(node_parameters::Cluster::Bootstrap(_)) => ParametersKind::Bootstrap,
            Some(node_parameters::Cluster::Register(_)) => ParametersKind::Register,
            None => ParametersKind::Empty,
        }),
        parameters_path: params_path.clone(),
        bootstrap_trace: cluster::bootstrap_trace(
            root,
            match parameters.as_ref().and_then(|p| p.cluster.as_ref()) {
                Some(node_parameters::Cluster::Bootstrap(b)) => Some(b),
                _ => None,
            },
        )?,
    };
    let decision = decide(&facts, sealed_path.clone(), root.data())?;
    tracing::info!(?decision, "start decision");
    match decision {
        Decision::Join => {
            let sealed: SealedConfiguration = read_proto(&sealed_path, "sealed configuration")?;
            identity::validate_node_id(&sealed.node_id).with_context(|| {
                format!(
                    "sealed configuration in {} is corrupt",
                    sealed_path.display()
                )
            })?;
            if sealed.address != args.address.to_string() {
                bail!(
                    "this node joined its cluster with address {}, but was started with --address {}; \
                     changing a node's address is not supported",
                    sealed.address,
                    args.address
                );
            }
            let join = cluster::prepare_join(root, sealed)?;
            if join.roles.consensus_member {
                check_etcd_binary(&args.etcd_binary)?;
                controlplane::check_member_root(root, &join.sealed)?;
                check_control_plane_ports(args.address)?;
            }
            Ok(Plan::Join(std::sync::Arc::new(join)))
        }
        Decision::Bootstrap => {
            let Some(node_parameters::Cluster::Bootstrap(b)) = parameters.and_then(|p| p.cluster)
            else {
                unreachable!("decided bootstrap from bootstrap parameters");
            };
            let labels = b.labels.clone().into_iter().collect();
            proto::labels::apply(&Default::default(), &labels, &[]).with_context(|| {
                format!(
                    "node parameters {} hold invalid labels",
                    params_path.display()
                )
            })?;
            check_etcd_binary(&args.etcd_binary)?;
            identity::public_key_from_slice(&b.owner_public_key).with_context(|| {
                format!(
                    "owner public key in node parameters {} is invalid",
                    params_path.display()
                )
            })?;
            check_control_plane_ports(args.address)?;
            Ok(Plan::Bootstrap(b))
        }
        Decision::Register => {
            let Some(node_parameters::Cluster::Register(r)) = parameters.and_then(|p| p.cluster)
            else {
                unreachable!("decided register from register parameters");
            };
            let what = format!("node parameters {}", params_path.display());
            check_register_parameters(&r).with_context(|| format!("{what} are invalid"))?;
            Ok(Plan::Register(std::sync::Arc::new(r), what))
        }
    }
}

/// Register parameters must name a ticket, a CA certificate, curators and valid labels.
fn check_register_parameters(r: &ClusterRegister) -> Result<()> {
    if r.register_ticket.is_empty() {
        bail!("they hold no register ticket");
    }
    pki::certificate_public_key(&r.ca_certificate)
        .context("their cluster CA certificate is unreadable")?;
    if r.curator_endpoints.is_empty() {
        bail!("they name no curator endpoint");
    }
    register::parse_endpoints(&r.curator_endpoints)?;
    let labels = r.labels.clone().into_iter().collect();
    proto::labels::apply(&Default::default(), &labels, &[]).context("they hold invalid labels")?;
    Ok(())
}

async fn run(args: Args) -> Result<()> {
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
        std::path::absolute(&args.root)
            .with_context(|| format!("resolving node root {}", args.root.display()))?,
    );
    match raise_open_files_limit() {
        Ok(limit) => tracing::info!(limit, "open files limit"),
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
    let (_lock, plan) = preflight(&args, &root)?;
    root.prepare()?;

    let values = NodeValues {
        membership: event::Value::new(),
        cluster_state: event::Value::new(),
        curators: event::Value::new(),
        roles: event::Value::new(),
        crl: rpc::CrlSlot::new(),
        credentials: Default::default(),
        services: event::Value::new(),
    };
    values.services.set(Default::default());
    values.cluster_state.set(ClusterState::Unknown);
    let settings = roleserver::Settings {
        root: root.clone(),
        address: args.address,
        etcd_binary: args.etcd_binary.clone(),
        raft_timing: consensus::RaftTiming {
            heartbeat: Duration::from_millis(args.etcd_heartbeat_ms),
            election_timeout: Duration::from_millis(args.etcd_election_timeout_ms),
        },
        curator_lease_ttl: Duration::from_secs(args.curator_lease_ttl),
        heartbeat,
        started_at_unix_ms,
    };
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::unbounded_channel();
    let address = args.address;
    let node_root = root.clone();
    let supervisor = supervisor::Supervisor::start(supervisor::Config::default(), move |ctx| {
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
    supervisor.shutdown().await;
    tracing::info!("all runnables stopped");
    match outcome {
        Err(e) if e.downcast_ref::<roleserver::LeftCluster>().is_some() => {
            // Every service has stopped: nothing uses the data any more.
            node_root.wipe_after_decommission(&e.to_string())?;
            tracing::info!("{e}: its data was wiped");
            eprintln!("polis-node: {e}; its data was wiped");
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_freed_within_the_wait_is_accepted() {
        let address: IpAddr = [127, 0, 0, 1].into();
        let held = std::net::TcpListener::bind((address, 0)).unwrap();
        let port = held.local_addr().unwrap().port();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let started = std::time::Instant::now();
        check_port_free(address, port, "test", PORT_WAIT).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(250));
        releaser.join().unwrap();
    }

    #[test]
    fn a_port_held_beyond_the_wait_is_refused() {
        let address: IpAddr = [127, 0, 0, 1].into();
        let held = std::net::TcpListener::bind((address, 0)).unwrap();
        let port = held.local_addr().unwrap().port();
        let err = check_port_free(address, port, "curator", Duration::from_millis(100))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("curator port 127.0.0.1:{port}")),
            "{err}"
        );
    }

    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        let limit = raise_open_files_limit().unwrap();
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!((now.rlim_cur, now.rlim_max), (limit, limit));
    }
}
