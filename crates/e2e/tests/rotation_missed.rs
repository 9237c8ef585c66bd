//! Issue 35, item 6: nodes off during a forced CA rotation come back with their data.
//! An encrypted worker and an encrypted consensus member are stopped; `rotate-ca
//! --force` runs to its end without them (the old CA retired: neither trusts the
//! curators' certificates any more, and no curator accepts theirs). Started again, the
//! worker unlocks its data from a curator by following the CA's handovers, each node
//! exchanges its certificate of the retired CA for one of the new CA
//! (ReissueNodeCertificate), and both are Home with what they held: the worker's file
//! on its encrypted data, the member's etcd member (a voter again, same member).
//! Root only; skipped with a printed reason where the kernel lacks ext4 encryption.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use e2e::{Cluster, Mounts, Node, TIMEOUT, data_image, fscrypt_usable, wait_until};

fn endpoints(nodes: &[&Node]) -> String {
    let all: Vec<String> = nodes.iter().map(|n| n.address.to_string()).collect();
    all.join(",")
}

fn rotation(cluster: &Cluster) -> Result<serde_json::Value> {
    let (ok, out, err) = cluster.ctl(&["cluster", "ca", "-o", "json"])?;
    ensure!(ok, "cluster ca: {err}");
    Ok(serde_json::from_str(&out)?)
}

/// The DER blocks of a PEM file.
fn pem_blocks(path: &Path) -> Result<Vec<Vec<u8>>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    Ok(pem::parse_many(text)?
        .into_iter()
        .map(|p| p.into_contents())
        .collect())
}

#[test]
fn an_encrypted_worker_and_member_off_during_a_forced_rotation_come_back_with_their_data()
-> Result<()> {
    if !fscrypt_usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let imgs: Vec<String> = ["m1", "m2", "w"]
        .iter()
        .map(|n| data_image(&dir.path().join(format!("{n}.img"))))
        .collect::<Result<_>>()?;
    let _mounts: Vec<Mounts> = ["m1", "m2", "w"]
        .iter()
        .map(|n| Mounts(dir.path().join(n).join("root")))
        .collect();
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("nodes")?;
    let (m1, id1) = cluster.add_worker_with("m1", &params, &["--data-device", &imgs[0]])?;
    let (mut m2, id2) = cluster.add_worker_with("m2", &params, &["--data-device", &imgs[1]])?;
    let (mut w, idw) = cluster.add_worker_with("w", &params, &["--data-device", &imgs[2]])?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let all = endpoints(&[&cluster.first, &m1, &m2]);
    let before = cluster.wait_members(&all, 3, 0)?;
    let member_id = |status: &serde_json::Value, node: &str| {
        status["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["node"] == node))
            .map(|m| m["member_id"].clone())
    };
    let m2_member = member_id(&before, &id2).context("m2 is no member")?;
    // Something only the worker's encrypted data holds.
    let marker = w.root.join("data/missed-rotation-marker");
    std::fs::write(&marker, b"kept")?;
    let old_ca = rotation(&cluster)?["trusted_ca_fingerprints"][0].clone();

    // Both off (SIGTERM: locked and unmounted); the rotation is forced to its end.
    w.stop_cleanly()?;
    m2.stop_cleanly()?;
    cluster.ctl_retry(&["--endpoints", &all, "cluster", "rotate-ca", "--force"])?;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let state = rotation(&cluster)?;
        let trusted = state["trusted_ca_fingerprints"].as_array().cloned();
        if state["phase"] == "settled" && trusted.as_ref().is_some_and(|t| !t.contains(&old_ca)) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the forced rotation never retired the old CA: {state}");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    // Back: both come Home, with their data.
    m2.start(&["--data-device", &imgs[1]])?;
    w.start(&["--data-device", &imgs[2]])?;
    m2.wait_home()?;
    w.wait_home()?;
    ensure!(
        std::fs::read(&marker).is_ok_and(|b| b == b"kept"),
        "the worker's data is not what it held"
    );
    ensure!(
        w.proc().output().contains("followed its handovers"),
        "the worker did not follow the CA's handovers"
    );
    let after = cluster.wait_members(&all, 3, 0)?;
    ensure!(
        member_id(&after, &id2).as_ref() == Some(&m2_member),
        "m2 is not the etcd member it was: {after}"
    );
    // Each holds a node certificate of the CA that signs now, which it trusts.
    let new_ca = rotation(&cluster)?["trusted_ca_fingerprints"][0].clone();
    for (name, node) in [("m2", &m2), ("w", &w)] {
        wait_until(
            &format!("{name} trusts the new CA and holds its certificate"),
            TIMEOUT,
            || {
                let trusted =
                    pem_blocks(&node.root.join("data/node/trust.pem")).unwrap_or_default();
                let cert = std::fs::read(node.root.join("data/node/cert.der")).unwrap_or_default();
                trusted.iter().any(|ca| {
                    Some(rpc::fingerprint(ca)) == new_ca.as_str().map(str::to_string)
                        && pki::issued_by(&cert, ca)
                })
            },
        )?;
    }
    // And the cluster serves them: a label on each reaches its node's record.
    for id in [&id2, &idw] {
        cluster.ctl_retry(&["node", "label", id, "back=yes"])?;
        let out = cluster.ctl_retry(&["--endpoints", &all, "node", "describe", id])?;
        ensure!(out.contains("back"), "{out}");
    }
    let out = cluster.ctl_retry(&["node", "list"])?;
    for id in [&id1, &id2, &idw] {
        ensure!(
            out.lines()
                .any(|l| l.contains(id.as_str()) && l.contains("UP")),
            "{id} is not UP:\n{out}"
        );
    }
    Ok(())
}
