//! The owner's backup is the escrow of encrypted members' data keys (issue 18): a
//! 3-member cluster on encrypted images (the first one bootstrapped on its image), a
//! label written, a backup taken; two members killed with -9 and their roots and images
//! deleted, the third stopped. `polis-node recover --data-device` on that survivor without
//! `--backup` is refused (no surviving peer holds its half), and with a backup of another
//! cluster too (by name); with the cluster's backup it comes Home, the label is there,
//! a new write is served, and it starts again as usual (its half kept in its ESP now).
//! Then `polis-node restore --data-device` refuses an image that holds something else
//! (untouched, root not created), and onto a fresh image serves the backup's label,
//! starts again as usual, and the raw image holds no label bytes. Root only; skipped
//! with a printed reason where the kernel lacks ext4 encryption.
//!
//! One cluster for the whole file: the phases build on each other.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, Mounts, Node, Proc, TIMEOUT, bin, data_image, fscrypt_usable};

/// Whether the raw image holds `needle` (no newline in it: grep's patterns are lines).
fn image_holds(img: &str, needle: &[u8], scratch: &Path) -> Result<bool> {
    ensure!(
        !needle.contains(&b'\n') && !needle.is_empty(),
        "unusable needle"
    );
    let pattern = scratch.join("pattern");
    std::fs::write(&pattern, needle)?;
    let status = Command::new("grep")
        .env("LC_ALL", "C")
        .args(["-a", "-q", "-F", "-f"])
        .arg(&pattern)
        .arg(img)
        .status()?;
    ensure!(
        status.code().is_some_and(|c| c <= 1),
        "grep failed: {status}"
    );
    Ok(status.success())
}

/// `polis-node SUBCOMMAND --log-format=json ARGS`.
fn node_command(subcommand: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("polis-node"));
    cmd.arg(subcommand).arg("--log-format=json").args(args);
    cmd
}

/// Runs a command that must be refused: exit 1 with a `polis-node:` line containing
/// `why`; returns that line.
fn refused(dir: &Path, what: &str, cmd: Command, why: &str) -> Result<String> {
    let mut proc = Proc::spawn(what, cmd, &dir.join(format!("{what}.log")))?;
    let status = proc.wait_exit(TIMEOUT)?;
    let output = proc.output();
    ensure!(status.code() == Some(1), "{what} must exit 1: {output}");
    let line = output
        .lines()
        .find(|l| l.starts_with("polis-node: "))
        .with_context(|| format!("no error line in: {output}"))?
        .to_string();
    ensure!(line.contains(why), "expected {why:?} in {line:?}");
    println!("refused as expected: {line}");
    Ok(line)
}

/// A well-formed backup of no cluster this test made (its header names another CA).
fn foreign_backup(path: &Path) -> Result<()> {
    let header = backup::Header {
        ca_fingerprint: "ab".repeat(32),
        trusted_ca_fingerprints: Vec::new(),
        revision: 42,
        quorum_read: true,
        taken_at_unix_ms: 1_700_000_000_000,
        node_id: "elsewhere".into(),
        etcd_cluster_id: "1".into(),
        etcd_member_id: "2".into(),
        polis_version: "0.1.0".into(),
        etcd_version: "3.4.23".into(),
    };
    let mut writer = backup::Writer::new(std::fs::File::create(path)?, &header)?;
    writer.write_snapshot(&[0x5a; 64 * 1024])?;
    writer.finish()?;
    Ok(())
}

fn describe(cluster: &Cluster, endpoint: &str, id: &str) -> Result<String> {
    cluster.ctl_retry(&["--endpoints", endpoint, "node", "describe", id])
}

#[test]
fn encrypted_members_recover_and_restore_from_the_owners_backup() -> Result<()> {
    if !fscrypt_usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let imgs: Vec<String> = ["n0", "m1", "m2", "restored", "foreign"]
        .iter()
        .map(|n| data_image(&dir.path().join(format!("{n}.img"))))
        .collect::<Result<_>>()?;
    let _mounts: Vec<Mounts> = ["n0", "restored"]
        .iter()
        .map(|n| Mounts(dir.path().join(n).join("root")))
        .collect();
    let mut lost_mounts: Vec<Option<Mounts>> = ["m1", "m2"]
        .iter()
        .map(|n| Some(Mounts(dir.path().join(n).join("root"))))
        .collect();

    let (mut cluster, others) = Cluster::encrypted_members(dir.path(), &imgs)?;
    let n0_dir = dir.path().join("n0");
    let esp0 = cluster.first.root.join("esp");
    let endpoint = cluster.first.address.to_string();
    let id0 = cluster.first.key_node_id()?;
    let (mut m1, mut m2) = {
        let mut it = others.into_iter().map(|(n, _)| n);
        (it.next().context("m1")?, it.next().context("m2")?)
    };

    let label = "qxzzy-escrow-secret-8123";
    cluster.ctl_retry(&["node", "label", &id0, &format!("secret={label}")])?;
    let backup = dir.path().join("cluster.polisbackup");
    let backup_str = backup.to_str().context("utf-8")?;
    cluster.ctl_retry(&["cluster", "backup", "--out", backup_str])?;

    // A majority lost for good: two members killed, their roots and images gone; the
    // survivor stopped.
    for (i, n) in [&mut m1, &mut m2].into_iter().enumerate() {
        n.proc().signal(libc::SIGKILL);
        n.proc().wait_exit(TIMEOUT)?;
        drop(lost_mounts[i].take());
        std::fs::remove_dir_all(&n.root)?;
        std::fs::remove_file(&imgs[1 + i])?;
    }
    cluster.first.stop_cleanly()?;
    let root0 = cluster.first.root.to_str().context("utf-8")?.to_string();
    let data0 = cluster.first.root.join("data");

    // Without the backup: nobody holds its half; refused, nothing mounted.
    refused(
        dir.path(),
        "recover-without-backup",
        node_command("recover", &["--root", &root0, "--data-device", &imgs[0]]),
        "no surviving peer holds this node's cluster half; pass --backup FILE",
    )?;
    ensure!(
        !datafs::mounts::is_mount_point(&data0)?,
        "a refused recover left the data mounted"
    );
    // Another cluster's backup: refused by name, before anything is read from it.
    let foreign = dir.path().join("foreign.polisbackup");
    foreign_backup(&foreign)?;
    let foreign_str = foreign.to_str().context("utf-8")?;
    let line = refused(
        dir.path(),
        "recover-foreign-backup",
        node_command(
            "recover",
            &[
                "--root",
                &root0,
                "--data-device",
                &imgs[0],
                "--backup",
                foreign_str,
            ],
        ),
        "is not of this node's cluster",
    )?;
    ensure!(
        line.contains(foreign_str),
        "the backup is not named: {line}"
    );
    ensure!(
        !datafs::mounts::is_mount_point(&data0)?,
        "a refused recover left the data mounted"
    );

    // With the cluster's backup: the escrowed half unlocks it; Home, label, a new write.
    let started = std::time::Instant::now();
    cluster.first.proc = Some(Proc::spawn(
        "polis-node recover",
        node_command(
            "recover",
            &[
                "--root",
                &root0,
                "--data-device",
                &imgs[0],
                "--backup",
                backup_str,
            ],
        ),
        &n0_dir.join("recover.log"),
    )?);
    cluster.first.wait_home()?;
    println!(
        "recovered with the backup's half: Home {:?} after recover started",
        started.elapsed()
    );
    ensure!(
        cluster
            .first
            .proc()
            .output()
            .contains("reading this node's cluster half from the backup"),
        "the half did not come from the backup"
    );
    ensure!(
        datafs::mounts::is_mount_point(&data0)?,
        "the recovered member's data is not the encrypted mount"
    );
    cluster.label_survived_recover(&endpoint, &id0, label)?;
    ensure!(
        esp0.join("data-cluster-half").exists(),
        "the only member keeps its half in its ESP (nobody else could answer)"
    );
    // Later starts are the usual ones.
    cluster.first.stop_cleanly()?;
    ensure!(
        !datafs::mounts::is_mount_point(&data0)?,
        "stopped but still mounted"
    );
    cluster.first.start(&["--data-device", &imgs[0]])?;
    cluster.first.wait_home()?;
    let out = describe(&cluster, &endpoint, &id0)?;
    ensure!(
        out.contains(label) && out.contains("recovered"),
        "labels lost after a restart:\n{out}"
    );
    cluster.first.stop_cleanly()?;

    // restore --data-device: an image holding something else is refused, untouched.
    let restored_dir = dir.path().join("restored");
    std::fs::create_dir_all(&restored_dir)?;
    let mut restored = Node::new(&restored_dir);
    let new_root = restored.root.to_str().context("utf-8")?.to_string();
    let address = restored.address.to_string();
    let foreign_img = &imgs[4];
    std::fs::write(foreign_img, b"somebody else's data, not a file system")?;
    std::fs::File::options()
        .write(true)
        .open(foreign_img)?
        .set_len(256 << 20)?;
    let before = std::fs::read(foreign_img)?;
    refused(
        dir.path(),
        "restore-foreign-device",
        node_command(
            "restore",
            &[
                "--root",
                &new_root,
                "--address",
                &address,
                "--backup",
                backup_str,
                "--data-device",
                foreign_img,
            ],
        ),
        foreign_img,
    )?;
    ensure!(
        std::fs::read(foreign_img)? == before,
        "a refused restore changed the device"
    );
    ensure!(
        !restored.root.exists(),
        "a refused restore left its root behind"
    );
    std::fs::remove_file(foreign_img)?;

    // Onto a fresh image: serves the backup's label, restarts as usual, raw image clean.
    restored.proc = Some(Proc::spawn(
        "polis-node restore",
        node_command(
            "restore",
            &[
                "--root",
                &new_root,
                "--address",
                &address,
                "--backup",
                backup_str,
                "--data-device",
                &imgs[3],
            ],
        ),
        &restored_dir.join("restore.log"),
    )?);
    restored.wait_home()?;
    ensure!(
        datafs::mounts::is_mount_point(&restored.root.join("data"))?,
        "the restored node's data is not the encrypted mount"
    );
    let out = describe(&cluster, &address, &id0)?;
    ensure!(out.contains(label), "the label is not restored:\n{out}");
    restored.stop_cleanly()?;
    restored.start(&["--data-device", &imgs[3]])?;
    restored.wait_home()?;
    let out = describe(&cluster, &address, &id0)?;
    ensure!(
        out.contains(label),
        "the label is gone after a restart:\n{out}"
    );
    restored.stop_cleanly()?;
    ensure!(
        !image_holds(&imgs[3], label.as_bytes(), dir.path())?,
        "the restored node's raw image holds the label value"
    );
    ensure!(
        !image_holds(&imgs[0], label.as_bytes(), dir.path())?,
        "the recovered node's raw image holds the label value"
    );
    // Sanity: the search finds what is there.
    ensure!(
        image_holds(&imgs[3], b"polis-datafs 1", dir.path())?,
        "the plain marker is not found: the search is broken"
    );
    Ok(())
}
