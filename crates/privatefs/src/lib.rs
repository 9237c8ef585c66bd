//! Private files: how Polis writes anything it keeps on disk.
//!
//! Node roots (`polis-node`) and operator config directories (`polisctl`) hold keys,
//! certificates and the files that decide what a node is. Both write them through here:
//!
//! ```text
//!   write_atomic(path, bytes):  <dir>/.<name>.tmp (0600) ─write─fsync─▶ rename ─▶ fsync <dir>
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
}
