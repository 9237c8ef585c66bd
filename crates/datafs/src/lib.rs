//! Node data on an encrypted file system, unlocked by a key split in two halves.
//!
//! Job: turn a data device (a block device, or a plain file through a loop device) into
//! the node's `ROOT/data` directory, encrypted by the kernel (ext4 + fscrypt policy v2,
//! AES-256-XTS contents, AES-256-CTS names) with a key derived from a local half (kept by
//! the node) and a cluster half (kept by the cluster). Place: a library under
//! `polis-node`'s startup (storage) path; it knows nothing of the cluster, etcd or gRPC.
//!
//! ```text
//!   device ──(file? loop device)──▶ probe ─ zeros ─▶ mkfs.ext4 -O encrypt -L polis-data
//!                                         ─ ours ──▶ mount on FS_DIR (0700)
//!                                         ─ else ──▶ refused, named (unless Always)
//!   FS_DIR/polis-datafs   marker: owner node + cluster (plain, not secret)
//!   FS_DIR/data/          encrypted directory ──bind mount──▶ DATA_DIR (ROOT/data)
//!   key = HKDF-SHA256(local half ‖ cluster half)  → FS_IOC_ADD_ENCRYPTION_KEY
//! ```
//!
//! Module map (each uses only those below it):
//! - `volume`: open (probe, format, mount, marker, unlock, bind) and close.
//! - `halffile`: the local half's file (created once 0600 atomically; loaded with a
//!   refusal for missing, corrupted or exposed files).
//! - `loopdev`, `mounts`, `fscrypt`: the kernel interfaces (loop, mount, fscrypt ioctls).
//! - `probe`, `marker`, `key`: pure logic (device classification, marker, halves/key).
//! - `error`: the [`Error`] every fallible call returns.
//!
//! Invariants:
//! - Nothing but a zeroed device is formatted unless the caller says
//!   [`FormatPolicy::Always`] (anything) or [`FormatPolicy::UnlessOwn`] (anything but the
//!   owner's own file system); [`FormatPolicy::Never`] formats nothing. A device of
//!   another owner is refused by name.
//! - Node data is only ever written inside the encrypted directory, and only once the
//!   key that unlocks it is the key the directory was made with (compared by the kernel's
//!   key identifier); a wrong key is refused and removed from the kernel again.
//! - Key material is zeroed when dropped and never printed (`Debug` is redacted).
//! - One image file is never bound to two loop devices at once (that would be two file
//!   systems writing the same blocks): a binding left by a killed process is reused, and
//!   mounts it left are unmounted before a new open.
//! - Closing removes the key from the kernel before unmounting.

mod error;
pub mod fscrypt;
pub mod halffile;
pub mod key;
pub mod loopdev;
pub mod marker;
pub mod mounts;
pub mod probe;
mod volume;

pub use error::Error;
pub use key::{DataKey, Half, HalfError};
pub use marker::Owner;
pub use volume::{ENCRYPTED_DIR, FormatPolicy, Spec, Volume, open};
