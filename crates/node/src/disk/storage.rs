//! Local storage: the node root's layout, permissions and atomic file writes.
//!
//! ```text
//!   <root>/lock                          flock'ed while a polis-node runs; its PID
//!   <root>/esp/parameters.pb             node parameters (operator-provided)
//!   <root>/esp/sealed_configuration.pb   written last; present = "join on start"
//!   <root>/esp/directory.pb              known curator endpoints (ClusterDirectory)
//!   <root>/esp/decommissioned            left when the node was decommissioned and wiped
//!   <root>/esp/data-*, <root>/datafs/    --data-device only (see `datakeys`)
//!   <root>/data/node/disowning           present while the node is being decommissioned
//!   <root>/data/node/roles.pb            roles as last seen from the cluster (LocalRoles)
//!   <root>/data/node/key.der             node Ed25519 key (PKCS#8)       0600
//!   <root>/data/node/cert.der            node certificate (cluster CA)
//!   <root>/data/node/ca.der              cluster CA certificate
//!   <root>/data/node/crl.der             newest cluster CRL seen (checks curators)
//!   <root>/data/etcd/data/               etcd's data directory
//!   <root>/data/etcd/peer/               etcd peer cert, key, CA, CRL (PEM)
//!   <root>/data/etcd/member.pb           etcd member this node became by joining later
//!   <root>/data/etcd/quota.pb            etcd backend quota of its member (EtcdQuota)
//!   <root>/data/etcd/members.pb          etcd members last listed (RecordedMembers; memberbook)
//!   <root>/ephemeral/consensus/          etcd's cwd; client socket etcd.sock:0
//! ```
//! Directories are 0700, secret files 0600, and every file is written atomically
//! (temporary file, fsync, rename, fsync of the directory) — except `lock`, which must
//! keep its inode because the lock is on it; it only ever holds a PID.
//!
//! The bottom layer: paths and file primitives only; may not know what a file means
//! (that is `files`) and imports no other module of this crate.

use std::fs;
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use prost::Message;

/// The paths of one node root.
/// The format of the roots this binary writes (see [`Root::check_format`]). Raised when a
/// file of the root changes in a way an older binary would misread; a migration from
/// the format before goes with it.
pub const ROOT_FORMAT: u32 = 1;

#[derive(Debug, Clone)]
pub struct Root {
    pub root: PathBuf,
}

impl Root {
    pub fn new(root: impl Into<PathBuf>) -> Root {
        Root { root: root.into() }
    }
    pub fn lock_file(&self) -> PathBuf {
        self.root.join("lock")
    }
    pub fn esp(&self) -> PathBuf {
        self.root.join("esp")
    }
    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }
    pub fn ephemeral(&self) -> PathBuf {
        self.root.join("ephemeral")
    }
    pub fn default_parameters(&self) -> PathBuf {
        self.esp().join("parameters.pb")
    }
    pub fn sealed_configuration(&self) -> PathBuf {
        self.esp().join("sealed_configuration.pb")
    }
    pub fn directory(&self) -> PathBuf {
        self.esp().join("directory.pb")
    }
    pub fn local_roles(&self) -> PathBuf {
        self.node_dir().join("roles.pb")
    }
    pub fn node_dir(&self) -> PathBuf {
        self.data().join("node")
    }
    pub fn node_key(&self) -> PathBuf {
        self.node_dir().join("key.der")
    }
    /// The parameters of a bootstrap in progress (removed once it is sealed).
    pub fn bootstrap_record(&self) -> PathBuf {
        self.node_dir().join("bootstrap.pb")
    }
    pub fn node_certificate(&self) -> PathBuf {
        self.node_dir().join("cert.der")
    }
    pub fn cluster_ca(&self) -> PathBuf {
        self.node_dir().join("ca.der")
    }
    /// The newest cluster CRL this node has seen.
    pub fn cluster_crl(&self) -> PathBuf {
        self.node_dir().join("crl.der")
    }
    /// The cluster CAs this node trusts and their CRLs (PEM), once a curator named
    /// them (a CA rotation): read before `ca.der`, which names the CA it joined under.
    pub fn cluster_trust(&self) -> PathBuf {
        self.node_dir().join("trust.pem")
    }
    pub fn etcd_data(&self) -> PathBuf {
        self.data().join("etcd").join("data")
    }
    /// Written when a bootstrapping node's etcd first answered: from then on its data
    /// holds at least the new cluster's first membership (see `bootstrap::prepare`).
    pub fn etcd_bootstrap_ready(&self) -> PathBuf {
        self.data().join("etcd").join("bootstrap-ready")
    }
    /// The etcd member this node became when it joined consensus after joining.
    pub fn consensus_membership(&self) -> PathBuf {
        self.data().join("etcd").join("member.pb")
    }
    /// The etcd members as last listed while etcd served clients (`memberbook`).
    pub fn etcd_members(&self) -> PathBuf {
        self.data().join("etcd").join("members.pb")
    }
    /// The cluster epoch this node's etcd data belongs to (`epochs`).
    pub fn etcd_epoch(&self) -> PathBuf {
        self.data().join("etcd").join("epoch.pb")
    }
    /// A recover under way on this member, until its claim is recorded (`epochs`).
    pub fn recover_progress(&self) -> PathBuf {
        self.data().join("etcd").join("recover.pb")
    }
    /// The backend quota this node's etcd member runs with (etcd upkeep).
    pub fn etcd_quota(&self) -> PathBuf {
        self.data().join("etcd").join("quota.pb")
    }
    /// Scheduled snapshots of this member's etcd (written by its curator).
    pub fn snapshots(&self) -> PathBuf {
        self.data().join("snapshots")
    }
    pub fn etcd_peer_dir(&self) -> PathBuf {
        self.data().join("etcd").join("peer")
    }
    pub fn consensus_run_dir(&self) -> PathBuf {
        self.ephemeral().join("consensus")
    }
    /// Present while the node is being decommissioned (removed with `data/`).
    pub fn disowning_marker(&self) -> PathBuf {
        self.node_dir().join("disowning")
    }
    /// Left by a node that was decommissioned and wiped: it refuses to start.
    pub fn decommissioned_marker(&self) -> PathBuf {
        self.esp().join("decommissioned")
    }
    /// The root's format number (see [`Root::check_format`]).
    pub fn format_file(&self) -> PathBuf {
        self.root.join("format")
    }

    /// Checks the format the root was written in against the formats this binary reads,
    /// under the root lock, before anything else of the root is read: a root written by
    /// a newer polis-node is refused with both formats named, instead of being
    /// misread; a root without a format number (new, or written before format numbers)
    /// is given this binary's. Roots of an older format would be migrated here, step by
    /// step, each step atomic; format 1 is the first, so none is older yet.
    pub fn check_format(&self) -> Result<()> {
        let path = self.format_file();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return write_atomic(&path, format!("{ROOT_FORMAT}\n").as_bytes())
                    .with_context(|| format!("recording the root format in {}", path.display()));
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let Ok(format) = text.trim().parse::<u32>() else {
            bail!(
                "node root {}: {} holds {:?}, not a format number; it was not written by \
                 polis-node",
                self.root.display(),
                path.display(),
                text.chars().take(40).collect::<String>()
            );
        };
        if format > ROOT_FORMAT {
            bail!(
                "node root {} has format {format}, written by a newer polis-node; this one \
                 (version {}) reads root formats up to {ROOT_FORMAT}: run the newer \
                 polis-node on it",
                self.root.display(),
                env!("CARGO_PKG_VERSION")
            );
        }
        if format == 0 {
            bail!(
                "node root {}: {} says format 0, which no polis-node writes",
                self.root.display(),
                path.display()
            );
        }
        Ok(())
    }

    /// After a decommission, with every service stopped: leaves `note` in
    /// [`Root::decommissioned_marker`] (first, so that an interrupted wipe still refuses
    /// to start), then removes `data/` (keys, certificates, etcd data), `ephemeral/`, the
    /// sealed configuration and the cluster directory. Node parameters stay.
    pub fn wipe_after_decommission(&self, note: &str) -> Result<()> {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let note = format!("{note} (at {stamp} seconds since the Unix epoch)\n");
        write_atomic(&self.decommissioned_marker(), note.as_bytes())
            .context("recording that this node was decommissioned")?;
        for dir in [self.data(), self.ephemeral()] {
            match fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", dir.display())),
            }
        }
        for file in [self.sealed_configuration(), self.directory()] {
            match fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", file.display())),
            }
        }
        Ok(())
    }

    /// Locks the root for this process's lifetime (the lock goes with the returned
    /// value, or with the process: the kernel drops it on exit, also after `kill -9`).
    /// Creates the root directory if needed. When another process holds the lock,
    /// refuses without writing anything, naming that process's PID.
    pub fn lock(&self) -> Result<RootLock> {
        ensure_private_dir(&self.root)?;
        let path = self.lock_file();
        // Not truncated on open: the holder's PID must stay readable for a refused start.
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening lock file {}", path.display()))?;
        // SAFETY: flock(2) on a descriptor we own.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(error).with_context(|| format!("locking {}", path.display()));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "a process that has not written its PID yet".to_string(),
                pid => format!("PID {pid}"),
            };
            bail!(
                "node root {} is in use by another polis-node ({holder}; lock file {}); \
                 stop that one first",
                self.root.display(),
                path.display()
            );
        }
        let pid = std::process::id();
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{pid}"))
            .with_context(|| format!("writing PID to {}", path.display()))?;
        Ok(RootLock { _file: file })
    }

    /// Creates the root's directories (0700) and empties `ephemeral/`.
    pub fn prepare(&self) -> Result<()> {
        for dir in [
            self.root.clone(),
            self.esp(),
            self.data(),
            self.node_dir(),
            self.data().join("etcd"),
            self.etcd_peer_dir(),
        ] {
            ensure_private_dir(&dir)?;
        }
        let ephemeral = self.ephemeral();
        if ephemeral.exists() {
            fs::remove_dir_all(&ephemeral)
                .with_context(|| format!("emptying {}", ephemeral.display()))?;
        }
        ensure_private_dir(&ephemeral)?;
        Ok(())
    }

    /// Cluster state a fresh bootstrap would silently shadow: etcd data or credentials.
    pub fn cluster_state_present(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        if dir_non_empty(&self.etcd_data()) {
            found.push(self.etcd_data());
        }
        for f in [self.node_key(), self.node_certificate(), self.cluster_ca()] {
            if f.exists() {
                found.push(f);
            }
        }
        found
    }
}

/// Holds a node root's lock (see [`Root::lock`]) until dropped.
#[derive(Debug)]
pub struct RootLock {
    _file: fs::File,
}

pub fn dir_non_empty(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

pub use privatefs::ensure_private_dir;

/// Writes `contents` to `path` atomically with mode 0600 (see `privatefs`).
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    Ok(privatefs::write_atomic(path, contents)?)
}

/// Reads and decodes a protobuf file; errors name the file.
pub fn read_proto<M: Message + Default>(path: &Path, what: &str) -> Result<M> {
    let bytes =
        fs::read(path).with_context(|| format!("reading {what} from {}", path.display()))?;
    M::decode(bytes.as_slice()).with_context(|| {
        format!(
            "{what} in {} is corrupt (not a valid protobuf)",
            path.display()
        )
    })
}

pub fn write_proto<M: Message>(path: &Path, message: &M) -> Result<()> {
    write_atomic(path, &message.encode_to_vec())
}

/// Reads a file that must exist; the error names it.
pub fn read_file(path: &Path, what: &str) -> Result<Vec<u8>> {
    fs::read(path).with_context(|| format!("reading {what} from {}", path.display()))
}

/// PEM-encodes DER for files consumed by etcd.
pub fn pem(tag: &str, der: &[u8]) -> Vec<u8> {
    pem::encode(&pem::Pem::new(tag, der)).into_bytes()
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_root_gets_its_format_and_a_newer_or_foreign_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().join("root"));
        std::fs::create_dir_all(&root.root).unwrap();
        root.check_format().unwrap();
        let written = std::fs::read_to_string(root.format_file()).unwrap();
        assert_eq!(written.trim(), ROOT_FORMAT.to_string());
        root.check_format().unwrap();
        std::fs::write(root.format_file(), format!("{}\n", ROOT_FORMAT + 1)).unwrap();
        let newer = format!("{:#}", root.check_format().unwrap_err());
        assert!(
            newer.contains(&format!("has format {}", ROOT_FORMAT + 1))
                && newer.contains(&format!("up to {ROOT_FORMAT}")),
            "{newer}"
        );
        std::fs::write(root.format_file(), "zip\n").unwrap();
        let foreign = format!("{:#}", root.check_format().unwrap_err());
        assert!(foreign.contains("not a format number"), "{foreign}");
        std::fs::write(root.format_file(), "0").unwrap();
        assert!(root.check_format().is_err());
    }

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn prepare_creates_private_dirs_and_empties_ephemeral() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().join("node"));
        root.prepare().unwrap();
        fs::write(root.ephemeral().join("stale"), b"x").unwrap();
        root.prepare().unwrap();
        assert!(!root.ephemeral().join("stale").exists());
        for d in [root.root.clone(), root.esp(), root.data(), root.ephemeral()] {
            let mode = fs::metadata(&d).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        assert!(root.cluster_state_present().is_empty());
        fs::write(root.node_key(), b"k").unwrap();
        assert_eq!(root.cluster_state_present(), vec![root.node_key()]);
    }

    #[test]
    fn a_locked_root_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().join("node"));
        let held = root.lock().unwrap();
        let pid = std::process::id().to_string();
        assert_eq!(fs::read_to_string(root.lock_file()).unwrap().trim(), pid);
        // flock locks belong to the open file, so a second open in this process conflicts
        // just as another process would.
        let err = format!("{:#}", root.lock().unwrap_err());
        assert!(err.contains(&format!("PID {pid}")), "{err}");
        assert_eq!(fs::read_to_string(root.lock_file()).unwrap().trim(), pid);
        drop(held);
        root.lock().unwrap();
    }

    #[test]
    fn corrupt_proto_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("params.pb");
        fs::write(&path, [0xff, 0xff, 0xff]).unwrap();
        let err =
            read_proto::<proto::config::NodeParameters>(&path, "node parameters").unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("params.pb") && text.contains("corrupt"),
            "{text}"
        );
    }
}
