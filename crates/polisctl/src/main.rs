//! `polisctl`: the operator's command line for Polis clusters.
//!
//! The config directory (`--config`, default `~/.config/polis`) holds the operator's
//! credentials:
//! ```text
//!   <config>/owner-key.pem    the owner's Ed25519 private key (PKCS#8 PEM)   0600
//!   <config>/owner.pem        the owner certificate from `takeownership`      0600
//!   <config>/ca.pem           the pinned cluster CA certificate               0600
//!   <config>/endpoints        the cluster's curators, one per line            0600
//! ```
//! `owner.pem` is renewed before any command once 2/3 of its lifetime have passed (or it
//! expired): AAA.Escrow with the owner key returns a new one, saved atomically.
//! `endpoints` is written by `takeownership` and refreshed whenever polisctl reads the
//! cluster's information (`cluster info`, `params register`); `--endpoints` overrides it.
//! Every call to a curator is mutual TLS: the curator's certificate must chain to the
//! pinned CA; polisctl presents its owner certificate (or, to take ownership, a
//! self-signed certificate proving the owner key).
//! Invariants: the directory is 0700 and every file in it 0600, written atomically; a key
//! file readable by others is refused, as ssh does.

mod cluster;
mod decommission;
mod launch;
mod output;

use std::fs;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser, Subcommand};
use identity::NodeKey;
use prost::Message;
use proto::config::{ClusterBootstrap, ClusterConfiguration, NodeParameters, node_parameters};

/// Operate Polis clusters.
#[derive(Debug, Parser)]
#[command(name = "polisctl", version)]
struct Cli {
    /// Configuration directory holding the owner key, certificate and pinned CA.
    #[arg(long, global = true, env = "POLISCTL_CONFIG")]
    config: Option<PathBuf>,
    /// Curator endpoints (IP or IP:PORT, comma-separated); tried in order. Default: the
    /// endpoints remembered in the config directory.
    #[arg(long, global = true, value_delimiter = ',', env = "POLISCTL_ENDPOINTS")]
    endpoints: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    output: output::Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
    /// Cluster-wide information.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Inspect and change nodes.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Print a shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
enum ParamsCommand {
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
    },
    /// Parameters for a new node to register into this cluster: the register ticket,
    /// the pinned cluster CA and the current curator endpoints. They stop working for
    /// nodes that have not registered yet when the ticket is rotated.
    Register {
        /// Where to write the parameters.
        #[arg(long)]
        out: PathBuf,
        /// Labels the node registers with, KEY=VALUE (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
    },
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// The cluster's CA, configuration and curators.
    Info,
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
    },
    /// Stop the cluster launched in DIR and remove DIR.
    Destroy { dir: PathBuf },
    /// Every certificate the cluster's CAs issued (node, owner, etcd peer): node,
    /// serial, expiry, whether revoked, and whether it is the one in use.
    Certificates,
    /// Replace the register ticket. Node parameters made with the old ticket stop
    /// working for nodes that have not registered yet; registered nodes can still be
    /// approved.
    RotateTicket,
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
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
    /// Set labels (KEY=VALUE) and remove them (KEY-) on a node.
    Label {
        id: String,
        #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
        changes: Vec<String>,
    },
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

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("label {s:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("label {s:?} has an empty key"));
    }
    Ok((k.to_string(), v.to_string()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("polisctl: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("polisctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn config_dir(cli: &Cli) -> Result<PathBuf> {
    if let Some(c) = &cli.config {
        return Ok(c.clone());
    }
    let home = std::env::var_os("HOME").context("HOME is not set; pass --config DIR")?;
    Ok(PathBuf::from(home).join(".config").join("polis"))
}

async fn run(cli: Cli) -> Result<()> {
    match &cli.command {
        Command::Takeownership {
            accept_ca,
            ca_fingerprint,
        } => {
            let config = config_dir(&cli)?;
            let trust = if *accept_ca {
                cluster::CaApproval::Accept
            } else if let Some(f) = ca_fingerprint {
                cluster::CaApproval::Fingerprint(f.clone())
            } else {
                cluster::CaApproval::Ask
            };
            cluster::take_ownership(&config, &cli.endpoints, trust).await
        }
        Command::Cluster(ClusterCommand::Info) => {
            let config = config_dir(&cli)?;
            cluster::cluster_info(&config, &cli.endpoints, cli.output).await
        }
        Command::Cluster(ClusterCommand::Launch {
            dir,
            nodes,
            first_address,
            stop,
            node_binary,
        }) => {
            if *stop {
                launch::stop(dir, false)
            } else {
                launch::launch(dir, *nodes, *first_address, node_binary.as_deref()).await
            }
        }
        Command::Cluster(ClusterCommand::Destroy { dir }) => launch::stop(dir, true),
        Command::Cluster(ClusterCommand::Status) => {
            let config = config_dir(&cli)?;
            cluster::cluster_status(&config, &cli.endpoints, cli.output).await
        }
        Command::Cluster(ClusterCommand::Certificates) => {
            let config = config_dir(&cli)?;
            cluster::certificates(&config, &cli.endpoints, cli.output).await
        }
        Command::Cluster(ClusterCommand::RotateTicket) => {
            let config = config_dir(&cli)?;
            cluster::rotate_ticket(&config, &cli.endpoints).await
        }
        Command::Node(command) => {
            let config = config_dir(&cli)?;
            match command {
                NodeCommand::List {
                    state,
                    role,
                    labels,
                } => {
                    cluster::node_list(
                        &config,
                        &cli.endpoints,
                        cli.output,
                        state.as_deref(),
                        role.as_deref(),
                        labels,
                    )
                    .await
                }
                NodeCommand::Describe { id } => {
                    cluster::node_describe(&config, &cli.endpoints, cli.output, id).await
                }
                NodeCommand::AddRole { id, role } => {
                    cluster::node_roles(
                        &config,
                        &cli.endpoints,
                        cli.output,
                        id,
                        vec![role.clone()],
                        vec![],
                    )
                    .await
                }
                NodeCommand::RemoveRole { id, role } => {
                    cluster::node_roles(
                        &config,
                        &cli.endpoints,
                        cli.output,
                        id,
                        vec![],
                        vec![role.clone()],
                    )
                    .await
                }
                NodeCommand::Approve { ids, all_new } => {
                    cluster::node_approve(&config, &cli.endpoints, ids, *all_new).await
                }
                NodeCommand::Decommission {
                    ids,
                    no_wait,
                    timeout,
                } => {
                    let wait = (!no_wait).then(|| std::time::Duration::from_secs(*timeout));
                    decommission::node_decommission(&config, &cli.endpoints, ids, wait).await
                }
                NodeCommand::Delete { ids } => {
                    decommission::node_delete(&config, &cli.endpoints, ids).await
                }
                NodeCommand::Label { id, changes } => {
                    cluster::node_label(&config, &cli.endpoints, cli.output, id, changes).await
                }
            }
        }
        Command::Completion { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "polisctl",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Params(ParamsCommand::Bootstrap {
            out,
            cluster_domain,
            labels,
            node_certificate_lifetime,
            owner_certificate_lifetime,
        }) => {
            let config = config_dir(&cli)?;
            let configuration = ClusterConfiguration {
                cluster_domain: cluster_domain.clone(),
                node_certificate_lifetime_seconds: node_certificate_lifetime.unwrap_or(0),
                owner_certificate_lifetime_seconds: owner_certificate_lifetime.unwrap_or(0),
            };
            write_bootstrap_params(&config, out, configuration, labels)?;
            eprintln!("wrote bootstrap parameters to {}", out.display());
            Ok(())
        }
        Command::Params(ParamsCommand::Register { out, labels }) => {
            let config = config_dir(&cli)?;
            write_register_params(&config, &cli.endpoints, out, labels.clone()).await?;
            eprintln!("wrote register parameters to {}", out.display());
            Ok(())
        }
    }
}

/// Writes bootstrap parameters for a new cluster owned by the key in `config` (created
/// if absent).
pub(crate) fn write_bootstrap_params(
    config: &Path,
    out: &Path,
    configuration: ClusterConfiguration,
    labels: &[(String, String)],
) -> Result<()> {
    let labels: std::collections::BTreeMap<String, String> = labels.iter().cloned().collect();
    proto::labels::apply(&Default::default(), &labels, &[])?;
    let key = ensure_owner_key(config)?;
    let params = NodeParameters {
        cluster: Some(node_parameters::Cluster::Bootstrap(ClusterBootstrap {
            owner_public_key: key.public_key().to_vec(),
            initial_cluster_configuration: Some(configuration),
            labels: labels.into_iter().collect(),
        })),
    };
    write_private(out, &params.encode_to_vec())
        .with_context(|| format!("writing node parameters to {}", out.display()))
}

/// Writes register parameters for a new node of the cluster `config` owns.
pub(crate) async fn write_register_params(
    config: &Path,
    endpoints: &[String],
    out: &Path,
    labels: Vec<(String, String)>,
) -> Result<()> {
    let map: std::collections::BTreeMap<String, String> = labels.iter().cloned().collect();
    proto::labels::apply(&Default::default(), &map, &[])?;
    let register = cluster::register_parameters(config, endpoints, labels).await?;
    let params = NodeParameters {
        cluster: Some(node_parameters::Cluster::Register(register)),
    };
    write_private(out, &params.encode_to_vec())
        .with_context(|| format!("writing node parameters to {}", out.display()))
}

pub(crate) fn owner_key_path(config: &Path) -> PathBuf {
    config.join("owner-key.pem")
}

/// Loads the owner key, creating it (and the 0700 config directory) if absent.
fn ensure_owner_key(config: &Path) -> Result<NodeKey> {
    if !config.exists() {
        privatefs::ensure_private_dir(config)?;
    }
    let mode = fs::metadata(config)
        .with_context(|| format!("reading {}", config.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "config directory {} has permissions {:o}, which let others in; chmod 700 it",
            config.display(),
            mode & 0o777
        );
    }
    let path = owner_key_path(config);
    if path.exists() {
        return load_owner_key(&path);
    }
    let key = NodeKey::generate().context("generating the owner key")?;
    let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", key.pkcs8_der()));
    write_private(&path, pem.as_bytes())
        .with_context(|| format!("writing owner key to {}", path.display()))?;
    eprintln!("created owner key {}", path.display());
    Ok(key)
}

pub(crate) fn load_owner_key(path: &Path) -> Result<NodeKey> {
    let mode = fs::metadata(path)
        .with_context(|| format!("reading owner key {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "owner key {} has permissions {:o}, which are too open; chmod 600 it",
            path.display(),
            mode & 0o777
        );
    }
    let text = fs::read_to_string(path)
        .with_context(|| format!("reading owner key {}", path.display()))?;
    let parsed = pem::parse(&text)
        .with_context(|| format!("owner key {} is not a PEM file", path.display()))?;
    if parsed.tag() != "PRIVATE KEY" {
        bail!(
            "owner key {} holds a {}, not a PRIVATE KEY",
            path.display(),
            parsed.tag()
        );
    }
    NodeKey::from_pkcs8(parsed.contents())
        .with_context(|| format!("owner key {} is not an Ed25519 key", path.display()))
}

/// Writes a 0600 file atomically (see `privatefs`).
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    Ok(privatefs::write_atomic(path, contents)?)
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
    fn owner_key_is_created_once_with_private_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cfg");
        let a = ensure_owner_key(&config).unwrap();
        let b = ensure_owner_key(&config).unwrap();
        assert_eq!(a.public_key(), b.public_key());
        let dir_mode = fs::metadata(&config).unwrap().permissions().mode() & 0o777;
        let key_mode = fs::metadata(owner_key_path(&config))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!((dir_mode, key_mode), (0o700, 0o600));
    }

    #[test]
    fn too_open_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cfg");
        ensure_owner_key(&config).unwrap();
        let key = owner_key_path(&config);
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        let err = ensure_owner_key(&config).unwrap_err().to_string();
        assert!(err.contains("too open"), "{err}");
    }

    #[test]
    fn labels_parse() {
        assert_eq!(parse_label("a=b"), Ok(("a".into(), "b".into())));
        assert!(parse_label("ab").is_err());
        assert!(parse_label("=b").is_err());
    }
}
