//! The kernel's native file encryption (fscrypt), driven by its ioctls (linux/fscrypt.h).
//!
//! Policy v2 only: the master key is added to the file system's keyring and named by the
//! 16-byte identifier the kernel derives from it (so a wrong key has a different
//! identifier and is never mistaken for the right one). Contents AES-256-XTS, names
//! AES-256-CTS, names padded to 32 bytes.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::key::{DATA_KEY_LEN, DataKey};

/// Identifier of a v2 master key (derived from the key by the kernel; not secret).
pub type KeyId = [u8; 16];

const POLICY_V2: u8 = 2;
const MODE_AES_256_XTS: u8 = 1;
const MODE_AES_256_CTS: u8 = 4;
const FLAGS_PAD_32: u8 = 0x03;
const KEY_SPEC_TYPE_IDENTIFIER: u32 = 2;

/// Set in [`remove_key`]'s answer when files were still open: their contents stay
/// readable through those open files until closed.
pub const REMOVAL_FILES_BUSY: u32 = 0x1;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PolicyV2 {
    version: u8,
    contents_mode: u8,
    filenames_mode: u8,
    flags: u8,
    log2_data_unit_size: u8,
    reserved: [u8; 3],
    identifier: KeyId,
}

#[repr(C)]
struct GetPolicyEx {
    size: u64,
    policy: PolicyV2,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct KeySpec {
    kind: u32,
    reserved: u32,
    u: [u8; 32],
}

#[repr(C)]
struct AddKey {
    spec: KeySpec,
    raw_size: u32,
    key_id: u32,
    reserved: [u32; 8],
    raw: [u8; DATA_KEY_LEN],
}

#[repr(C)]
#[derive(Default)]
struct RemoveKey {
    spec: KeySpec,
    status_flags: u32,
    reserved: [u32; 5],
}

#[repr(C)]
struct KeyStatus {
    spec: KeySpec,
    reserved: [u32; 6],
    status: u32,
    status_flags: u32,
    user_count: u32,
    out_reserved: [u32; 13],
}

const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | ((b'f' as u64) << 8) | nr
}
// SET takes the v1 policy's size in its number (12 bytes) but reads the version byte first.
const FS_IOC_SET_ENCRYPTION_POLICY: u64 = (2 << 30) | (12 << 16) | ((b'f' as u64) << 8) | 19;
const FS_IOC_GET_ENCRYPTION_POLICY_EX: u64 = iowr(22, 9);
const FS_IOC_ADD_ENCRYPTION_KEY: u64 = iowr(23, 80);
const FS_IOC_REMOVE_ENCRYPTION_KEY: u64 = iowr(24, 64);
const FS_IOC_GET_ENCRYPTION_KEY_STATUS: u64 = iowr(26, 128);

const _: () = assert!(size_of::<PolicyV2>() == 24);
const _: () = assert!(size_of::<KeySpec>() == 40);
const _: () = assert!(size_of::<AddKey>() == 80 + DATA_KEY_LEN);
const _: () = assert!(size_of::<RemoveKey>() == 64);
const _: () = assert!(size_of::<KeyStatus>() == 128);

/// Whether the running kernel can encrypt ext4 files (`/sys/fs/ext4/features/encryption`).
pub fn kernel_supports_ext4_encryption() -> bool {
    Path::new("/sys/fs/ext4/features/encryption").exists()
}

fn ioctl<T>(file: &File, request: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` points to a live `#[repr(C)]` struct of the size the request encodes
    // (checked by the const assertions above); the kernel reads/writes only within it.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), request as _, arg as *mut T) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Adds `key` to the keyring of the file system holding `dir`; returns its identifier.
/// Adding a key already present is harmless (the kernel counts it once per user).
pub fn add_key(dir: &File, key: &DataKey) -> io::Result<KeyId> {
    let mut arg = AddKey {
        spec: KeySpec {
            kind: KEY_SPEC_TYPE_IDENTIFIER,
            ..KeySpec::default()
        },
        raw_size: DATA_KEY_LEN as u32,
        key_id: 0,
        reserved: [0; 8],
        raw: *key.as_bytes(),
    };
    let result = ioctl(dir, FS_IOC_ADD_ENCRYPTION_KEY, &mut arg);
    // The copy of the key on our stack is wiped whatever happened.
    for b in arg.raw.iter_mut() {
        // SAFETY: valid exclusive reference to a byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    result?;
    let mut id = KeyId::default();
    id.copy_from_slice(&arg.spec.u[..16]);
    Ok(id)
}

/// Removes the key `id` from the file system holding `dir`; returns the kernel's status
/// flags ([`REMOVAL_FILES_BUSY`]).
pub fn remove_key(dir: &File, id: &KeyId) -> io::Result<u32> {
    let mut arg = RemoveKey {
        spec: spec(id),
        ..RemoveKey::default()
    };
    ioctl(dir, FS_IOC_REMOVE_ENCRYPTION_KEY, &mut arg)?;
    Ok(arg.status_flags)
}

/// Whether the key `id` is present in the keyring of the file system holding `dir`.
pub fn key_present(dir: &File, id: &KeyId) -> io::Result<bool> {
    let mut arg = KeyStatus {
        spec: spec(id),
        reserved: [0; 6],
        status: 0,
        status_flags: 0,
        user_count: 0,
        out_reserved: [0; 13],
    };
    ioctl(dir, FS_IOC_GET_ENCRYPTION_KEY_STATUS, &mut arg)?;
    Ok(arg.status == 2)
}

/// Makes the empty directory `dir` encrypted with the key `id` (a no-op when it already
/// is; `EEXIST` when it is encrypted with another key, `ENOTEMPTY` when it holds files).
pub fn set_policy(dir: &File, id: &KeyId) -> io::Result<()> {
    let mut policy = PolicyV2 {
        version: POLICY_V2,
        contents_mode: MODE_AES_256_XTS,
        filenames_mode: MODE_AES_256_CTS,
        flags: FLAGS_PAD_32,
        identifier: *id,
        ..PolicyV2::default()
    };
    ioctl(dir, FS_IOC_SET_ENCRYPTION_POLICY, &mut policy)
}

/// The key identifier `dir` is encrypted with; `None` when it is not encrypted.
pub fn policy_key(dir: &File) -> io::Result<Option<KeyId>> {
    let mut arg = GetPolicyEx {
        size: size_of::<PolicyV2>() as u64,
        policy: PolicyV2::default(),
    };
    match ioctl(dir, FS_IOC_GET_ENCRYPTION_POLICY_EX, &mut arg) {
        Ok(()) if arg.policy.version == POLICY_V2 => Ok(Some(arg.policy.identifier)),
        Ok(()) => Err(io::Error::other(format!(
            "encrypted with fscrypt policy version {}, not 2",
            arg.policy.version
        ))),
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => Ok(None),
        Err(e) => Err(e),
    }
}

fn spec(id: &KeyId) -> KeySpec {
    let mut spec = KeySpec {
        kind: KEY_SPEC_TYPE_IDENTIFIER,
        ..KeySpec::default()
    };
    spec.u[..16].copy_from_slice(id);
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux_headers() {
        // Values from <linux/fscrypt.h> as compiled on x86_64/aarch64.
        assert_eq!(FS_IOC_SET_ENCRYPTION_POLICY, 0x800c_6613);
        assert_eq!(FS_IOC_GET_ENCRYPTION_POLICY_EX, 0xc009_6616);
        assert_eq!(FS_IOC_ADD_ENCRYPTION_KEY, 0xc050_6617);
        assert_eq!(FS_IOC_REMOVE_ENCRYPTION_KEY, 0xc040_6618);
        assert_eq!(FS_IOC_GET_ENCRYPTION_KEY_STATUS, 0xc080_661a);
    }
}
