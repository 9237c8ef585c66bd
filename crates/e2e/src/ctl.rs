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
