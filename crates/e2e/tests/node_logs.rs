//! Node logs over the API with real polis-node processes and real etcd on 127.x
//! addresses: `polisctl node logs` of a worker and of a member (etcd's forwarded lines
//! included), `-n`, `--runnable`, `-f` seeing a new line, a node certificate refused,
//! and lines that survive a restart.
//!
//! One cluster for the whole file: the phases build on each other. Every node logs 20
//! numbered lines a second from `root.logtest` (a hidden polis-node flag).

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use e2e::{Cluster, TIMEOUT, wait_until};
use serde_json::Value;

/// `node logs ID -o json` (plus `extra`).
fn logs(cluster: &Cluster, id: &str, extra: &[&str]) -> Result<Vec<Value>> {
    let mut args = vec!["node", "logs", id, "-o", "json"];
    args.extend_from_slice(extra);
    let out = cluster.ctl_retry(&args)?;
    out.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
        .collect()
}

/// The number in a "log test line N" text.
fn test_line(line: &Value) -> Option<u64> {
    line["text"]
        .as_str()?
        .strip_prefix("log test line ")?
        .parse()
        .ok()
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

#[test]
fn node_logs_of_workers_and_members_for_the_owner_only() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap_with(tmp.path(), &[], &["--log-test-lines-per-second", "20"])?;
    let first = cluster.first.key_node_id()?;
    let params = cluster.register_params("w1")?;
    let (mut worker, worker_id) = cluster.add_worker("w1", &params)?;

    // A member's lines include etcd's (forwarded, target "etcd") and the supervisor's DNs.
    let member = logs(&cluster, &first, &["-n", "0"])?;
    assert!(
        member.iter().any(|l| l["target"] == "etcd"),
        "no etcd lines"
    );
    assert!(
        member.iter().any(|l| l["runnable"]
            .as_str()
            .unwrap_or("")
            .starts_with("root.role.controlplane")),
        "no control plane lines"
    );

    // -n: exactly the last N; --runnable: only that subtree.
    let five = logs(&cluster, &worker_id, &["-n", "5"])?;
    assert_eq!(five.len(), 5, "{five:?}");
    let seqs: Vec<u64> = five.iter().filter_map(|l| l["sequence"].as_u64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let tests = logs(
        &cluster,
        &worker_id,
        &["-n", "0", "--runnable", "root.logtest"],
    )?;
    assert!(!tests.is_empty());
    assert!(
        tests.iter().all(|l| l["runnable"] == "root.logtest"),
        "{tests:?}"
    );
    assert!(tests.iter().all(|l| test_line(l).is_some()), "{tests:?}");
    let role = logs(
        &cluster,
        &worker_id,
        &["-n", "0", "--runnable", "root.role"],
    )?;
    assert!(!role.is_empty());
    assert!(
        role.iter().all(|l| l["runnable"]
            .as_str()
            .unwrap_or("")
            .starts_with("root.role")),
        "{role:?}"
    );

    // -f: the latest line, then newer ones as they are logged.
    let config = cluster.config.to_str().context("utf-8 path")?;
    let mut cmd = Command::new(e2e::bin("polisctl"));
    cmd.args([
        "--config",
        config,
        "node",
        "logs",
        &worker_id,
        "-f",
        "-n",
        "1",
        "--runnable",
        "root.logtest",
        "-o",
        "json",
    ]);
    let mut follow = e2e::Proc::spawn("polisctl node logs -f", cmd, &tmp.path().join("f.log"))?;
    let start = follow.wait_for_line(TIMEOUT, |l| l.contains("log test line"))?;
    let start = test_line(&serde_json::from_str(&start)?).context("a test line")?;
    follow.wait_for_line(TIMEOUT, |l| {
        serde_json::from_str::<Value>(l)
            .ok()
            .and_then(|v| test_line(&v))
            .is_some_and(|n| n > start + 5)
    })?;
    drop(follow);

    // Only the owner: the worker's own node certificate is refused by the member.
    let creds = rpc::Credentials {
        certificate: std::fs::read(worker.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(worker.root.join("data/node/key.der"))?,
    };
    let ca = std::fs::read(worker.root.join("data/node/ca.der"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let servers = [
        (cluster.first.address, cluster.first.key_node_id()?),
        (worker.address, worker.key_node_id()?),
    ];
    for (endpoint, server_id) in servers {
        let refused = runtime.block_on(async {
            let channel = rpc::connect(
                std::net::SocketAddr::new(endpoint, rpc::NODE_LOGS_PORT),
                &rpc::ServerTrust::ClusterNode {
                    trust: rpc::TrustSlot::new(ca.clone()),
                    node_id: server_id,
                },
                Some(&creds),
            )
            .await?;
            anyhow::Ok(
                proto::api::node_logs_client::NodeLogsClient::new(channel)
                    .node_logs_tail(proto::api::NodeLogsRequest::default())
                    .await,
            )
        })?;
        let status = refused.err().context("a node certificate read node logs")?;
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    }

    // A restart: the lines logged before it are still there (the rotated file).
    let before = now_micros();
    worker.proc().signal(libc::SIGTERM);
    worker.proc().wait_exit(TIMEOUT)?;
    worker.start(&[])?;
    worker.wait_home()?;
    let deadline = Instant::now() + TIMEOUT;
    let after = loop {
        let (ok, out, err) = cluster.ctl(&["node", "logs", &worker_id, "-n", "0", "-o", "json"])?;
        if ok {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "node logs after a restart: {err}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let lines: Vec<Value> = after
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert!(
        lines
            .iter()
            .any(|l| l["time_unix_micros"].as_u64().is_some_and(|t| t < before)),
        "no line from before the restart"
    );
    wait_until("a line of the new run", TIMEOUT, || {
        logs(
            &cluster,
            &worker_id,
            &["-n", "1", "--runnable", "root.logtest"],
        )
        .ok()
        .and_then(|l| l.first().and_then(|v| v["time_unix_micros"].as_u64()))
        .is_some_and(|t| t > before)
    })?;
    let log = worker.root.join("data/log/node.log");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&log)?.permissions().mode() & 0o777, 0o600);
    Ok(())
}
