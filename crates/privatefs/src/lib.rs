//! Private files: how Polis writes anything it keeps on disk.
//!
//! Node roots (`polis-node`) and operator config directories (`polisctl`) hold keys,
//! certificates and the files that decide what a node is. Both write them through here:
//!
//! ```text
//!   write_atomic(path, bytes):  <dir>/.<name>.tmp (0600) ─write─fsync─▶ rename ─▶ fsync <dir>
//!   AtomicFile (streamed):      the same, written in pieces; removed if dropped uncommitted
//! ```
//!
//! Invariants:
//! - A reader (or a node restarting after a crash) sees the old file or the new one,
//!   never a mix or a truncated file.
//! - Files are created 0600 and directories 0700 (existing directories are tightened).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| FsError {
        step: "writing (not a file path)",
        path: path.to_path_buf(),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(at("creating", &tmp))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(at("writing", &tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(at("renaming into place", path))?;
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(at("syncing directory", &dir))
}

/// A private file written in pieces that appears at its path only once complete:
/// `<dir>/.<name>.tmp` (0600) is written, then [`AtomicFile::commit`] fsyncs it, renames
/// it into place and fsyncs the directory. Dropped without a commit (an error, a
/// cancelled copy), the temporary file is removed: nothing is left behind.
pub struct AtomicFile {
    file: Option<File>,
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`; fails (naming the path) when its directory is missing.
    pub fn create(path: &Path) -> Result<AtomicFile, FsError> {
        let (dir, tmp) = temporary_for(path)?;
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(at("creating", &tmp))?;
        Ok(AtomicFile {
            file: Some(file),
            tmp,
            path: path.to_path_buf(),
            dir,
        })
    }

    /// The temporary file being written.
    pub fn temporary_path(&self) -> &Path {
        &self.tmp
    }

    /// Makes the file appear at its path, complete and durable.
    pub fn commit(mut self) -> Result<(), FsError> {
        let file = self
            .file
            .take()
            .expect("an uncommitted AtomicFile holds its file");
        file.sync_all().map_err(at("writing", &self.tmp))?;
        drop(file);
        fs::rename(&self.tmp, &self.path).map_err(at("renaming into place", &self.path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(at("syncing directory", &self.dir))
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file
            .as_mut()
            .expect("an uncommitted AtomicFile holds its file")
            .write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file
            .as_mut()
            .expect("an uncommitted AtomicFile holds its file")
            .flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// The directory of `path` and the temporary file written before renaming to it.
fn temporary_for(path: &Path) -> Result<(PathBuf, PathBuf), FsError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| FsError {
        step: "writing (not a file path)",
        path: path.to_path_buf(),
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    Ok((dir, tmp))
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
        assert!(err.to_string().contains("/nonexistent-dir/.x.tmp"), "{err}");
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
        assert!(err.to_string().contains("/nonexistent-dir/.x.tmp"), "{err}");
    }
}
