//! kubectl as polis-node runs it: a credential, bounded calls (pure plumbing, a leaf).

use std::time::Duration;

use crate::config::Layout;

/// kubectl with polis-node's own credential, `args`; stdin `input` when given.
pub async fn kubectl(
    binaries: &std::path::Path,
    layout: &Layout,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, String> {
    kubectl_as(
        binaries,
        &layout.path("polis-admin.kubeconfig"),
        args,
        input,
    )
    .await
}

/// kubectl with the credential of `kubeconfig`, `args` (each call bounded: 5 s per
/// request, 30 s in all); stdin `input` when given; its output, or its error output.
pub async fn kubectl_as(
    binaries: &std::path::Path,
    kubeconfig: &std::path::Path,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, String> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(binaries.join("kubectl"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=5s")
        .args(args)
        .stdin(if input.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| format!("running kubectl: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .await
            .map_err(|e| format!("kubectl stdin: {e}"))?;
    }
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .map_err(|_| "kubectl took over 30 s".to_string())?
        .map_err(|e| format!("kubectl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}
