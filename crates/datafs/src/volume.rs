//! Opening (probe, format, mount, unlock, bind) and closing a node's data file system.

use std::fs::{self, DirBuilder, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, io_at};
use crate::fscrypt::{self, KeyId};
use crate::key::DataKey;
use crate::loopdev;
use crate::marker::{self, Owner};
use crate::mounts;
use crate::probe::{self, Content};

/// Name of the encrypted directory at the top of the file system.
pub const ENCRYPTED_DIR: &str = "data";

/// Whether a device that is not empty may be formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatPolicy {
    /// Format only a zeroed device; mount our own; refuse anything else.
    IfEmpty,
    /// Format whatever the device holds (the operator said so).
    Always,
    /// Never format: the device must hold our file system already (a node whose data
    /// is known to be on it).
    Never,
    /// Format anything but this owner's own file system: the operator asked to format a
    /// device on a node's first start, and that start may be a resumed one.
    UnlessOwn,
}

/// What to open and where.
#[derive(Debug, Clone, Copy)]
pub struct Spec<'a> {
    /// A block device, or a regular file used through a loop device.
    pub device: &'a Path,
    /// Where the ext4 file system is mounted (made 0700).
    pub fs_dir: &'a Path,
    /// Where its encrypted directory appears (a bind mount; must be empty or absent).
    pub data_dir: &'a Path,
    /// The node and cluster the device is (to be) marked for.
    pub owner: &'a Owner,
    pub format: FormatPolicy,
}

/// An open (mounted, unlocked) data file system. [`Volume::close`] removes the key and
/// unmounts; dropping an open volume does the same, logging what failed.
#[derive(Debug)]
pub struct Volume {
    device: PathBuf,
    fs_dir: PathBuf,
    data_dir: PathBuf,
    key_id: KeyId,
    formatted: bool,
    open: bool,
}

impl Volume {
    /// The encrypted directory, where node data goes.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
    /// Whether this open formatted the device.
    pub fn formatted(&self) -> bool {
        self.formatted
    }
    /// The fscrypt identifier of the data key (not secret).
    pub fn key_id(&self) -> &KeyId {
        &self.key_id
    }

    /// Unmounts the encrypted directory, removes the key from the kernel, unmounts the
    /// file system (the loop device, if any, is then freed by the kernel).
    pub fn close(mut self) -> Result<(), Error> {
        self.open = false;
        close(&self.fs_dir, &self.data_dir, &self.key_id)
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if self.open
            && let Err(e) = close(&self.fs_dir, &self.data_dir, &self.key_id)
        {
            tracing::warn!(device = %self.device.display(), "closing the data file system: {e}");
        }
    }
}

fn close(fs_dir: &Path, data_dir: &Path, key_id: &KeyId) -> Result<(), Error> {
    mounts::unmount(data_dir).map_err(io_at("unmounting the encrypted data at", data_dir))?;
    let root = File::open(fs_dir).map_err(io_at("opening", fs_dir))?;
    let flags =
        fscrypt::remove_key(&root, key_id).map_err(io_at("removing the data key of", fs_dir))?;
    drop(root);
    if flags & fscrypt::REMOVAL_FILES_BUSY != 0 {
        tracing::warn!(
            "files under {} were still open when its key was removed",
            fs_dir.display()
        );
    }
    mounts::unmount(fs_dir).map_err(io_at("unmounting the data file system at", fs_dir))
}

/// Opens the data file system of `spec` with `key`: formats a zeroed device (or any
/// device under [`FormatPolicy::Always`]), refuses anything else that is not ours, mounts
/// it, checks the marker names `spec.owner`, adds the key, checks it is the key the
/// encrypted directory was made with, and bind-mounts that directory on `data_dir`.
/// Leftover mounts of a process killed while the volume was open are unmounted first.
pub fn open(spec: &Spec<'_>, key: &DataKey) -> Result<Volume, Error> {
    if spec.format != FormatPolicy::UnlessOwn {
        return open_as(spec, key);
    }
    let kept = Spec {
        format: FormatPolicy::IfEmpty,
        ..*spec
    };
    match open_as(&kept, key) {
        Err(Error::Foreign { .. } | Error::OtherOwner { .. } | Error::Marker { .. }) => {
            let formatted = Spec {
                format: FormatPolicy::Always,
                ..*spec
            };
            open_as(&formatted, key)
        }
        other => other,
    }
}

fn open_as(spec: &Spec<'_>, key: &DataKey) -> Result<Volume, Error> {
    if !fscrypt::kernel_supports_ext4_encryption() {
        return Err(Error::Unsupported);
    }
    spec.owner.validate().map_err(Error::Owner)?;
    release_stale(spec.fs_dir, spec.data_dir)?;

    let device = spec.device;
    let kind = fs::metadata(device)
        .map_err(io_at("reading data device", device))?
        .file_type();
    let (block, loop_dev) = if kind.is_block_device() {
        (device.to_path_buf(), None)
    } else if kind.is_file() {
        let l = loopdev::attach(device)
            .map_err(io_at("binding a loop device to data device", device))?;
        (l.path().to_path_buf(), Some(l))
    } else {
        return Err(Error::NotADevice {
            device: device.to_path_buf(),
        });
    };

    let format = match (probe::classify(&read_head(&block)?), spec.format) {
        (_, FormatPolicy::Always) => true,
        (Content::Empty, FormatPolicy::Never) => {
            return Err(Error::Unformatted {
                device: device.to_path_buf(),
            });
        }
        (Content::Empty, FormatPolicy::IfEmpty | FormatPolicy::UnlessOwn) => true,
        (Content::Ours, _) => false,
        (Content::Other(what), _) => {
            return Err(Error::Foreign {
                device: device.to_path_buf(),
                what,
            });
        }
    };
    if format {
        tracing::info!(device = %device.display(), "formatting the encrypted data file system");
        mkfs(&block, device)?;
    }

    privatefs::ensure_private_dir(spec.fs_dir)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mounts::mount(&block, spec.fs_dir, Some("ext4"), flags)
        .map_err(io_at("mounting the data file system on", spec.fs_dir))?;
    // The mount holds the loop device now; without our descriptor it is freed on unmount.
    drop(loop_dev);
    let mut guard = MountGuard(vec![spec.fs_dir.to_path_buf()]);

    let key_id = unlock(spec, key)?;

    privatefs::ensure_private_dir(spec.data_dir)?;
    if fs::read_dir(spec.data_dir)
        .map_err(io_at("listing", spec.data_dir))?
        .next()
        .is_some()
    {
        return Err(Error::DataDirNotEmpty {
            path: spec.data_dir.to_path_buf(),
        });
    }
    let encrypted = spec.fs_dir.join(ENCRYPTED_DIR);
    mounts::mount(&encrypted, spec.data_dir, None, libc::MS_BIND)
        .map_err(io_at("bind-mounting the encrypted data on", spec.data_dir))?;
    guard.0.clear();
    Ok(Volume {
        device: device.to_path_buf(),
        fs_dir: spec.fs_dir.to_path_buf(),
        data_dir: spec.data_dir.to_path_buf(),
        key_id,
        formatted: format,
        open: true,
    })
}

/// Marker check (writing it on a fresh file system), key, encrypted directory.
fn unlock(spec: &Spec<'_>, key: &DataKey) -> Result<KeyId, Error> {
    let device = spec.device.to_path_buf();
    let fs_dir = spec.fs_dir;
    fs::set_permissions(fs_dir, fs::Permissions::from_mode(0o700))
        .map_err(io_at("setting permissions of", fs_dir))?;
    let encrypted = fs_dir.join(ENCRYPTED_DIR);
    let marker_path = fs_dir.join(marker::FILE);
    match fs::read_to_string(&marker_path) {
        Ok(text) => {
            let found = Owner::decode(&text).map_err(|e| Error::Marker {
                device: device.clone(),
                path: marker_path.clone(),
                reason: e.to_string(),
            })?;
            if &found != spec.owner {
                return Err(Error::OtherOwner {
                    device,
                    found: found.to_string(),
                    expected: spec.owner.to_string(),
                });
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A fresh file system, or a format interrupted before its marker: only if no
            // node data was written yet.
            if non_empty(&encrypted)? {
                return Err(Error::Marker {
                    device,
                    path: marker_path,
                    reason: "missing, while the file system holds node data".into(),
                });
            }
            privatefs::write_atomic(&marker_path, spec.owner.encode().as_bytes())?;
        }
        Err(e) => return Err(io_at("reading", &marker_path)(e)),
    }

    let root = File::open(fs_dir).map_err(io_at("opening", fs_dir))?;
    let id = fscrypt::add_key(&root, key).map_err(io_at("adding the data key to", fs_dir))?;
    match DirBuilder::new().mode(0o700).create(&encrypted) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_at("creating", &encrypted)(e)),
    }
    let dir = File::open(&encrypted).map_err(io_at("opening", &encrypted))?;
    let policy =
        fscrypt::policy_key(&dir).map_err(io_at("reading the encryption policy of", &encrypted))?;
    match policy {
        Some(p) if p == id => Ok(id),
        Some(_) => {
            // The wrong key is useless here; leave nothing of it in the kernel.
            let _ = fscrypt::remove_key(&root, &id);
            Err(Error::WrongKey { device })
        }
        None if non_empty(&encrypted)? => Err(Error::NotEncrypted {
            device,
            path: encrypted,
        }),
        None => {
            fscrypt::set_policy(&dir, &id)
                .map_err(io_at("setting the encryption policy of", &encrypted))?;
            Ok(id)
        }
    }
}

fn non_empty(dir: &Path) -> Result<bool, Error> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_at("listing", dir)(e)),
    }
}

/// Unmounts what a killed process left mounted on `data_dir` and `fs_dir`.
fn release_stale(fs_dir: &Path, data_dir: &Path) -> Result<(), Error> {
    for dir in [data_dir, fs_dir] {
        if mounts::is_mount_point(dir).map_err(io_at("checking mounts of", dir))? {
            tracing::warn!(
                "unmounting {} left mounted by an earlier run",
                dir.display()
            );
            mounts::unmount(dir).map_err(io_at("unmounting a leftover mount at", dir))?;
        }
    }
    Ok(())
}

fn read_head(block: &Path) -> Result<Vec<u8>, Error> {
    let mut head = Vec::with_capacity(probe::HEAD_LEN);
    File::open(block)
        .and_then(|f| f.take(probe::HEAD_LEN as u64).read_to_end(&mut head))
        .map_err(io_at("reading the start of", block))?;
    Ok(head)
}

fn mkfs(block: &Path, device: &Path) -> Result<(), Error> {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-m", "0", "-O", "encrypt", "-L"])
        .arg(probe::LABEL)
        .arg(block)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Format {
            device: device.to_path_buf(),
            detail: format!("running mkfs.ext4 (is e2fsprogs installed?): {e}"),
        })?;
    if !out.status.success() {
        return Err(Error::Format {
            device: device.to_path_buf(),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

/// Unmounts what it holds when an open fails half way.
struct MountGuard(Vec<PathBuf>);

impl Drop for MountGuard {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            if let Err(e) = mounts::unmount(dir) {
                tracing::warn!("unmounting {} after a failed open: {e}", dir.display());
            }
        }
    }
}
