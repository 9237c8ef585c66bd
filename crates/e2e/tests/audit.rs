//! The audit log with real polis-node processes and real etcd on 127.x addresses: a
//! worker's registration, approval, labels and decommission appear with the right
//! caller, target and result; a refused call appears as refused; `cluster audit -f`
//! sees a new entry as it is written; `--node` filters; and a small configured bound
//! drops the oldest entries of the caller holding most of the log (here the owner).
//!
//! One cluster for the whole file: the phases build on each other.

use std::process::Command;

use anyhow::{Context, Result};
use e2e::{Cluster, TIMEOUT, wait_until};
use serde_json::Value;

/// The bound the cluster is bootstrapped with.
const BOUND: usize = 25;

/// `cluster audit -o json` (plus `extra`): one entry per line, oldest first.
fn audit(cluster: &Cluster, extra: &[&str]) -> Result<Vec<Value>> {
    let mut args = vec!["cluster", "audit", "-o", "json"];
    args.extend_from_slice(extra);
    let out = cluster.ctl_retry(&args)?;
    out.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
        .collect()
}

fn method(entry: &Value) -> &str {
    entry["method"]
        .as_str()
        .and_then(|m| m.rsplit('/').next())
        .unwrap_or("")
}

/// The last entry of `method` on `target`.
fn last<'a>(entries: &'a [Value], name: &str, target: &str) -> Option<&'a Value> {
    entries
        .iter()
        .rev()
        .find(|e| method(e) == name && e["target"] == target)
}

#[test]
fn audit_log_records_changes_refusals_and_stays_bounded() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap_with(
        tmp.path(),
        &["--audit-max-entries", &BOUND.to_string()],
        &[],
    )?;
    let first_id = cluster.first.key_node_id()?;

    // A worker registers (self-signed), the owner approves it, it commits.
    let params = cluster.register_params("w1")?;
    let (worker_node, worker) = cluster.add_worker("w1", &params)?;
    let entries = audit(&cluster, &[])?;
    let approve = last(&entries, "ApproveNode", &worker).context("no ApproveNode entry")?;
    assert_eq!(approve["identity_kind"], "owner", "{approve}");
    assert!(
        approve["identity"]
            .as_str()
            .unwrap_or("")
            .starts_with("serial "),
        "{approve}"
    );
    assert_eq!(approve["code"], 0, "{approve}");
    assert!(
        approve["source_address"]
            .as_str()
            .unwrap_or("")
            .starts_with("127."),
        "{approve}"
    );
    assert_eq!(approve["curator"], first_id.as_str(), "{approve}");
    for name in ["RegisterNode", "CommitNode"] {
        let e = last(&entries, name, &worker).with_context(|| format!("no {name} entry"))?;
        assert_eq!(e["identity_kind"], "self-signed", "{e}");
        assert_eq!(e["identity"], worker.as_str(), "{e}");
        assert_eq!(e["code"], 0, "{e}");
    }
    // Taking ownership escrowed an owner certificate; reads are not recorded.
    assert!(entries.iter().any(|e| method(e) == "Escrow"));
    assert!(
        !entries
            .iter()
            .any(|e| ["ListNodes", "GetRegisterTicket", "Heartbeat"].contains(&method(e))),
        "reads recorded: {entries:?}"
    );
    // Keys sort by time: the stream is in key order.
    let keys: Vec<&str> = entries.iter().filter_map(|e| e["key"].as_str()).collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");

    // `-f` prints the stored entries, then a new one as it is written.
    let config = cluster.config.to_str().context("utf-8 path")?;
    let mut follow_cmd = Command::new(e2e::bin("polisctl"));
    follow_cmd.args(["--config", config, "cluster", "audit", "-f", "-o", "json"]);
    let mut follow = e2e::Proc::spawn(
        "polisctl cluster audit -f",
        follow_cmd,
        &tmp.path().join("audit-follow.log"),
    )?;
    follow.wait_for_line(TIMEOUT, |l| l.contains("ApproveNode"))?;
    cluster.ctl_retry(&["node", "label", &worker, "team=audit"])?;
    let line = follow.wait_for_line(TIMEOUT, |l| l.contains("UpdateNodeLabels"))?;
    let labelled: Value = serde_json::from_str(&line)?;
    assert_eq!(labelled["target"], worker.as_str(), "{labelled}");
    assert_eq!(labelled["code"], 0, "{labelled}");
    drop(follow);

    // A refused call is recorded as refused: an UP node cannot be deleted.
    let (ok, _, err) = cluster.ctl(&["node", "delete", &worker])?;
    assert!(!ok, "deleting an UP node succeeded");
    let entries = audit(&cluster, &[])?;
    let refused = last(&entries, "DeleteNode", &worker).context("no DeleteNode entry")?;
    assert_ne!(refused["code"], 0, "{refused}");
    assert!(
        !refused["message"].as_str().unwrap_or("").is_empty(),
        "{refused} {err}"
    );

    // A node certificate refused a Manage call is recorded as refused, with its caller.
    let worker_creds = rpc::Credentials {
        certificate: std::fs::read(worker_node.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(worker_node.root.join("data/node/key.der"))?,
    };
    let ca = std::fs::read(worker_node.root.join("data/node/ca.der"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let denied = runtime.block_on(async {
        let channel = rpc::connect(
            std::net::SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT),
            &rpc::ServerTrust::PinnedCa(ca),
            Some(&worker_creds),
        )
        .await?;
        anyhow::Ok(
            proto::api::management_client::ManagementClient::new(channel)
                .approve_node(proto::api::ApproveNodeRequest {
                    id: first_id.clone(),
                })
                .await,
        )
    })?;
    assert_eq!(
        denied.expect_err("a node approved a node").code(),
        tonic::Code::PermissionDenied
    );
    // Refused calls of anyone but the owner are counted per caller, RPC and code: the
    // entry comes when its window (10 s) closes, with the count.
    let mut refused = Value::Null;
    wait_until("the refused ApproveNode to be recorded", TIMEOUT, || {
        let entries = audit(&cluster, &[]).unwrap_or_default();
        match entries
            .iter()
            .rev()
            .find(|e| method(e) == "ApproveNode" && e["identity"] == worker.as_str())
        {
            Some(e) => {
                refused = e.clone();
                true
            }
            None => false,
        }
    })?;
    assert_eq!(refused["identity_kind"], "node", "{refused}");
    assert_eq!(refused["code_name"], "PermissionDenied", "{refused}");
    assert_eq!(refused["count"], 1, "{refused}");

    // --node: only entries naming the worker; --since 1d: all of them.
    let only = audit(&cluster, &["--node", &worker])?;
    assert!(!only.is_empty());
    assert!(
        only.iter()
            .all(|e| e["target"] == worker.as_str() || e["identity"] == worker.as_str()),
        "{only:?}"
    );
    assert!(last(&only, "UpdateNodeLabels", &worker).is_some());
    let (ok, _, err) = cluster.ctl(&["cluster", "audit", "--node", "not-a-node"])?;
    assert!(!ok && err.contains("--node"), "{err}");
    let (ok, _, err) = cluster.ctl(&["cluster", "audit", "--since", "5w"])?;
    assert!(!ok && err.contains("unit"), "{err}");

    // Decommissioning the worker.
    cluster.ctl_retry(&["node", "decommission", &worker])?;
    let entries = audit(&cluster, &["--since", "1d"])?;
    let decommission =
        last(&entries, "DecommissionNode", &worker).context("no DecommissionNode entry")?;
    assert_eq!(decommission["code"], 0, "{decommission}");
    assert_eq!(decommission["identity_kind"], "owner", "{decommission}");

    // The bound: more changes than it keeps. The owner holds most of the log, so its
    // own oldest entries go; the others' (the worker's registration, its refused call)
    // stay: a caller only pushes out entries of callers holding more than it does.
    let owners_oldest = entries
        .iter()
        .find(|e| e["identity_kind"] == "owner")
        .context("no owner entry")?["key"]
        .clone();
    for i in 0..BOUND + 5 {
        cluster.ctl_retry(&["node", "label", &first_id, &format!("round={i}")])?;
    }
    let mut entries = Vec::new();
    wait_until("the audit log to shrink to its bound", TIMEOUT, || {
        entries = audit(&cluster, &[]).unwrap_or_default();
        !entries.is_empty() && entries.len() <= BOUND
    })?;
    assert!(
        entries.iter().all(|e| e["key"] != owners_oldest),
        "{entries:?}"
    );
    assert!(last(&entries, "ApproveNode", &worker).is_none());
    for name in ["RegisterNode", "CommitNode"] {
        assert!(
            last(&entries, name, &worker).is_some(),
            "{name}: {entries:?}"
        );
    }
    assert!(
        entries
            .iter()
            .any(|e| method(e) == "ApproveNode" && e["identity"] == worker.as_str()),
        "{entries:?}"
    );
    let newest = entries.last().context("no entries")?;
    assert_eq!(method(newest), "UpdateNodeLabels", "{newest}");
    assert_eq!(newest["target"], first_id.as_str(), "{newest}");
    Ok(())
}
