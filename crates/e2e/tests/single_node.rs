//! A one-node cluster, end to end: real polis-node processes running real etcd.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{Node, TIMEOUT, process_alive, wait_until};
use prost::Message;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn sealed(node: &Node) -> proto::config::SealedConfiguration {
    let bytes = std::fs::read(node.root.join("esp/sealed_configuration.pb")).unwrap();
    proto::config::SealedConfiguration::decode(bytes.as_slice()).unwrap()
}

#[test]
fn bootstrap_reaches_home_with_state_in_etcd() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::bootstrapped(dir.path())?;
    let sealed = sealed(&node);
    identity::validate_node_id(&sealed.node_id)?;

    // The node record, the initial owner and the cluster configuration are in etcd.
    let record = node
        .etcd_get(&format!("namespaced:curator/nodes/{}", sealed.node_id))?
        .expect("node record exists");
    let record = proto::state::Node::decode(record.as_slice())?;
    assert_eq!(record.id, sealed.node_id);
    assert_eq!(record.state, proto::state::NodeState::Up as i32);
    assert!(record.roles.unwrap().consensus_member.is_some());
    assert_eq!(record.address, node.address.to_string());
    let keys = node.etcdctl(&["get", "--prefix", "--keys-only", "namespaced:"])?;
    for expected in [
        "namespaced:curator/global/initial_owner",
        "namespaced:curator/cluster/configuration",
        "namespaced:curator/cluster-pki/ca/cert",
        "namespaced:curator/cluster-pki/ca/crl",
        "namespaced:etcd-pki/ca/cert",
        "namespaced:etcd-pki/ca/crl",
    ] {
        assert!(
            keys.lines().any(|k| k == expected),
            "{expected} missing in:\n{keys}"
        );
    }
    assert!(keys.contains(&format!(
        "namespaced:curator/cluster-pki/issued/node-{}",
        sealed.node_id
    )));
    assert!(keys.contains(&format!(
        "namespaced:etcd-pki/issued/peer-{}",
        sealed.node_id
    )));
    let (cluster_id, member_id) = node.etcd_ids()?;
    assert_eq!(
        (cluster_id, member_id),
        (sealed.etcd_cluster_id, sealed.etcd_member_id)
    );

    // Permissions: private directories, secret files 0600.
    for d in [
        "",
        "esp",
        "data",
        "data/node",
        "data/etcd/peer",
        "ephemeral",
        "ephemeral/consensus",
    ] {
        assert_eq!(mode(&node.root.join(d)), 0o700, "directory {d}");
    }
    for f in [
        "data/node/key.der",
        "data/etcd/peer/key.pem",
        "esp/sealed_configuration.pb",
    ] {
        assert_eq!(mode(&node.root.join(f)), 0o600, "file {f}");
    }
    assert_eq!(mode(&dir.path().join("config/owner-key.pem")), 0o600);
    assert_eq!(mode(&dir.path().join("config")), 0o700);
    Ok(())
}

#[test]
fn kill_9_and_restart_is_the_same_cluster_with_data() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    let before = sealed(&node);
    let ids = node.etcd_ids()?;
    node.etcdctl(&["put", "operator/marker", "survives"])?;
    let etcd_pid = node.etcd_pid()?;

    node.proc().signal(libc::SIGKILL);
    node.proc().wait_exit(TIMEOUT)?;
    // etcd must not outlive polis-node.
    wait_until("etcd to die with polis-node", TIMEOUT, || {
        !process_alive(etcd_pid)
    })?;

    node.start(&[])?; // no --params: the sealed configuration decides
    node.wait_home()?;
    assert_eq!(node.etcd_ids()?, ids, "etcd cluster or member ID changed");
    let after = sealed(&node);
    assert_eq!(after, before, "sealed configuration changed");
    assert_eq!(
        node.etcdctl(&["get", "--print-value-only", "operator/marker"])?
            .trim(),
        "survives"
    );
    let ca = node.etcd_get("namespaced:curator/cluster-pki/ca/cert")?;
    assert_eq!(
        ca.as_deref(),
        Some(before.cluster_ca_certificate.as_slice())
    );
    Ok(())
}

#[test]
fn repeated_kill_9_after_home_comes_back_each_time() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    let ids = node.etcd_ids()?;
    for _ in 0..3 {
        node.proc().signal(libc::SIGKILL);
        node.proc().wait_exit(TIMEOUT)?;
        node.start(&[])?;
        node.wait_home()?;
    }
    assert_eq!(node.etcd_ids()?, ids);
    Ok(())
}

/// When to kill the first start of a bootstrap.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// polis-node SIGKILLs itself right after the named step (`POLIS_CRASH_AFTER`).
    After(&'static str),
    /// The test sends SIGKILL this long after the start, wherever bootstrap is then.
    At(Duration),
}

/// The etcd cluster ID a run logged when its etcd became ready, if it did.
fn logged_cluster_id(output: &str) -> Option<u64> {
    output.lines().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        if v["fields"]["message"] != "etcd is ready" {
            return None;
        }
        u64::from_str_radix(v["fields"]["cluster_id"].as_str()?, 16).ok()
    })
}

#[test]
fn kill_9_at_any_moment_of_bootstrap_resumes_as_the_same_cluster() -> Result<()> {
    // Restarted with the same parameters, an interrupted bootstrap comes back as the
    // cluster it was becoming: same node key, same etcd cluster, the CAs it stored.
    let kills = [
        Kill::At(Duration::from_millis(60)),
        Kill::After("node-key"),
        Kill::After("peer-files"),
        Kill::At(Duration::from_millis(250)),
        Kill::After("etcd-ready"),
        Kill::After("cluster-pki"),
        Kill::After("node-certificate"),
        Kill::After("records"),
        Kill::After("sealed"),
    ];
    let mut resumed = 0;
    for kill in kills {
        let dir = tempfile::tempdir()?;
        let mut node = Node::new(dir.path());
        let params = node.bootstrap_params()?;
        let params = params.to_str().unwrap().to_string();
        let first = match kill {
            Kill::After(step) => {
                node.start_with_env(&["--params", &params], &[("POLIS_CRASH_AFTER", step)])?
            }
            Kill::At(after) => {
                let proc = node.start(&["--params", &params])?;
                // The moment of the kill is the test's input, not a wait for something.
                std::thread::sleep(after);
                proc.signal(libc::SIGKILL);
                proc
            }
        };
        let status = first.wait_exit(TIMEOUT)?;
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "{kill:?}: {}",
            first.output()
        );
        let cluster_before = logged_cluster_id(&first.output());
        let key_path = node.root.join("data/node/key.der");
        let key_before = std::fs::read(&key_path).ok();
        let ca_before = std::fs::read(node.root.join("data/node/ca.der")).ok();

        node.start(&["--params", &params])?;
        node.wait_home()
            .with_context(|| format!("{kill:?}: the restart did not reach Home"))?;
        let after = sealed(&node);
        if let Some(key) = key_before {
            assert_eq!(
                std::fs::read(&key_path)?,
                key,
                "{kill:?}: the node key changed"
            );
        }
        assert_eq!(node.key_node_id()?, after.node_id, "{kill:?}");
        assert_eq!(
            node.etcd_ids()?,
            (after.etcd_cluster_id, after.etcd_member_id),
            "{kill:?}"
        );
        if let Some(id) = cluster_before {
            assert_eq!(after.etcd_cluster_id, id, "{kill:?}: a new etcd cluster");
        }
        if let Some(ca) = ca_before {
            assert_eq!(
                after.cluster_ca_certificate, ca,
                "{kill:?}: a new cluster CA"
            );
        }
        let stored_ca = node.etcd_get("namespaced:curator/cluster-pki/ca/cert")?;
        assert_eq!(
            stored_ca.as_ref(),
            Some(&after.cluster_ca_certificate),
            "{kill:?}"
        );
        // The etcd peer files are those of the stored peer CA.
        let peer_ca = std::fs::read_to_string(node.root.join("data/etcd/peer/ca.pem"))?;
        let stored_peer_ca = node.etcd_get("namespaced:etcd-pki/ca/cert")?;
        assert_eq!(
            Some(pem::parse(peer_ca)?.into_contents()),
            stored_peer_ca,
            "{kill:?}: peer files of another peer CA"
        );
        assert!(
            !node.root.join("data/node/bootstrap.pb").exists(),
            "{kill:?}"
        );
        resumed += 1;
    }
    assert_eq!(resumed, kills.len());
    Ok(())
}

#[test]
fn an_interrupted_bootstrap_resumes_only_with_its_own_parameters_and_state() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let crashed = |name: &str, step: &str| -> Result<(Node, String)> {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub)?;
        let mut node = Node::new(&sub);
        let params = node.bootstrap_params()?.to_str().unwrap().to_string();
        let proc = node.start_with_env(&["--params", &params], &[("POLIS_CRASH_AFTER", step)])?;
        proc.wait_exit(TIMEOUT)?;
        Ok((node, params))
    };
    // Other parameters (another owner): refused, naming why.
    let (mut a, _) = crashed("a", "records")?;
    let (_, other_params) = crashed("b", "node-key")?;
    let out = refused(&mut a, &["--params", &other_params])?;
    assert!(
        out.contains("second cluster") && out.contains("same ones"),
        "{out}"
    );

    // The same parameters over another node's etcd data: refused once etcd shows it.
    let (mut c, c_params) = crashed("c", "etcd-ready")?;
    let (d, _) = crashed("d", "records")?;
    let c_data = c.root.join("data/etcd/data");
    std::fs::remove_dir_all(&c_data)?;
    copy_dir(&d.root.join("data/etcd/data"), &c_data)?;
    let out = refused(&mut c, &["--params", &c_params])?;
    assert!(
        out.contains("second cluster") && out.contains("belongs to members"),
        "{out}"
    );

    // A node key with no bootstrap record (e.g. a registration in progress): refused.
    let (mut e, e_params) = crashed("e", "node-key")?;
    std::fs::remove_file(e.root.join("data/node/bootstrap.pb"))?;
    let out = refused(&mut e, &["--params", &e_params])?;
    assert!(out.contains("second cluster"), "{out}");
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[test]
fn sigterm_stops_etcd_cleanly_and_exits_zero() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    let etcd_pid = node.etcd_pid()?;
    node.proc().signal(libc::SIGTERM);
    let status = node.proc().wait_exit(TIMEOUT)?;
    assert!(status.success(), "polis-node exited with {status}");
    assert!(
        !process_alive(etcd_pid),
        "etcd still running after polis-node exited"
    );
    assert!(
        node.proc().output().contains("etcd stopped"),
        "no clean etcd stop logged"
    );
    Ok(())
}

#[test]
fn etcd_crash_is_restarted_by_the_supervisor() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    let first = node.etcd_pid()?;
    // SAFETY: kill(2) on the etcd child of our own polis-node.
    unsafe { libc::kill(first, libc::SIGKILL) };
    let proc = node.proc();
    proc.wait_for_line(TIMEOUT, |l| {
        l.contains("runnable failed") && l.contains("etcd exited")
    })?;
    let count_ready = |p: &e2e::Proc| p.output().matches("etcd is ready").count();
    wait_until("etcd ready again", TIMEOUT, || count_ready(proc) >= 2)?;
    node.etcdctl(&["put", "after", "restart"])?;
    let second = node.etcd_pid()?;
    assert_ne!(second, first, "etcd was not restarted");
    assert!(e2e::process_alive(second));
    Ok(())
}

/// Runs polis-node expecting a refusal; returns its stderr/log output.
fn refused(node: &mut Node, extra: &[&str]) -> Result<String> {
    let proc = node.start(extra)?;
    let status = proc.wait_exit(TIMEOUT)?;
    assert!(
        !status.success(),
        "polis-node should have refused; output:\n{}",
        proc.output()
    );
    Ok(proc.output())
}

#[test]
fn refuses_state_without_sealed_configuration() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    node.proc().signal(libc::SIGKILL);
    node.proc().wait_exit(TIMEOUT)?;
    // Simulate a crash before the sealed configuration was written.
    std::fs::remove_file(node.root.join("esp/sealed_configuration.pb"))?;
    let key_before = std::fs::read(node.root.join("data/node/key.der"))?;
    let params = dir.path().join("params.pb");
    let out = refused(&mut node, &["--params", params.to_str().unwrap()])?;
    assert!(out.contains("second cluster"), "{out}");
    assert!(out.contains("data/etcd/data"), "{out}");
    assert_eq!(
        std::fs::read(node.root.join("data/node/key.der"))?,
        key_before
    );
    assert!(node.root.join("data/etcd/data/member").is_dir());
    Ok(())
}

#[test]
fn refuses_corrupt_parameters_naming_the_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    let params = dir.path().join("bad-params.pb");
    std::fs::write(&params, b"\xff\xff\xff garbage")?;
    let out = refused(&mut node, &["--params", params.to_str().unwrap()])?;
    assert!(
        out.contains("bad-params.pb") && out.contains("corrupt"),
        "{out}"
    );
    assert!(!node.root.join("data/node/key.der").exists());
    Ok(())
}

#[test]
fn refuses_missing_parameters_naming_the_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    let out = refused(&mut node, &["--params", "/nonexistent/params.pb"])?;
    assert!(out.contains("/nonexistent/params.pb"), "{out}");
    let out = refused(&mut node, &[])?;
    assert!(
        out.contains("nothing to do") && out.contains("polisctl params bootstrap"),
        "{out}"
    );
    Ok(())
}

#[test]
fn refuses_corrupt_sealed_configuration_without_overwriting() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    node.proc().signal(libc::SIGTERM);
    node.proc().wait_exit(TIMEOUT)?;
    let sealed_path = node.root.join("esp/sealed_configuration.pb");
    std::fs::write(&sealed_path, b"\x0a\xff\xff")?;
    let out = refused(&mut node, &[])?;
    assert!(
        out.contains("sealed_configuration.pb") && out.contains("corrupt"),
        "{out}"
    );
    assert_eq!(std::fs::read(&sealed_path)?, b"\x0a\xff\xff");
    Ok(())
}

#[test]
fn refuses_address_not_on_this_machine() -> Result<()> {
    // The address exists only inside a namespace this test creates, not here.
    let ns = e2e::NetNs::with_address("10.213.77.1")?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    let params = node.bootstrap_params()?;
    node.address = "10.213.77.1".parse()?;
    let out = refused(&mut node, &["--params", params.to_str().unwrap()])?;
    assert!(
        out.contains("10.213.77.1 is not present on this machine"),
        "{out}"
    );
    assert!(
        !node.root.join("data").exists(),
        "refusal wrote to the root"
    );
    drop(ns);
    Ok(())
}

#[test]
fn refuses_missing_etcd_binary_saying_how_to_install() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    let params = node.bootstrap_params()?;
    let out = refused(
        &mut node,
        &[
            "--params",
            params.to_str().unwrap(),
            "--etcd-binary",
            "/nonexistent/etcd",
        ],
    )?;
    assert!(
        out.contains("/nonexistent/etcd") && out.contains("apt-get install -y etcd-server"),
        "{out}"
    );
    Ok(())
}

#[test]
fn refuses_restart_on_a_different_address() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    node.proc().signal(libc::SIGTERM);
    node.proc().wait_exit(TIMEOUT)?;
    let original = node.address;
    node.address = e2e::unique_loopback();
    let out = refused(&mut node, &[])?;
    assert!(out.contains(&format!("with address {original}")), "{out}");
    Ok(())
}

#[test]
fn sigusr1_dumps_the_supervisor_tree() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    node.proc().signal(libc::SIGUSR1);
    let line = node
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("supervisor tree"))?;
    assert!(line.contains("root.role.controlplane.consensus"), "{line}");
    assert!(line.contains("HEALTHY"), "{line}");
    Ok(())
}

#[test]
fn relative_root_bootstraps_and_restarts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::new(dir.path());
    let params = node.bootstrap_params()?;
    let start = |extra: &[&str]| -> Result<e2e::Proc> {
        let mut cmd = std::process::Command::new(e2e::bin("polis-node"));
        cmd.current_dir(dir.path())
            .args([
                "--root",
                "root",
                "--address",
                &node.address.to_string(),
                "--log-format=json",
            ])
            .args(extra);
        e2e::Proc::spawn("polis-node", cmd, &dir.path().join("relative.log"))
    };
    let mut first = start(&["--params", params.to_str().unwrap()])?;
    first.wait_for_line(TIMEOUT, e2e::is_home_line)?;
    first.signal(libc::SIGTERM);
    assert!(first.wait_exit(TIMEOUT)?.success());
    let mut second = start(&[])?;
    second.wait_for_line(TIMEOUT, e2e::is_home_line)?;
    assert!(node.root.join("esp/sealed_configuration.pb").exists());
    Ok(())
}

#[test]
fn refuses_a_node_key_that_is_not_the_sealed_nodes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    node.proc().signal(libc::SIGTERM);
    node.proc().wait_exit(TIMEOUT)?;
    let key_path = node.root.join("data/node/key.der");
    let other = identity::NodeKey::generate()?;
    std::fs::write(&key_path, other.pkcs8_der())?;
    let marker = node.root.join("ephemeral/left-alone");
    std::fs::write(&marker, b"x")?;
    let out = refused(&mut node, &[])?;
    assert!(
        out.contains(&other.node_id()) && out.contains("sealed configuration is for"),
        "{out}"
    );
    assert!(marker.exists(), "a refusal must not touch the root");
    std::fs::write(&key_path, b"garbage")?;
    let out = refused(&mut node, &[])?;
    assert!(out.contains("key.der is corrupt"), "{out}");
    Ok(())
}

#[test]
fn invalid_labels_are_refused_by_polisctl_and_by_the_node() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config");
    let out = dir.path().join("params.pb");
    let (status, _, err) = e2e::polisctl(&[
        "--config",
        config.to_str().unwrap(),
        "params",
        "bootstrap",
        "--out",
        out.to_str().unwrap(),
        "--label",
        "bad key=x",
    ])?;
    assert!(
        !status.success() && err.contains("invalid label key"),
        "{err}"
    );
    assert!(!out.exists());

    // Parameters written by something else are checked by the node.
    let owner = identity::NodeKey::generate()?;
    let params = proto::config::NodeParameters {
        cluster: Some(proto::config::node_parameters::Cluster::Bootstrap(
            proto::config::ClusterBootstrap {
                owner_public_key: owner.public_key().to_vec(),
                initial_cluster_configuration: None,
                labels: [("-bad".to_string(), "x".to_string())].into(),
            },
        )),
    };
    std::fs::write(&out, params.encode_to_vec())?;
    let mut node = Node::new(dir.path());
    let log = refused(&mut node, &["--params", out.to_str().unwrap()])?;
    assert!(log.contains("params.pb hold invalid labels"), "{log}");
    assert!(!node.root.join("data/node/key.der").exists());
    Ok(())
}
