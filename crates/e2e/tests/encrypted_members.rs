//! Encrypted data on consensus members (issue 18, stage 4): three members (the first one
//! bootstrapped on its encrypted image) and a worker, all on encrypted loop images. The
//! raw images hold no label value and no CA key bytes; a cold start of all (SIGTERM all,
//! start all) comes Home, members unlocking each other through their ESPs' peer halves;
//! one member's ESP and image copied elsewhere alone never unlock. Root only; skipped
//! with a printed reason where the kernel lacks ext4 encryption.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, Mounts, Node, TIMEOUT, data_image, fscrypt_usable, wait_until};

/// Whether the raw image holds `needle` (no newline in it: grep's patterns are lines).
fn image_holds(img: &str, needle: &[u8], scratch: &Path) -> Result<bool> {
    ensure!(
        !needle.contains(&b'\n') && !needle.is_empty(),
        "unusable needle"
    );
    let pattern = scratch.join("pattern");
    std::fs::write(&pattern, needle)?;
    let status = std::process::Command::new("grep")
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

/// Registers an encrypted worker `name` on image `img`, approves it, waits until UP.
fn encrypted_worker(cluster: &Cluster, name: &str, img: &str) -> Result<(Node, String)> {
    let params = cluster.register_params(name)?;
    cluster.add_worker_with(name, &params, &["--data-device", img])
}

fn endpoints(nodes: &[&Node]) -> String {
    let all: Vec<String> = nodes.iter().map(|n| n.address.to_string()).collect();
    all.join(",")
}

#[test]
fn encrypted_members_cold_start_together_and_a_stolen_member_never_unlocks_alone() -> Result<()> {
    if !fscrypt_usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let imgs: Vec<String> = ["n0", "m1", "m2", "w"]
        .iter()
        .map(|n| data_image(&dir.path().join(format!("{n}.img"))))
        .collect::<Result<_>>()?;
    let _mounts: Vec<Mounts> = ["n0", "m1", "m2", "w", "copy"]
        .iter()
        .map(|n| Mounts(dir.path().join(n).join("root")))
        .collect();

    // The first node bootstraps on its encrypted image.
    let n0_dir = dir.path().join("n0");
    std::fs::create_dir_all(&n0_dir)?;
    let mut first = Node::new(&n0_dir);
    let params = first.bootstrap_params()?;
    first.start(&[
        "--params",
        params.to_str().unwrap(),
        "--data-device",
        &imgs[0],
    ])?;
    first.wait_home()?;
    let esp0 = first.root.join("esp");
    ensure!(
        datafs::mounts::is_mount_point(&first.root.join("data"))?,
        "the first node's data is not the encrypted mount"
    );
    ensure!(
        esp0.join("data-cluster-half").exists(),
        "a one-member cluster keeps its half in its ESP (nowhere else holds it)"
    );
    let mut cluster = Cluster {
        dir: dir.path().to_path_buf(),
        config: n0_dir.join("config"),
        first,
        node_args: vec![],
    };
    let endpoint = cluster.first.address.to_string();
    cluster.ctl_retry(&["--endpoints", &endpoint, "takeownership", "--accept-ca"])?;

    let (mut m1, id1) = encrypted_worker(&cluster, "m1", &imgs[1])?;
    let (mut m2, id2) = encrypted_worker(&cluster, "m2", &imgs[2])?;
    let (mut w, idw) = encrypted_worker(&cluster, "w", &imgs[3])?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    cluster.wait_members(&endpoints(&[&cluster.first, &m1, &m2]), 3, 0)?;
    // Every member keeps the others' halves; the first one's half left its ESP once
    // another member answered with it.
    wait_until(
        "the first node's half is kept by another member",
        TIMEOUT,
        || !esp0.join("data-cluster-half").exists(),
    )?;
    for n in [&cluster.first, &m1, &m2] {
        let peers = n.root.join("esp/data-peers");
        wait_until("the member keeps two peer halves", TIMEOUT, || {
            std::fs::read(&peers).is_ok_and(|b| b.len() > 2 * 80)
        })?;
    }
    let label = "qxzzy-cold-secret-4711";
    cluster.ctl_retry(&["node", "label", &idw, &format!("secret={label}")])?;
    let ca_key = cluster
        .first
        .etcd_get("namespaced:curator/cluster-pki/ca/key")?
        .context("no cluster CA key in etcd")?;

    // SIGTERM all: locked and unmounted.
    w.stop_cleanly()?;
    for n in [&mut m2, &mut m1, &mut cluster.first] {
        n.stop_cleanly()?;
    }
    for (img, n) in imgs.iter().zip(["n0", "m1", "m2", "w"]) {
        ensure!(
            !image_holds(img, label.as_bytes(), dir.path())?,
            "{n}'s raw image holds the label value"
        );
        // Windows of the CA's private key (grep patterns are lines: none with \n).
        for chunk in ca_key[16..]
            .chunks(16)
            .filter(|c| c.len() == 16 && !c.contains(&b'\n'))
        {
            ensure!(
                !image_holds(img, chunk, dir.path())?,
                "{n}'s raw image holds CA key bytes"
            );
        }
    }
    // Sanity: the search finds what is there.
    ensure!(
        image_holds(&imgs[0], b"polis-datafs 1", dir.path())?,
        "the plain marker is not found: the search is broken"
    );

    // Cold start of all: members unlock each other, then the worker through a curator.
    for (n, img) in [
        (&mut cluster.first, &imgs[0]),
        (&mut m1, &imgs[1]),
        (&mut m2, &imgs[2]),
    ] {
        n.start(&["--data-device", img])?;
    }
    w.start(&["--data-device", &imgs[3]])?;
    for n in [&mut cluster.first, &mut m1, &mut m2, &mut w] {
        n.wait_home()?;
    }
    let mut through_member = false;
    for n in [&mut cluster.first, &mut m1, &mut m2] {
        through_member |= n
            .proc()
            .output()
            .contains("another member handed this node its cluster half");
    }
    ensure!(through_member, "no member unlocked through another member");
    let out = cluster.ctl_retry(&[
        "--endpoints",
        &endpoints(&[&cluster.first, &m1, &m2]),
        "node",
        "describe",
        &idw,
    ])?;
    ensure!(
        out.contains(label),
        "the label is gone after the cold start:\n{out}"
    );

    // One member's ESP and image, copied elsewhere, alone: nobody answers, never mounted.
    w.stop_cleanly()?;
    for n in [&mut m2, &mut m1, &mut cluster.first] {
        n.stop_cleanly()?;
    }
    let copy_dir = dir.path().join("copy");
    std::fs::create_dir(&copy_dir)?;
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(&m1.root)
        .arg(copy_dir.join("root"))
        .output()?;
    ensure!(out.status.success(), "cp: {out:?}");
    let stolen = copy_dir.join("stolen.img");
    std::fs::copy(&imgs[1], &stolen)?;
    std::fs::remove_file(&imgs[1])?;
    let mut copy = Node::new(&copy_dir);
    copy.address = m1.address;
    copy.start(&["--data-device", stolen.to_str().unwrap()])?;
    // Split is logged once every member's listener and every curator failed to answer.
    copy.wait_state("Split")?;
    ensure!(
        !datafs::mounts::is_mount_point(&copy.root.join("data"))?,
        "a stolen member's copy unlocked alone"
    );
    ensure!(
        !copy.proc().output().contains("data device unlocked"),
        "a stolen member's copy unlocked alone"
    );
    // SIGTERM while waiting to unlock: a clean stop.
    copy.stop_cleanly()?;
    Ok(())
}
