//! Private files: how Polis writes anything it keeps on disk.
//!
//! Node roots (`polis-node`) and operator config directories (`polisctl`) hold keys,
//! certificates and the files that decide what a node is. Both write them through here:
//!
//! ```text
//!   write_atomic(path, bytes):  <dir>/.<name>.<random>.tmp  created new (O_EXCL), 0600
//!                               ─write─fsync─▶ rename over <path> ─▶ fsync <dir>
//!   AtomicFile (streamed):      written in pieces; removed if dropped uncommitted
//! ```
//!
//! Invariants:
//! - A reader (or a node restarting after a crash) sees the old file or the new one,
//!   never a mix or a truncated file.
//! - Files are created 0600 and directories 0700 (existing directories are tightened).
//! - A secret is only ever written into a file this call created: the temporary name is
//!   random and opened with `O_CREAT|O_EXCL` (which never follows a symlink) with mode
//!   0600 from the start, so nothing planted at a predictable name (a symlink to another
//!   file, a world-readable file) receives a byte. A symlink at `path` itself is replaced,
//!   never followed. A failed write leaves no temporary file behind.

use std::fs::{self, DirBuilder, File};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// An I/O error with the path and the step that failed.
#[derive(Debug, thiserror::Error)]
#[error("{step} {}", path.display())]
pub struct FsError {
    pub step: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn at<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FsError + 'a {
    move |source| FsError {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `dir` (and parents) with mode 0700, and tightens it if it already exists.
pub fn ensure_private_dir(dir: &Path) -> Result<(), FsError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(at("creating directory", dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(at("setting permissions of", dir))
}

/// Writes `contents` to `path` atomically with mode 0600.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), FsError> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(contents)
        .map_err(at("writing a temporary file for", path))?;
    file.commit()
}

/// A private file written in pieces that appears at its path only once complete:
/// `<dir>/.<name>.<random>.tmp`, created new (`O_EXCL`, 0600 from the start), is
/// written, then [`AtomicFile::commit`] fsyncs it, renames it into place and fsyncs the
/// directory. Dropped without a commit (an error, a cancelled copy), the temporary file
/// is removed: nothing is left behind.
pub struct AtomicFile {
    file: tempfile::NamedTempFile,
    path: PathBuf,
    dir: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`; fails (naming the directory) when it is missing.
    pub fn create(path: &Path) -> Result<AtomicFile, FsError> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path.file_name().ok_or_else(|| FsError {
            step: "writing (not a file path)",
            path: path.to_path_buf(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
        let mut prefix = std::ffi::OsString::from(".");
        prefix.push(name);
        prefix.push(".");
        let file = tempfile::Builder::new()
            .prefix(&prefix)
            .suffix(".tmp")
            .permissions(fs::Permissions::from_mode(0o600))
            .tempfile_in(&dir)
            .map_err(at("creating a temporary file in", &dir))?;
        Ok(AtomicFile {
            file,
            path: path.to_path_buf(),
            dir,
        })
    }

    /// The temporary file being written.
    pub fn temporary_path(&self) -> &Path {
        self.file.path()
    }

    /// Makes the file appear at its path, complete and durable.
    pub fn commit(self) -> Result<(), FsError> {
        self.file
            .as_file()
            .sync_all()
            .map_err(at("writing a temporary file for", &self.path))?;
        // On failure the temporary file is dropped, and with it removed.
        self.file
            .persist(&self.path)
            .map_err(|e| at("renaming into place", &self.path)(e.error))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(at("syncing directory", &self.dir))
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_is_private_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let entries: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "temporary file left behind");
    }

    #[test]
    fn private_dirs_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("a/b");
        fs::create_dir_all(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&d).unwrap();
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn errors_name_the_path() {
        let err = write_atomic(Path::new("/nonexistent-dir/x"), b"x").unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir"), "{err}");
    }

    #[test]
    fn a_symlink_planted_at_the_old_temporary_name_receives_nothing() {
        // Before: the temporary file was `.<name>.tmp`, opened with create + truncate,
        // which follows a symlink: the secret went into the link's target.
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep me").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".secret.tmp")).unwrap();
        let path = dir.path().join("secret");
        write_atomic(&path, b"the key").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(fs::read(&path).unwrap(), b"the key");
    }

    #[test]
    fn temporary_names_are_unpredictable_and_private_from_the_first_byte() {
        // A world-readable file planted at the old name is neither used nor widened into.
        let dir = tempfile::tempdir().unwrap();
        let planted = dir.path().join(".secret.tmp");
        fs::write(&planted, b"").unwrap();
        fs::set_permissions(&planted, fs::Permissions::from_mode(0o644)).unwrap();
        let path = dir.path().join("secret");
        write_atomic(&path, b"the key").unwrap();
        assert_eq!(fs::read(&planted).unwrap(), b"");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_symlink_at_the_path_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep me").unwrap();
        let path = dir.path().join("secret");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        write_atomic(&path, b"the key").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep me");
        assert!(
            !fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&path).unwrap(), b"the key");
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("occupied");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), b"x").unwrap();
        let err = write_atomic(&path, b"the key").unwrap_err();
        assert!(err.to_string().contains("occupied"), "{err}");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("occupied")]);
    }
    #[test]
    fn atomic_file_appears_only_on_commit_and_leaves_nothing_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let mut f = AtomicFile::create(&path).unwrap();
        f.write_all(b"part one, ").unwrap();
        f.write_all(b"part two").unwrap();
        assert!(!path.exists());
        f.commit().unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"part one, part two");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );

        let other = dir.path().join("abandoned");
        let mut f = AtomicFile::create(&other).unwrap();
        f.write_all(b"half").unwrap();
        drop(f);
        let entries: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "only the committed file remains");

        let err = AtomicFile::create(Path::new("/nonexistent-dir/x"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("/nonexistent-dir"), "{err}");
    }
}
