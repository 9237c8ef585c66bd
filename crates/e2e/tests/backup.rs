//! Backups, with real polis-node processes and real etcd on 127.x addresses: a backup
//! taken through a follower curator of a 3-member cluster is a private file whose header
//! names that follower, the revision and the cluster CA; the snapshot inside is a real
//! etcd snapshot (`etcdctl snapshot restore` takes it, and a bare etcd started on the
//! restored data holds the node record with the label written before the backup, not
//! the one written after); workers and anonymous callers are refused; `inspect` refuses
//! truncated, corrupted and foreign files naming them; `--out` into a missing directory
//! leaves nothing behind; with two of three members killed, the survivor still gives a
//! backup of its own state, marked as read without a quorum.
//!
//! One cluster for the whole file: the cases build on the one backup.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use e2e::{BareEtcd, Cluster, Node, TIMEOUT, endpoints, pem_der};
use proto::api;

/// The node whose curator leads, asked through `asked`.
fn curator_leader(runtime: &tokio::runtime::Runtime, asked: &Node) -> Result<SocketAddr> {
    let channel = runtime.block_on(rpc::connect(
        SocketAddr::new(asked.address, rpc::CURATOR_PORT),
        &rpc::ServerTrust::FirstUse,
        None,
    ))?;
    let answer = runtime.block_on(
        api::curator_local_client::CuratorLocalClient::new(channel)
            .get_current_leader(api::GetCurrentLeaderRequest {}),
    )?;
    Ok(answer.into_inner().leader_endpoint.parse()?)
}

/// Calls TakeBackup at `node` with `credentials` (None: no client certificate) and
/// reads the whole stream; the status of the first failure.
async fn take_backup(
    node: &Node,
    trust: &rpc::ServerTrust,
    credentials: Option<&rpc::Credentials>,
) -> std::result::Result<u64, tonic::Status> {
    let endpoint = SocketAddr::new(node.address, rpc::CURATOR_PORT);
    let channel = rpc::connect(endpoint, trust, credentials)
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut stream = api::backup_client::BackupClient::new(channel)
        .take_backup(api::TakeBackupRequest {})
        .await?
        .into_inner();
    let mut bytes = 0;
    while let Some(chunk) = stream.message().await? {
        if let Some(api::backup_chunk::Part::Data(d)) = chunk.part {
            bytes += d.len() as u64;
        }
    }
    Ok(bytes)
}

/// `polisctl cluster backup inspect FILE` must fail with exit 1 and one line naming the
/// file and `what`.
fn refused(cluster: &Cluster, file: &Path, what: &str) -> Result<()> {
    let path = file.to_str().context("utf-8 path")?;
    let (status, out, err) = e2e::polisctl(&[
        "--config",
        cluster.config.to_str().context("utf-8")?,
        "cluster",
        "backup",
        "inspect",
        path,
    ])?;
    if status.code() != Some(1) || !out.is_empty() {
        bail!("inspect of {path} should fail with exit 1: {status:?} {out} {err}");
    }
    let line = err.trim_end();
    if line.lines().count() != 1 || !line.contains(path) || !line.contains(what) {
        bail!("inspect of {path}: expected one line naming it and {what:?}, got {err:?}");
    }
    Ok(())
}

/// The labels of node `id`'s record in an etcd reachable through `client`.
async fn labels_in(
    client: &mut etcd_client::Client,
    id: &str,
) -> Result<std::collections::HashMap<String, String>> {
    use prost::Message;
    let key = format!(
        "{}{}",
        consensus::client::namespace_prefix("curator"),
        curator::layout::node_key(id)
    );
    let answer = client.get(key.clone(), None).await?;
    let kv = answer.kvs().first().with_context(|| format!("no {key}"))?;
    Ok(proto::state::Node::decode(kv.value())?.labels)
}

#[test]
fn backup_through_a_follower_is_a_restorable_private_etcd_snapshot() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("nodes")?;
    let (mut w1, id1) = cluster.add_worker("w1", &params)?;
    let (mut w2, id2) = cluster.add_worker("w2", &params)?;
    let (worker, _) = cluster.add_worker("worker", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let n0 = &cluster.first;
    let members = [n0, &w1, &w2];
    cluster.wait_members(&endpoints(&members), 3, 0)?;
    let id0 = n0.key_node_id()?;
    cluster.ctl_retry(&["node", "label", &id0, "backup-test=before"])?;

    // Taken through a follower curator: answered from its own etcd member.
    let leader = curator_leader(&runtime, n0)?;
    let follower = members
        .into_iter()
        .find(|n| n.address != leader.ip())
        .context("a follower")?;
    let follower_id = follower.key_node_id()?;
    let label_revision: i64 = {
        let json: serde_json::Value = serde_json::from_str(&follower.etcdctl(&[
            "get",
            &format!("namespaced:curator/nodes/{id0}"),
            "-w",
            "json",
        ])?)?;
        json["kvs"][0]["mod_revision"]
            .as_i64()
            .context("mod_revision")?
    };
    let out_dir = dir.path().join("backups");
    std::fs::create_dir(&out_dir)?;
    let file = out_dir.join("cluster.polisbackup");
    let file_str = file.to_str().context("utf-8")?;
    let saved = cluster.ctl_retry(&[
        "--endpoints",
        &follower.address.to_string(),
        "cluster",
        "backup",
        "--out",
        file_str,
        "-o",
        "json",
    ])?;
    let saved: serde_json::Value = serde_json::from_str(&saved)?;
    assert_eq!(saved["node_id"], follower_id.as_str(), "{saved}");
    let mode = std::fs::metadata(&file)?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the backup holds the CA key: 0600");
    let leftovers: Vec<_> = std::fs::read_dir(&out_dir)?.collect();
    assert_eq!(leftovers.len(), 1, "only the backup, no temporary file");
    cluster.ctl_retry(&["node", "label", &id0, "backup-test=after"])?;

    // inspect verifies it offline and shows where it came from.
    let (ok, out, err) = cluster.ctl(&["cluster", "backup", "inspect", file_str, "-o", "json"])?;
    assert!(ok, "inspect: {err}");
    let inspected: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(inspected["verified"], true);
    assert_eq!(inspected["node_id"], follower_id.as_str());
    let ca = pem_der(&cluster.config.join("ca.pem"))?;
    assert_eq!(inspected["ca_fingerprint"], rpc::fingerprint(&ca).as_str());
    assert_eq!(inspected["quorum_read"], true);
    let revision = inspected["revision"].as_i64().context("revision")?;
    assert!(
        revision >= label_revision,
        "backup revision {revision} precedes the label write at {label_revision}"
    );
    let (ok, table, _) = cluster.ctl(&["cluster", "backup", "inspect", file_str])?;
    assert!(
        ok && table.contains(&follower_id) && table.contains("Verified"),
        "{table}"
    );

    // The snapshot inside is a real etcd snapshot.
    let snapshot = dir.path().join("snapshot.db");
    {
        let mut reader = std::fs::File::open(&file)?;
        let parsed = backup::open(&mut reader)?;
        let mut out = std::fs::File::create(&snapshot)?;
        backup::copy_snapshot(&mut reader, &parsed, &mut out)?;
    }
    let status = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&snapshot)
        .output()?;
    assert!(status.status.success(), "{status:?}");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    assert!(status["revision"].as_i64().context("revision")? >= revision);
    let restored = dir.path().join("restored");
    std::fs::create_dir(&restored)?;
    let address = e2e::unique_loopback();
    let peer = format!("https://{address}:{}", consensus::config::PEER_PORT);
    let restore = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("snapshot")
        .arg("restore")
        .arg(&snapshot)
        .arg(format!("--data-dir={}", restored.join("data").display()))
        .arg("--name=restored")
        .arg(format!("--initial-cluster=restored={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .output()?;
    assert!(restore.status.success(), "restore: {restore:?}");
    let etcd = BareEtcd::spawn(&restored, address, consensus::RaftTiming::default())?;
    let labels = runtime.block_on(async {
        let mut client = etcd.ready_client(TIMEOUT).await?;
        labels_in(&mut client, &id0).await
    })?;
    assert_eq!(
        labels.get("backup-test").map(String::as_str),
        Some("before"),
        "the restored etcd holds the state of the backup: {labels:?}"
    );
    drop(etcd);

    // Owners only: a worker's node certificate and an anonymous caller are refused.
    let trust = rpc::ServerTrust::PinnedCa(ca.clone());
    let worker_credentials = rpc::Credentials {
        certificate: std::fs::read(worker.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(worker.root.join("data/node/key.der"))?,
    };
    for (who, credentials) in [("worker", Some(&worker_credentials)), ("anonymous", None)] {
        let answer = runtime.block_on(take_backup(follower, &trust, credentials));
        assert_eq!(
            answer.as_ref().map_err(|s| s.code()),
            Err(tonic::Code::PermissionDenied),
            "{who}: {answer:?}"
        );
    }

    // inspect refuses what is not a whole, intact Polis backup, naming the file.
    let bytes = std::fs::read(&file)?;
    let truncated = dir.path().join("truncated.polisbackup");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2])?;
    refused(&cluster, &truncated, "truncated")?;
    let flipped = dir.path().join("flipped.polisbackup");
    let mut bad = bytes.clone();
    let middle = inspected["snapshot_offset"].as_u64().context("offset")? as usize + 5000;
    bad[middle] ^= 0x04;
    std::fs::write(&flipped, &bad)?;
    refused(&cluster, &flipped, "hash mismatch")?;
    refused(&cluster, &snapshot, "not a Polis backup")?;
    refused(
        &cluster,
        &dir.path().join("missing.polisbackup"),
        "No such file",
    )?;

    // --out into a missing directory: a clean failure, nothing created.
    let missing = dir.path().join("no-such-dir/cluster.polisbackup");
    let (ok, _, err) = cluster.ctl(&[
        "cluster",
        "backup",
        "--out",
        missing.to_str().context("utf-8")?,
    ])?;
    assert!(!ok && err.trim_end().lines().count() == 1, "{err}");
    assert!(err.contains("no-such-dir"), "{err}");
    assert!(!dir.path().join("no-such-dir").exists());

    // Without a quorum (two of three members killed), the survivor's curator still
    // gives a backup of its own member's state, saying so.
    cluster.wait_members(&endpoints(&[n0, &w1, &w2]), 3, 0)?;
    for member in [&mut w1, &mut w2] {
        member.proc().signal(libc::SIGKILL);
        member.proc().wait_exit(TIMEOUT)?;
    }
    let alone = dir.path().join("backups/alone.polisbackup");
    let alone_str = alone.to_str().context("utf-8")?;
    let n0 = &cluster.first;
    let saved = cluster.ctl_retry(&[
        "--endpoints",
        &n0.address.to_string(),
        "cluster",
        "backup",
        "--out",
        alone_str,
        "-o",
        "json",
    ])?;
    let saved: serde_json::Value = serde_json::from_str(&saved)?;
    assert_eq!(saved["quorum_read"], false, "{saved}");
    assert_eq!(saved["node_id"], id0.as_str());
    let (ok, out, err) = cluster.ctl(&["cluster", "backup", "inspect", alone_str, "-o", "json"])?;
    assert!(ok, "{err}");
    let inspected: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(inspected["quorum_read"], false);
    assert!(inspected["revision"].as_i64().context("revision")? > revision);
    // And it lists the snapshots a recovery could start from (its own; the two members
    // it cannot reach named as such), as an operator does before `recover`.
    let listed = cluster.ctl_retry(&[
        "--endpoints",
        &n0.address.to_string(),
        "cluster",
        "backups",
        "-o",
        "json",
    ])?;
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    let unreachable = listed["unreachable"].as_array().context("unreachable")?;
    assert_eq!(unreachable.len(), 2, "{listed}");
    // A second backup, now that n0's member knows it has no leader: answered without
    // asking the quorum first. Before: 5 s, the revision's quorum read timing out.
    let again = dir.path().join("backups/alone-again.polisbackup");
    let started = std::time::Instant::now();
    cluster.ctl_retry(&[
        "--endpoints",
        &n0.address.to_string(),
        "cluster",
        "backup",
        "--out",
        again.to_str().context("utf-8")?,
    ])?;
    let took = started.elapsed();
    println!("second quorum-less backup took {took:?}");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    Ok(())
}
