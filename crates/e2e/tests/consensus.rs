//! A highly available control plane, with real polis-node processes and real etcd on
//! 127.x addresses: consensus members added live (two at once), any curator serving
//! every call (forwarding with the trust rule), a quorum-losing removal refused, leader
//! failover, a worker finding a curator from its directory, a cold start of the whole
//! control plane, and a removal that revokes the member's peer certificate.
//!
//! One cluster for the whole file: the phases build on each other, as an operator's
//! day would.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, TIMEOUT, endpoints, peer_accepts, pem_der};
use proto::api;

fn endpoint(node: &Node) -> String {
    node.address.to_string()
}

/// The owner's credentials and the pinned CA from the cluster's polisctl config.
fn owner(cluster: &Cluster) -> Result<(rpc::ServerTrust, rpc::Credentials)> {
    let key = identity::NodeKey::from_pkcs8(&pem_der(&cluster.config.join("owner-key.pem"))?)?;
    Ok((
        rpc::ServerTrust::PinnedCa(pem_der(&cluster.config.join("ca.pem"))?),
        rpc::Credentials {
            certificate: pem_der(&cluster.config.join("owner.pem"))?,
            key_pkcs8: key.pkcs8_der().to_vec(),
        },
    ))
}

/// A node's own certificate and key (what its curator and heartbeats use).
fn node_credentials(node: &Node) -> Result<rpc::Credentials> {
    Ok(rpc::Credentials {
        certificate: std::fs::read(node.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(node.root.join("data/node/key.der"))?,
    })
}

async fn list_nodes(
    at: &Node,
    trust: &rpc::ServerTrust,
    credentials: &rpc::Credentials,
    forwarded: Option<&str>,
) -> std::result::Result<usize, tonic::Status> {
    let endpoint = SocketAddr::new(at.address, rpc::CURATOR_PORT);
    let channel = rpc::connect(endpoint, trust, Some(credentials))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(api::ListNodesRequest::default());
    if let Some(identity) = forwarded {
        request.metadata_mut().insert(
            rpc::forward::FORWARDED_IDENTITY,
            identity.parse().expect("ascii"),
        );
    }
    api::management_client::ManagementClient::new(channel)
        .list_nodes(request)
        .await
        .map(|r| r.into_inner().nodes.len())
}

/// The node whose curator leads, asked through any of `candidates`.
fn leader_of<'a>(cluster: &Cluster, candidates: &[&'a Node]) -> Result<&'a Node> {
    cluster.wait_members(&endpoints(candidates), 3, 0)?;
    // The etcd leader and the curator leader may differ: ask a curator.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let first = candidates[0];
    let channel = runtime.block_on(rpc::connect(
        SocketAddr::new(first.address, rpc::CURATOR_PORT),
        &rpc::ServerTrust::FirstUse,
        None,
    ))?;
    let answer = runtime.block_on(
        api::curator_local_client::CuratorLocalClient::new(channel)
            .get_current_leader(api::GetCurrentLeaderRequest {}),
    )?;
    let leader_endpoint: SocketAddr = answer.into_inner().leader_endpoint.parse()?;
    candidates
        .iter()
        .find(|n| n.address == leader_endpoint.ip())
        .copied()
        .context("the curator leader is one of the candidates")
}

#[test]
fn control_plane_grows_fails_over_restarts_and_shrinks() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("workers")?;
    let (mut w1, id1) = cluster.add_worker("w1", &params)?;
    let (mut w2, id2) = cluster.add_worker("w2", &params)?;
    let (mut w3, id3) = cluster.add_worker("w3", &params)?;
    let (w4, _) = cluster.add_worker("w4", &params)?;

    // Two consensus members at once: etcd takes one learner at a time, both finish.
    let started = Instant::now();
    let adders: Vec<_> = [id1.clone(), id2.clone()]
        .into_iter()
        .map(|id| {
            let config = cluster.config.clone();
            std::thread::spawn(move || {
                e2e::polisctl(&[
                    "--config",
                    config.to_str().expect("utf-8"),
                    "node",
                    "add-role",
                    &id,
                    "ConsensusMember",
                ])
            })
        })
        .collect();
    for adder in adders {
        let (status, _, err) = adder.join().expect("adder thread")?;
        assert!(status.success(), "add-role: {err}");
    }
    let n0 = &cluster.first;
    let all = endpoints(&[n0, &w1, &w2]);
    cluster.wait_members(&all, 3, 0)?;
    println!("two members added and promoted in {:?}", started.elapsed());
    for node in [&mut w1, &mut w2] {
        node.wait_for_curator()?;
        assert!(node.root.join("data/etcd/member.pb").exists());
    }
    let nodes = cluster.nodes()?;
    let members = |id: &str| {
        nodes.iter().any(|n| {
            n["id"] == id
                && n["roles"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r == "ConsensusMember"))
        })
    };
    assert!(members(&id1) && members(&id2) && !members(&id3));

    // Any curator serves every call: a follower forwards to the leader.
    let (trust, owner_credentials) = owner(&cluster)?;
    let leader = leader_of(&cluster, &[n0, &w1, &w2])?;
    let leader_address = leader.address;
    let follower = [n0, &w1, &w2]
        .into_iter()
        .find(|n| n.address != leader_address)
        .context("a follower")?;
    let listed = runtime
        .block_on(list_nodes(follower, &trust, &owner_credentials, None))
        .map_err(|s| anyhow::anyhow!("ListNodes through a follower: {s:?}"))?;
    assert_eq!(listed, 5);
    // The trust rule: only a consensus member's certificate may forward an identity.
    let owner_identity = rpc::forward::encode_identity(&rpc::Identity::User {
        name: "owner".into(),
        public_key: vec![0; 32],
    })
    .expect("encodable");
    let forged_by_worker = runtime.block_on(list_nodes(
        leader,
        &trust,
        &node_credentials(&w3)?,
        Some(&owner_identity),
    ));
    assert_eq!(
        forged_by_worker.map_err(|s| s.code()),
        Err(tonic::Code::PermissionDenied),
        "a worker cannot forward an identity"
    );
    let forged_by_owner = runtime.block_on(list_nodes(
        leader,
        &trust,
        &owner_credentials,
        Some(&owner_identity),
    ));
    assert_eq!(
        forged_by_owner.map_err(|s| s.code()),
        Err(tonic::Code::PermissionDenied),
        "an owner cannot forward an identity"
    );
    let by_curator = runtime.block_on(list_nodes(
        leader,
        &trust,
        &node_credentials(follower)?,
        Some(&owner_identity),
    ));
    assert_eq!(
        by_curator.ok(),
        Some(5),
        "a curator's node forwards the owner"
    );

    // A removal that would lose the quorum is refused: one of three voters is down.
    let down = [&mut w1, &mut w2]
        .into_iter()
        .find(|n| n.address != leader_address)
        .context("a non-leader worker member")?;
    let down_id = down.key_node_id()?;
    // Health for quorum planning is asked of each member's curator: a dead one does not
    // answer, right away (no heartbeat timeout to wait out).
    down.proc().signal(libc::SIGKILL);
    down.proc().wait_exit(TIMEOUT)?;
    let other = [&id1, &id2]
        .into_iter()
        .find(|id| **id != down_id)
        .context("the other member")?;
    let (ok, _, err) = cluster.ctl(&["node", "remove-role", other, "ConsensusMember"])?;
    assert!(!ok && err.contains("quorum"), "{err}");
    down.start(&[])?;
    down.wait_for_curator()?;
    cluster.wait_members(&all, 3, 0)?;
    let _ = n0;

    // Failover: kill -9 the curator leader's node; Management answers through the others.
    let leader_address = leader_of(&cluster, &[&cluster.first, &w1, &w2])?.address;
    let mut first = cluster.first;
    let killed: &mut Node = [&mut first, &mut w1, &mut w2]
        .into_iter()
        .find(|n| n.address == leader_address)
        .context("the leader's node")?;
    killed.proc().signal(libc::SIGKILL);
    let killed_at = Instant::now();
    let survivors: Vec<String> = [first.address, w1.address, w2.address]
        .iter()
        .filter(|a| **a != leader_address)
        .map(|a| a.to_string())
        .collect();
    let survivors = survivors.join(",");
    loop {
        let (ok, _, _) = cluster_ctl(
            &cluster.config,
            &["--endpoints", &survivors, "node", "list"],
        )?;
        if ok {
            break;
        }
        assert!(
            killed_at.elapsed() < TIMEOUT,
            "Management never served again"
        );
    }
    println!(
        "failover: Management served again {:?} after kill -9 of the leader",
        killed_at.elapsed()
    );
    let killed: &mut Node = [&mut first, &mut w1, &mut w2]
        .into_iter()
        .find(|n| n.address == leader_address)
        .context("the leader's node")?;
    killed.proc().wait_exit(TIMEOUT)?;
    killed.start(&[])?;
    killed.wait_for_curator()?;
    let all = endpoints(&[&first, &w1, &w2]);
    cluster_wait_members(&cluster.config, &all, 3)?;

    // A worker whose only configured curator is gone finds another in its directory.
    w3.proc().signal(libc::SIGTERM);
    w3.proc().wait_exit(TIMEOUT)?;
    first.proc().signal(libc::SIGTERM);
    first.proc().wait_exit(TIMEOUT)?;
    let params_curators = read_register_curators(&params)?;
    assert_eq!(params_curators, vec![format!("{}:7835", first.address)]);
    w3.start(&[])?;
    w3.wait_home()?;
    // Home for a worker means a curator answered its WatchNode: it found one of the
    // others in its directory (the parameters name only the stopped first node).
    let directory: proto::config::ClusterDirectory = {
        use prost::Message;
        Message::decode(std::fs::read(w3.root.join("esp/directory.pb"))?.as_slice())?
    };
    assert!(
        directory
            .curator_endpoints
            .iter()
            .any(|e| !params_curators.contains(e)),
        "the directory names curators beyond the parameters: {directory:?}"
    );
    first.start(&[])?;
    first.wait_for_curator()?;
    cluster_wait_members(&cluster.config, &all, 3)?;

    // Cold start: stop all three members, start all three: Home and serving.
    for node in [&mut first, &mut w1, &mut w2] {
        node.proc().signal(libc::SIGTERM);
    }
    for node in [&mut first, &mut w1, &mut w2] {
        let status = node.proc().wait_exit(TIMEOUT)?;
        assert!(status.success(), "SIGTERM stops a member cleanly: {status}");
    }
    for node in [&mut first, &mut w1, &mut w2] {
        node.start(&[])?;
    }
    for node in [&mut first, &mut w1, &mut w2] {
        node.wait_home()?;
    }
    cluster_wait_members(&cluster.config, &all, 3)?;
    let (ok, out, err) = cluster_ctl(&cluster.config, &["--endpoints", &all, "node", "list"])?;
    assert!(ok, "{out}{err}");

    // Remove a member: 2 voters, its etcd data gone, its peer certificate refused.
    let removed = &mut w2;
    let removed_id = removed.key_node_id()?;
    let saved = dir.path().join("removed-peer");
    std::fs::create_dir_all(&saved)?;
    for f in ["cert.pem", "key.pem", "ca.pem"] {
        std::fs::copy(removed.root.join("data/etcd/peer").join(f), saved.join(f))?;
    }
    let peer = SocketAddr::new(w1.address, consensus::config::PEER_PORT);
    assert!(
        runtime.block_on(peer_accepts(
            peer,
            &saved.join("ca.pem"),
            &saved.join("cert.pem"),
            &saved.join("key.pem")
        ))?,
        "before removal, the member's peer certificate is accepted"
    );
    let (ok, out, err) = cluster_ctl(
        &cluster.config,
        &[
            "--endpoints",
            &all,
            "node",
            "remove-role",
            &removed_id,
            "ConsensusMember",
        ],
    )?;
    assert!(ok, "{out}{err}");
    let two = endpoints(&[&first, &w1]);
    wait_voters_and_data_gone(&cluster.config, &two, 2, &removed.root)?;
    removed
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("left consensus"))?;
    // The CRL reaches the remaining members' peer CRL files; etcd then refuses the
    // removed member's certificate on every new connection.
    let deadline = Instant::now() + TIMEOUT;
    while runtime.block_on(peer_accepts(
        peer,
        &saved.join("ca.pem"),
        &saved.join("cert.pem"),
        &saved.join("key.pem"),
    ))? {
        assert!(
            Instant::now() < deadline,
            "the revoked peer certificate is still accepted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let own = w1.root.join("data/etcd/peer");
    assert!(
        runtime.block_on(peer_accepts(
            peer,
            &own.join("ca.pem"),
            &own.join("cert.pem"),
            &own.join("key.pem")
        ))?,
        "a member's own peer certificate is still accepted"
    );

    // 2 → 1: the departing member still votes its own removal through.
    let w1_id = w1.key_node_id()?;
    let first_id = first.key_node_id()?;
    // If w1 leads, it hands leadership over and answers Unavailable; the election that
    // follows can outlast polisctl's own retries, so the operator's "retry" is done here.
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (ok, out, err) = cluster_ctl(
            &cluster.config,
            &[
                "--endpoints",
                &two,
                "node",
                "remove-role",
                &w1_id,
                "ConsensusMember",
            ],
        )?;
        if ok {
            break;
        }
        assert!(
            err.contains("unavailable") && Instant::now() < deadline,
            "{out}{err}"
        );
    }
    let only = endpoint(&first);
    wait_voters_and_data_gone(&cluster.config, &only, 1, &w1.root)?;
    // The last voter cannot leave.
    let (ok, _, err) = cluster_ctl(
        &cluster.config,
        &[
            "--endpoints",
            &only,
            "node",
            "remove-role",
            &first_id,
            "ConsensusMember",
        ],
    )?;
    assert!(!ok && err.contains("last voting member"), "{err}");
    let _ = (w4, id1);
    Ok(())
}

fn cluster_ctl(config: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    let mut all = vec!["--config", config.to_str().context("utf-8")?];
    all.extend_from_slice(args);
    let (status, out, err) = e2e::polisctl(&all)?;
    Ok((status.success(), out, err))
}

/// Waits until `voters` answering voters remain and the removed node's etcd data is gone.
fn wait_voters_and_data_gone(
    config: &Path,
    endpoints: &str,
    voters: usize,
    removed_root: &Path,
) -> Result<()> {
    cluster_wait_members(config, endpoints, voters)?;
    let data = removed_root.join("data/etcd/data");
    e2e::wait_until("the removed member's etcd data gone", TIMEOUT, || {
        !data.exists()
    })
    .with_context(|| {
        // The removed node's own account of it: its latest log.
        let logs = removed_root.parent().map(|d| d.join("node-1.log"));
        let mut newest = None;
        if let Some(dir) = removed_root.parent() {
            for n in 1..20 {
                let log = dir.join(format!("node-{n}.log"));
                if log.exists() {
                    newest = Some(log);
                }
            }
        }
        let text = newest
            .or(logs)
            .and_then(|l| std::fs::read_to_string(l).ok())
            .unwrap_or_default();
        let own: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains("\"target\":\"etcd\""))
            .collect();
        let tail = &own[own.len().saturating_sub(40)..];
        format!(
            "the removed node's log ends (etcd's own lines left out):\n{}",
            tail.join("\n")
        )
    })
}

fn cluster_wait_members(config: &Path, endpoints: &str, voters: usize) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let (ok, out, _) = cluster_ctl(
            config,
            &["--endpoints", endpoints, "cluster", "status", "-o", "json"],
        )?;
        let status: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let members = status["members"].as_array().cloned().unwrap_or_default();
        if ok
            && members.len() == voters
            && members
                .iter()
                .all(|m| m["role"] == "voter" && m["answered"] == true)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("never saw {voters} answering voters: {out}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_register_curators(path: &Path) -> Result<Vec<String>> {
    use prost::Message;
    let params = proto::config::NodeParameters::decode(std::fs::read(path)?.as_slice())?;
    match params.cluster {
        Some(proto::config::node_parameters::Cluster::Register(r)) => Ok(r.curator_endpoints),
        other => bail!("not register parameters: {other:?}"),
    }
}
