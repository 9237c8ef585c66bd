//! `polis-node restore` from a backup file, with real polis-node processes and real
//! etcd: a one-member cluster and a worker; a label written before a backup taken with
//! `polisctl cluster backup`, another after it; every node stopped and the member's root
//! deleted (the worker's kept); each refusal first (a non-empty root, a truncated
//! backup, a flipped byte, a file that is no backup: exit 1, one line naming the file or
//! root, the root unchanged or absent); then `restore` into a new root on the former
//! member's address: it serves, the owner's polisctl config still works (same CA, same
//! owner), the label from before the backup is there and the later one is not, the
//! worker comes back UP and HEALTHY by itself, and the restored node starts again
//! normally (`polis-node --root --address`).
//!
//! The CRL across a restore: polisctl and a worker took CRLs issued after the backup;
//! the restored cluster's CRL replaces them at once (its number is past theirs), and a
//! revocation after the restore reaches polisctl, which then refuses the revoked
//! certificate.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Impostor, Node, Proc, TIMEOUT, bin, pem_der, wait_until};

/// Fast heartbeats (the same on every node), so that the worker's return shows quickly.
const NODE_ARGS: [&str; 2] = ["--heartbeat-period-ms=300", "--heartbeat-timeout-ms=1500"];

/// The `polis-node restore` command line.
fn restore_command(root: &Path, address: &str, backup: &Path) -> Command {
    let mut cmd = Command::new(bin("polis-node"));
    cmd.arg("restore")
        .arg("--root")
        .arg(root)
        .arg("--address")
        .arg(address)
        .arg("--backup")
        .arg(backup)
        .arg("--log-format=json")
        .args(NODE_ARGS);
    cmd
}

/// Every path under `root` (empty when absent), with sizes.
fn tree(root: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut found = Vec::new();
    if !root.exists() {
        return Ok(found);
    }
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                dirs.push(entry.path());
            }
            found.push((entry.path(), meta.len()));
        }
    }
    found.sort();
    Ok(found)
}

/// `restore` must exit 1 with a `polis-node:` line naming `names` and `why`, and leave
/// `root` as it was.
fn refused(
    dir: &Path,
    root: &Path,
    address: &str,
    backup: &Path,
    names: &Path,
    why: &str,
) -> Result<()> {
    let before = tree(root)?;
    let existed = root.exists();
    let mut proc = Proc::spawn(
        "polis-node restore (refused)",
        restore_command(root, address, backup),
        &dir.join("restore-refused.log"),
    )?;
    let status = proc.wait_exit(TIMEOUT)?;
    let output = proc.output();
    assert_eq!(status.code(), Some(1), "restore must exit 1: {output}");
    let line = output
        .lines()
        .find(|l| l.starts_with("polis-node: "))
        .with_context(|| format!("no error line in: {output}"))?;
    let named = names.to_str().context("utf-8")?;
    assert!(
        line.contains(named) && line.contains(why),
        "expected {named:?} and {why:?} in {line:?}"
    );
    assert_eq!(
        root.exists(),
        existed,
        "restore refused but created/removed the root"
    );
    assert_eq!(
        tree(root)?,
        before,
        "restore refused but changed {}",
        root.display()
    );
    println!("refused as expected: {line}");
    Ok(())
}

fn labels_of(cluster: &Cluster, id: &str) -> Result<serde_json::Value> {
    let node = cluster
        .node(id)?
        .with_context(|| format!("node {id} not listed"))?;
    Ok(node["labels"].clone())
}

#[test]
fn restore_from_a_backup_file_brings_the_cluster_back_on_a_new_root() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap_with(dir.path(), &[], &NODE_ARGS)?;
    let params = cluster.register_params("nodes")?;
    let (mut worker, worker_id) = cluster.add_worker("worker", &params)?;
    let (mut former, former_id) = cluster.add_worker("former", &params)?;
    cluster.ctl_retry(&["node", "add-role", &former_id, "ConsensusMember"])?;
    let member_id = cluster.first.key_node_id()?;
    let both = e2e::endpoints(&[&cluster.first, &former]);
    cluster.wait_members(&both, 2, 0)?;

    cluster.ctl_retry(&["node", "label", &worker_id, "before=yes"])?;
    let file = dir.path().join("cluster.polisbackup");
    let file_str = file.to_str().context("utf-8")?;
    cluster.ctl_retry(&["cluster", "backup", "--out", file_str])?;
    cluster.ctl_retry(&["node", "label", &worker_id, "after=yes"])?;

    // While the cluster lives, a restore at a new address is refused: both members
    // answer on their etcd peer ports.
    let elsewhere = e2e::unique_loopback().to_string();
    refused(
        dir.path(),
        &dir.path().join("second-cluster-root"),
        &elsewhere,
        &file,
        &file,
        "2 of the backup's 2 other consensus members still answer",
    )?;
    // A drill beside it is not: its epoch is a drill's, and no client of one line takes
    // the other's answers.
    let drill_dir = dir.path().join("drill");
    std::fs::create_dir_all(&drill_dir)?;
    let mut drill = Node::new(&drill_dir);
    let mut drill_command = restore_command(&drill.root, &drill.address.to_string(), &file);
    drill_command.arg("--drill");
    drill.proc = Some(Proc::spawn(
        "polis-node restore --drill",
        drill_command,
        &drill_dir.join("restore.log"),
    )?);
    drill.wait_home()?;
    let drill_endpoint = drill.address.to_string();
    let drill_id = drill.key_node_id()?;
    // A config of the drill's own (the owner's, without the epoch it has seen) works
    // with the drill once the drill's curator leads, then refuses the live cluster.
    let drill_config = dir.path().join("drill-config");
    e2e::copy_config(&cluster.config, &drill_config, &["epoch"])?;
    let drill_config_str = drill_config.to_str().context("utf-8")?;
    let ctl_drill = |endpoints: &str| {
        e2e::polisctl(&[
            "--config",
            drill_config_str,
            "--endpoints",
            endpoints,
            "node",
            "list",
            "-o",
            "json",
        ])
    };
    wait_until(
        "the drill's own curator answers its config",
        TIMEOUT,
        || {
            // The epoch of whichever curator answered first is kept: start again until the
            // answer is the drill's (its own record listed).
            let _ = std::fs::remove_file(drill_config.join("epoch"));
            ctl_drill(&drill_endpoint)
                .is_ok_and(|(status, out, _)| status.success() && out.contains(&drill_id))
        },
    )?;
    let live = e2e::endpoints(&[&cluster.first, &former]);
    let (status, _, err) = ctl_drill(&live)?;
    assert!(
        !status.success() && err.contains("DRILL"),
        "the drill's config must refuse the live cluster: {err}"
    );
    // The owner's config, which has seen the live cluster, refuses the drill, and
    // still reaches the live cluster.
    let (ok, out, err) = cluster.ctl(&["--endpoints", &drill_endpoint, "node", "list"])?;
    assert!(
        !ok && err.contains("DRILL"),
        "the owner's config must refuse the drill: {err} {out}"
    );
    cluster.ctl_retry(&["node", "list"])?;
    drill.proc().signal(libc::SIGKILL);
    drill.proc().wait_exit(TIMEOUT)?;

    // A member down for a moment: a restore at its address is refused while the other
    // member answers (it would come back to a newer epoch and hold back: an outage).
    for node in [&mut cluster.first, &mut worker] {
        node.proc().signal(libc::SIGTERM);
        node.proc().wait_exit(TIMEOUT)?;
    }
    let address = cluster.first.address.to_string();
    refused(
        dir.path(),
        &dir.path().join("at-a-member-root"),
        &address,
        &file,
        &file,
        "1 of the backup's 1 other consensus members still answer",
    )?;

    // Every node stopped; the member's root is lost, the worker's kept.
    former.proc().signal(libc::SIGTERM);
    former.proc().wait_exit(TIMEOUT)?;
    std::fs::remove_dir_all(&cluster.first.root)?;

    // Refusals.
    let busy = dir.path().join("busy-root");
    std::fs::create_dir(&busy)?;
    std::fs::write(busy.join("something"), b"keep me")?;
    refused(dir.path(), &busy, &address, &file, &busy, "is not empty")?;
    let new_root = dir.path().join("restored-root");
    let bytes = std::fs::read(&file)?;
    let truncated = dir.path().join("truncated.polisbackup");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2])?;
    refused(
        dir.path(),
        &new_root,
        &address,
        &truncated,
        &truncated,
        "truncated",
    )?;
    let flipped = dir.path().join("flipped.polisbackup");
    let mut corrupt = bytes.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0x40;
    std::fs::write(&flipped, &corrupt)?;
    refused(
        dir.path(),
        &new_root,
        &address,
        &flipped,
        &flipped,
        "hash mismatch",
    )?;
    let foreign = dir.path().join("foreign.db");
    std::fs::write(&foreign, b"SQLite format 3\0 and more bytes than a prefix")?;
    refused(
        dir.path(),
        &new_root,
        &address,
        &foreign,
        &foreign,
        "not a Polis backup",
    )?;
    let empty = dir.path().join("empty-root");
    std::fs::create_dir(&empty)?;
    refused(
        dir.path(),
        &empty,
        &address,
        &foreign,
        &foreign,
        "not a Polis backup",
    )?;
    // A well-formed backup whose snapshot is no etcd database fails once the root was
    // written to: what the restore wrote goes again (the root too, when it was absent).
    let garbage = dir.path().join("garbage.polisbackup");
    {
        let header = backup::Header {
            ca_fingerprint: "ab".repeat(32),
            trusted_ca_fingerprints: Vec::new(),
            revision: 42,
            quorum_read: true,
            taken_at_unix_ms: 1_700_000_000_000,
            node_id: member_id.clone(),
            etcd_cluster_id: "1".into(),
            etcd_member_id: "2".into(),
            polis_version: "0.1.0".into(),
            etcd_version: "3.4.23".into(),
        };
        let mut writer = backup::Writer::new(std::fs::File::create(&garbage)?, &header)?;
        writer.write_snapshot(&[0x5a; 64 * 1024])?;
        writer.finish()?;
    }
    for root in [&new_root, &empty] {
        refused(
            dir.path(),
            root,
            &address,
            &garbage,
            &garbage,
            "snapshot restore failed",
        )?;
    }

    // The restore, on the former member's address, into a new root.
    cluster.first.root = new_root.clone();
    let log = cluster.first.dir.join("restore.log");
    let proc = Proc::spawn(
        "polis-node restore",
        restore_command(&new_root, &address, &file),
        &log,
    )?;
    cluster.first.proc = Some(proc);
    cluster.first.wait_home()?;
    let restored_id = cluster.first.key_node_id()?;
    assert_ne!(restored_id, member_id, "a new node key");

    // The owner's config works (same CA, same owner); the labels are the backup's.
    let labels = labels_of(&cluster, &worker_id)?;
    assert_eq!(labels["before"], "yes", "{labels}");
    assert!(
        labels.get("after").is_none(),
        "written after the backup: {labels}"
    );
    cluster.ctl_retry(&["node", "label", &worker_id, "restored=yes"])?;
    cluster.wait_node(&restored_id, "UP", None)?;
    let restored = cluster
        .node(&restored_id)?
        .context("restored node listed")?;
    assert!(
        restored["roles"].to_string().contains("ConsensusMember"),
        "{restored}"
    );
    cluster.wait_members(&address, 1, 0)?;
    // Former members are marked as no longer etcd members; the restored node records its own.
    assert_eq!(cluster.first.recorded_member_id(&former_id)?, 0);
    assert_eq!(
        cluster.first.recorded_member_id(&restored_id)?,
        cluster.first.etcd_ids()?.1
    );

    // The worker comes back by itself.
    worker.start(&[])?;
    worker.wait_home()?;
    cluster.wait_node(&worker_id, "UP", Some("HEALTHY"))?;
    let labels = labels_of(&cluster, &worker_id)?;
    assert_eq!(labels["restored"], "yes", "{labels}");

    // The former member, started with its old root, finds a newer epoch of its cluster
    // (the restore's) and does not serve; its data holds a write the backup lacks
    // (`after`), so it keeps it and holds back, saying so in `cluster status`.
    former.start(&[])?;
    former
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("holding back"))?;
    let both = format!("{address},{}", former.address);
    wait_until("cluster status shows the held-back member", TIMEOUT, || {
        cluster
            .status(&both)
            .is_ok_and(|(_, status)| status["warnings"].to_string().contains("holding back"))
    })?;
    let (ok, status) = cluster.status(&both)?;
    assert!(ok, "a held-back member is no second cluster: {status}");
    // The operator gives its data up (moved aside, kept): it rejoins as a learner, then
    // a voter, by itself.
    former.proc().signal(libc::SIGTERM);
    former.proc().wait_exit(TIMEOUT)?;
    std::fs::rename(
        former.root.join("data/etcd"),
        dir.path().join("former-etcd-kept"),
    )?;
    former.start(&[])?;
    cluster.wait_members(&format!("{address},{}", former.address), 2, 0)?;
    cluster.wait_node(&former_id, "UP", Some("HEALTHY"))?;
    assert_eq!(
        cluster.first.recorded_member_id(&former_id)?,
        former.etcd_ids()?.1,
        "the rejoined member records its new member ID"
    );

    // Later starts are ordinary ones.
    cluster.first.proc().signal(libc::SIGTERM);
    let status = cluster.first.proc().wait_exit(TIMEOUT)?;
    if !status.success() {
        bail!("restored node did not stop cleanly: {status:?}");
    }
    cluster.first.start(&[])?;
    cluster.first.wait_home()?;
    let labels = labels_of(&cluster, &worker_id)?;
    assert_eq!(labels["before"], "yes", "{labels}");
    assert_eq!(labels["restored"], "yes", "{labels}");
    Ok(())
}

/// The CRL a client holds (DER): polisctl's `CFG/crl.pem`, a node's `data/node/crl.der`.
fn held_crl(path: &Path) -> Option<Vec<u8>> {
    if path.extension().is_some_and(|e| e == "pem") {
        pem_der(path).ok()
    } else {
        std::fs::read(path).ok()
    }
}

/// Waits until the CRL held at `path` satisfies `good` (given its number and serials),
/// running `poke` before each look (polisctl fetches the CRL once per command); returns
/// its number.
fn wait_for_crl(
    what: &str,
    path: &Path,
    ca: &[u8],
    mut poke: impl FnMut() -> Result<()>,
    good: impl Fn(u64, &[Vec<u8>]) -> bool,
) -> Result<u64> {
    let mut last = None;
    wait_until(what, TIMEOUT, || {
        if poke().is_err() {
            return false;
        }
        let Some(crl) = held_crl(path) else {
            return false;
        };
        let (Ok(number), Ok(serials)) =
            (pki::verified_crl_number(&crl, ca), pki::crl_serials(&crl))
        else {
            return false;
        };
        last = Some(number);
        good(number, &serials)
    })
    .with_context(|| format!("{}: last CRL number {last:?}", path.display()))?;
    last.context("no CRL")
}

/// A node's node certificate and key, read before a decommission wipes them.
fn node_credentials(node: &Node) -> Result<rpc::Credentials> {
    Ok(rpc::Credentials {
        certificate: std::fs::read(node.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(node.root.join("data/node/key.der"))?,
    })
}

/// Decommissions the running worker `node` and waits until it exited; returns its
/// certificate's serial.
fn decommission(cluster: &Cluster, node: &mut Node, id: &str) -> Result<Vec<u8>> {
    let serial = pki::certificate_serial(&node_credentials(node)?.certificate)?;
    let out = cluster.ctl_retry(&["node", "decommission", id])?;
    assert!(out.contains("DECOMMISSIONED"), "{out}");
    node.proc().wait_exit(TIMEOUT)?;
    Ok(serial)
}

#[test]
fn revocations_after_a_restore_reach_clients_that_saw_later_crls_of_the_backed_up_cluster()
-> Result<()> {
    // Before: the restored cluster numbered its CRLs on from the backup's, below the
    // ones polisctl and the nodes had taken after the backup; they kept theirs (the
    // newest by number) and ignored every revocation until the numbers caught up, so
    // polisctl took a revoked certificate for a curator's ("not a curator certificate"
    // instead of "revoked").
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap_with(dir.path(), &[], &NODE_ARGS)?;
    let params = cluster.register_params("nodes")?;
    let (mut kept, kept_id) = cluster.add_worker("kept", &params)?;
    let (mut gone1, gone1_id) = cluster.add_worker("gone1", &params)?;
    let (mut gone2, gone2_id) = cluster.add_worker("gone2", &params)?;
    let ca = pem_der(&cluster.config.join("ca.pem"))?;
    let ctl_crl = cluster.config.join("crl.pem");
    let kept_crl = kept.root.join("data/node/crl.der");
    let list = |cluster: &Cluster| cluster.ctl_retry(&["node", "list"]).map(drop);

    let file = dir.path().join("cluster.polisbackup");
    cluster.ctl_retry(&[
        "cluster",
        "backup",
        "--out",
        file.to_str().context("utf-8")?,
    ])?;

    // Two revocations after the backup: with numbers counted on by one, the restored
    // cluster's first revocation then has a lower number than the CRL the clients hold
    // (an equal one would have been taken, as it differs).
    let revoked = [
        decommission(&cluster, &mut gone1, &gone1_id)?,
        decommission(&cluster, &mut gone2, &gone2_id)?,
    ];
    let lists_both = |_: u64, serials: &[Vec<u8>]| revoked.iter().all(|r| serials.contains(r));
    let seen = wait_for_crl(
        "polisctl takes the CRL revoking both",
        &ctl_crl,
        &ca,
        || list(&cluster),
        lists_both,
    )?;
    let seen_by_node = wait_for_crl(
        "the kept worker takes the CRL revoking both",
        &kept_crl,
        &ca,
        || Ok(()),
        lists_both,
    )?;
    println!("CRL numbers seen after the backup: polisctl {seen}, worker {seen_by_node}");

    // Every node stopped, the member's root lost; restored on its address.
    for node in [&mut cluster.first, &mut kept] {
        node.proc().signal(libc::SIGTERM);
        node.proc().wait_exit(TIMEOUT)?;
    }
    std::fs::remove_dir_all(&cluster.first.root)?;
    let new_root = dir.path().join("restored-root");
    let address = cluster.first.address.to_string();
    cluster.first.root = new_root.clone();
    let log = cluster.first.dir.join("restore.log");
    let proc = Proc::spawn(
        "polis-node restore",
        restore_command(&new_root, &address, &file),
        &log,
    )?;
    cluster.first.proc = Some(proc);
    cluster.first.wait_home()?;

    // The restored cluster's CRL replaces the later ones the clients hold.
    let restored = wait_for_crl(
        "polisctl takes the restored cluster's CRL",
        &ctl_crl,
        &ca,
        || list(&cluster),
        |number, _| number > seen,
    )?;
    kept.start(&[])?;
    kept.wait_home()?;
    wait_for_crl(
        "the kept worker takes the restored cluster's CRL",
        &kept_crl,
        &ca,
        || Ok(()),
        |number, _| number > seen_by_node,
    )?;

    // A revocation in the restored cluster reaches polisctl, which refuses the revoked
    // certificate where a curator should be.
    let credentials = node_credentials(&kept)?;
    let serial = decommission(&cluster, &mut kept, &kept_id)?;
    let after = wait_for_crl(
        "polisctl takes the CRL revoking the kept worker",
        &ctl_crl,
        &ca,
        || list(&cluster),
        |_, serials| serials.contains(&serial),
    )?;
    println!("CRL numbers after the restore: {restored}, then {after}");
    let impostor = Impostor::serve(
        std::net::SocketAddr::new(kept.address, rpc::CURATOR_PORT),
        credentials,
    )?;
    let (ok, _, err) = cluster.ctl(&["--endpoints", &kept.address.to_string(), "node", "list"])?;
    assert!(!ok && err.contains("revoked"), "{err}");
    assert!(
        impostor.handshakes_attempted() > 0,
        "polisctl did dial the impostor"
    );
    Ok(())
}

/// `polis-node set-curators` on the worker's root.
fn set_curators(root: &Path, endpoints: &[&str]) -> Result<(bool, String)> {
    let out = Command::new(bin("polis-node"))
        .arg("set-curators")
        .arg("--root")
        .arg(root)
        .args(endpoints)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

/// After a restore onto a new address the workers' directories name the old curators:
/// `polis-node set-curators` points a stopped worker at the new one. Here the worker is
/// first pointed at an address where no curator runs (it keeps trying that one, and
/// only that one), then at the member, and comes back UP and HEALTHY; refused while the
/// worker runs.
#[test]
fn set_curators_points_a_stopped_worker_at_a_curator_it_cannot_find() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap_with(dir.path(), &[], &NODE_ARGS)?;
    let params = cluster.register_params("nodes")?;
    let (mut worker, worker_id) = cluster.add_worker("worker", &params)?;
    cluster.wait_node(&worker_id, "UP", Some("HEALTHY"))?;

    let (ok, text) = set_curators(&worker.root, &["127.0.0.1"])?;
    assert!(!ok, "accepted while the worker runs: {text}");
    assert!(text.contains("polis-node:"), "{text}");

    worker.proc().signal(libc::SIGTERM);
    worker.proc().wait_exit(TIMEOUT)?;
    let nowhere = e2e::unique_loopback().to_string();
    let (ok, text) = set_curators(&worker.root, &[&nowhere])?;
    assert!(ok, "{text}");
    worker.start(&[])?;
    worker
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains(&nowhere))
        .context("the worker tries the address it was given")?;
    cluster.wait_node(&worker_id, "UP", Some("HEARTBEAT_TIMEOUT"))?;

    worker.proc().signal(libc::SIGTERM);
    worker.proc().wait_exit(TIMEOUT)?;
    let member = cluster.first.address.to_string();
    let (ok, text) = set_curators(&worker.root, &[&member])?;
    assert!(ok, "{text}");
    assert!(text.contains(&member), "{text}");
    worker.start(&[])?;
    worker.wait_home()?;
    cluster.wait_node(&worker_id, "UP", Some("HEALTHY"))?;
    Ok(())
}
