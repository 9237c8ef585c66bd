//! Encrypted data devices in tests: whether the kernel can, sparse image files, and a
//! guard that unmounts what a killed node left mounted.
//!
//! A leaf: may not start processes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Whether this kernel has ext4 encryption; says so (SKIPPED) when it has not.
pub fn fscrypt_usable() -> bool {
    if !datafs::fscrypt::kernel_supports_ext4_encryption() {
        println!("SKIPPED: this kernel lacks ext4 encryption (/sys/fs/ext4/features/encryption)");
        return false;
    }
    true
}

/// A sparse 256 MiB image file at `path` for `--data-device`; returns its path as text.
pub fn data_image(path: &Path) -> Result<String> {
    std::fs::File::create(path)?.set_len(256 << 20)?;
    Ok(path.to_str().context("utf-8 path")?.to_string())
}

/// Unmounts what a node killed by its guard left mounted under its root `ROOT` (declare
/// it before the node, so that it drops after it).
pub struct Mounts(pub PathBuf);

impl Drop for Mounts {
    fn drop(&mut self) {
        // A killed node's etcd dies a moment after it (PR_SET_PDEATHSIG) and keeps the
        // mount busy until then: retry for a while, then detach it lazily.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for d in [self.0.join("data"), self.0.join("datafs")] {
            while datafs::mounts::is_mount_point(&d).unwrap_or(false) {
                if datafs::mounts::unmount(&d).is_ok() {
                    continue;
                }
                if std::time::Instant::now() > deadline {
                    if let Ok(path) = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()) {
                        // SAFETY: umount2(2) with a NUL-terminated path and a flag.
                        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
                    }
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}
