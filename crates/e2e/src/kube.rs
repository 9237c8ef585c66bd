//! Upstream Kubernetes in the tests and benchmarks: the folders of the programs the
//! scripts build (passed in environment variables), kubectl, and kubectl's way in
//! through `polisctl kubernetes proxy`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::{Cluster, Proc, TIMEOUT};

/// The folder `var` names, holding `program`; the error names the `script` that builds it.
pub fn program_folder(var: &str, program: &str, script: &str) -> Result<PathBuf> {
    let dir = PathBuf::from(
        std::env::var_os(var)
            .with_context(|| format!("{var} is not set: run {script} and export its folder"))?,
    );
    ensure!(
        dir.join(program).exists(),
        "{var}={} holds no {program}",
        dir.display()
    );
    Ok(dir)
}

/// kubectl of `binaries` with `kubeconfig`: (success, stdout, stderr).
pub fn kubectl(
    binaries: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> Result<(bool, String, String)> {
    let out = Command::new(binaries.join("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=5s")
        .args(args)
        .output()
        .context("running kubectl")?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `polisctl kubernetes proxy` for `cluster` on a fresh loopback address (its log in
/// `dir`), forwarding; and a kubeconfig in `dir` that goes through it.
pub fn kubernetes_proxy(cluster: &Cluster, dir: &Path) -> Result<(Proc, PathBuf)> {
    let proxy_address = SocketAddr::new(crate::unique_loopback(), 16443);
    let mut proxy_cmd = Command::new(crate::bin("polisctl"));
    proxy_cmd.args([
        "--config",
        cluster.config.to_str().context("utf-8")?,
        "kubernetes",
        "proxy",
        "--listen",
        &proxy_address.to_string(),
    ]);
    let mut proxy = Proc::spawn(
        "polisctl kubernetes proxy",
        proxy_cmd,
        &dir.join("proxy.log"),
    )?;
    proxy.wait_for_line(TIMEOUT, |l| l.contains("forwarding"))?;
    let via = dir.join("via.kubeconfig");
    kubernetes_credentials(cluster, &via, Some(proxy_address))?;
    Ok((proxy, via))
}

/// The owner's kubeconfig from `polisctl kubernetes credentials` into `out` (through
/// the proxy at `via` when given).
pub fn kubernetes_credentials(
    cluster: &Cluster,
    out: &Path,
    via: Option<SocketAddr>,
) -> Result<()> {
    let via = via.map(|v| v.to_string());
    let mut args = vec![
        "kubernetes",
        "credentials",
        "--out",
        out.to_str().context("utf-8")?,
    ];
    if let Some(via) = &via {
        args.extend(["--via", via.as_str()]);
    }
    cluster.ctl_retry(&args)?;
    Ok(())
}
