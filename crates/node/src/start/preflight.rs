//! Preflight: everything that can refuse a start, checked before anything is written
//! (but the root lock), ending in the [`Plan`] the cluster manager carries out.
//!
//! ```text
//!   address on this machine, crash points, root a directory ─▶ root lock ─▶ not
//!   decommissioned ─▶ root facts ─▶ decision ─▶ per decision: sealed configuration,
//!   node key, etcd binary, member data, free ports / bootstrap or register parameters
//!     ─▶ Plan (Bootstrap | Register | Join)
//! ```
//! Also raises the open-files limit. Reads only (besides the lock file): may not write
//! to the root, start a runnable or talk to the cluster.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use proto::config::{
    ClusterBootstrap, ClusterRegister, NodeParameters, SealedConfiguration, node_parameters,
};

use crate::disk::files::{has_etcd_data, parse_endpoints, recorded_membership};
use crate::disk::storage::{Root, RootLock, read_proto};
use crate::process::crash::check_crash_points;
use crate::start::decision::{Decision, ParametersKind, RootFacts, decide};
use crate::start::{bootstrap, join};
use crate::state::membership::JoinData;

/// What preflight decided and validated before the supervisor started.
#[derive(Debug, Clone)]
pub enum Plan {
    Bootstrap(ClusterBootstrap),
    /// Register parameters and where they came from (for messages).
    Register(Arc<ClusterRegister>, String),
    /// Join data is loaded and checked in preflight: it is only reads.
    Join(Arc<JoinData>),
}

/// What preflight needs of the node's flags.
#[derive(Debug, Clone)]
pub struct Flags {
    /// This node's address (`--address`).
    pub address: IpAddr,
    /// The node parameters file, when given (`--params`).
    pub params: Option<PathBuf>,
    /// The etcd binary (`--etcd-binary`).
    pub etcd_binary: PathBuf,
}

/// Fails unless `address` is assigned to an interface of this machine.
pub fn check_address(address: IpAddr) -> Result<()> {
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
pub fn raise_open_files_limit() -> std::io::Result<u64> {
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
pub fn check_control_plane_ports(address: IpAddr) -> Result<()> {
    check_port_free(
        address,
        consensus::config::PEER_PORT,
        "etcd peer",
        PORT_WAIT,
    )?;
    check_port_free(address, rpc::CURATOR_PORT, "curator", PORT_WAIT)
}

pub fn check_etcd_binary(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        _ => Err(consensus::ConsensusError::BinaryMissing { path: path.into() }.into()),
    }
}

/// Everything that can refuse the start, before anything is written (but the root lock,
/// which the returned plan must be carried out under).
pub fn preflight(flags: &Flags, root: &Root) -> Result<(RootLock, Plan)> {
    let lock = lock_checked(flags, root)?;
    Ok((lock, decide_plan(flags, root)?))
}

/// [`preflight`]'s checks and root lock without the decision: a data device is unlocked
/// in between (`datadev`), then [`decide_plan`] reads what it holds.
pub fn lock_checked(flags: &Flags, root: &Root) -> Result<RootLock> {
    check_address(flags.address)?;
    check_crash_points()?;
    lock_root(root)
}

/// The root lock (refused while another node runs on the root), then the refusal of a
/// decommissioned root and of a root in a newer format (`Root::check_format`). Shared by
/// every start, `recover` and `restore` included.
pub fn lock_root(root: &Root) -> Result<RootLock> {
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
    root.check_format()?;
    Ok(lock)
}

pub fn decide_plan(flags: &Flags, root: &Root) -> Result<Plan> {
    let sealed_path = root.sealed_configuration();
    let params_path = flags
        .params
        .clone()
        .unwrap_or_else(|| root.default_parameters());
    let sealed_present = sealed_path.exists();
    let parameters: Option<NodeParameters> = if sealed_present {
        None
    } else if flags.params.is_some() || params_path.exists() {
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
        bootstrap_trace: bootstrap::trace(
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
            let join = load_join(flags, root)?;
            check_member_start(flags, root, &join)?;
            Ok(Plan::Join(Arc::new(join)))
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
            check_etcd_binary(&flags.etcd_binary)?;
            identity::public_key_from_slice(&b.owner_public_key).with_context(|| {
                format!(
                    "owner public key in node parameters {} is invalid",
                    params_path.display()
                )
            })?;
            check_control_plane_ports(flags.address)?;
            Ok(Plan::Bootstrap(b))
        }
        Decision::Register => {
            let Some(node_parameters::Cluster::Register(r)) = parameters.and_then(|p| p.cluster)
            else {
                unreachable!("decided register from register parameters");
            };
            let what = format!("node parameters {}", params_path.display());
            check_register_parameters(&r).with_context(|| format!("{what} are invalid"))?;
            Ok(Plan::Register(Arc::new(r), what))
        }
    }
}

/// The sealed configuration (present), checked against the address, and the join data.
pub fn load_join(flags: &Flags, root: &Root) -> Result<JoinData> {
    let sealed_path = root.sealed_configuration();
    let sealed: SealedConfiguration = read_proto(&sealed_path, "sealed configuration")?;
    identity::validate_node_id(&sealed.node_id).with_context(|| {
        format!(
            "sealed configuration in {} is corrupt",
            sealed_path.display()
        )
    })?;
    if sealed.address != flags.address.to_string() {
        bail!(
            "this node joined its cluster with address {}, but was started with --address {}; \
             changing a node's address is not supported",
            sealed.address,
            flags.address
        );
    }
    join::prepare(root, sealed)
}

/// A consensus member's start: etcd binary, its etcd data, free ports.
pub fn check_member_start(flags: &Flags, root: &Root, join: &JoinData) -> Result<()> {
    if join.roles.consensus_member {
        check_etcd_binary(&flags.etcd_binary)?;
        check_member_root(root, &join.sealed)?;
        check_control_plane_ports(flags.address)?;
    }
    Ok(())
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
    parse_endpoints(&r.curator_endpoints)?;
    let labels = r.labels.clone().into_iter().collect();
    proto::labels::apply(&Default::default(), &labels, &[]).context("they hold invalid labels")?;
    Ok(())
}

/// Preflight for a consensus member's restart: a member whose etcd data is gone would
/// come back as a new, empty member; a node that never finished joining has none yet.
fn check_member_root(root: &Root, sealed: &SealedConfiguration) -> Result<()> {
    if recorded_membership(root, Some(sealed))?.is_some() && !has_etcd_data(root) {
        bail!(
            "this node is a consensus member, but its etcd data at {} is missing; \
             starting would create a new, empty member",
            root.etcd_data().display()
        );
    }
    Ok(())
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

    /// Raises the process's open-files limit: a process of its own (`ownprocess`).
    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        let _ = ownprocess::in_own_process(
            module_path!(),
            "the_open_files_limit_is_raised_to_the_hard_limit",
            the_open_files_limit_is_raised_body,
        );
    }

    fn the_open_files_limit_is_raised_body() {
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
