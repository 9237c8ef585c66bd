//! The curator's API over real mTLS against a real polis-node: the README flow with
//! polisctl, takeownership on a terminal, health and restarts. (The authorization
//! matrix is `authz_matrix.rs`.)

use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{Node, TIMEOUT, polisctl};

fn ctl(node: &Node, config: &str, args: &[&str]) -> Result<(bool, String, String)> {
    let config = node.dir.join(config);
    let endpoint = node.address.to_string();
    let mut all = vec![
        "--config",
        config.to_str().unwrap(),
        "--endpoints",
        endpoint.as_str(),
    ];
    all.extend_from_slice(args);
    let (status, out, err) = polisctl(&all)?;
    Ok((status.success(), out, err))
}

/// polisctl until it succeeds (the curator may still be electing itself).
fn ctl_ok(node: &Node, config: &str, args: &[&str]) -> Result<String> {
    let mut last = String::new();
    for _ in 0..100 {
        let (ok, out, err) = ctl(node, config, args)?;
        if ok {
            return Ok(out);
        }
        last = err;
        if !last.contains("unavailable") && !last.contains("cannot reach") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("polisctl {args:?} failed: {last}")
}

#[test]
fn readme_flow_takeownership_and_manage_nodes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::bootstrapped(dir.path())?;

    // Before ownership: a clear refusal, not a crash.
    let (ok, _, err) = ctl(&node, "config", &["node", "list"])?;
    assert!(
        !ok && err.contains("run `polisctl takeownership` first"),
        "{err}"
    );
    // Without a terminal and without --accept-ca it refuses, showing the fingerprint.
    let (ok, _, err) = ctl(&node, "config", &["takeownership"])?;
    assert!(
        !ok && err.contains("no terminal") && err.contains("SHA256:"),
        "{err}"
    );
    // A wrong fingerprint is refused.
    let (ok, _, err) = ctl(
        &node,
        "config",
        &["takeownership", "--ca-fingerprint", "00ff"],
    )?;
    assert!(!ok && err.contains("CA fingerprint mismatch"), "{err}");

    // A config directory that served another cluster before keeps that cluster's CRL:
    // it is dropped when the new CA is pinned, not left to break every later command.
    let foreign = pki::Ca::generate("another cluster", Duration::from_secs(3600))?;
    let crl = pem::encode(&pem::Pem::new("X509 CRL", foreign.crl(&[], 7)?));
    std::fs::write(dir.path().join("config/crl.pem"), crl)?;
    let (ok, out, err) = ctl(&node, "config", &["takeownership", "--accept-ca"])?;
    assert!(ok && out.contains("Took ownership"), "{out}{err}");
    assert!(err.contains("another cluster's CRL"), "{err}");
    // Harmless to repeat; and the right fingerprint pins without asking.
    ctl_ok(&node, "config", &["takeownership"])?;
    for file in ["owner.pem", "ca.pem", "owner-key.pem"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("config").join(file))?
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{file}");
    }

    let nodes: serde_json::Value =
        serde_json::from_str(&ctl_ok(&node, "config", &["node", "list", "-o", "json"])?)?;
    let nodes = nodes.as_array().context("an array")?;
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n["state"], "UP");
    assert_eq!(n["roles"], serde_json::json!(["ConsensusMember"]));
    assert_eq!(n["address"], node.address.to_string());
    assert!(n["health"] == "HEALTHY" || n["health"] == "UNKNOWN", "{n}");
    let id = n["id"].as_str().context("id")?.to_string();

    let table = ctl_ok(&node, "config", &["node", "list"])?;
    assert!(
        table.starts_with("ID") && table.contains(&id) && table.contains("ConsensusMember"),
        "{table}"
    );
    let yaml = ctl_ok(&node, "config", &["node", "list", "-o", "yaml"])?;
    assert!(
        yaml.contains(&format!("- address: {}\n", node.address)),
        "{yaml}"
    );

    let info: serde_json::Value = serde_json::from_str(&ctl_ok(
        &node,
        "config",
        &["cluster", "info", "-o", "json"],
    )?)?;
    let sealed_ca = std::fs::read(node.root.join("data/node/ca.der"))?;
    assert_eq!(info["ca_fingerprint"], rpc::fingerprint(&sealed_ca));

    let described: serde_json::Value = serde_json::from_str(&ctl_ok(
        &node,
        "config",
        &["node", "label", &id, "zone=a", "rack=r1", "-o", "json"],
    )?)?;
    assert_eq!(
        described["labels"],
        serde_json::json!({"zone": "a", "rack": "r1"})
    );
    let described: serde_json::Value = serde_json::from_str(&ctl_ok(
        &node,
        "config",
        &["node", "label", &id, "rack-", "-o", "json"],
    )?)?;
    assert_eq!(described["labels"], serde_json::json!({"zone": "a"}));
    let filtered: serde_json::Value = serde_json::from_str(&ctl_ok(
        &node,
        "config",
        &["node", "list", "--label", "zone=b", "-o", "json"],
    )?)?;
    assert_eq!(filtered, serde_json::json!([]));
    let (ok, _, err) = ctl(&node, "config", &["node", "label", &id, "bad key=1"])?;
    assert!(!ok && err.contains("invalid label key"), "{err}");
    let described = ctl_ok(&node, "config", &["node", "describe", &id])?;
    assert!(described.contains("zone=a"), "{described}");

    // Errors: unknown node, unreachable endpoint, a different owner key.
    let (ok, _, err) = ctl(
        &node,
        "config",
        &["node", "describe", "polis-00000000000000000000000000000000"],
    )?;
    assert!(!ok && err.contains("does not exist"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A malformed ID is refused by polisctl itself, naming it (no cluster needed).
    for args in [
        &["node", "describe", "polis-XYZ"][..],
        &["node", "label", "polis-XYZ", "zone=b"][..],
    ] {
        let (ok, _, err) = ctl(&node, "no-such-config", args)?;
        assert!(
            !ok && err.contains("not a node ID") && err.contains("polis-XYZ"),
            "{err}"
        );
    }
    let (status, _, err) = polisctl(&[
        "--config",
        dir.path().join("config").to_str().unwrap(),
        "--endpoints",
        &e2e::unique_loopback().to_string(),
        "node",
        "list",
    ])?;
    assert!(!status.success() && err.contains("cannot reach"), "{err}");

    let (status, _, err) = polisctl(&[
        "--config",
        dir.path().join("intruder").to_str().unwrap(),
        "params",
        "bootstrap",
        "--out",
        dir.path().join("other-params.pb").to_str().unwrap(),
    ])?;
    assert!(status.success(), "{err}");
    let (ok, _, err) = ctl(&node, "intruder", &["takeownership", "--accept-ca"])?;
    assert!(!ok && err.contains("not this cluster's owner key"), "{err}");
    assert!(!dir.path().join("intruder/owner.pem").exists());
    Ok(())
}

/// Runs polisctl takeownership on a pseudo-terminal (util-linux `script`), typing `answer`.
fn takeownership_on_terminal(node: &Node, answer: &str) -> Result<(bool, String)> {
    use std::io::Write;
    let command = format!(
        "{} --config {} --endpoints {} takeownership",
        e2e::bin("polisctl").display(),
        node.dir.join("config").display(),
        node.address
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running script(1) from util-linux")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(answer.as_bytes())?;
    let out = child.wait_with_output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

#[test]
fn takeownership_asks_on_a_terminal() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::bootstrapped(dir.path())?;
    let ca = std::fs::read(node.root.join("data/node/ca.der"))?;
    let fingerprint = rpc::fingerprint(&ca);

    // The curator may still be starting or electing itself: retry those answers only.
    let settled = |answer: &str| -> Result<(bool, String)> {
        let mut last = (false, String::new());
        for _ in 0..50 {
            last = takeownership_on_terminal(&node, answer)?;
            if !(last.1.contains("cannot reach") || last.1.contains("unavailable")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(last)
    };
    let (ok, text) = settled("n\n")?;
    assert!(
        !ok && text.contains(&fingerprint) && text.contains("not accepted"),
        "{text}"
    );
    assert!(!dir.path().join("config/ca.pem").exists());

    let (ok, text) = settled("y\n")?;
    assert!(
        ok && text.contains(&fingerprint) && text.contains("Took ownership"),
        "{text}"
    );
    assert!(dir.path().join("config/owner.pem").exists());
    Ok(())
}

#[test]
fn completions_are_generated() -> Result<()> {
    for shell in ["bash", "zsh", "fish"] {
        let (status, out, err) = polisctl(&["completion", shell])?;
        assert!(status.success(), "{shell}: {err}");
        assert!(
            out.contains("takeownership") && out.contains("polisctl"),
            "{shell}"
        );
    }
    let (status, _, err) = polisctl(&["completion", "tcsh"])?;
    assert!(!status.success() && err.contains("tcsh"), "{err}");
    Ok(())
}

fn node_health(node: &Node) -> Result<String> {
    let nodes: serde_json::Value =
        serde_json::from_str(&ctl_ok(node, "config", &["node", "list", "-o", "json"])?)?;
    Ok(nodes[0]["health"].as_str().unwrap_or_default().to_string())
}

#[test]
fn heartbeats_make_the_node_healthy_and_the_curator_survives_kill_9() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    // A lease far longer than polisctl's retries: waiting it out would fail the test.
    node.extra_args = vec!["--curator-lease-ttl".into(), "60".into()];
    let params = node.bootstrap_params()?;
    node.start(&["--params", params.to_str().unwrap()])?;
    node.wait_home()?;
    ctl_ok(&node, "config", &["takeownership", "--accept-ca"])?;
    e2e::wait_until("node HEALTHY", TIMEOUT, || {
        node_health(&node).is_ok_and(|h| h == "HEALTHY")
    })?;

    node.proc().signal(libc::SIGKILL);
    node.proc().wait_exit(TIMEOUT)?;
    node.start(&[])?;
    node.wait_home()?;
    // The restarted curator removes its previous lifetime's election key instead of
    // waiting for that lease to expire, and serves the owner again.
    let restarted = std::time::Instant::now();
    ctl_ok(&node, "config", &["node", "list"])?;
    println!("owner served {:?} after Home", restarted.elapsed());
    e2e::wait_until("node HEALTHY again", TIMEOUT, || {
        node_health(&node).is_ok_and(|h| h == "HEALTHY")
    })?;
    Ok(())
}

#[test]
fn curator_serves_again_after_etcd_crashes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    ctl_ok(&node, "config", &["takeownership", "--accept-ca"])?;
    let etcd = node.etcd_pid()?;
    // SAFETY: kill(2) on the etcd child of our own polis-node.
    unsafe { libc::kill(etcd, libc::SIGKILL) };
    let proc = node.proc();
    e2e::wait_until("etcd ready again", TIMEOUT, || {
        proc.output().matches("etcd is ready").count() >= 2
    })?;
    let listed: serde_json::Value =
        serde_json::from_str(&ctl_ok(&node, "config", &["node", "list", "-o", "json"])?)?;
    assert_eq!(listed[0]["state"], "UP");
    ctl_ok(
        &node,
        "config",
        &[
            "node",
            "label",
            listed[0]["id"].as_str().unwrap(),
            "after=crash",
        ],
    )?;
    Ok(())
}
