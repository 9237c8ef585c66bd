//! `polis-node --config FILE` end to end: a one-node cluster bootstrapped and restarted
//! from its configuration file alone, and a file with a mistake refused before anything
//! is written.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use e2e::{Node, Proc, bin};
use prost::Message;

/// `polis-node --config FILE`, nothing else on the command line.
fn start_from_file(node: &mut Node, file: &Path, log: &str) -> Result<()> {
    let mut command = Command::new(bin("polis-node"));
    command.arg("--config").arg(file);
    node.proc = Some(Proc::spawn("polis-node", command, &node.dir.join(log))?);
    Ok(())
}

#[test]
fn a_node_bootstraps_and_restarts_from_its_configuration_file_alone() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    let params = node.bootstrap_params()?;
    let file = dir.path().join("node.toml");
    std::fs::write(
        &file,
        format!(
            "# A first node.\nroot = {:?}\naddress = \"{}\"\nparams = {:?}\n\
             log-format = \"json\"\netcd-heartbeat-ms = 50\netcd-election-timeout-ms = 500\n",
            node.root.to_str().context("utf-8 path")?,
            node.address,
            params.to_str().context("utf-8 path")?,
        ),
    )?;

    start_from_file(&mut node, &file, "node-1.log")?;
    node.wait_home()?;
    let bytes = std::fs::read(node.root.join("esp/sealed_configuration.pb"))?;
    let sealed = proto::config::SealedConfiguration::decode(bytes.as_slice())?;
    let ids = node.etcd_ids()?;
    assert_eq!(ids, (sealed.etcd_cluster_id, sealed.etcd_member_id));
    let output = node.proc().output();
    assert!(
        output.contains("flags read from the configuration file too"),
        "the start names its file:\n{output}"
    );

    // Every later start: the same file (its parameters no longer read), the same cluster.
    node.stop_cleanly()?;
    start_from_file(&mut node, &file, "node-2.log")?;
    node.wait_home()?;
    assert_eq!(node.etcd_ids()?, ids, "etcd cluster or member ID changed");
    Ok(())
}

#[test]
fn a_file_with_an_unknown_key_is_refused_before_anything_is_written() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("root");
    let file = dir.path().join("node.toml");
    std::fs::write(
        &file,
        format!(
            "root = {:?}\nadress = \"127.0.0.1\"\n",
            root.to_str().unwrap()
        ),
    )?;
    let output = Command::new(bin("polis-node"))
        .arg("--config")
        .arg(&file)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let expected = format!(
        "{}:2: unknown key \"adress\"; the keys are: root, address",
        file.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(!root.exists(), "nothing is written on a refusal");

    let missing = dir.path().join("absent.toml");
    let output = Command::new(bin("polis-node"))
        .arg("--config")
        .arg(&missing)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let expected = format!("reading the node configuration from {}", missing.display());
    assert!(stderr.contains(&expected), "{stderr}");
    Ok(())
}
