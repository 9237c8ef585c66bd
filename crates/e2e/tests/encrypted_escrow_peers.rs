//! `polis-node recover --data-device` without a backup, when another survivor's unlock
//! listener still answers (issue 18): a 3-member cluster on encrypted images (the first
//! bootstrapped on its image) loses one member for good (kill -9, root and image
//! deleted); the other two are stopped. One survivor is started as usual: it cannot
//! unlock (nobody answers for it) and waits, Split, its listener up. `recover` on the
//! other survivor gets its half from that listener (refused after that unlock while its
//! curator port is held: unmounted again, nothing kept), comes Home as the only member with
//! the label there and a write served, and keeps its half in its ESP only until the
//! waiting survivor (unlocked through it in turn) keeps it again. Root only; skipped with
//! a printed reason where the kernel lacks ext4 encryption.

use std::process::Command;

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, Mounts, Proc, TIMEOUT, bin, data_image, fscrypt_usable, wait_until};

#[test]
fn an_encrypted_survivor_recovers_with_its_half_from_another_survivor() -> Result<()> {
    if !fscrypt_usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let imgs: Vec<String> = ["n0", "m1", "m2"]
        .iter()
        .map(|n| data_image(&dir.path().join(format!("{n}.img"))))
        .collect::<Result<_>>()?;
    let _mounts: Vec<Mounts> = ["n0", "m1"]
        .iter()
        .map(|n| Mounts(dir.path().join(n).join("root")))
        .collect();
    let mut lost_mounts = Some(Mounts(dir.path().join("m2").join("root")));

    let (mut cluster, others) = Cluster::encrypted_members(dir.path(), &imgs)?;
    let id0 = cluster.first.key_node_id()?;
    let endpoint = cluster.first.address.to_string();
    let label = "qxzzy-peer-escrow-5521";
    cluster.ctl_retry(&["node", "label", &id0, &format!("secret={label}")])?;
    let (mut m1, mut m2) = {
        let mut it = others.into_iter().map(|(n, _)| n);
        (it.next().context("m1")?, it.next().context("m2")?)
    };

    // m2 lost for good; the two survivors stopped.
    m2.proc().signal(libc::SIGKILL);
    m2.proc().wait_exit(TIMEOUT)?;
    drop(lost_mounts.take());
    std::fs::remove_dir_all(&m2.root)?;
    std::fs::remove_file(&imgs[2])?;
    m1.stop_cleanly()?;
    cluster.first.stop_cleanly()?;

    // m1 started as usual: nobody answers for it; it waits, its listener serving.
    m1.start(&["--data-device", &imgs[1]])?;
    m1.wait_state("Split")?;

    let root0 = cluster.first.root.to_str().context("utf-8")?.to_string();
    let recover = || {
        let mut cmd = Command::new(bin("polis-node"));
        cmd.args([
            "recover",
            "--log-format=json",
            "--root",
            &root0,
            "--data-device",
            &imgs[0],
        ]);
        cmd
    };
    // A refusal after the unlock (its curator port held): unmounted again.
    let held = std::net::TcpListener::bind((cluster.first.address, rpc::CURATOR_PORT))?;
    let mut refused = Proc::spawn(
        "polis-node recover (refused)",
        recover(),
        &dir.path().join("n0").join("recover-refused.log"),
    )?;
    let status = refused.wait_exit(TIMEOUT)?;
    let output = refused.output();
    ensure!(
        status.code() == Some(1),
        "recover must be refused: {output}"
    );
    ensure!(
        output.contains("another member handed this node its cluster half")
            && output.contains("curator"),
        "not refused after the unlock, for the held port: {output}"
    );
    ensure!(
        !datafs::mounts::is_mount_point(&cluster.first.root.join("data"))?
            && !datafs::mounts::is_mount_point(&cluster.first.root.join("datafs"))?,
        "a recover refused after the unlock left the data mounted"
    );
    ensure!(
        !cluster.first.root.join("esp/data-cluster-half").exists(),
        "a refused recover kept the half in the ESP"
    );
    drop(held);

    // recover on n0 without a backup: m1's listener hands it its half.
    cluster.first.proc = Some(Proc::spawn(
        "polis-node recover",
        recover(),
        &dir.path().join("n0").join("recover.log"),
    )?);
    cluster.first.wait_home()?;
    ensure!(
        cluster
            .first
            .proc()
            .output()
            .contains("another member handed this node its cluster half"),
        "the half did not come from the other survivor"
    );
    cluster.label_survived_recover(&endpoint, &id0, label)?;
    // The waiting survivor unlocks through the recovered one and keeps its half again:
    // the recovered one's ESP lets go of it.
    m1.wait_home()?;
    let own_half = cluster.first.root.join("esp/data-cluster-half");
    wait_until(
        "the recovered member's half is kept by the other survivor again",
        TIMEOUT,
        || !own_half.exists(),
    )?;
    m1.stop_cleanly()?;
    cluster.first.stop_cleanly()?;
    Ok(())
}
