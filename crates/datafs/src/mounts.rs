//! mount(2)/umount2(2) and "is this path a mount point" from `/proc/self/mountinfo`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Mounts `source` on `target` (`fstype` None for a bind mount with `MS_BIND` in `flags`).
pub fn mount(source: &Path, target: &Path, fstype: Option<&str>, flags: u64) -> io::Result<()> {
    let src = cstr(source)?;
    let dst = cstr(target)?;
    let fs = fstype.map(|t| CString::new(t).expect("no NUL in a file system type"));
    // SAFETY: all pointers are NUL-terminated strings alive for the call, or null.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            fs.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
            flags as libc::c_ulong,
            std::ptr::null(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Unmounts `target`.
pub fn unmount(target: &Path) -> io::Result<()> {
    let dst = cstr(target)?;
    // SAFETY: `dst` is a NUL-terminated string alive for the call.
    if unsafe { libc::umount2(dst.as_ptr(), 0) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Whether `path` is a mount point in this process' mount namespace.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let path = match path.canonicalize() {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mount_points(&info).any(|m| m == path))
}

/// The mount points listed in a mountinfo text (field 5, octal escapes undone).
fn mount_points(info: &str) -> impl Iterator<Item = PathBuf> + '_ {
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(field))))
}

fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // Three octal digits name one byte, so the first is at most 3: `\400` and up
        // are no escape the kernel writes (and would overflow a byte), kept as text.
        if b[i] == b'\\'
            && i + 3 < b.len()
            && (b'0'..=b'3').contains(&b[i + 1])
            && b[i + 2..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_mount_points_are_unescaped() {
        let info = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 35 98:0 /x /srv rw - ext4 /dev/loop0 rw\n";
        let found: Vec<_> = mount_points(info).collect();
        assert_eq!(found, [PathBuf::from("/mnt/a b"), PathBuf::from("/srv")]);
    }

    /// Found by `properties::any_field_unescapes`: `\400` overflowed a byte (a panic
    /// in debug builds, a wrong byte in release ones).
    #[test]
    fn an_octal_escape_past_a_byte_is_kept_as_text() {
        assert_eq!(unescape("\\400"), b"\\400");
        assert_eq!(unescape("\\777x"), b"\\777x");
        assert_eq!(unescape("\\377"), [0xff]);
    }
}

/// Properties over arbitrary mountinfo text (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_field_unescapes(field in prop_oneof![any::<String>(), "([a-z/ ]|\\\\[0-9]{0,4}){0,12}"]) {
            let _ = unescape(&field);
            let _ = mount_points(&field).count();
        }

        #[test]
        fn escaped_bytes_come_back(path in prop::collection::vec(any::<u8>(), 0..40)) {
            // The kernel's escaping of space, tab, newline and backslash in a path.
            let mut escaped = String::new();
            for &b in &path {
                match b {
                    b' ' | b'\t' | b'\n' | b'\\' => escaped.push_str(&format!("\\{b:03o}")),
                    _ => escaped.push(char::from(b)),
                }
            }
            let latin1: Vec<u8> = unescape(&escaped);
            let want: Vec<u8> = path
                .iter()
                .flat_map(|&b| char::from(b).to_string().into_bytes())
                .collect();
            prop_assert_eq!(latin1, want);
        }
    }
}
