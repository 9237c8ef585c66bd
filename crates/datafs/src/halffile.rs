//! The local half on disk (in the node's ESP): created once, 0600, written atomically;
//! read back with a refusal naming the file for anything but a well-formed private half.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::{Error, io_at};
use crate::key::Half;

/// Creates a new random half at `path` (0600, atomic). Refuses to replace one: a local
/// half replaced is a data device lost.
pub fn create(path: &Path) -> Result<Half, Error> {
    match fs::symlink_metadata(path) {
        Ok(_) => {
            return Err(Error::LocalHalfExists {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_at("checking", path)(e)),
    }
    let half = Half::generate().map_err(|e| Error::LocalHalf {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    privatefs::write_atomic(path, &half.encode())?;
    Ok(half)
}

/// Reads the half at `path`: missing, readable by others, or malformed → refused by name.
pub fn load(path: &Path) -> Result<Half, Error> {
    let bad = |reason: String| Error::LocalHalf {
        path: path.to_path_buf(),
        reason,
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::LocalHalfMissing {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(io_at("reading", path)(e)),
    };
    if !meta.file_type().is_file() {
        return Err(bad("not a regular file".into()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "mode {mode:04o} lets others read it (must be 0600); it may have leaked"
        )));
    }
    let mut bytes = fs::read(path).map_err(io_at("reading", path))?;
    let half = Half::decode(&bytes).map_err(|e| bad(e.to_string()));
    bytes.fill(0);
    half
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("local-half");
        let half = create(&path).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(load(&path).unwrap(), half);
        assert!(matches!(create(&path), Err(Error::LocalHalfExists { .. })));
        assert_eq!(
            load(&path).unwrap(),
            half,
            "a refused create changed the half"
        );
    }

    #[test]
    fn missing_corrupted_or_exposed_halves_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("local-half");
        let e = load(&path).unwrap_err();
        assert!(matches!(e, Error::LocalHalfMissing { .. }), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");

        create(&path).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        bytes[10] ^= 0x40;
        privatefs::write_atomic(&path, &bytes).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("corrupted") && e.contains("local-half"), "{e}");

        privatefs::write_atomic(&path, b"short").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("wrong length 5"), "{e}");

        fs::remove_file(&path).unwrap();
        create(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("0644") && e.contains("0600"), "{e}");
    }
}
