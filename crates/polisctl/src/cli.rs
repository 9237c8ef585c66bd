//! The command line: clap's definitions of every command and flag (their doc comments
//! are the help texts), the argument parsers, and where the config directory is.
//! May not act on anything: main dispatches the parsed command to `commands`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use crate::output;

/// Operate Polis clusters.
#[derive(Debug, Parser)]
#[command(name = "polisctl", version)]
pub(crate) struct Cli {
    /// Configuration directory holding the owner key, certificate and pinned CA.
    #[arg(long, global = true, env = "POLISCTL_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Curator endpoints (IP or IP:PORT, comma-separated); tried in order. Default: the
    /// endpoints remembered in the config directory.
    #[arg(long, global = true, value_delimiter = ',', env = "POLISCTL_ENDPOINTS")]
    pub(crate) endpoints: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub(crate) output: output::Format,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create node parameters.
    #[command(subcommand)]
    Params(ParamsCommand),
    /// Prove the owner key to the cluster, pin its CA and receive an owner certificate.
    Takeownership {
        /// Pin the cluster CA without asking.
        #[arg(long, conflicts_with = "ca_fingerprint")]
        accept_ca: bool,
        /// Pin the cluster CA only if its SHA-256 fingerprint is HEX.
        #[arg(long, value_name = "HEX")]
        ca_fingerprint: Option<String>,
    },
    /// Print the public half of this config directory's key (made when absent), as a
    /// PEM SubjectPublicKeyInfo: what an admin adds with `cluster operator add`.
    Key {
        /// Write it to FILE instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Cluster-wide information.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Inspect and change nodes.
    #[command(subcommand)]
    Node(NodeCommand),
    /// A live view of the cluster: nodes, consensus members and leaders, the latest
    /// audit entries. Needs a terminal; q quits.
    Dashboard,
    /// Kubernetes on the cluster: credentials for kubectl, a local proxy to the
    /// controllers' apiservers.
    #[command(subcommand)]
    Kubernetes(KubernetesCommand),
    /// Print a shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum KubernetesCommand {
    /// Write a kubeconfig with a short-lived client certificate for you: the owner and
    /// admins get cluster-admin, operators edit, readers view (audited).
    Credentials {
        /// Where to write the kubeconfig (0600).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// How long the certificate lasts (e.g. 8h, 30m; at most 24h) [default: 8h].
        #[arg(long, value_parser = parse_lifetime, value_name = "DURATION")]
        lifetime: Option<u64>,
        /// Point the kubeconfig at a `polisctl kubernetes proxy` listening on ADDR
        /// (kubectl then keeps working while any one controller is down).
        #[arg(long, value_name = "ADDR:PORT")]
        via: Option<std::net::SocketAddr>,
    },
    /// Forward ADDR to the first controller's apiserver that accepts (TLS passes
    /// through); runs until interrupted.
    Proxy {
        #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:6443")]
        listen: std::net::SocketAddr,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ParamsCommand {
    /// Parameters for the first node of a new cluster; creates the owner key if absent.
    Bootstrap {
        /// Where to write the parameters.
        #[arg(long)]
        out: PathBuf,
        /// The cluster's DNS domain.
        #[arg(long, default_value = "polis.internal")]
        cluster_domain: String,
        /// Node labels, KEY=VALUE (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Lifetime of node and etcd peer certificates: seconds, or a number with a unit
        /// (s, m, h, d, y), e.g. 90d. Nodes renew theirs at 2/3 of it. [default: 1y]
        #[arg(long, value_parser = parse_lifetime, value_name = "DURATION")]
        node_certificate_lifetime: Option<u64>,
        /// Lifetime of owner certificates (as above); polisctl renews the owner's at 2/3
        /// of it. [default: 30d]
        #[arg(long, value_parser = parse_lifetime, value_name = "DURATION")]
        owner_certificate_lifetime: Option<u64>,
        /// etcd backend quota of every consensus member, e.g. 2GiB or 512MiB (at least
        /// 2MiB, at most 8GiB); fixed at bootstrap. Past it etcd refuses writes until the
        /// curator has freed space. [default: 2GiB]
        #[arg(long, value_parser = parse_etcd_quota, value_name = "SIZE")]
        etcd_quota: Option<u64>,
        /// Scheduled snapshots: how often every consensus member snapshots its etcd into
        /// its root (ROOT/data/snapshots), e.g. 6h, 30m, 1d (at least 1m, at most 7d);
        /// changeable later (`cluster config set`). [default: 6h]
        #[arg(long, value_parser = parse_snapshot_interval_normal, value_name = "DURATION")]
        snapshot_interval: Option<u64>,
        /// Scheduled snapshots: how many each member keeps (1 to 100); older ones are
        /// deleted. [default: 5]
        #[arg(long, value_parser = parse_snapshot_keep, value_name = "N")]
        snapshot_keep: Option<u32>,
        /// How many audit log entries the cluster keeps; past it the oldest are dropped.
        /// [default: 10000]
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..), value_name = "N")]
        audit_max_entries: Option<u64>,
        /// How many bytes the audit log's entries may take together, e.g. 8MiB (at
        /// least 64KiB); past it entries are dropped as past the count.
        /// [default: 8MiB, or a sixteenth of the etcd quota when that is less]
        #[arg(long, value_parser = parse_audit_max_bytes, value_name = "SIZE")]
        audit_max_bytes: Option<u64>,
    },
    /// Parameters for a new node to register into this cluster: a new register ticket,
    /// the pinned cluster CA and the current curator endpoints. They stop working for
    /// nodes that have not registered yet once the ticket expires, is used up or is
    /// revoked (`cluster tickets`, `cluster ticket revoke ID`, `cluster rotate-ticket`).
    Register {
        /// Where to write the parameters.
        #[arg(long)]
        out: PathBuf,
        /// Labels the node registers with, KEY=VALUE (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// How long the ticket lets new nodes register, e.g. 30m, 24h, 7d; `never` for a
        /// ticket that does not expire.
        #[arg(long, value_parser = parse_ticket_ttl, default_value = "24h", value_name = "DURATION")]
        ttl: u64,
        /// How many nodes the ticket lets register [default: unlimited].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
        uses: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// The cluster's CA, configuration and curators.
    Info,
    /// Each node's version against the version-skew policy (same major version, at most
    /// one minor version apart), and whether the next upgrade step may start: every
    /// version readable and within the policy, every UP node HEALTHY. Exits 1 when it
    /// may not.
    Versions,
    /// The etcd members (voter or learner), the leader, each member's raft index; asks
    /// every curator's own etcd member, so it answers without a quorum too. Exits 1
    /// when there is no quorum.
    Status,
    /// Start a local development cluster of N polis-node processes on loopback
    /// addresses under DIR (the first three become consensus members), or start an
    /// existing one in DIR again.
    Launch {
        dir: PathBuf,
        /// How many nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// The first node's address; the others follow (127.0.0.2, .3, …).
        #[arg(long, default_value = "127.0.0.2")]
        first_address: std::net::Ipv4Addr,
        /// Stop the cluster in DIR instead (SIGTERM to every node).
        #[arg(long)]
        stop: bool,
        /// The polis-node binary [default: next to polisctl, else on PATH].
        #[arg(long)]
        node_binary: Option<PathBuf>,
        /// Keep each node's data on an encrypted image file (DIR/nodeK/data.img, 256 MiB
        /// sparse; `polis-node --data-device`). Root only.
        #[arg(long)]
        encrypted: bool,
        /// Give the consensus members the KubernetesController role (polis-node finds
        /// the programs through POLIS_KUBERNETES_BINARIES or --kubernetes-binaries).
        #[arg(long)]
        kubernetes: bool,
    },
    /// Stop the cluster launched in DIR and remove DIR.
    Destroy { dir: PathBuf },
    /// Every certificate the cluster's CAs issued (node, owner, etcd peer): node,
    /// serial, expiry, whether revoked, and whether it is the one in use.
    Certificates,
    /// Replace the cluster CA online: a new CA is trusted by every node first, then
    /// signs while every certificate is renewed under it, then the old CA is retired
    /// and its certificates refused. The curator leader moves it on as nodes catch up
    /// (`cluster ca` shows what it waits for). Refused while a node does not answer,
    /// unless `--force` (such a node must re-register afterwards).
    RotateCa {
        /// Move on without waiting for nodes that have not caught up; also forces a
        /// running rotation on.
        #[arg(long)]
        force: bool,
        /// Rotate the etcd peer CA (etcd's member-to-member TLS) instead: each member
        /// restarts its etcd twice, one member at a time, while polis-node runs on.
        /// Refused while a member is down, and never forced.
        #[arg(long, conflicts_with = "force")]
        etcd_peer: bool,
    },
    /// The cluster CAs trusted (the signing one first) and, during a rotation, its phase
    /// and what it waits for.
    Ca {
        /// The etcd peer CAs and their rotation instead.
        #[arg(long)]
        etcd_peer: bool,
    },
    /// Revoke every register ticket. Node parameters made so far stop working for nodes
    /// that have not registered yet; registered nodes can still be approved. New
    /// parameters (`params register`) carry a new ticket.
    RotateTicket,
    /// The register tickets: id, created, expiry, uses left, creator (never a secret).
    Tickets,
    /// One register ticket.
    #[command(subcommand)]
    Ticket(TicketCommand),
    /// The cluster owner's credentials.
    #[command(subcommand)]
    Owner(OwnerCommand),
    /// Operators: named users with their own key and a role (reader, operator, admin).
    #[command(subcommand)]
    Operator(OperatorCommand),
    /// Save a backup of the cluster's etcd (`--out FILE`), taken from the etcd member of
    /// the first curator that answers (`--endpoints` picks one), or inspect one
    /// (`backup inspect FILE`). A backup holds the cluster CA's private key and the
    /// register ticket: keep it like a private key.
    Backup(BackupArgs),
    /// Every consensus member's scheduled snapshots: node, name, revision, size, age.
    /// Fetch one with `cluster backup --from-node ID --name NAME --out FILE`.
    Backups,
    /// The cluster configuration (`config set` changes the snapshot schedule).
    Config(ConfigArgs),
    /// The audit log: every call that changed (or tried to change) cluster state, who
    /// made it, from where, on what, and its result; oldest first.
    Audit {
        /// Keep printing new entries as they are written, until interrupted.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only entries naming this node (as target or caller).
        #[arg(long, value_name = "ID")]
        node: Option<String>,
        /// Only entries of the last DURATION, e.g. 30s, 15m, 2h, 1d.
        #[arg(long, value_parser = parse_since, value_name = "DURATION")]
        since: Option<u64>,
    },
}

/// `cluster config` | `cluster config set …`.
#[derive(Debug, clap::Args)]
pub(crate) struct ConfigArgs {
    #[command(subcommand)]
    pub(crate) command: Option<ConfigCommand>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Change the scheduled snapshots: every member picks the change up without a
    /// restart.
    Set {
        /// How often each consensus member snapshots its etcd, e.g. 6h, 30m, 1d (at
        /// least 1m; curators started for tests accept seconds).
        #[arg(long, value_parser = parse_snapshot_interval_any, value_name = "DURATION")]
        snapshot_interval: Option<u64>,
        /// How many snapshots each member keeps (1 to 100).
        #[arg(long, value_parser = parse_snapshot_keep, value_name = "N")]
        snapshot_keep: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TicketCommand {
    /// Delete ticket ID: nodes that have not registered with it yet are refused; nodes
    /// that did stay.
    Revoke { id: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum OperatorCommand {
    /// Add operator NAME with ROLE for the key in FILE (`polisctl key` of the new
    /// operator). Admins only. The operator then runs `polisctl takeownership`.
    Add {
        name: String,
        /// reader (lists and describes), operator (also approves, labels, changes
        /// roles, reads logs and the audit log) or admin (also backups, operators,
        /// tickets).
        #[arg(long)]
        role: String,
        /// The operator's public key (PEM, as `polisctl key` prints it).
        #[arg(long, value_name = "FILE")]
        key_file: PathBuf,
    },
    /// Every operator: name, role, key, when added and by whom; and every name whose
    /// removal left certificates unrevoked (state `removing`: run `operator remove`
    /// again).
    List,
    /// Remove operator NAME: every certificate it holds is revoked at once and its
    /// connections end. Admins only.
    Remove { name: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum OwnerCommand {
    /// Replace the owner key with a new one (written to the config directory) and revoke
    /// every owner certificate issued so far: copies of the old key or certificates stop
    /// working. Run again after an interruption to finish.
    Rotate,
}

/// `cluster backup --out FILE` | `cluster backup inspect FILE`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct BackupArgs {
    #[command(subcommand)]
    pub(crate) command: Option<BackupCommand>,
    /// Where to write the backup (0600; it appears only once complete and verified).
    #[arg(long, required = true, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
    /// Fetch a scheduled snapshot kept by this node (see `cluster backups`) instead of
    /// taking a backup now.
    #[arg(long, requires = "name", value_name = "ID")]
    pub(crate) from_node: Option<String>,
    /// The scheduled snapshot to fetch (with --from-node).
    #[arg(long, requires = "from_node", value_name = "NAME")]
    pub(crate) name: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BackupCommand {
    /// Show a backup's header and verify its SHA-256, offline. Exits 1 when the file is
    /// not a complete, intact Polis backup.
    Inspect { file: PathBuf },
}

#[derive(Debug, Subcommand)]
pub(crate) enum NodeCommand {
    /// List nodes.
    List {
        /// Only nodes in this state (NEW, STANDBY, UP, …).
        #[arg(long)]
        state: Option<String>,
        /// Only nodes with this role (e.g. ConsensusMember).
        #[arg(long)]
        role: Option<String>,
        /// Only nodes with this label (KEY=VALUE, repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
    },
    /// Show one node (including its public key: check it before approving).
    Describe { id: String },
    /// Give a node a role. ConsensusMember: the node joins etcd (learner, then voter) and
    /// runs a curator, without restarting.
    AddRole {
        id: String,
        #[arg(value_name = "ROLE")]
        role: String,
    },
    /// Take a role from a node. ConsensusMember: refused when the remaining voters could
    /// not keep a quorum; otherwise the node leaves etcd (its peer certificate revoked)
    /// and stops its etcd and curator.
    RemoveRole {
        id: String,
        #[arg(value_name = "ROLE")]
        role: String,
    },
    /// Admit registered nodes (NEW → STANDBY); they then commit and come UP.
    Approve {
        /// Node IDs.
        #[arg(required_unless_present = "all_new")]
        ids: Vec<String>,
        /// Approve every node waiting for approval.
        #[arg(long)]
        all_new: bool,
    },
    /// Take UP nodes out of the cluster for good: out of consensus (refused when the
    /// remaining voters could not keep a quorum), roles removed, certificates revoked;
    /// a running node wipes its data and exits. Waits until each is DECOMMISSIONED.
    Decommission {
        /// Node IDs.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Return once the decommission has started.
        #[arg(long)]
        no_wait: bool,
        /// Longest wait for each node, in seconds.
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
        timeout: u64,
    },
    /// Delete the records of DECOMMISSIONED nodes, or of NEW/STANDBY nodes that should
    /// never join. A deleted node's key can never register again.
    Delete {
        /// Node IDs.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Whether this node may be restarted on the next version now (docs/upgrades.md, "Upgrading"):
    /// the cluster allows an upgrade step (`cluster versions`), the node is UP, and a
    /// consensus member's restart leaves a quorum of HEALTHY members. Exits 1 with the
    /// reasons when it may not.
    UpgradeCheck { id: String },
    /// Set labels (KEY=VALUE) and remove them (KEY-) on a node.
    Label {
        id: String,
        #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
        changes: Vec<String>,
    },
    /// A node's own log lines (worker or member), read from the node itself with the
    /// owner's certificate (its port 7836): the latest, or followed with -f.
    Logs {
        id: String,
        /// Keep printing new lines until interrupted (a reader that falls behind the
        /// node's buffer is told how many lines it missed).
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only the last N lines (0: all the node keeps).
        #[arg(short = 'n', long = "lines", default_value_t = 100, value_name = "N")]
        lines: u32,
        /// Only lines of runnables whose DN starts with this, e.g. root.role.heartbeat.
        #[arg(long, value_name = "DN-PREFIX")]
        runnable: Option<String>,
        /// Only lines of the last DURATION, e.g. 30s, 15m, 2h, 1d.
        #[arg(long, value_parser = parse_since, value_name = "DURATION")]
        since: Option<u64>,
    },
}

/// A register ticket's lifetime in seconds: a number with a unit (s, m, h, d);
/// `never` (or 0): no expiry.
fn parse_ticket_ttl(s: &str) -> Result<u64, String> {
    match s.trim() {
        "never" | "0" => Ok(0),
        other => match parse_since(other)? {
            0 => Err(format!("{s:?}: a ticket lives at least 1s (or `never`)")),
            secs => Ok(secs),
        },
    }
}

/// A look-back duration in seconds: a number with a unit (s, m, h, d).
fn parse_since(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?}: expected a number with a unit, e.g. 15m"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit must be s, m, h or d")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?}: too long"))
}

/// A certificate lifetime: seconds, or a number with a unit (s, m, h, d, y); within
/// the PKI's bounds (`pki::check_lifetime`).
fn parse_lifetime(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 3600, 90m, 12h, 30d, 1y)"))?;
    let unit_secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        "y" => 365 * 86400,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}; use s, m, h, d or y"
            ));
        }
    };
    let secs = number
        .checked_mul(unit_secs)
        .ok_or_else(|| format!("{s:?} is too long"))?;
    pki::check_lifetime(std::time::Duration::from_secs(secs)).map_err(|e| e.to_string())?;
    Ok(secs)
}

/// An etcd backend quota: a size (`proto::quota::parse_size`) within the bounds.
fn parse_etcd_quota(s: &str) -> Result<u64, String> {
    let bytes = proto::quota::parse_size(s).map_err(|e| e.to_string())?;
    if bytes == 0 {
        return Err("an etcd quota of 0 bytes leaves no room for anything".into());
    }
    proto::quota::effective_quota(bytes).map_err(|e| e.to_string())
}

/// The audit log's byte budget: a size of at least 64 KiB (room for a few entries of
/// the largest size, `curator::audit::bounds::MAX_ENTRY_BYTES`).
fn parse_audit_max_bytes(s: &str) -> Result<u64, String> {
    let bytes = proto::quota::parse_size(s).map_err(|e| e.to_string())?;
    if bytes < 64 << 10 {
        return Err(format!(
            "an audit log of {} is too small (at least 64KiB)",
            proto::quota::show(bytes)
        ));
    }
    Ok(bytes)
}

/// A snapshot interval within the normal bounds (`proto::snapshots`).
fn parse_snapshot_interval_normal(s: &str) -> Result<u64, String> {
    let secs = proto::snapshots::parse_interval(s).map_err(|e| e.to_string())?;
    proto::snapshots::check_interval(secs, proto::snapshots::Bounds::NORMAL)
        .map_err(|e| e.to_string())
}

/// A snapshot interval of at least a second: the curator applies its own bounds (a
/// minute, unless started for tests).
fn parse_snapshot_interval_any(s: &str) -> Result<u64, String> {
    let secs = proto::snapshots::parse_interval(s).map_err(|e| e.to_string())?;
    proto::snapshots::check_interval(secs, proto::snapshots::Bounds::TESTING)
        .map_err(|e| e.to_string())
}

fn parse_snapshot_keep(s: &str) -> Result<u32, String> {
    let keep: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a count (1 to {})", proto::snapshots::MAX_KEEP))?;
    proto::snapshots::check_keep(keep).map_err(|e| e.to_string())
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("label {s:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("label {s:?} has an empty key"));
    }
    Ok((k.to_string(), v.to_string()))
}

impl Cli {
    /// The config directory: `--config`, else `~/.config/polis`.
    pub(crate) fn config_dir(&self) -> Result<PathBuf> {
        if let Some(c) = &self.config {
            return Ok(c.clone());
        }
        let home = std::env::var_os("HOME").context("HOME is not set; pass --config DIR")?;
        Ok(PathBuf::from(home).join(".config").join("polis"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_parse_with_units_and_bounds() {
        for (text, secs) in [
            ("20", Some(20)),
            ("20s", Some(20)),
            ("90m", Some(5400)),
            ("12h", Some(43200)),
            ("30d", Some(2_592_000)),
            ("1y", Some(31_536_000)),
            ("4", None),
            ("11y", None),
            ("1w", None),
            ("x", None),
            ("", None),
            ("99999999999999999999y", None),
        ] {
            assert_eq!(parse_lifetime(text).ok(), secs, "{text:?}");
        }
    }

    #[test]
    fn backup_takes_out_or_inspect() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["polisctl", "cluster", "backup"].iter().chain(args))
                .map(|c| format!("{:?}", c.command))
        };
        assert!(parse(&["--out", "f"]).unwrap().contains("out: Some(\"f\")"));
        assert!(parse(&["inspect", "f"]).unwrap().contains("Inspect"));
        assert!(parse(&[]).is_err());
        assert!(parse(&["inspect"]).is_err());
    }

    #[test]
    fn snapshot_flags_parse() {
        assert_eq!(parse_snapshot_interval_normal("6h"), Ok(21600));
        assert!(parse_snapshot_interval_normal("2s").is_err());
        assert_eq!(parse_snapshot_interval_any("2s"), Ok(2));
        assert!(parse_snapshot_interval_any("0").is_err());
        assert!(parse_snapshot_interval_any("8d").is_err());
        assert_eq!(parse_snapshot_keep("5"), Ok(5));
        assert!(parse_snapshot_keep("0").is_err());
        assert!(parse_snapshot_keep("x").is_err());
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["polisctl", "cluster", "backup"].iter().chain(args))
                .map(|c| format!("{:?}", c.command))
        };
        assert!(parse(&["--out", "f", "--from-node", "n", "--name", "x"]).is_ok());
        assert!(parse(&["--out", "f", "--from-node", "n"]).is_err());
        assert!(parse(&["--out", "f", "--name", "x"]).is_err());
    }

    #[test]
    fn labels_parse() {
        assert_eq!(parse_label("a=b"), Ok(("a".into(), "b".into())));
        assert!(parse_label("ab").is_err());
        assert!(parse_label("=b").is_err());
    }

    #[test]
    fn look_back_durations_parse_with_units() {
        assert_eq!(parse_since("30s"), Ok(30));
        assert_eq!(parse_since("15m"), Ok(900));
        assert_eq!(parse_since("2h"), Ok(7200));
        assert_eq!(parse_since("1d"), Ok(86_400));
        for bad in ["", "5", "m", "5w", "-1s", "99999999999999999999d"] {
            assert!(parse_since(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn audit_budgets_parse() {
        assert_eq!(parse_audit_max_bytes("8MiB"), Ok(8 << 20));
        assert!(
            parse_audit_max_bytes("1KiB")
                .unwrap_err()
                .contains("too small")
        );
        assert!(parse_audit_max_bytes("lots").is_err());
    }

    #[test]
    fn etcd_quotas_parse_within_bounds() {
        assert_eq!(parse_etcd_quota("2GiB"), Ok(2 << 30));
        assert_eq!(parse_etcd_quota("4MiB"), Ok(4 << 20));
        let small = parse_etcd_quota("1MiB").unwrap_err();
        assert!(small.contains("too small"), "{small}");
        let large = parse_etcd_quota("16GiB").unwrap_err();
        assert!(large.contains("too large"), "{large}");
        assert!(parse_etcd_quota("lots").unwrap_err().contains("not a size"));
        assert!(parse_etcd_quota("0").is_err());
    }
}

/// Properties of the argument parsers over arbitrary text (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn unit() -> impl Strategy<Value = (&'static str, u64)> {
        prop_oneof![
            Just(("s", 1)),
            Just(("m", 60)),
            Just(("h", 3600)),
            Just(("d", 86_400)),
        ]
    }

    proptest! {
        #[test]
        fn any_argument_parses_or_is_refused(text in any::<String>()) {
            let _ = parse_ticket_ttl(&text);
            let _ = parse_since(&text);
            if let Ok(secs) = parse_lifetime(&text) {
                prop_assert!(pki::check_lifetime(std::time::Duration::from_secs(secs)).is_ok());
            }
            let _ = parse_etcd_quota(&text);
            let _ = parse_audit_max_bytes(&text);
            let _ = parse_snapshot_interval_normal(&text);
            let _ = parse_snapshot_interval_any(&text);
            let _ = parse_snapshot_keep(&text);
        }

        #[test]
        fn durations_are_their_number_of_units(n in any::<u64>(), (unit, scale) in unit()) {
            prop_assert_eq!(parse_since(&format!("{n}{unit}")).ok(), n.checked_mul(scale));
            let ttl = parse_ticket_ttl(&format!("{n}{unit}"));
            match n.checked_mul(scale) {
                // A ticket lives at least a second; `0` alone means never.
                Some(0) => prop_assert!(ttl.is_err()),
                Some(secs) => prop_assert_eq!(ttl, Ok(secs)),
                None => prop_assert!(ttl.is_err()),
            }
        }

        #[test]
        fn labels_split_at_the_first_equals_sign(key in "[^=]{1,20}", value in any::<String>()) {
            prop_assert_eq!(parse_label(&format!("{key}={value}")), Ok((key, value)));
        }
    }
}
