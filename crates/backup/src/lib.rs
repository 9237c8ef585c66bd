//! The Polis backup file: writing, reading and verifying it.
//!
//! `polisctl cluster backup` writes one; `polisctl cluster backup inspect` (and a later
//! `polis-node restore`) read and verify it. The file is a header that names where the
//! backup came from, the etcd snapshot exactly as etcd streamed it, and a trailer with
//! the snapshot's size and SHA-256, written once the stream is complete (a curator
//! streams the snapshot, so its hash is known only at the end):
//!
//! ```text
//!   offset      length  content (integers big-endian)
//!   0           8       magic "POLISBAK"
//!   8           4       format version (1)
//!   12          4       header length H (at most 64 KiB)
//!   16          H       header: UTF-8 JSON (`Header`: CA fingerprint, revision, time,
//!                       node, versions)
//!   16+H        D       the etcd snapshot: what etcd's Maintenance.Snapshot streams, the
//!                       bbolt database followed by etcd's own SHA-256 of it (the same
//!                       bytes `etcdctl snapshot save` writes; `etcdctl snapshot restore`
//!                       takes them as they are)
//!   16+H+D      80      trailer: D (8), SHA-256 of the snapshot (32), SHA-256 of the
//!                       header bytes (32), end magic "POLISEND" (8)
//! ```
//!
//! The snapshot is contiguous, so it can be cut out with standard tools
//! (`tail -c +$((16+H+1)) FILE | head -c D`), or with [`copy_snapshot`].
//!
//! Verification ([`open`], then [`verify`] or [`copy_snapshot`]) tells apart: not a
//! Polis backup (wrong magic), a format this code does not know, a truncated file (no
//! end magic where the file ends, or shorter than its header), a corrupted header, a
//! trailer that disagrees with the file's length, and a snapshot whose SHA-256 differs
//! from the trailer's.
//!
//! A backup holds the cluster CA's private key (register tickets only as hashes): files are
//! written 0600, atomically ([`create_file`] over `privatefs::AtomicFile`).
//!
//! Pure over `Read`/`Write`/`Seek` except the two file helpers ([`create_file`],
//! [`inspect_file`]). May not know about etcd clients, gRPC or the cluster.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ring::digest::{Context, SHA256};
use serde::{Deserialize, Serialize};

/// The first bytes of every Polis backup.
pub const MAGIC: &[u8; 8] = b"POLISBAK";
/// The last bytes of every complete Polis backup.
pub const END_MAGIC: &[u8; 8] = b"POLISEND";
/// The format this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Largest header accepted.
pub const MAX_HEADER_LEN: u32 = 64 * 1024;
/// Bytes before the header: magic, version, header length.
pub const PREFIX_LEN: u64 = 16;
/// Bytes of the trailer.
pub const TRAILER_LEN: u64 = 8 + 32 + 32 + 8;

/// Where and when a backup was taken. Unknown fields are ignored when reading, so a
/// later Polis may add some without a new format version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// SHA-256 of the cluster CA certificate (DER), lowercase hex: the fingerprint
    /// `polisctl takeownership` shows.
    pub ca_fingerprint: String,
    /// SHA-256 fingerprints of every cluster CA trusted when the backup was taken, the
    /// signing one (`ca_fingerprint`) first: two while a CA rotation ran. Empty in
    /// backups taken before Polis recorded them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_ca_fingerprints: Vec<String>,
    /// The etcd revision read from the member before its snapshot began: every change
    /// up to it is in the snapshot (a few later ones may be too).
    pub revision: i64,
    /// Whether that revision was read through the quorum (linearizable): then every
    /// write acknowledged before the backup began is in it. False when the member had
    /// no quorum and the backup was taken from its local state alone.
    pub quorum_read: bool,
    /// When the snapshot began, milliseconds since the Unix epoch (the curator's clock).
    pub taken_at_unix_ms: u64,
    /// The node whose etcd member the snapshot came from.
    pub node_id: String,
    /// etcd cluster and member IDs, hex.
    pub etcd_cluster_id: String,
    pub etcd_member_id: String,
    /// Versions of the serving polis-node and its etcd.
    pub polis_version: String,
    pub etcd_version: String,
}

/// What the trailer records of the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    pub snapshot_size: u64,
    pub snapshot_sha256: [u8; 32],
    pub header_sha256: [u8; 32],
}

/// A backup whose structure has been read ([`open`]); the snapshot is verified only by
/// [`verify`] or [`copy_snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    pub format_version: u32,
    pub header: Header,
    pub trailer: Trailer,
    /// Where the snapshot starts in the file.
    pub snapshot_offset: u64,
}

/// What is wrong with a backup.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(
        "not a Polis backup (it does not start with {:?})",
        String::from_utf8_lossy(MAGIC)
    )]
    NotABackup,
    #[error(
        "backup format version {0} is not supported (this Polis reads version {FORMAT_VERSION})"
    )]
    UnsupportedVersion(u32),
    #[error("truncated: {0}")]
    Truncated(String),
    #[error("corrupted header: {0}")]
    CorruptHeader(String),
    #[error("corrupted: {0}")]
    Corrupt(String),
    #[error(
        "corrupted: the snapshot's SHA-256 is {actual}, the backup records {expected} (hash mismatch)"
    )]
    HashMismatch { expected: String, actual: String },
    #[error("the header cannot be written: {0}")]
    BadHeader(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// A [`BackupError`] about a named file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct FileError {
    pub path: PathBuf,
    #[source]
    pub source: BackupError,
}

fn sha256_array(context: Context) -> [u8; 32] {
    context
        .finish()
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

/// Writes a backup: the header first, then the snapshot in pieces, then the trailer.
pub struct Writer<W: Write> {
    inner: W,
    hasher: Context,
    size: u64,
    header_sha256: [u8; 32],
}

impl<W: Write> Writer<W> {
    /// Writes the prefix and `header` to `inner`.
    pub fn new(mut inner: W, header: &Header) -> Result<Writer<W>, BackupError> {
        let json = serde_json::to_vec(header).map_err(|e| BackupError::BadHeader(e.to_string()))?;
        let len = u32::try_from(json.len())
            .ok()
            .filter(|l| *l <= MAX_HEADER_LEN)
            .ok_or_else(|| BackupError::BadHeader(format!("{} bytes is too long", json.len())))?;
        inner.write_all(MAGIC)?;
        inner.write_all(&FORMAT_VERSION.to_be_bytes())?;
        inner.write_all(&len.to_be_bytes())?;
        inner.write_all(&json)?;
        Ok(Writer {
            inner,
            hasher: Context::new(&SHA256),
            size: 0,
            header_sha256: sha256_array({
                let mut c = Context::new(&SHA256);
                c.update(&json);
                c
            }),
        })
    }

    /// Appends a piece of the snapshot.
    pub fn write_snapshot(&mut self, piece: &[u8]) -> io::Result<()> {
        self.inner.write_all(piece)?;
        self.hasher.update(piece);
        self.size += piece.len() as u64;
        Ok(())
    }

    /// Bytes of snapshot written so far.
    pub fn snapshot_size(&self) -> u64 {
        self.size
    }

    /// SHA-256 of the snapshot written so far.
    pub fn snapshot_sha256(&self) -> [u8; 32] {
        sha256_array(self.hasher.clone())
    }

    /// Writes the trailer; returns the inner writer (not flushed to disk: the caller
    /// commits the file) and the trailer.
    pub fn finish(mut self) -> Result<(W, Trailer), BackupError> {
        let trailer = Trailer {
            snapshot_size: self.size,
            snapshot_sha256: self.snapshot_sha256(),
            header_sha256: self.header_sha256,
        };
        self.inner.write_all(&trailer.snapshot_size.to_be_bytes())?;
        self.inner.write_all(&trailer.snapshot_sha256)?;
        self.inner.write_all(&trailer.header_sha256)?;
        self.inner.write_all(END_MAGIC)?;
        self.inner.flush()?;
        Ok((self.inner, trailer))
    }
}

/// Reads exactly `buf.len()` bytes, or says the file ends too early.
fn read_exact_or_truncated(
    r: &mut impl Read,
    buf: &mut [u8],
    what: &str,
) -> Result<(), BackupError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            BackupError::Truncated(format!("the file ends inside {what}"))
        }
        _ => BackupError::Io(e),
    })
}

/// Reads and checks a backup's structure: magic, version, header (against its hash in
/// the trailer), trailer (against the file's length). Does not read the snapshot.
pub fn open<R: Read + Seek>(r: &mut R) -> Result<Backup, BackupError> {
    let len = r.seek(SeekFrom::End(0))?;
    r.seek(SeekFrom::Start(0))?;
    let mut prefix = [0u8; PREFIX_LEN as usize];
    if len < 8 {
        return Err(BackupError::NotABackup);
    }
    read_exact_or_truncated(r, &mut prefix[..8], "the magic")?;
    if &prefix[..8] != MAGIC {
        return Err(BackupError::NotABackup);
    }
    read_exact_or_truncated(r, &mut prefix[8..], "the format version")?;
    let version = u32::from_be_bytes(prefix[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(BackupError::UnsupportedVersion(version));
    }
    let header_len = u32::from_be_bytes(prefix[12..16].try_into().expect("4 bytes"));
    if header_len > MAX_HEADER_LEN {
        return Err(BackupError::CorruptHeader(format!(
            "its length {header_len} exceeds {MAX_HEADER_LEN}"
        )));
    }
    let snapshot_offset = PREFIX_LEN + u64::from(header_len);
    if len < snapshot_offset + TRAILER_LEN {
        return Err(BackupError::Truncated(format!(
            "{len} bytes cannot hold a {header_len}-byte header and the trailer"
        )));
    }
    let mut json = vec![0u8; header_len as usize];
    read_exact_or_truncated(r, &mut json, "the header")?;

    r.seek(SeekFrom::Start(len - TRAILER_LEN))?;
    let mut raw = [0u8; TRAILER_LEN as usize];
    read_exact_or_truncated(r, &mut raw, "the trailer")?;
    if &raw[72..80] != END_MAGIC {
        return Err(BackupError::Truncated(format!(
            "no end marker {:?} at its end ({len} bytes)",
            String::from_utf8_lossy(END_MAGIC)
        )));
    }
    let trailer = Trailer {
        snapshot_size: u64::from_be_bytes(raw[..8].try_into().expect("8 bytes")),
        snapshot_sha256: raw[8..40].try_into().expect("32 bytes"),
        header_sha256: raw[40..72].try_into().expect("32 bytes"),
    };
    let actual_size = len - snapshot_offset - TRAILER_LEN;
    if trailer.snapshot_size != actual_size {
        return Err(BackupError::Corrupt(format!(
            "the trailer records a {}-byte snapshot, the file holds {actual_size} bytes",
            trailer.snapshot_size
        )));
    }
    let header_sha256 = ring::digest::digest(&SHA256, &json);
    if header_sha256.as_ref() != trailer.header_sha256 {
        return Err(BackupError::CorruptHeader(
            "its SHA-256 differs from the one in the trailer".to_string(),
        ));
    }
    let header: Header =
        serde_json::from_slice(&json).map_err(|e| BackupError::CorruptHeader(e.to_string()))?;
    Ok(Backup {
        format_version: version,
        header,
        trailer,
        snapshot_offset,
    })
}

/// Reads the snapshot of `backup` (as [`open`] found it in `r`), writing it to `out`,
/// and checks its SHA-256. On a mismatch `out` has received bad bytes: the caller must
/// discard them (e.g. by not committing an `AtomicFile`).
pub fn copy_snapshot<R: Read + Seek, W: Write>(
    r: &mut R,
    backup: &Backup,
    out: &mut W,
) -> Result<(), BackupError> {
    r.seek(SeekFrom::Start(backup.snapshot_offset))?;
    let mut left = backup.trailer.snapshot_size;
    let mut hasher = Context::new(&SHA256);
    let mut buf = vec![0u8; 256 * 1024];
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        read_exact_or_truncated(r, &mut buf[..want], "the snapshot")?;
        hasher.update(&buf[..want]);
        out.write_all(&buf[..want])?;
        left -= want as u64;
    }
    let actual = sha256_array(hasher);
    if actual != backup.trailer.snapshot_sha256 {
        return Err(BackupError::HashMismatch {
            expected: hex::encode(backup.trailer.snapshot_sha256),
            actual: hex::encode(actual),
        });
    }
    Ok(())
}

/// Checks the snapshot's SHA-256 against the trailer.
pub fn verify<R: Read + Seek>(r: &mut R, backup: &Backup) -> Result<(), BackupError> {
    copy_snapshot(r, backup, &mut io::sink())
}

/// Opens and fully verifies the backup at `path`; errors name the file.
pub fn inspect_file(path: &Path) -> Result<Backup, FileError> {
    let named = |source| FileError {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(|e| named(BackupError::Io(e)))?;
    if file.metadata().map_err(|e| named(e.into()))?.is_dir() {
        return Err(named(BackupError::Io(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        ))));
    }
    let mut reader = io::BufReader::with_capacity(256 * 1024, &mut file);
    let backup = open(&mut reader).map_err(named)?;
    verify(&mut reader, &backup).map_err(named)?;
    Ok(backup)
}

/// Starts writing a backup to `path` (0600, atomically: it appears there only when the
/// caller commits the returned file after [`Writer::finish`]; dropped, nothing is left).
pub fn create_file(
    path: &Path,
    header: &Header,
) -> Result<Writer<privatefs::AtomicFile>, FileError> {
    let file = privatefs::AtomicFile::create(path).map_err(|e| FileError {
        path: path.to_path_buf(),
        source: BackupError::Io(io::Error::new(
            e.source.kind(),
            format!("{e}: {}", e.source),
        )),
    })?;
    Writer::new(file, header).map_err(|source| FileError {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests;
