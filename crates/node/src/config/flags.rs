//! The command line: `polis-node` and its subcommands (clap), and [`Start`], what one
//! start of the node needs of them.
//!
//! A start path: parses only (the flags' own value checks); imports `datadev`'s device
//! description and `tcp`'s bounds.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::data::datadev;
use crate::process::tcp;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Runs a Polis node.
// `args_override_self`: a flag given twice keeps its last value rather than being refused;
// `config_file` puts the file's flags before the command line's, so that these win.
#[derive(Debug, Parser)]
#[command(
    name = "polis-node",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    args_override_self = true
)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    /// Node root directory (created 0700 if absent).
    #[arg(long, required = true)]
    pub(crate) root: Option<PathBuf>,
    /// This node's address; peers and clients reach it here. Must be on this machine.
    #[arg(long, required = true)]
    pub(crate) address: Option<IpAddr>,
    /// Node parameters file [default: ROOT/esp/parameters.pb]. Only read by a node
    /// that does not belong to a cluster yet.
    #[arg(long)]
    pub(crate) params: Option<PathBuf>,
    /// Keep ROOT/data on this device (a block device, or a file used through a loop
    /// device), encrypted with a key split between this node's ESP and the cluster.
    /// Formatted on the first start when empty. Consensus members unlock each other
    /// (port 7837) when no curator runs yet.
    #[arg(long, value_name = "DEV")]
    pub(crate) data_device: Option<PathBuf>,
    /// Format the data device on the first start even though it holds something.
    #[arg(long, requires = "data_device")]
    pub(crate) data_device_format: bool,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// After a quorum loss: make this stopped surviving consensus member the only member
    /// of its cluster, keeping everything it committed, then run it as usual. Refused
    /// while a majority of the other members still answer (unless --force).
    Recover(RecoverArgs),
    /// Make a new node, on an empty or absent root, the only consensus member and curator
    /// of the cluster a backup (`polisctl cluster backup`) was taken from, then run it
    /// as usual. Later starts are the usual `polis-node --root ROOT --address ADDR`.
    Restore(RestoreArgs),
    /// Point a stopped node at curators it cannot find by itself (after a restore onto a
    /// new address): its cluster directory is replaced by the given endpoints
    /// (host or host:port). The node is not started; start it as usual afterwards.
    SetCurators(SetCuratorsArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct SetCuratorsArgs {
    /// The node's root.
    #[arg(long)]
    pub(crate) root: PathBuf,
    /// Curator endpoints, e.g. the restored member's address.
    #[arg(required = true)]
    pub(crate) endpoints: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct RestoreArgs {
    /// The new node root: empty or absent.
    #[arg(long)]
    pub(crate) root: PathBuf,
    /// This node's address (a former member's lets the workers return by themselves).
    #[arg(long)]
    pub(crate) address: IpAddr,
    /// The backup file.
    #[arg(long)]
    pub(crate) backup: PathBuf,
    /// Keep the new ROOT/data on this encrypted device (as `polis-node --data-device`);
    /// formatted when empty.
    #[arg(long, value_name = "DEV")]
    pub(crate) data_device: Option<PathBuf>,
    /// Format the data device even though it holds something.
    #[arg(long, requires = "data_device")]
    pub(crate) data_device_format: bool,
    /// Restore even though a majority of the backup's other consensus members answer on
    /// their etcd peer ports (they must be lost for good, or there would be two clusters).
    #[arg(long, conflicts_with = "drill")]
    pub(crate) force: bool,
    /// A rehearsal beside the live cluster: allowed while its members answer, at an
    /// address none of the backup's members had. The restored cluster's epoch is a
    /// drill's: clients that have seen the cluster refuse its answers, and clients of
    /// the drill refuse the cluster's.
    #[arg(long)]
    pub(crate) drill: bool,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Debug, clap::Args)]
pub(crate) struct RecoverArgs {
    /// The surviving member's node root.
    #[arg(long)]
    pub(crate) root: PathBuf,
    /// This node's address [default: the one it joined its cluster with].
    #[arg(long)]
    pub(crate) address: Option<IpAddr>,
    /// Recover even though a majority of the other members answer on their etcd peer
    /// ports (they must be lost for good, or they would form a second cluster).
    #[arg(long)]
    pub(crate) force: bool,
    /// The member's encrypted data device (its `--data-device`); unlocked with the half a
    /// surviving member keeps, else with --backup. Never formatted.
    #[arg(long, value_name = "DEV")]
    pub(crate) data_device: Option<PathBuf>,
    /// A backup of this cluster (`polisctl cluster backup`): this node's cluster half is
    /// read from its record there when no surviving member answers with it.
    #[arg(long, requires = "data_device")]
    pub(crate) backup: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) common: Common,
}

/// Flags of every start, recover included.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Common {
    /// Read flags from this TOML file too: each key is a long flag without its dashes,
    /// e.g. `address = "10.0.0.1"`, `etcd-heartbeat-ms = 100`, `no-metrics = true`.
    ///
    /// Numbers are TOML integers, switches true or false, everything else strings.
    /// Unknown keys and bad values are refused, naming the file's line. The command line
    /// wins over the file, and so does an environment variable (POLIS_ETCD_BINARY); a
    /// switch set true in the file cannot be turned off on the command line. `recover`
    /// and `restore` use the keys they have as flags and leave the others (`params`).
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text")]
    pub(crate) log_format: LogFormat,
    /// Where `/metrics` (Prometheus) is served over plain HTTP [default: the node's
    /// address when it is a loopback one, else 127.0.0.1; port 7839].
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    /// Serve no metrics (and count no RPCs).
    #[arg(long, conflicts_with = "metrics_listen")]
    pub(crate) no_metrics: bool,
    /// The etcd binary (Debian: apt-get install etcd-server).
    #[arg(long, env = "POLIS_ETCD_BINARY", default_value = consensus::config::DEFAULT_ETCD_BINARY)]
    pub(crate) etcd_binary: PathBuf,
    /// The folder holding kube-apiserver, kube-controller-manager, kube-scheduler and
    /// kubectl, for the KubernetesController role (`scripts/kubernetes-binaries` prints
    /// it; the polis-kubernetes package installs them here).
    #[arg(
        long,
        env = "POLIS_KUBERNETES_BINARIES",
        default_value = "/usr/lib/polis/kubernetes"
    )]
    pub(crate) kubernetes_binaries: PathBuf,
    /// The folder holding containerd, containerd-shim-runc-v2, runc and ctr, for the
    /// KubernetesWorker role (`scripts/runtime-binaries` prints it).
    #[arg(
        long,
        env = "POLIS_RUNTIME_BINARIES",
        default_value = "/usr/lib/polis/runtime"
    )]
    pub(crate) runtime_binaries: PathBuf,
    /// A folder of OCI image archives (`*.tar`) a KubernetesWorker imports into
    /// containerd when it starts: the pause image and the images its pods use (no
    /// registry is asked; pods use `imagePullPolicy: Never`).
    #[arg(
        long,
        env = "POLIS_KUBERNETES_IMAGES",
        default_value = "/usr/lib/polis/images"
    )]
    pub(crate) kubernetes_images: PathBuf,
    /// The CNI plugins' folder (Debian's containernetworking-plugins).
    #[arg(long, default_value = "/usr/lib/cni")]
    pub(crate) cni_plugins: PathBuf,
    /// Lifetime of the Kubernetes components' certificates in seconds (for tests; 0:
    /// the curator's default, 24 h); renewed at 2/3 of it.
    #[arg(long, hide = true, default_value_t = 0)]
    pub(crate) kubernetes_certificate_lifetime_s: u64,
    /// etcd raft heartbeat interval in milliseconds.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(10..=5000))]
    pub(crate) etcd_heartbeat_ms: u64,
    /// etcd raft election timeout in milliseconds (at least 5 heartbeats).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..=50000))]
    pub(crate) etcd_election_timeout_ms: u64,
    /// Bounds TCP retransmission backoff in this node's network namespace, in
    /// milliseconds (sets net.ipv4.tcp_rto_max_ms; Linux 6.15 or later; unset: the
    /// kernel's, 120 s): after a network cut heals, etcd's peer streams and curator
    /// connections resume within this bound (1000 recommended for consensus members).
    #[arg(long, value_parser = clap::value_parser!(u64).range(tcp::RTO_MAX_MS_MIN..=tcp::RTO_MAX_MS_MAX))]
    pub(crate) tcp_rto_max_ms: Option<u64>,
    /// TTL of the curator's leadership lease, in seconds: how long a dead leader blocks
    /// failover.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub(crate) curator_lease_ttl: u64,
    /// How often this node heartbeats, in milliseconds (for tests; every node of a
    /// cluster must use the same period and timeout).
    #[arg(long, hide = true, default_value_t = curator::health::Timing::DEFAULT.period().as_millis() as u64)]
    pub(crate) heartbeat_period_ms: u64,
    /// After how long without a heartbeat the curator (on this node, when it leads)
    /// reports a node as timed out, and this node calls itself Split when no curator
    /// answered its heartbeats, in milliseconds (for tests; at least 3 periods).
    #[arg(long, hide = true, default_value_t = curator::health::Timing::DEFAULT.timeout().as_millis() as u64)]
    pub(crate) heartbeat_timeout_ms: u64,
    /// etcd upkeep: how often the curator leader looks at the members' databases, in
    /// milliseconds (for tests).
    #[arg(long, hide = true, default_value_t = curator::upkeep::Settings::DEFAULT.period.as_millis() as u64)]
    pub(crate) etcd_upkeep_period_ms: u64,
    /// etcd upkeep: no member's database is defragmented below this size, in bytes (for
    /// tests).
    #[arg(long, hide = true, default_value_t = curator::upkeep::Settings::DEFAULT.defrag_floor_bytes)]
    pub(crate) etcd_defrag_floor_bytes: u64,
    /// etcd upkeep: the bytes of history (old values) etcd may keep before the curator
    /// leader compacts it (for tests).
    #[arg(long, hide = true, default_value_t = curator::upkeep::Settings::DEFAULT.history_bytes)]
    pub(crate) etcd_history_bytes: u64,
    /// etcd upkeep: history younger than this is never compacted, in milliseconds (for
    /// tests).
    #[arg(long, hide = true, default_value_t = curator::upkeep::Settings::DEFAULT.history_min_age.as_millis() as u64)]
    pub(crate) etcd_history_min_age_ms: u64,
    /// Scheduled snapshots: let the owner set intervals from 1 s up (else at least 1
    /// minute), for tests.
    #[arg(long, hide = true)]
    pub(crate) snapshot_short_intervals: bool,
    /// RegisterNode and Escrow calls a second this node's curator takes from one source
    /// address (bursts of twice that); 0: no limit (for tests and benchmarks that
    /// register many nodes from one address).
    #[arg(long, hide = true, default_value_t = 10)]
    pub(crate) entry_rate_per_second: u32,
    /// Logs this many lines a second from `root.logtest` (for tests and `bench logs`:
    /// a node that logs fast).
    #[arg(long, hide = true, default_value_t = 0)]
    pub(crate) log_test_lines_per_second: u32,
}

/// What this process does, from its flags.
pub(crate) struct Start {
    pub(crate) root: PathBuf,
    /// `None`: recover, address from the sealed configuration.
    pub(crate) address: Option<IpAddr>,
    pub(crate) params: Option<PathBuf>,
    /// `Some(force)`: `polis-node recover`.
    pub(crate) recover: Option<bool>,
    /// `polis-node recover --backup`.
    pub(crate) recover_backup: Option<PathBuf>,
    /// `Some(backup file)`: `polis-node restore`.
    pub(crate) restore: Option<PathBuf>,
    /// `polis-node restore --force` / `--drill`.
    pub(crate) restore_force: bool,
    pub(crate) restore_drill: bool,
    pub(crate) data_device: Option<datadev::DataDevice>,
    pub(crate) args: Common,
}

/// What the command line asks for: a node start (also recover and restore), or
/// `set-curators`, which does not start the node.
pub(crate) enum Invocation {
    SetCurators(SetCuratorsArgs),
    Start(Box<Start>),
}

/// What `parsed` asks this process to do.
pub(crate) fn invocation(parsed: Args) -> Invocation {
    let start = match parsed.command {
        Some(Command::SetCurators(a)) => return Invocation::SetCurators(a),
        Some(Command::Recover(r)) => Start {
            root: r.root,
            address: r.address,
            params: None,
            recover: Some(r.force),
            recover_backup: r.backup,
            restore: None,
            restore_force: false,
            restore_drill: false,
            data_device: r.data_device.map(|device| datadev::DataDevice {
                device,
                format: false,
            }),
            args: r.common,
        },
        Some(Command::Restore(r)) => Start {
            root: r.root,
            address: Some(r.address),
            params: None,
            recover: None,
            recover_backup: None,
            restore: Some(r.backup),
            restore_force: r.force,
            restore_drill: r.drill,
            data_device: r.data_device.map(|device| datadev::DataDevice {
                device,
                format: r.data_device_format,
            }),
            args: r.common,
        },
        None => Start {
            root: parsed.root.expect("clap requires --root"),
            address: Some(parsed.address.expect("clap requires --address")),
            params: parsed.params,
            recover: None,
            recover_backup: None,
            restore: None,
            restore_force: false,
            restore_drill: false,
            data_device: parsed.data_device.map(|device| datadev::DataDevice {
                device,
                format: parsed.data_device_format,
            }),
            args: parsed.common,
        },
    };
    Invocation::Start(Box::new(start))
}
