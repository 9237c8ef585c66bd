//! Errors of the data file system, one variant per thing a caller (or operator) can act on.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "this kernel cannot encrypt ext4 files (no /sys/fs/ext4/features/encryption): \
         an encrypted data device is not available here"
    )]
    Unsupported,
    #[error("data device {device} is neither a block device nor a regular file")]
    NotADevice { device: PathBuf },
    #[error(
        "data device {device} holds {what}; refusing to format it without an explicit \
         format request (--data-device-format)"
    )]
    Foreign { device: PathBuf, what: String },
    #[error(
        "data device {device} holds no file system (all zeros), but this node's data is \
         supposed to be on it: wrong device, or one that was wiped"
    )]
    Unformatted { device: PathBuf },
    #[error("formatting data device {device} (mkfs.ext4) failed: {detail}")]
    Format { device: PathBuf, detail: String },
    #[error("data device {device} belongs to {found}, not to {expected}")]
    OtherOwner {
        device: PathBuf,
        found: String,
        expected: String,
    },
    #[error("data device {device}: marker {path} is unreadable: {reason}")]
    Marker {
        device: PathBuf,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "the data key does not unlock data device {device}: the local half or the \
         cluster half is not this device's"
    )]
    WrongKey { device: PathBuf },
    #[error("data device {device}: {path} holds files but is not encrypted")]
    NotEncrypted { device: PathBuf, path: PathBuf },
    #[error(
        "{path} is not empty (plain node data from a start without a data device?); \
         move its contents away before mounting an encrypted data device there"
    )]
    DataDirNotEmpty { path: PathBuf },
    #[error(
        "the local half of the data key is missing at {path} (a missing or replaced ESP?): \
         without it the data device cannot be unlocked"
    )]
    LocalHalfMissing { path: PathBuf },
    #[error("the local half of the data key at {path} is unusable: {reason}")]
    LocalHalf { path: PathBuf, reason: String },
    #[error("refusing to replace the local half of the data key at {path}")]
    LocalHalfExists { path: PathBuf },
    #[error("invalid owner: {0}")]
    Owner(String),
    #[error("{step} {}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Private(#[from] privatefs::FsError),
}

pub(crate) fn io_at(step: &'static str, path: &std::path::Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { step, path, source }
}
