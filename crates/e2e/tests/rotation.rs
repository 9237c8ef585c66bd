//! Certificate rotation with second-scale lifetimes: node, etcd peer, curator and owner
//! certificates are replaced while clients keep calling, no call fails, no process
//! restarts, and etcd peers connect anew with renewed certificates after the first ones
//! expired (their existing connections are cut to force new handshakes).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node};

/// Node (and etcd peer) and owner certificate lifetimes, seconds.
const NODE_LIFETIME: u64 = 18;
const OWNER_LIFETIME: u64 = 15;

fn pem_der(path: &Path) -> Result<Vec<u8>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(pem::parse(text)?.into_contents())
}

/// The certificates a node uses: (node certificate, etcd peer certificate if any).
fn node_certificates(node: &Node) -> Result<(Vec<u8>, Option<Vec<u8>>)> {
    let cert = std::fs::read(node.root.join("data/node/cert.der"))?;
    let peer_path = node.root.join("data/etcd/peer/cert.pem");
    let peer = if peer_path.exists() {
        Some(pem_der(&peer_path)?)
    } else {
        None
    };
    Ok((cert, peer))
}

fn serial(der: &[u8]) -> Result<String> {
    Ok(pki::certificate_serial(der)?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Cuts every established etcd peer connection of these members (both ends), so that
/// etcd must dial and handshake again with whatever certificate files it has now.
fn cut_peer_connections(nodes: &[&Node]) -> Result<()> {
    for node in nodes {
        let address = node.address.to_string();
        for filter in [
            ["dst", address.as_str(), "dport", "=", ":7834"],
            ["src", address.as_str(), "sport", "=", ":7834"],
        ] {
            let out = std::process::Command::new("ss")
                .arg("-K")
                .args(filter)
                .output()
                .context("running ss -K")?;
            if !out.status.success() {
                bail!(
                    "ss -K {filter:?} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    Ok(())
}

#[test]
fn certificates_rotate_online_without_failed_calls_or_restarts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node_lifetime = NODE_LIFETIME.to_string();
    let owner_lifetime = format!("{OWNER_LIFETIME}s");
    let mut cluster = Cluster::bootstrap_with(
        dir.path(),
        &[
            "--node-certificate-lifetime",
            &node_lifetime,
            "--owner-certificate-lifetime",
            &owner_lifetime,
        ],
        &[],
    )?;
    let params = cluster.register_params("nodes")?;
    let (mut n1, id1) = cluster.add_worker("n1", &params)?;
    let (mut w2, id2) = cluster.add_worker("w2", &params)?;
    cluster.ctl_retry(&["node", "add-role", &id1, "ConsensusMember"])?;
    let all = format!("{},{}", cluster.first.address, n1.address);
    cluster.wait_members(&all, 2, 0)?;
    n1.wait_for_curator()?;
    let id0 = cluster.first.key_node_id()?;

    // Every process that must survive: polis-node and etcd.
    let mut pids = vec![cluster.first.proc().pid(), n1.proc().pid(), w2.proc().pid()];
    pids.push(cluster.first.etcd_pid()?);
    pids.push(n1.etcd_pid()?);
    let first_peer = node_certificates(&n1)?
        .1
        .context("n1 has a peer certificate")?;
    let first_peer_expiry = pki::Validity::of(&first_peer)?.not_after;
    let owner_path = cluster.config.join("owner.pem");

    // The client loop: the owner lists nodes (polisctl, which renews its certificate at
    // 2/3 of its lifetime) while the nodes heartbeat and watch; serials are sampled.
    let mut seen: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut calls = 0u32;
    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    let mut cut = false;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(3 * NODE_LIFETIME + 10);
    loop {
        let (ok, out, err) = cluster.ctl(&["node", "list", "-o", "json"])?;
        calls += 1;
        if ok {
            let nodes: serde_json::Value = serde_json::from_str(&out)?;
            for n in nodes.as_array().cloned().unwrap_or_default() {
                if let Some(w) = n["warnings"].as_array().filter(|w| !w.is_empty()) {
                    warnings.push(format!("{}: {w:?}", n["id"]));
                }
                if n["health"] == "HEARTBEAT_TIMEOUT" {
                    failures.push(format!("node {} is {}", n["id"], n["health"]));
                }
            }
        } else {
            failures.push(format!("node list: {err}"));
        }
        for (name, node) in [("n0", &cluster.first), ("n1", &n1), ("w2", &w2)] {
            let (cert, peer) = node_certificates(node)?;
            seen.entry(name).or_default().insert(serial(&cert)?);
            if let Some(peer) = peer {
                seen.entry(if name == "n0" { "n0-peer" } else { "n1-peer" })
                    .or_default()
                    .insert(serial(&peer)?);
            }
        }
        seen.entry("owner")
            .or_default()
            .insert(serial(&pem_der(&owner_path)?)?);

        // Past the first peer certificate's expiry: force new peer handshakes, then a
        // write needs both voters (quorum of 2), so etcd must have reconnected with
        // renewed certificates.
        if !cut && pki::unix_now() > first_peer_expiry + 1 {
            cut_peer_connections(&[&cluster.first, &n1])?;
            cut = true;
            let write = Instant::now();
            let (ok, _, err) = cluster.ctl(&["node", "label", &id2, "rotation=after-expiry"])?;
            calls += 1;
            if !ok {
                failures.push(format!("write after cutting peer connections: {err}"));
            }
            println!(
                "peer connections cut {} s after the first peer certificate expired; a quorum write took {:?}",
                pki::unix_now() - first_peer_expiry,
                write.elapsed()
            );
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "{calls} owner calls in {:?}; serials seen: {seen:#?}",
        started.elapsed()
    );
    assert!(
        cut,
        "the loop never got past the first peer certificate's expiry"
    );
    assert!(failures.is_empty(), "failed calls: {failures:#?}");
    assert!(
        warnings.is_empty(),
        "expiry warnings while renewing: {warnings:#?}"
    );
    for (what, serials) in &seen {
        // Over 3 node lifetimes each certificate is replaced at least twice.
        assert!(
            serials.len() >= 3,
            "{what} was not rotated twice: {serials:?}"
        );
    }
    for pid in &pids {
        assert!(e2e::process_alive(*pid), "process {pid} is gone");
    }
    // No second etcd was started by any node, and no runnable logged renewal trouble.
    for (name, node) in [("n0", &mut cluster.first), ("n1", &mut n1), ("w2", &mut w2)] {
        let log = node.proc().output();
        let etcd_starts = log.lines().filter(|l| l.contains("started etcd")).count();
        assert!(etcd_starts <= 1, "{name} started etcd {etcd_starts} times");
        for trouble in [
            "renewing this node's certificates",
            "heartbeat failed",
            "certificate has expired",
            "bad certificate",
        ] {
            let lines: Vec<&str> = log.lines().filter(|l| l.contains(trouble)).collect();
            assert!(lines.is_empty(), "{name} logged {trouble:?}: {lines:#?}");
        }
    }
    assert_eq!(cluster.first.etcd_pid()?, pids[3]);
    assert_eq!(n1.etcd_pid()?, pids[4]);

    // `cluster certificates`: every kind, several per node, one current each, none
    // revoked, expired ones listed as such.
    let out = cluster.ctl_retry(&["cluster", "certificates", "-o", "json"])?;
    let list: Vec<serde_json::Value> = serde_json::from_str(&out)?;
    let now = pki::unix_now();
    let count = |kind: &str, node: &str| {
        list.iter()
            .filter(|c| c["kind"] == kind && c["node"] == node)
            .count()
    };
    for id in [&id0, &id1, &id2] {
        assert!(
            count("node", id) >= 3,
            "node certificates of {id}: {list:#?}"
        );
    }
    for id in [&id0, &id1] {
        assert!(count("etcd-peer", id) >= 3, "peer certificates of {id}");
    }
    assert!(count("etcd-peer", &id2) == 0);
    // Consensus members also serve curator certificates, renewed the same way.
    for id in [&id0, &id1] {
        assert!(count("curator", id) >= 3, "curator certificates of {id}");
    }
    assert!(count("curator", &id2) == 0);
    assert!(count("owner", "") >= 3, "owner certificates");
    let mut current: BTreeMap<(String, String), u32> = BTreeMap::new();
    for c in &list {
        assert_eq!(c["revoked"], false, "{c}");
        if c["current"] == true {
            *current
                .entry((c["kind"].to_string(), c["node"].to_string()))
                .or_default() += 1;
            assert!(
                c["not_after_unix"].as_u64().unwrap_or(0) > now,
                "current but expired: {c}"
            );
        }
    }
    assert!(current.values().all(|n| *n == 1), "{current:?}");
    assert_eq!(current.len(), 3 + 2 + 2 + 1, "{current:?}");
    assert!(
        list.iter()
            .any(|c| c["not_after_unix"].as_u64().unwrap_or(u64::MAX) < now),
        "expired certificates are listed"
    );
    let (ok, table, err) = cluster.ctl(&["cluster", "certificates"])?;
    assert!(ok, "{err}");
    assert!(
        table.contains("KIND") && table.contains("expired"),
        "{table}"
    );
    println!("{table}");
    Ok(())
}
