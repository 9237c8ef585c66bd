//! The cluster CA replaced online: a 3-member + 2-worker cluster under continuous label
//! writes (polisctl, which follows the rotation on its own) and heartbeats rotates its
//! cluster CA. The curator leader is killed while the new CA is introduced and comes
//! back; the rotation waits for it and finishes. No call fails, no write is lost, no
//! other process restarts, every certificate in use ends under the new CA, and a
//! certificate of the old one is refused afterwards. Then the etcd peer CA is rotated
//! on the same cluster the same way (each member's etcd restarts, polis-node does not).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, TIMEOUT, endpoints};
use proto::api;

/// How long the whole rotation may take, leader failover and restart included.
const ROTATION_BOUND: Duration = Duration::from_secs(180);

fn pem_blocks(path: &std::path::Path) -> Result<Vec<Vec<u8>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(pem::parse_many(text)?
        .into_iter()
        .map(|b| b.into_contents())
        .collect())
}

/// A call to `node` with `credentials`, trusting only `ca` (and its `crl`): whether the
/// curator there took it.
fn call_with(
    node: &Node,
    ca: &[u8],
    crl: &[u8],
    credentials: rpc::Credentials,
) -> Result<std::result::Result<(), String>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let trust = rpc::TrustSlot::new(ca.to_vec());
        trust.offer(crl)?;
        let channel = match rpc::connect(
            SocketAddr::new(node.address, rpc::CURATOR_PORT),
            &rpc::ServerTrust::ClusterCa { trust },
            Some(&credentials),
        )
        .await
        {
            Ok(c) => c,
            Err(e) => return Ok(Err(e.to_string())),
        };
        Ok(api::management_client::ManagementClient::new(channel)
            .get_cluster_info(api::GetClusterInfoRequest {})
            .await
            .map(|_| ())
            .map_err(|s| s.message().to_string()))
    })
}

#[test]
fn the_cluster_ca_rotates_online_through_a_leader_failover() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("nodes")?;
    let (mut n1, id1) = cluster.add_worker("n1", &params)?;
    let (mut n2, id2) = cluster.add_worker("n2", &params)?;
    let (mut w3, id3) = cluster.add_worker("w3", &params)?;
    let (mut w4, _id4) = cluster.add_worker("w4", &params)?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let all = endpoints(&[&cluster.first, &n1, &n2]);
    cluster.wait_members(&all, 3, 0)?;
    n1.wait_for_curator()?;
    n2.wait_for_curator()?;
    // Later commands reach every curator, whichever leads.
    cluster.ctl_retry(&["cluster", "info"])?;

    let config = cluster.config.clone();
    let old_ca = pem_blocks(&config.join("ca.pem"))?.remove(0);
    let old_owner = rpc::Credentials {
        certificate: pem_blocks(&config.join("owner.pem"))?.remove(0),
        key_pkcs8: pem_blocks(&config.join("owner-key.pem"))?.remove(0),
    };
    let before = rotation_json(&config)?;
    assert_eq!(before["phase"], "settled", "{before}");
    // A copy of the configuration that is not used during the whole rotation.
    let idle = dir.path().join("idle-config");
    e2e::copy_config(&config, &idle, &[])?;

    // A node that registers after the rotation with parameters made before it.
    let mut late = cluster.new_node("late")?;
    let mut first = cluster.first;
    let leader_address = first.curator_leader_address()?;
    let mut nodes: Vec<(&str, &mut Node)> = vec![
        ("n0", &mut first),
        ("n1", &mut n1),
        ("n2", &mut n2),
        ("w3", &mut w3),
        ("w4", &mut w4),
    ];
    let leader_index = nodes
        .iter()
        .position(|(_, n)| n.address == leader_address)
        .context("the leader's node")?;
    // Every process that must survive: the others' polis-node, and the other members'
    // etcd (the first three nodes are the members).
    let mut pids = Vec::new();
    for (i, (_, node)) in nodes.iter_mut().enumerate() {
        if i != leader_index {
            pids.push(node.proc().pid());
            if i < 3 {
                pids.push(node.etcd_pid()?);
            }
        }
    }

    // Refused until every node reported the CAs it trusts (its first heartbeat status).
    let deadline = Instant::now() + TIMEOUT;
    let (ok, out, err) = loop {
        let answer = ctl_as(&config, &["cluster", "rotate-ca"])?;
        if answer.0 || !answer.2.contains("has not reported") || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(ok, "rotate-ca: {err}");
    assert!(out.contains("started"), "{out}");
    // The leader dies while the new CA is introduced; it comes back a little later.
    nodes[leader_index].1.proc().signal(libc::SIGKILL);
    nodes[leader_index].1.proc().wait_exit(TIMEOUT)?;
    let killed_at = Instant::now();
    let mut restarted = false;
    // `cluster status` names the running rotation, as the curators that answer follow
    // it; it cannot have settled, the killed node holds it up.
    let (_, out, err) = ctl_as(&config, &["cluster", "status", "-o", "json"])?;
    let status: serde_json::Value = serde_json::from_str(&out)
        .with_context(|| format!("cluster status printed no JSON: {out} {err}"))?;
    assert!(
        status["warnings"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w
                .as_str()
                .unwrap_or_default()
                .contains("CA rotation is running"))),
        "cluster status does not show the rotation: {status}"
    );

    let mut writes = 0u32;
    let mut last_written = None;
    let mut failures = Vec::new();
    let mut phases = Vec::new();
    let started = Instant::now();
    let mut during_failover = Vec::new();
    loop {
        // The killed leader's node comes back once the others had a few seconds without
        // it: the rotation must wait for it, not lock it out.
        if !restarted && killed_at.elapsed() > Duration::from_secs(5) {
            nodes[leader_index].1.start(&[])?;
            nodes[leader_index].1.wait_for_curator()?;
            restarted = true;
        }
        let value = writes + 1;
        let (ok, _, err) = ctl_as(
            &config,
            &["node", "label", &id3, &format!("rotation={value}")],
        )?;
        if ok {
            writes = value;
            last_written = Some(value);
        } else if transient_while_the_leader_is_down(&err, restarted, killed_at) {
            during_failover.push(format!("label write {value}: {err}"));
        } else {
            failures.push(format!("label write {value}: {err}"));
        }
        let state = rotation_json(&config);
        match state {
            Ok(state) => {
                let phase = state["phase"].as_str().unwrap_or_default().to_string();
                if phases.last() != Some(&phase) {
                    println!(
                        "{:?}: phase {phase}, waiting for {}",
                        started.elapsed(),
                        state["waiting_for"]
                    );
                    phases.push(phase.clone());
                }
                if phase == "settled" && restarted {
                    break;
                }
            }
            Err(e) if transient_while_the_leader_is_down(&e.to_string(), restarted, killed_at) => {
                during_failover.push(format!("cluster ca: {e:#}"));
            }
            Err(e) => failures.push(format!("cluster ca: {e:#}")),
        }
        if started.elapsed() > ROTATION_BOUND {
            print_log_lines(&mut nodes, &["cluster CAs", "rotation", "Issuer"]);
            bail!(
                "the rotation did not finish within {ROTATION_BOUND:?}; phases {phases:?}; \
                 failures {:#?}; during the failover {:#?}",
                failures.iter().rev().take(5).collect::<Vec<_>>(),
                during_failover.iter().rev().take(5).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "rotation done in {:?} with {writes} label writes; phases {phases:?}",
        started.elapsed()
    );
    println!(
        "{} calls refused while the killed leader's successor was elected: {during_failover:#?}",
        during_failover.len()
    );
    assert!(failures.is_empty(), "failed calls: {failures:#?}");
    assert!(
        phases.iter().any(|p| p == "reissuing"),
        "never saw the new CA sign: {phases:?}"
    );

    // Every write acknowledged is there.
    let described = ctl_retry_as(&config, &["node", "describe", &id3, "-o", "json"])?;
    let described: serde_json::Value = serde_json::from_str(&described)?;
    assert_eq!(
        described["labels"]["rotation"],
        last_written
            .context("no write was acknowledged")?
            .to_string(),
        "{described}"
    );

    // Every certificate in use is the new CA's: nodes' on disk, the owner's, and the
    // curators' (a client trusting only the new CA reaches each).
    let state = rotation_json(&config)?;
    let trusted = state["trusted_ca_fingerprints"]
        .as_array()
        .context("fingerprints")?;
    assert_eq!(trusted.len(), 1, "{state}");
    let pinned = pem_blocks(&config.join("ca.pem"))?;
    assert_eq!(pinned.len(), 1, "polisctl still pins the old CA");
    let new_ca = pinned[0].clone();
    assert_ne!(new_ca, old_ca);
    assert_eq!(trusted[0], rpc::fingerprint(&new_ca));
    let crl = pem_blocks(&config.join("crl.pem"))?
        .into_iter()
        .find(|crl| pki::verified_crl_number(crl, &new_ca).is_ok())
        .context("the new CA's CRL saved by polisctl")?;
    let owner_now = rpc::Credentials {
        certificate: pem_blocks(&config.join("owner.pem"))?.remove(0),
        key_pkcs8: old_owner.key_pkcs8.clone(),
    };
    assert!(pki::issued_by(&owner_now.certificate, &new_ca));
    for (name, node) in nodes.iter() {
        let cert = std::fs::read(node.root.join("data/node/cert.der"))?;
        assert!(
            pki::issued_by(&cert, &new_ca),
            "{name} uses a certificate of the old CA"
        );
        let trust = pem_blocks(&node.root.join("data/node/trust.pem"))?;
        assert!(
            trust.contains(&new_ca) && !trust.contains(&old_ca),
            "{name}"
        );
    }
    // `cluster certificates`: every certificate in use of the cluster CA (not the etcd
    // peer CA's) is the new CA's.
    let listed = ctl_retry_as(&config, &["cluster", "certificates", "-o", "json"])?;
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    let new_name = x509_parser::parse_x509_certificate(&new_ca)?
        .1
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .context("the new CA's name")?
        .to_string();
    let in_use: Vec<&serde_json::Value> = listed
        .as_array()
        .context("a list")?
        .iter()
        .filter(|c| c["current"] == true && c["kind"] != "etcd-peer")
        .collect();
    assert!(in_use.len() >= 8, "{listed}");
    for c in &in_use {
        assert_eq!(c["issuer"], new_name.as_str(), "{c}");
    }
    for node in [&*nodes[0].1, &*nodes[1].1, &*nodes[2].1] {
        call_with(node, &new_ca, &crl, owner_now.clone())?
            .map_err(|e| anyhow::anyhow!("curator {}: {e}", node.address))?;
    }
    // A backup from each member names the CA that signs now, also from the nodes that
    // joined under the old one (and a configuration pinning the new CA takes it).
    let backups = tempfile::tempdir()?;
    for (name, node) in nodes.iter().take(3) {
        let file = backups.path().join(format!("{name}.polisbackup"));
        let file = file.to_str().context("utf-8 path")?;
        let endpoint = node.address.to_string();
        ctl_retry_as(
            &config,
            &["--endpoints", &endpoint, "cluster", "backup", "--out", file],
        )?;
        let inspected = ctl_retry_as(
            &config,
            &["cluster", "backup", "inspect", file, "-o", "json"],
        )?;
        let inspected: serde_json::Value = serde_json::from_str(&inspected)?;
        assert_eq!(
            inspected["ca_fingerprint"],
            rpc::fingerprint(&new_ca).as_str(),
            "backup from {name}: {inspected}"
        );
    }
    // A configuration idle for longer than a retired CA's handover is followed (180
    // days since a curator last answered it) is refused, saying how to re-pin it.
    let long_idle = dir.path().join("long-idle-config");
    e2e::copy_config(&idle, &long_idle, &[])?;
    let long_ago = pki::unix_now() - 181 * 86_400;
    std::fs::write(long_idle.join("ca-confirmed"), format!("{long_ago}\n"))?;
    let (ok, _, err) = ctl_as(&long_idle, &["cluster", "info"])?;
    assert!(
        !ok,
        "a configuration idle for 181 days must not follow: {err}"
    );
    assert!(
        err.contains("181 days ago") && err.contains("takeownership --ca-fingerprint"),
        "{err}"
    );
    assert_eq!(pem_blocks(&long_idle.join("ca.pem"))?, vec![old_ca.clone()]);
    // The idle configuration follows the old CA's handover to the new one by itself:
    // pinned anew, its owner certificate renewed under the new CA, the command served.
    let (ok, _, err) = ctl_as(&idle, &["cluster", "info"])?;
    assert!(ok, "the idle configuration: {err}");
    assert!(err.contains("handed over to SHA256:"), "{err}");
    assert_eq!(pem_blocks(&idle.join("ca.pem"))?, vec![new_ca.clone()]);
    assert!(pki::issued_by(
        &pem_blocks(&idle.join("owner.pem"))?[0],
        &new_ca
    ));
    // A configuration pinning a CA that handed over to nothing here (another
    // cluster's) is refused, saying what to do.
    let foreign = dir.path().join("foreign-config");
    std::fs::create_dir(&foreign)?;
    std::fs::set_permissions(
        &foreign,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )?;
    for name in ["endpoints", "owner-key.pem", "owner.pem"] {
        std::fs::copy(idle.join(name), foreign.join(name))?;
    }
    let stranger = pki::Ca::generate("Polis Cluster CA", pki::CA_LIFETIME)?;
    std::fs::write(
        foreign.join("ca.pem"),
        pem::encode(&pem::Pem::new("CERTIFICATE", stranger.cert_der.clone())),
    )?;
    let (ok, _, err) = ctl_as(&foreign, &["cluster", "info"])?;
    assert!(!ok, "a configuration pinning another CA was served");
    assert!(
        err.contains("rotated while this configuration was not used")
            && err.contains("takeownership"),
        "{err}"
    );
    // Register parameters made before the rotation pin the retired CA: the node stops
    // saying what to do.
    late.start(&["--params", params.to_str().context("utf-8 path")?])?;
    let status = late.proc().wait_exit(TIMEOUT)?;
    assert_eq!(status.code(), Some(1));
    let output = late.proc().output();
    assert!(
        output.contains("parameters made before a CA rotation"),
        "{output}"
    );
    // Nothing else restarted.
    for pid in &pids {
        assert!(e2e::process_alive(*pid), "process {pid} is gone");
    }
    for (name, node) in nodes.iter_mut() {
        let log = node.proc().output();
        for trouble in [
            "heartbeat failed",
            "certificate has expired",
            "UnknownIssuer",
        ] {
            // Not a refusal: the listener closing, at the old CA's retirement, the
            // connections its certificates opened (`rpc::server::sweep`).
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains(trouble) && !l.contains("rpc::server::sweep"))
                .collect();
            assert!(lines.is_empty(), "{name} logged {trouble:?}: {lines:#?}");
        }
    }
    // A certificate of the old CA is refused (after the logs were checked: the refusal
    // is logged).
    let refused = call_with(&*nodes[0].1, &new_ca, &crl, old_owner)?;
    assert!(
        refused.is_err(),
        "the old CA's owner certificate was accepted"
    );
    println!("the old owner certificate: {refused:?}");
    let _ = (id1, id2);
    rotate_the_etcd_peer_ca(&config, &mut nodes, &id3)
}

/// Whether the etcd peer port of `node` answers a request presenting the peer
/// certificate in `cert` (PEM file) with `key`, checking etcd's own certificate against
/// `node`'s peer trust file.
fn peer_accepts(node: &Node, cert: &std::path::Path, key: &std::path::Path) -> Result<bool> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(e2e::peer_accepts(
        SocketAddr::new(node.address, consensus::config::PEER_PORT),
        &node.root.join("data/etcd/peer/ca.pem"),
        cert,
        key,
    ))
}

/// The etcd peer CA replaced online on the same cluster, label writes going on: each
/// member's etcd restarts to load the new CA and again to drop the old one, one member
/// at a time, while every polis-node keeps running. Every member presents a peer
/// certificate of the new CA at the end, and a peer certificate of the old CA is refused.
fn rotate_the_etcd_peer_ca(
    config: &std::path::Path,
    nodes: &mut [(&str, &mut Node)],
    labelled: &str,
) -> Result<()> {
    let peer_dir = |node: &Node| node.root.join("data/etcd/peer");
    let old_peer_ca = pem_blocks(&peer_dir(nodes[0].1).join("ca.pem"))?.remove(0);
    // A copy of a member's peer certificate of the old CA, taken before the rotation.
    let kept = tempfile::tempdir()?;
    let (old_peer_cert, peer_key) = (
        kept.path().join("cert.pem"),
        peer_dir(nodes[1].1).join("key.pem"),
    );
    std::fs::copy(peer_dir(nodes[1].1).join("cert.pem"), &old_peer_cert)?;
    assert!(
        peer_accepts(nodes[0].1, &old_peer_cert, &peer_key)?,
        "the peer port refused a current peer certificate"
    );
    let before = ctl_retry_as(config, &["cluster", "ca", "--etcd-peer", "-o", "json"])?;
    let before: serde_json::Value = serde_json::from_str(&before)?;
    assert_eq!(before["phase"], "settled", "{before}");
    assert_eq!(
        before["trusted_ca_fingerprints"][0],
        rpc::fingerprint(&old_peer_ca).as_str(),
        "{before}"
    );

    // A member that does not answer: refused (every other member's etcd restarts, which
    // would cost the quorum), and never forced.
    let leader = nodes[0].1.curator_leader_address()?;
    let victim = (0..3)
        .find(|&i| nodes[i].1.address != leader)
        .context("a member that does not lead")?;
    nodes[victim].1.proc = None; // SIGKILL; its etcd follows
    let victim_curator = SocketAddr::new(nodes[victim].1.address, rpc::CURATOR_PORT).to_string();
    e2e::wait_until("cluster status to miss the stopped member", TIMEOUT, || {
        ctl_as(config, &["cluster", "status", "-o", "json"]).is_ok_and(|(_, out, _)| {
            serde_json::from_str::<serde_json::Value>(&out).is_ok_and(|s| {
                s["unreachable"].as_array().is_some_and(|u| {
                    u.iter()
                        .any(|e| e.as_str().unwrap_or_default().contains(&victim_curator))
                })
            })
        })
    })?;
    let (ok, _, refusal) = ctl_as(config, &["cluster", "rotate-ca", "--etcd-peer"])?;
    assert!(!ok, "rotate-ca --etcd-peer started with a member down");
    assert!(
        refusal.contains("does not answer") && refusal.contains("cost the quorum"),
        "{refusal}"
    );
    let (ok, _, err) = ctl_as(config, &["cluster", "rotate-ca", "--etcd-peer", "--force"])?;
    assert!(!ok && err.contains("--force"), "{err}");
    nodes[victim].1.start(&[])?;
    nodes[victim].1.wait_for_curator()?;

    let node_pids: Vec<i32> = nodes.iter_mut().map(|(_, n)| n.proc().pid()).collect();
    let mut etcd_pids = Vec::new();
    for (_, node) in nodes.iter_mut().take(3) {
        etcd_pids.push(node.etcd_pid()?);
    }
    let deadline = Instant::now() + TIMEOUT;
    let (ok, out, err) = loop {
        let answer = ctl_as(config, &["cluster", "rotate-ca", "--etcd-peer"])?;
        if answer.0 || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(ok, "rotate-ca --etcd-peer: {err}");
    assert!(out.contains("started"), "{out}");

    // The same member is killed as it restarts its own etcd, holding the restart key,
    // and comes back 5 s later: it gives the key back at once (the others do not wait
    // for the key's lease), the rotation waits for it and finishes.
    let mut stopped_at: Option<Instant> = None;
    let mut killed_holding_key = false;
    let mut came_back = false;
    let started = Instant::now();
    let (mut writes, mut last_written) = (0u32, None);
    let mut failures = Vec::new();
    let mut phases: Vec<String> = Vec::new();
    let mut saw_status_line = false;
    loop {
        if stopped_at.is_none()
            && nodes[victim]
                .1
                .proc()
                .output()
                .contains("restarting etcd: it loads changed etcd peer CAs only at start")
        {
            // Holding the key for sure when its restart had not finished.
            killed_holding_key = !nodes[victim]
                .1
                .proc()
                .output()
                .contains("etcd restarted with the cluster's etcd peer CAs");
            nodes[victim].1.proc = None;
            stopped_at = Some(Instant::now());
            println!(
                "{:?}: member {} stopped (holding the restart key: {killed_holding_key})",
                started.elapsed(),
                nodes[victim].0
            );
        }
        if !came_back && stopped_at.is_some_and(|t| t.elapsed() > Duration::from_secs(5)) {
            nodes[victim].1.start(&[])?;
            nodes[victim].1.wait_for_curator()?;
            came_back = true;
            let log = nodes[victim].1.proc().output();
            let deadline = Instant::now() + TIMEOUT;
            while killed_holding_key
                && !nodes[victim]
                    .1
                    .proc()
                    .output()
                    .contains("gave back the etcd restart key an earlier run held")
            {
                if Instant::now() > deadline {
                    bail!(
                        "the member killed while restarting its etcd never gave the key back: {log}"
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            println!(
                "{:?}: member {} is back",
                started.elapsed(),
                nodes[victim].0
            );
        }
        let value = writes + 1;
        let (ok, _, err) = ctl_as(
            config,
            &["node", "label", labelled, &format!("peer-rotation={value}")],
        )?;
        if ok {
            writes = value;
            last_written = Some(value);
        } else {
            failures.push(format!("label write {value}: {err}"));
        }
        if !saw_status_line {
            let (_, out, _) = ctl_as(config, &["cluster", "status", "-o", "json"])?;
            saw_status_line = out.contains("an etcd peer CA rotation is running");
        }
        match ctl_as(config, &["cluster", "ca", "--etcd-peer", "-o", "json"]) {
            Ok((true, out, _)) => {
                let state: serde_json::Value = serde_json::from_str(&out)?;
                let phase = state["phase"].as_str().unwrap_or_default().to_string();
                let waiting = state["waiting_for"].as_array().map_or(0, Vec::len);
                let shown = format!("{phase} ({waiting} waiting)");
                if phases.last() != Some(&shown) {
                    println!(
                        "{:?}: peer CA phase {phase}, waiting for {}",
                        started.elapsed(),
                        state["waiting_for"]
                    );
                    phases.push(shown);
                }
                if phase == "settled"
                    && waiting == 0
                    && came_back
                    && phases.iter().any(|p| p.starts_with("reissuing"))
                {
                    break;
                }
            }
            Ok((false, _, err)) => failures.push(format!("cluster ca --etcd-peer: {err}")),
            Err(e) => failures.push(format!("cluster ca --etcd-peer: {e:#}")),
        }
        if started.elapsed() > ROTATION_BOUND {
            print_log_lines(nodes, &["peertrust", "peer CA", "restart"]);
            bail!(
                "the etcd peer CA rotation did not finish within {ROTATION_BOUND:?}; phases \
                 {phases:?}; failures {:#?}",
                failures.iter().rev().take(5).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "etcd peer CA rotation done in {:?} with {writes} label writes; phases {phases:?}",
        started.elapsed()
    );
    assert!(failures.is_empty(), "failed calls: {failures:#?}");
    assert!(
        saw_status_line,
        "cluster status never named the etcd peer CA rotation"
    );
    let described = ctl_retry_as(config, &["node", "describe", labelled, "-o", "json"])?;
    let described: serde_json::Value = serde_json::from_str(&described)?;
    assert_eq!(
        described["labels"]["peer-rotation"],
        last_written
            .context("no write was acknowledged")?
            .to_string(),
        "{described}"
    );

    // Every member trusts only the new peer CA and presents a certificate of it.
    let after = ctl_retry_as(config, &["cluster", "ca", "--etcd-peer", "-o", "json"])?;
    let after: serde_json::Value = serde_json::from_str(&after)?;
    let trusted = after["trusted_ca_fingerprints"]
        .as_array()
        .context("fingerprints")?;
    assert_eq!(trusted.len(), 1, "{after}");
    let new_peer_ca = pem_blocks(&peer_dir(nodes[0].1).join("ca.pem"))?;
    assert_eq!(
        new_peer_ca.len(),
        1,
        "the trust file still names the old peer CA"
    );
    let new_peer_ca = new_peer_ca[0].clone();
    assert_ne!(new_peer_ca, old_peer_ca);
    assert_eq!(trusted[0], rpc::fingerprint(&new_peer_ca).as_str());
    for (name, node) in nodes.iter().take(3) {
        assert_eq!(
            pem_blocks(&peer_dir(node).join("ca.pem"))?,
            vec![new_peer_ca.clone()],
            "{name}"
        );
        let cert = pem_blocks(&peer_dir(node).join("cert.pem"))?.remove(0);
        assert!(
            pki::issued_by(&cert, &new_peer_ca),
            "{name} presents a peer certificate of the old CA"
        );
    }
    let listed = ctl_retry_as(config, &["cluster", "certificates", "-o", "json"])?;
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    let current_peer: Vec<&serde_json::Value> = listed
        .as_array()
        .context("a list")?
        .iter()
        .filter(|c| c["current"] == true && c["kind"] == "etcd-peer")
        .collect();
    assert!(current_peer.len() >= 3, "{listed}");
    for c in &current_peer {
        assert!(
            c["issuer"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Polis etcd Peer CA (from"),
            "{c}"
        );
    }
    // The old peer certificate was revoked when its CA retired: what keeps it out of a
    // member's etcd that still holds the old CA in memory until its second restart (the
    // refusal below would hold without it once every etcd dropped the old CA).
    let old_serial: String = pki::certificate_serial(&pem_blocks(&old_peer_cert)?[0])?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let old_listed = listed
        .as_array()
        .context("a list")?
        .iter()
        .find(|c| c["serial"] == old_serial.as_str())
        .with_context(|| format!("old peer certificate {old_serial} not listed: {listed}"))?;
    assert_eq!(old_listed["revoked"], true, "{old_listed}");
    // The old peer certificate is refused, a new one is taken.
    let new_peer_cert = peer_dir(nodes[1].1).join("cert.pem");
    for (name, node) in nodes.iter().take(3) {
        assert!(
            !peer_accepts(node, &old_peer_cert, &peer_key)?,
            "{name}'s etcd took the old peer certificate"
        );
        assert!(
            peer_accepts(node, &new_peer_cert, &peer_key)?,
            "{name}'s etcd refused the new peer certificate"
        );
    }
    // Every other polis-node kept running; each member's etcd was restarted (etcd 3.4
    // loads its peer CAs only at start).
    for (i, ((name, node), pid)) in nodes.iter_mut().zip(&node_pids).enumerate() {
        if i != victim {
            assert_eq!(node.proc().pid(), *pid, "{name}");
            assert!(e2e::process_alive(*pid), "{name}'s polis-node is gone");
        }
    }
    for ((name, node), pid) in nodes.iter_mut().take(3).zip(&etcd_pids) {
        assert_ne!(node.etcd_pid()?, *pid, "{name}'s etcd never restarted");
    }
    Ok(())
}

/// Prints each node's log lines that contain one of `needles` (a rotation overran).
fn print_log_lines(nodes: &mut [(&str, &mut Node)], needles: &[&str]) {
    for (name, node) in nodes.iter_mut() {
        let log = node.proc().output();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| needles.iter().any(|n| l.contains(n)))
            .collect();
        println!("{name}: {lines:#?}");
    }
}

/// Failures a client sees while the killed leader's successor is being elected (a few
/// seconds after the kill, before its node is back): retried by any client, not lost.
fn transient_while_the_leader_is_down(err: &str, restarted: bool, killed_at: Instant) -> bool {
    !restarted
        && killed_at.elapsed() < Duration::from_secs(30)
        && (err.contains("unavailable") || err.contains("reach") || err.contains("leader"))
}

fn ctl_as(config: &std::path::Path, args: &[&str]) -> Result<(bool, String, String)> {
    let mut all = vec!["--config", config.to_str().context("utf-8 path")?];
    all.extend_from_slice(args);
    let (status, out, err) = e2e::polisctl(&all)?;
    Ok((status.success(), out, err))
}

fn ctl_retry_as(config: &std::path::Path, args: &[&str]) -> Result<String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (ok, out, err) = ctl_as(config, args)?;
        if ok {
            return Ok(out);
        }
        if Instant::now() > deadline {
            bail!("polisctl {args:?} failed: {err}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn rotation_json(config: &std::path::Path) -> Result<serde_json::Value> {
    let (ok, out, err) = ctl_as(config, &["cluster", "ca", "-o", "json"])?;
    if !ok {
        bail!("{err}");
    }
    Ok(serde_json::from_str(&out)?)
}
