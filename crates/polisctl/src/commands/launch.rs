//! `polisctl cluster launch DIR --nodes N`: a local development cluster of real
//! `polis-node` processes on loopback addresses, like `talosctl cluster create`.
//!
//! ```text
//!   DIR/config/           polisctl config (owner key, owner certificate, CA, endpoints)
//!   DIR/launch.json       the nodes' addresses (a re-launch restarts the same cluster)
//!   DIR/nodeK/root/       node K's root;  DIR/nodeK/node.log  its log;  nodeK/pid
//!   DIR/nodeK/data.img    --encrypted: node K's data device (256 MiB sparse file, root
//!                         only: loop devices, ext4 encryption, mounts)
//! ```
//! Fresh: node 1 bootstraps, polisctl takes ownership, nodes 2…N register and are
//! approved, nodes 2 and 3 get ConsensusMember (three voters). Existing DIR: the nodes
//! that are not running are started again (no parameters: they rejoin). `--stop` stops
//! them (SIGTERM); `cluster destroy` stops them and removes DIR.
//! Runs the other commands as steps (quietly); the only command module that uses others.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::commands::{cluster, node, params, status};
use crate::output::Format;
use crate::render::node::print_node_list;
use crate::trust::{self, CaApproval};

const WAIT: Duration = Duration::from_secs(120);
/// The size of each node's data image with `--encrypted` (sparse).
const IMAGE_BYTES: u64 = 256 << 20;

/// Node K's data image (`--encrypted`), created sparse when absent.
fn data_image(dir: &Path, k: usize) -> Result<PathBuf> {
    let path = node_dir(dir, k).join("data.img");
    if !path.exists() {
        privatefs::ensure_private_dir(&node_dir(dir, k))?;
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("creating the data image {}", path.display()))?;
        file.set_len(IMAGE_BYTES)
            .with_context(|| format!("sizing the data image {}", path.display()))?;
    }
    Ok(path)
}

fn node_dir(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("node{k}"))
}

fn config_dir(dir: &Path) -> PathBuf {
    dir.join("config")
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join("launch.json")
}

/// The polis-node binary: `--node-binary`, else next to polisctl, else on PATH.
fn node_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().context("locating polisctl")?;
    let beside = exe.with_file_name("polis-node");
    if beside.is_file() {
        return Ok(beside);
    }
    Ok(PathBuf::from("polis-node"))
}

fn pid_of(dir: &Path, k: usize) -> Option<i32> {
    std::fs::read_to_string(node_dir(dir, k).join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether `pid` runs polis-node (not a zombie, not a reused PID).
fn running(pid: i32) -> bool {
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
    });
    alive
        && std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.contains("polis-node"))
}

/// Starts node `k` in the background; it outlives polisctl.
fn start_node(
    binary: &Path,
    dir: &Path,
    k: usize,
    address: IpAddr,
    params: Option<&Path>,
    encrypted: bool,
) -> Result<()> {
    let ndir = node_dir(dir, k);
    privatefs::ensure_private_dir(&ndir)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ndir.join("node.log"))
        .with_context(|| format!("opening {}", ndir.join("node.log").display()))?;
    let mut command = Command::new(binary);
    command
        .arg("--root")
        .arg(ndir.join("root"))
        .arg("--address")
        .arg(address.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(p) = params {
        command.arg("--params").arg(p);
    }
    if encrypted {
        command.arg("--data-device").arg(data_image(dir, k)?);
    }
    // Its own process group: a Ctrl-C in this terminal does not reach it.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let child = command
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    std::fs::write(ndir.join("pid"), child.id().to_string())?;
    eprintln!(
        "  node{k} on {address} (pid {}, log {})",
        child.id(),
        ndir.join("node.log").display()
    );
    Ok(())
}

/// Runs `step` until it succeeds or `WAIT` passes; `what` names it in the error.
async fn retry<T, F, Fut>(what: &str, mut step: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        match step().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => {
                return Err(e.context(format!("{what} (gave up after {WAIT:?})")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn addresses(first: Ipv4Addr, n: usize) -> Result<Vec<IpAddr>> {
    (0..n)
        .map(|i| {
            let last = u32::from(first) + i as u32;
            let ip = Ipv4Addr::from(last);
            if !ip.is_loopback() {
                bail!("address {ip} is outside 127.0.0.0/8; pick a lower --first-address");
            }
            Ok(IpAddr::V4(ip))
        })
        .collect()
}

/// `cluster launch`.
pub(crate) async fn launch(
    dir: &Path,
    nodes: usize,
    first_address: Ipv4Addr,
    binary: Option<&Path>,
    encrypted: bool,
    kubernetes: bool,
) -> Result<()> {
    let binary = node_binary(binary)?;
    let dir = std::path::absolute(dir).context("resolving the cluster directory")?;
    let config = config_dir(&dir);
    if state_file(&dir).exists() {
        return relaunch(&dir, &binary).await;
    }
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if !first_address.is_loopback() {
        bail!("--first-address must be a loopback address (127.0.0.0/8)");
    }
    // SAFETY: geteuid(2) has no preconditions.
    if encrypted && unsafe { libc::geteuid() } != 0 {
        bail!("--encrypted needs root (loop devices, ext4 encryption keys, mounts)");
    }
    let addresses = addresses(first_address, nodes)?;
    privatefs::ensure_private_dir(&dir)?;
    std::fs::write(
        state_file(&dir),
        serde_json::to_vec_pretty(&json!({ "addresses": addresses, "encrypted": encrypted }))?,
    )?;
    let what = if encrypted { "encrypted " } else { "" };
    eprintln!(
        "Launching a {nodes}-node {what}cluster in {}",
        dir.display()
    );

    // Node 1 bootstraps.
    let params = dir.join("bootstrap.params");
    let configuration = proto::config::ClusterConfiguration {
        cluster_domain: "polis.internal".into(),
        ..Default::default()
    };
    params::write_bootstrap_params(&config, &params, configuration, &[])?;
    start_node(&binary, &dir, 1, addresses[0], Some(&params), encrypted)?;
    let first = vec![addresses[0].to_string()];
    retry("taking ownership of the new cluster", || async {
        trust::take_ownership(&config, &first, CaApproval::Accept).await
    })
    .await?;

    if nodes > 1 {
        eprintln!("Registering {} more nodes", nodes - 1);
        let register = dir.join("register.params");
        params::write_register_params(&config, &[], &register, vec![]).await?;
        for (k, address) in addresses.iter().enumerate().skip(1) {
            start_node(&binary, &dir, k + 1, *address, Some(&register), encrypted)?;
        }
        let want = nodes - 1;
        retry("waiting for the nodes to register", || async {
            let new = node::list_ids(&config, &[], Some("new")).await?;
            if new.len() < want {
                bail!("{} of {want} registered", new.len());
            }
            Ok(())
        })
        .await?;
        node::node_approve(&config, &[], &[], true).await?;
        retry("waiting for the nodes to come UP", || async {
            let up = node::list_ids(&config, &[], Some("up")).await?;
            if up.len() < nodes {
                bail!("{} of {nodes} UP", up.len());
            }
            Ok(())
        })
        .await?;
    }
    // The first three nodes are the control plane: add the others one at a time (etcd
    // takes one learner at a time), each once the previous one votes everywhere.
    let mut members = vec![node_id_at(&config, addresses[0]).await?];
    for (k, address) in addresses.iter().enumerate().skip(1).take(2) {
        let id = node_id_at(&config, *address).await?;
        eprintln!("Making node{} a consensus member", k + 1);
        node::node_roles(
            &config,
            &[],
            Format::Quiet,
            &id,
            vec![proto::ROLE_CONSENSUS_MEMBER.into()],
            vec![],
        )
        .await?;
        members.push(id);
        wait_control_plane(&config, &members).await?;
    }
    // Returns only when the promise holds: every member votes in every member's view and
    // its curator answers (a leader's view alone was once taken for it).
    wait_control_plane(&config, &members).await?;
    if kubernetes {
        for id in &members {
            eprintln!("Making {id} a Kubernetes controller");
            node::node_roles(
                &config,
                &[],
                Format::Quiet,
                id,
                vec![proto::ROLE_KUBERNETES_CONTROLLER.into()],
                vec![],
            )
            .await?;
        }
    }
    retry("refreshing the curator endpoints", || async {
        cluster::cluster_info(&config, &[], Format::Quiet).await
    })
    .await?;
    print_summary(&dir, &config).await
}

/// Waits until every one of `members` is a voter in every answering member's view and
/// its curator answers (`status::control_plane_ready`).
async fn wait_control_plane(config: &Path, members: &[String]) -> Result<()> {
    retry(
        "waiting for every consensus member to vote and serve",
        || async { status::control_plane_ready(config, &[], members).await },
    )
    .await
}

/// The members every answering member names (a re-launched cluster's control plane).
async fn known_members(config: &Path) -> Result<Vec<String>> {
    let gathered = status::gather(config, &[]).await?;
    let mut names: Vec<String> = gathered
        .answers
        .iter()
        .flat_map(|a| a.members.iter().map(|m| m.name.clone()))
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    if names.is_empty() {
        bail!("no member answered");
    }
    Ok(names)
}

async fn node_id_at(config: &Path, address: IpAddr) -> Result<String> {
    node::list_nodes(config, &[])
        .await?
        .into_iter()
        .find(|n| n.address == address.to_string())
        .map(|n| n.id)
        .with_context(|| format!("no node at {address}"))
}

async fn print_summary(dir: &Path, config: &Path) -> Result<()> {
    let nodes = retry("listing the nodes", || async {
        node::list_nodes(config, &[]).await
    })
    .await?;
    print_node_list(&nodes, Format::Table);
    println!();
    println!("polisctl config: {}", config.display());
    println!(
        "  polisctl --config {} node list     # or: export POLISCTL_CONFIG={}",
        config.display(),
        config.display()
    );
    println!("Stop: polisctl cluster launch {} --stop", dir.display());
    // polis-node's default metrics listener: its own address when it is a loopback one.
    let targets: Vec<String> = nodes
        .iter()
        .map(|n| match n.address.parse::<IpAddr>() {
            Ok(ip) if ip.is_loopback() => format!("'{ip}:{METRICS_PORT}'"),
            _ => format!("'127.0.0.1:{METRICS_PORT}'"),
        })
        .collect();
    println!(
        "Prometheus scrape targets (http, /metrics): [{}]",
        targets.join(", ")
    );
    Ok(())
}

/// The port polis-node serves `/metrics` on by default.
const METRICS_PORT: u16 = 7839;

/// Whether the cluster in DIR was launched with `--encrypted`.
fn saved_encrypted(dir: &Path) -> Result<bool> {
    let path = state_file(dir);
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is corrupt", path.display()))?;
    Ok(state["encrypted"].as_bool().unwrap_or(false))
}

fn saved_addresses(dir: &Path) -> Result<Vec<IpAddr>> {
    let path = state_file(dir);
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is corrupt", path.display()))?;
    state["addresses"]
        .as_array()
        .context("no addresses")?
        .iter()
        .map(|a| {
            a.as_str()
                .and_then(|s| s.parse().ok())
                .context("an address that is not an IP")
        })
        .collect()
}

async fn relaunch(dir: &Path, binary: &Path) -> Result<()> {
    let addresses = saved_addresses(dir)?;
    let encrypted = saved_encrypted(dir)?;
    eprintln!(
        "Starting the existing {}-node cluster in {}",
        addresses.len(),
        dir.display()
    );
    for (i, address) in addresses.iter().enumerate() {
        let k = i + 1;
        match pid_of(dir, k) {
            Some(pid) if running(pid) => {
                eprintln!("  node{k} on {address} runs already (pid {pid})")
            }
            _ => {
                if !node_dir(dir, k)
                    .join("root/esp/sealed_configuration.pb")
                    .exists()
                {
                    bail!(
                        "node{k} never joined its cluster (no sealed configuration); \
                         destroy the cluster and launch a new one"
                    );
                }
                start_node(binary, dir, k, *address, None, encrypted)?;
            }
        }
    }
    let config = config_dir(dir);
    // Like a fresh launch, return once the control plane is whole again.
    retry(
        "waiting for every consensus member to vote and serve",
        || async {
            let members = known_members(&config).await?;
            status::control_plane_ready(&config, &[], &members).await
        },
    )
    .await?;
    print_summary(dir, &config).await
}

/// `cluster launch --stop` and `cluster destroy`.
pub(crate) fn stop(dir: &Path, remove: bool) -> Result<()> {
    if !state_file(dir).exists() {
        bail!("{} holds no launched cluster", dir.display());
    }
    let count = saved_addresses(dir)?.len();
    // One after the other, the last launched first: etcd's leader, stopped while its
    // peers stop too, spends 7 s on a leadership transfer nobody can take; stopped
    // while they run, it hands over in milliseconds, and stopped last, alone, it
    // skips the transfer.
    let mut stopping = Vec::new();
    for k in (1..=count).rev() {
        let Some(pid) = pid_of(dir, k).filter(|p| running(*p)) else {
            continue;
        };
        // SAFETY: kill(2) on a pid that runs polis-node, which we started.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while running(pid) {
            if Instant::now() > deadline {
                bail!("node{k} (pid {pid}) did not stop within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("stopped node{k} (pid {pid})");
        stopping.push(k);
    }
    if stopping.is_empty() {
        eprintln!("no node was running");
    }
    if remove {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        eprintln!("removed {}", dir.display());
    }
    Ok(())
}
