//! The polisctl wrapper: runs the CLI binary and hands back what it printed.
//!
//! May not know about nodes or clusters (those pass their own flags, see
//! `crate::cluster`).

use std::process::{Command, ExitStatus};

use anyhow::{Context, Result};

use crate::process::bin;

/// Runs `polisctl` with `args`, returning (status, stdout, stderr).
pub fn polisctl(args: &[&str]) -> Result<(ExitStatus, String, String)> {
    let out = Command::new(bin("polisctl"))
        .args(args)
        .output()
        .context("running polisctl")?;
    Ok((
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// A copy of the polisctl configuration directory `from` at `to` (made 0700, as polisctl
/// makes it): its files, less those named in `except` (e.g. `epoch`).
pub fn copy_config(from: &std::path::Path, to: &std::path::Path, except: &[&str]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        if entry.file_type()?.is_file() && !except.iter().any(|e| name == *e) {
            std::fs::copy(entry.path(), to.join(&name))?;
        }
    }
    Ok(())
}
