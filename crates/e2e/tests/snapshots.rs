//! Scheduled snapshots, with real polis-node processes and real etcd on 127.x
//! addresses, one 2-member cluster for the whole file (its nodes started with the
//! hidden `--snapshot-short-intervals`, so the owner may set seconds):
//! the defaults (6 h, keep 5) shown by `cluster config`; the schedule changed live to
//! 2 s / keep 3 — every member then keeps exactly 3 private files in
//! ROOT/data/snapshots and the older ones are pruned; `cluster backups` lists both
//! members' (never a hidden temporary file a crash would leave, nor other files); one of each fetched through the first node's curator (the other's relayed
//! from its own curator), verified by `backup inspect` and naming its member; keep
//! lowered live to 2; a member whose snapshot directory is a regular file shows the
//! failure in `cluster status` and recovers once it is gone; refusals: unknown node,
//! traversal and unknown names (no file left behind), a node certificate instead of
//! the owner's, intervals out of bounds (a second, plain cluster: under a minute is
//! refused by its curator).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, TIMEOUT, endpoints, pem_der, wait_until};
use proto::api;

/// The snapshot files in a member's root (names only, sorted).
fn files(node: &Node) -> BTreeSet<String> {
    std::fs::read_dir(node.root.join("data/snapshots"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| curator::snapshots::SnapshotName::parse(n).is_some())
                .collect()
        })
        .unwrap_or_default()
}

/// `cluster backups -o json` through `endpoint`.
fn listing(cluster: &Cluster, endpoint: &str) -> Result<serde_json::Value> {
    let out = cluster.ctl_retry(&["--endpoints", endpoint, "cluster", "backups", "-o", "json"])?;
    Ok(serde_json::from_str(&out)?)
}

/// `polisctl cluster backup --from-node NODE --name NAME --out OUT` must fail with exit
/// 1, one line containing `what`, and no file at `out`.
fn fetch_refused(cluster: &Cluster, node: &str, name: &str, out: &Path, what: &str) -> Result<()> {
    let out_str = out.to_str().context("utf-8")?;
    let args = [
        "cluster",
        "backup",
        "--from-node",
        node,
        "--name",
        name,
        "--out",
        out_str,
    ];
    let (ok, stdout, err) = cluster.ctl(&args)?;
    if ok || !stdout.is_empty() {
        bail!("fetch of {node}/{name} should fail: {stdout} {err}");
    }
    let line = err.trim_end();
    if line.lines().count() != 1 || !line.contains(what) {
        bail!("fetch of {node}/{name}: expected one line with {what:?}, got {err:?}");
    }
    if out.exists() {
        bail!("a refused fetch left {out_str} behind");
    }
    Ok(())
}

#[test]
fn scheduled_snapshots_are_kept_pruned_listed_fetched_and_watched() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap_with(dir.path(), &[], &["--snapshot-short-intervals"])?;
    let params = cluster.register_params("members")?;
    let (mut w1, id1) = cluster.add_worker("w1", &params)?;
    cluster.ctl_retry(&["node", "add-role", &id1, "ConsensusMember"])?;
    let n0 = &cluster.first;
    let id0 = n0.key_node_id()?;
    cluster.wait_members(&endpoints(&[n0, &w1]), 2, 0)?;
    w1.wait_for_curator()?;
    let members: [(&Node, &str); 2] = [(n0, &id0), (&w1, &id1)];

    // Bounds: polisctl refuses seconds at bootstrap, and out-of-range counts anywhere.
    let refused = Node::new(&dir.path().join("refused"));
    std::fs::create_dir_all(&refused.dir)?;
    let err = refused
        .bootstrap_params_with(&["--snapshot-interval", "2s"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("too short"), "{err}");
    let (ok, _, err) = cluster.ctl(&["cluster", "config", "set", "--snapshot-keep", "0"])?;
    assert!(!ok && err.contains("out of bounds"), "{err}");

    // The defaults, then a live change to 2 s / keep 3.
    let config: serde_json::Value =
        serde_json::from_str(&cluster.ctl_retry(&["cluster", "config", "-o", "json"])?)?;
    assert_eq!(config["snapshot_interval"], "6h", "{config}");
    assert_eq!(config["snapshot_keep"], 5, "{config}");
    let set = cluster.ctl_retry(&[
        "cluster",
        "config",
        "set",
        "--snapshot-interval",
        "2s",
        "--snapshot-keep",
        "3",
        "-o",
        "json",
    ])?;
    let config: serde_json::Value = serde_json::from_str(&set)?;
    assert_eq!(config["snapshot_interval_seconds"], 2, "{config}");
    assert_eq!(config["snapshot_keep"], 3, "{config}");

    // Each member: 3 kept, and the ones seen first pruned while new ones come.
    for (node, id) in members {
        let mut first_seen = BTreeSet::new();
        wait_until(
            &format!("{id}: 3 snapshots kept, older pruned"),
            TIMEOUT * 2,
            || {
                let now = files(node);
                if first_seen.is_empty() {
                    first_seen = now.clone();
                }
                now.len() == 3 && !first_seen.is_empty() && first_seen.is_disjoint(&now)
            },
        )?;
        let snapshots = node.root.join("data/snapshots");
        let mode = std::fs::metadata(&snapshots)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", snapshots.display());
        for name in files(node) {
            let mode = std::fs::metadata(snapshots.join(&name))
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0o600); // pruned meanwhile
            assert_eq!(mode, 0o600, "{name}");
        }
    }

    // What a crash mid-snapshot leaves (a hidden temporary file) and other files are
    // never listed.
    let planted = [
        ".snapshot-0000000000000001-r1.polisbak.x1y2z3.tmp",
        "snapshot-0000000000000001-r1.polisbak.tmp",
        "notes.txt",
    ];
    for name in planted {
        std::fs::write(n0.root.join("data/snapshots").join(name), b"partial")?;
    }
    // Listed through the first node's curator: both members', named, with revisions.
    let listed = listing(&cluster, &n0.address.to_string())?;
    for name in planted {
        assert!(
            !listed.to_string().contains(name),
            "{name} listed: {listed}"
        );
    }
    let rows = listed["snapshots"].as_array().cloned().unwrap_or_default();
    for (_, id) in members {
        let own: Vec<_> = rows.iter().filter(|r| r["node"] == *id).collect();
        assert!(!own.is_empty(), "no snapshots of {id} listed: {listed}");
        for r in own {
            let name = r["name"].as_str().context("name")?;
            let parsed =
                curator::snapshots::SnapshotName::parse(name).context("a snapshot name")?;
            assert_eq!(r["revision"], parsed.revision, "{r}");
            assert!(r["size"].as_u64().unwrap_or(0) > 0, "{r}");
        }
    }
    assert_eq!(listed["unreachable"], serde_json::json!([]), "{listed}");
    let table = cluster.ctl_retry(&["cluster", "backups"])?;
    let header = table.lines().next().unwrap_or_default();
    for column in ["NODE", "NAME", "REVISION", "SIZE", "AGE"] {
        assert!(header.contains(column), "{table}");
    }
    assert!(table.contains(&id0) && table.contains(&id1), "{table}");
    let table = cluster.ctl_retry(&["cluster", "config"])?;
    assert!(table.contains("Snapshot interval:           2s"), "{table}");
    assert!(table.contains("Snapshots kept per member:   3"), "{table}");

    // Fetch the newest of each member through the first node's curator (w1's relayed).
    let out_dir = dir.path().join("fetched");
    std::fs::create_dir(&out_dir)?;
    for (node, id) in members {
        let newest = files(node).into_iter().next_back().context("a snapshot")?;
        let out = out_dir.join(format!("{id}.polisbak"));
        let out_str = out.to_str().context("utf-8")?;
        cluster.ctl_retry(&[
            "--endpoints",
            &n0.address.to_string(),
            "cluster",
            "backup",
            "--from-node",
            id,
            "--name",
            &newest,
            "--out",
            out_str,
        ])?;
        let mode = std::fs::metadata(&out)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let inspected: serde_json::Value = serde_json::from_str(
            &cluster.ctl_retry(&["cluster", "backup", "inspect", out_str, "-o", "json"])?,
        )?;
        assert_eq!(inspected["node_id"], *id, "{inspected}");
        let parsed = curator::snapshots::SnapshotName::parse(&newest).context("name")?;
        assert_eq!(inspected["revision"], parsed.revision, "{inspected}");
        assert_eq!(
            inspected["taken_at_unix_ms"], parsed.taken_at_unix_ms,
            "{inspected}"
        );
        let ca = pem_der(&cluster.config.join("ca.pem"))?;
        assert_eq!(
            inspected["ca_fingerprint"],
            rpc::fingerprint(&ca),
            "{inspected}"
        );
    }

    // Refusals: nothing is written.
    let refused_out = out_dir.join("refused.polisbak");
    let valid_name = files(&w1).into_iter().next_back().context("a snapshot")?;
    fetch_refused(
        &cluster,
        "polis-00000000000000000000000000000000",
        &valid_name,
        &refused_out,
        "not a consensus member",
    )?;
    for bad in [
        "../../n0/root/data/node/key.der",
        "/etc/passwd",
        "snapshot-0000000000000001-r1.polisbak/../../x",
    ] {
        fetch_refused(&cluster, &id1, bad, &refused_out, "not a snapshot name")?;
    }
    fetch_refused(
        &cluster,
        &id1,
        "snapshot-0000000000000001-r1.polisbak",
        &refused_out,
        "no snapshot",
    )?;

    // Not the owner: a member's node certificate may list nothing, and the local call
    // (which it may make) refuses a traversal name.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let ca = pem_der(&cluster.config.join("ca.pem"))?;
    let trust = rpc::ServerTrust::PinnedCa(ca);
    let node_credentials = rpc::Credentials {
        certificate: std::fs::read(w1.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(w1.root.join("data/node/key.der"))?,
    };
    let n0_endpoint = SocketAddr::new(n0.address, rpc::CURATOR_PORT);
    let (list, fetch, local) = runtime.block_on(async {
        let channel = rpc::connect(n0_endpoint, &trust, Some(&node_credentials)).await?;
        let mut backup = api::backup_client::BackupClient::new(channel.clone());
        let list = backup
            .list_snapshots(api::ListSnapshotsRequest {})
            .await
            .err();
        let fetch = backup
            .fetch_snapshot(api::FetchSnapshotRequest {
                node_id: id0.clone(),
                name: valid_name.clone(),
            })
            .await
            .err();
        let local = api::curator_local_client::CuratorLocalClient::new(channel)
            .snapshots_fetch_local(api::SnapshotsFetchLocalRequest {
                name: "../node/key.der".into(),
            })
            .await
            .err();
        anyhow::Ok((list, fetch, local))
    })?;
    assert_eq!(list.map(|s| s.code()), Some(tonic::Code::PermissionDenied));
    assert_eq!(fetch.map(|s| s.code()), Some(tonic::Code::PermissionDenied));
    assert_eq!(local.map(|s| s.code()), Some(tonic::Code::InvalidArgument));

    // Keep lowered live: 2 per member.
    cluster.ctl_retry(&["cluster", "config", "set", "--snapshot-keep", "2"])?;
    for (node, id) in members {
        wait_until(&format!("{id}: 2 snapshots kept"), TIMEOUT, || {
            files(node).len() == 2
        })?;
    }

    // A failing member: its snapshot directory replaced by a regular file. The member
    // may be writing a snapshot into it meanwhile (a removal then finds a new file), or
    // create it again before the file is written: both are tried again.
    let snapshots = w1.root.join("data/snapshots");
    wait_until("the snapshot directory replaced by a file", TIMEOUT, || {
        let _ = std::fs::remove_dir_all(&snapshots);
        std::fs::write(&snapshots, b"not a directory").is_ok()
    })?;
    let all = endpoints(&[n0, &w1]);
    let warned = |status: &serde_json::Value| {
        status["warnings"].as_array().is_some_and(|w| {
            w.iter().any(|w| {
                w.as_str().is_some_and(|w| {
                    w.contains(&id1)
                        && w.contains("scheduled snapshot failed")
                        && w.contains("last success: 20")
                })
            })
        })
    };
    let mut last = serde_json::Value::Null;
    wait_until(
        "the failed snapshot shown in cluster status",
        TIMEOUT,
        || {
            last = cluster.status(&all).map(|s| s.1).unwrap_or_default();
            warned(&last)
        },
    )
    .with_context(|| format!("last status: {last}"))?;
    let (_, table, _) = cluster.ctl(&["--endpoints", &all, "cluster", "status"])?;
    assert!(
        table.contains(&format!("warning: node {id1}: scheduled snapshot failed")),
        "{table}"
    );
    // Only that member warns.
    assert!(
        !last["warnings"]
            .to_string()
            .contains(&format!("node {id0}: scheduled")),
        "{last}"
    );
    std::fs::remove_file(&snapshots)?;
    wait_until(
        "the member snapshots again and the warning goes",
        TIMEOUT,
        || {
            last = cluster.status(&all).map(|s| s.1).unwrap_or_default();
            !warned(&last) && !files(&w1).is_empty()
        },
    )
    .with_context(|| format!("last status: {last}"))?;

    // Demoted (an operator may demote), the former member keeps no snapshot: each holds
    // every key of the cluster, which roles reserve for admins.
    let w1_snapshots = w1.root.join("data/snapshots");
    assert!(w1_snapshots.exists());
    cluster.ctl_retry(&["node", "remove-role", &id1, "ConsensusMember"])?;
    wait_until(
        "the demoted member's snapshots are removed",
        TIMEOUT,
        || !w1_snapshots.exists(),
    )?;
    assert!(
        w1.proc()
            .output()
            .contains("its scheduled snapshots removed")
    );
    drop(w1);
    drop(cluster);

    // Without the test flag a curator refuses intervals under a minute, and takes one.
    let plain = Cluster::bootstrap(&dir.path().join("plain"))?;
    let (ok, _, err) = plain.ctl(&["cluster", "config", "set", "--snapshot-interval", "2s"])?;
    assert!(!ok && err.contains("too short"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let set = plain.ctl_retry(&[
        "cluster",
        "config",
        "set",
        "--snapshot-interval",
        "1m",
        "-o",
        "json",
    ])?;
    let config: serde_json::Value = serde_json::from_str(&set)?;
    assert_eq!(config["snapshot_interval"], "1m", "{config}");
    assert_eq!(config["snapshot_keep"], 5, "{config}");
    Ok(())
}
