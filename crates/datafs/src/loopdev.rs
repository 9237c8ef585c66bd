//! Loop devices: a plain file used as a block device, through the kernel's loop ioctls
//! (linux/loop.h) rather than `losetup`.
//!
//! A file already bound to a loop device (a node killed while its data was mounted) is
//! reused, never bound a second time: two loop devices over one ext4 image would be two
//! independent file systems writing the same blocks. New bindings are made with
//! `LO_FLAGS_AUTOCLEAR`, so the kernel frees the loop device by itself once the last user
//! (our descriptor, then the mount) lets go of it.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const LOOP_CTL_GET_FREE: u64 = 0x4C82;
const LOOP_CONFIGURE: u64 = 0x4C0A;
const LOOP_GET_STATUS64: u64 = 0x4C05;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(size_of::<LoopInfo64>() == 232);
const _: () = assert!(size_of::<LoopConfig>() == 304);

fn zeroed_info() -> LoopInfo64 {
    LoopInfo64 {
        device: 0,
        inode: 0,
        rdevice: 0,
        offset: 0,
        sizelimit: 0,
        number: 0,
        encrypt_type: 0,
        encrypt_key_size: 0,
        flags: 0,
        file_name: [0; 64],
        crypt_name: [0; 64],
        encrypt_key: [0; 32],
        init: [0; 2],
    }
}

/// A loop device bound to a file; the open descriptor keeps it bound until dropped.
#[derive(Debug)]
pub struct LoopDevice {
    path: PathBuf,
    _dev: File,
}

impl LoopDevice {
    /// The block device (`/dev/loopN`).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Binds `file` to a loop device (or finds the one it is already bound to).
pub fn attach(file: &Path) -> io::Result<LoopDevice> {
    let backing = OpenOptions::new().read(true).write(true).open(file)?;
    let meta = backing.metadata()?;
    if let Some(found) = find_bound(meta.dev(), meta.ino())? {
        return Ok(found);
    }
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // Another process may take the free device between asking and binding: retry.
    let mut last = None;
    for _ in 0..32 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = OpenOptions::new().read(true).write(true).open(&path)?;
        let mut config = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: zeroed_info(),
            reserved: [0; 8],
        };
        config.info.flags = LO_FLAGS_AUTOCLEAR;
        let name = file.as_os_str().as_encoded_bytes();
        let len = name.len().min(63);
        config.info.file_name[..len].copy_from_slice(&name[..len]);
        // SAFETY: `config` is a live `struct loop_config` (size checked above).
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &mut config) };
        if r == 0 {
            return Ok(LoopDevice { path, _dev: dev });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
        last = Some(e);
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free loop device")))
}

/// The loop device already bound to the file with this device and inode number.
fn find_bound(dev: u64, ino: u64) -> io::Result<Option<LoopDevice>> {
    let entries = match fs::read_dir("/sys/block") {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("loop") || !Path::new("/sys/block").join(name).join("loop").exists() {
            continue;
        }
        let path = PathBuf::from("/dev").join(name);
        let Ok(file) = OpenOptions::new().read(true).write(true).open(&path) else {
            continue;
        };
        let mut info = zeroed_info();
        // SAFETY: `info` is a live `struct loop_info64` (size checked above).
        let r = unsafe { libc::ioctl(file.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
        if r == 0 && info.device == dev && info.inode == ino {
            return Ok(Some(LoopDevice { path, _dev: file }));
        }
    }
    Ok(None)
}
