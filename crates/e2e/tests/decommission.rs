//! The end of a node's life, with real polis-node processes and real etcd on 127.x
//! addresses: decommissioning a worker and a consensus member of a 3-member control
//! plane (each ends DECOMMISSIONED, wiped, exited 0, its old certificates refused by the
//! curator and by etcd peers), a quorum-losing decommission refused, a node decommissioned
//! while down refused when it comes back, deletion rules, and decommissioned or deleted
//! keys refused when they register again.
//!
//! One cluster for the whole file: the phases build on each other.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use e2e::{Cluster, Impostor, Node, TIMEOUT, endpoints, peer_accepts};
use proto::api;

/// Copies of a node's credentials, taken before the decommission wipes them.
struct Saved {
    dir: PathBuf,
}

impl Saved {
    fn take(node: &Node, into: &Path) -> Result<Saved> {
        std::fs::create_dir_all(into)?;
        for (from, to) in [
            ("data/node/key.der", "key.der"),
            ("data/node/cert.der", "cert.der"),
            ("data/node/ca.der", "ca.der"),
        ] {
            std::fs::copy(node.root.join(from), into.join(to))
                .with_context(|| format!("copying {}", node.root.join(from).display()))?;
        }
        let peer = node.root.join("data/etcd/peer");
        if peer.join("cert.pem").is_file() {
            for file in ["ca.pem", "cert.pem", "key.pem"] {
                std::fs::copy(peer.join(file), into.join(format!("peer-{file}")))
                    .with_context(|| format!("copying {}", peer.join(file).display()))?;
            }
        }
        Ok(Saved {
            dir: into.to_path_buf(),
        })
    }

    fn credentials(&self) -> Result<rpc::Credentials> {
        Ok(rpc::Credentials {
            certificate: std::fs::read(self.dir.join("cert.der"))?,
            key_pkcs8: std::fs::read(self.dir.join("key.der"))?,
        })
    }

    /// Whether etcd's peer port at `peer` accepts this node's old peer certificate.
    async fn peer_accepted(&self, peer: SocketAddr) -> Result<bool> {
        peer_accepts(
            peer,
            &self.dir.join("peer-ca.pem"),
            &self.dir.join("peer-cert.pem"),
            &self.dir.join("peer-key.pem"),
        )
        .await
    }
}

/// A heartbeat with `credentials` straight to the curator at `at`.
async fn heartbeat(at: &Node, ca: &[u8], credentials: &rpc::Credentials) -> Result<tonic::Status> {
    let channel = rpc::connect(
        SocketAddr::new(at.address, rpc::CURATOR_PORT),
        &rpc::ServerTrust::PinnedCa(ca.to_vec()),
        Some(credentials),
    )
    .await?;
    match api::curator_client::CuratorClient::new(channel)
        .heartbeat(api::HeartbeatRequest::default())
        .await
    {
        Ok(_) => Ok(tonic::Status::ok("")),
        Err(s) => Ok(s),
    }
}

fn listed_state(cluster: &Cluster, id: &str) -> Result<String> {
    let node = cluster.node(id)?.context("the node is listed")?;
    Ok(node["state"].as_str().unwrap_or_default().to_string())
}

/// A fresh root holding only `key` (as an interrupted registration leaves it), started
/// with register `params`: the node registers with that key.
fn register_with_key(cluster: &Cluster, name: &str, key: &Path, params: &Path) -> Result<Node> {
    let mut node = cluster.new_node(name)?;
    let node_dir = node.root.join("data/node");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&node_dir)?;
    for dir in [&node.root, &node.root.join("data")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let target = node_dir.join("key.der");
    std::fs::copy(key, &target)?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600))?;
    node.start(&["--params", params.to_str().context("utf-8 path")?])?;
    Ok(node)
}

#[test]
fn nodes_leave_the_cluster_for_good() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("workers")?;
    let (mut m1, id_m1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id_m2) = cluster.add_worker("m2", &params)?;
    let (mut worker, id_worker) = cluster.add_worker("worker", &params)?;
    let (mut sleeper, id_sleeper) = cluster.add_worker("sleeper", &params)?;
    for id in [&id_m1, &id_m2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    let n0 = &cluster.first;
    cluster.wait_members(&endpoints(&[n0, &m1, &m2]), 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;
    let ca = std::fs::read(n0.root.join("data/node/ca.der"))?;

    // An UP node is not deleted: it must be decommissioned first.
    let (ok, _, err) = cluster.ctl(&["node", "delete", &id_worker])?;
    assert!(!ok && err.contains("decommission it first"), "{err}");
    assert_eq!(listed_state(&cluster, &id_worker)?, "UP");

    // A decommission that would cost the quorum is refused up front: with m2 down,
    // removing m1 would leave one healthy voter of two.
    m2.proc().signal(libc::SIGKILL);
    m2.proc().wait_exit(TIMEOUT)?;
    let (ok, _, err) = cluster.ctl(&["node", "decommission", &id_m1])?;
    assert!(!ok && err.contains("quorum"), "{err}");
    assert_eq!(listed_state(&cluster, &id_m1)?, "UP");
    m2.start(&[])?;
    m2.wait_for_curator()?;
    cluster.wait_members(&endpoints(&[n0, &m1, &m2]), 3, 0)?;

    // A worker: DECOMMISSIONED, its process exits 0 saying so, its data is wiped.
    let saved_worker = Saved::take(&worker, &dir.path().join("saved-worker"))?;
    let out = cluster.ctl_retry(&["node", "decommission", &id_worker])?;
    assert!(out.contains("DECOMMISSIONED"), "{out}");
    let status = worker.proc().wait_exit(TIMEOUT)?;
    assert!(
        status.success(),
        "the decommissioned worker exits 0: {status:?}"
    );
    assert!(
        worker.proc().output().contains("left its cluster"),
        "{}",
        worker.proc().output()
    );
    assert!(!worker.root.join("data").exists(), "data/ is wiped");
    assert!(!worker.root.join("esp/sealed_configuration.pb").exists());
    assert_eq!(listed_state(&cluster, &id_worker)?, "DECOMMISSIONED");
    // Its node certificate is refused by the curator, as revoked.
    let refused = runtime.block_on(heartbeat(n0, &ca, &saved_worker.credentials()?))?;
    assert!(rpc::is_revoked(&refused), "{refused:?}");
    // Started again, the wiped root refuses and says why.
    worker.start(&[])?;
    let status = worker.proc().wait_exit(TIMEOUT)?;
    assert!(!status.success());
    assert!(
        worker.proc().output().contains("was decommissioned"),
        "{}",
        worker.proc().output()
    );

    // A consensus member: out of etcd (2 voters left), DECOMMISSIONED, wiped; its old
    // peer certificate is refused by the remaining etcd members.
    let saved_m2 = Saved::take(&m2, &dir.path().join("saved-m2"))?;
    let n0_peer = SocketAddr::new(n0.address, consensus::config::PEER_PORT);
    assert!(
        runtime.block_on(saved_m2.peer_accepted(n0_peer))?,
        "a member's peer certificate is accepted before its decommission"
    );
    let out = cluster.ctl_retry(&["node", "decommission", &id_m2])?;
    assert!(
        out.lines()
            .next()
            .is_some_and(|l| l.contains("DECOMMISSIONING")),
        "the first answer is DECOMMISSIONING: {out}"
    );
    assert!(out.contains("DECOMMISSIONED"), "{out}");
    let status = m2.proc().wait_exit(TIMEOUT)?;
    assert!(
        status.success(),
        "the decommissioned member exits 0: {status:?}"
    );
    assert!(
        !m2.root.join("data").exists(),
        "data/ (etcd data too) is wiped"
    );
    cluster.wait_members(&endpoints(&[n0, &m1]), 2, 0)?;
    for peer in [n0, &m1] {
        let at = SocketAddr::new(peer.address, consensus::config::PEER_PORT);
        assert!(
            !runtime.block_on(saved_m2.peer_accepted(at))?,
            "etcd at {at} refuses the decommissioned member's peer certificate"
        );
    }
    let refused = runtime.block_on(heartbeat(&m1, &ca, &saved_m2.credentials()?))?;
    assert!(rpc::is_revoked(&refused), "{refused:?}");
    let node = cluster.node(&id_m2)?.context("listed")?;
    assert_eq!(node["roles"].as_array().map(Vec::len), Some(0), "{node}");

    // A removed node cannot pose as a curator: the remaining nodes and polisctl hold the
    // CRL that lists its certificate, and check curators against it.
    let m2_serial = pki::certificate_serial(&saved_m2.credentials()?.certificate)?;
    e2e::wait_until("m1 saves the CRL revoking m2", TIMEOUT, || {
        std::fs::read(m1.root.join("data/node/crl.der"))
            .ok()
            .and_then(|crl| pki::crl_serials(&crl).ok())
            .is_some_and(|serials| serials.contains(&m2_serial))
    })?;
    let impostor = Impostor::serve(
        SocketAddr::new(m2.address, rpc::CURATOR_PORT),
        saved_m2.credentials()?,
    )?;
    let (ok, _, err) = cluster.ctl(&["--endpoints", &m2.address.to_string(), "node", "list"])?;
    assert!(!ok && err.contains("revoked"), "{err}");
    assert!(
        impostor.handshakes_attempted() > 0,
        "polisctl did dial the impostor"
    );
    drop(impostor);

    // A node that is down is decommissioned by the curator alone; when it comes back it
    // is refused and says so.
    let saved_sleeper = Saved::take(&sleeper, &dir.path().join("saved-sleeper"))?;
    sleeper.proc().signal(libc::SIGKILL);
    sleeper.proc().wait_exit(TIMEOUT)?;
    let out = cluster.ctl_retry(&["node", "decommission", &id_sleeper])?;
    assert!(out.contains("DECOMMISSIONED"), "{out}");
    sleeper.start(&[])?;
    let status = sleeper.proc().wait_exit(TIMEOUT)?;
    assert!(
        !status.success(),
        "a node decommissioned while down is refused"
    );
    let output = sleeper.proc().output();
    assert!(
        output.contains("decommissioned or deleted while it was down"),
        "{output}"
    );
    assert!(
        sleeper.root.join("data/node/key.der").exists(),
        "a refused node's data is kept"
    );

    // A decommissioned key never registers again; neither does a deleted one.
    let mut again = register_with_key(
        &cluster,
        "sleeper-again",
        &saved_sleeper.dir.join("key.der"),
        &params,
    )?;
    let status = again.proc().wait_exit(TIMEOUT)?;
    assert!(!status.success());
    assert!(
        again.proc().output().contains("decommissioned"),
        "{}",
        again.proc().output()
    );
    let out = cluster.ctl_retry(&["node", "delete", &id_worker])?;
    assert!(out.contains("deleted"), "{out}");
    assert!(cluster.node(&id_worker)?.is_none(), "the record is gone");
    let (ok, _, err) = cluster.ctl(&["node", "delete", &id_worker])?;
    assert!(!ok && err.contains("deleted already"), "{err}");
    let mut again = register_with_key(
        &cluster,
        "worker-again",
        &saved_worker.dir.join("key.der"),
        &params,
    )?;
    let status = again.proc().wait_exit(TIMEOUT)?;
    assert!(!status.success());
    assert!(
        again.proc().output().contains("was deleted"),
        "{}",
        again.proc().output()
    );

    // A node that never joined is deleted without a decommission; decommissioning it is
    // refused.
    let mut newcomer = cluster.new_node("newcomer")?;
    newcomer.start(&["--params", params.to_str().context("utf-8")?])?;
    newcomer.wait_state("Foreign")?;
    let id_new = newcomer.key_node_id()?;
    let (ok, _, err) = cluster.ctl(&["node", "decommission", &id_new])?;
    assert!(!ok && err.contains("deleted instead"), "{err}");
    cluster.ctl_retry(&["node", "delete", &id_new])?;
    assert!(cluster.node(&id_new)?.is_none());

    // The first node, which may lead: the curators hand the decommission over to the
    // one that stays, and the cluster carries on with one voter.
    let id_n0 = n0.key_node_id()?;
    let m1_endpoint = m1.address.to_string();
    let out = cluster.ctl_retry(&["--endpoints", &m1_endpoint, "node", "decommission", &id_n0])?;
    assert!(out.contains("DECOMMISSIONED"), "{out}");
    let mut first = cluster.first;
    let status = first.proc().wait_exit(TIMEOUT)?;
    assert!(status.success(), "the first node exits 0: {status:?}");
    assert!(!first.root.join("data").exists());
    let config = cluster.config.to_str().context("utf-8")?;
    let (status, out, err) = e2e::polisctl(&[
        "--config",
        config,
        "--endpoints",
        &m1_endpoint,
        "cluster",
        "status",
        "-o",
        "json",
    ])?;
    assert!(status.success(), "{out} {err}");
    let status: serde_json::Value = serde_json::from_str(&out)?;
    let members = status["members"].as_array().cloned().unwrap_or_default();
    assert_eq!(members.len(), 1, "{status}");
    let (status, out, err) = e2e::polisctl(&[
        "--config",
        config,
        "--endpoints",
        &m1_endpoint,
        "node",
        "list",
    ])?;
    assert!(status.success() && out.contains(&id_m1), "{out} {err}");
    Ok(())
}
