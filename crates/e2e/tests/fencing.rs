//! No node can harm another (issue 15): races between a node's own calls and the
//! owner's decisions about it. Real polis-node and etcd processes on 127.x addresses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, read_register_params};
use proto::api;

/// Calls each registration loop makes at most, and how long it may run: bounds on the
/// traffic the test sends whatever happens.
const CALLS_PER_LOOP: usize = 400;
const LOOP_TIME: Duration = Duration::from_secs(30);

/// Registers `key` over and over (self-signed, as a registering node does) until `stop`;
/// counts the calls the curator accepted.
async fn register_loop(
    endpoint: SocketAddr,
    register: proto::config::ClusterRegister,
    key: Arc<identity::NodeKey>,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) -> Result<()> {
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let channel = rpc::connect(endpoint, &trust, Some(&rpc::self_signed(&key)?)).await?;
    let mut curator = api::curator_client::CuratorClient::new(channel);
    let started = Instant::now();
    for _ in 0..CALLS_PER_LOOP {
        if stop.load(Ordering::SeqCst) || started.elapsed() > LOOP_TIME {
            break;
        }
        let answer = curator
            .register_node(api::RegisterNodeRequest {
                register_ticket: register.register_ticket.clone(),
                address: "127.0.0.1".into(),
                labels: Default::default(),
                ..Default::default()
            })
            .await;
        match answer {
            Ok(mut updates) => {
                updates.get_mut().message().await.ok();
                accepted.fetch_add(1, Ordering::SeqCst);
            }
            Err(status) if status.code() == tonic::Code::PermissionDenied => {
                if !status.message().contains("was deleted") {
                    bail!("refused for another reason: {status:?}");
                }
                refused.fetch_add(1, Ordering::SeqCst);
            }
            // A leader hiccup is not what this test is about; the next call retries.
            Err(status) if status.code() == tonic::Code::Unavailable => {}
            Err(status) => bail!("RegisterNode failed: {status:?}"),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_keys_do_not_re_register_while_the_owner_deletes() -> Result<()> {
    // Before: the tombstone was checked before the record was created, outside the
    // creating transaction; a registration in flight while the owner deleted the node
    // wrote its record back (NEW), and the deleted key was in the cluster again.
    let dir = tempfile::tempdir()?;
    // The loops register from one address as fast as they can: no per-source limit.
    let cluster = tokio::task::block_in_place(|| {
        Cluster::bootstrap_with(dir.path(), &[], &["--entry-rate-per-second", "0"])
    })?;
    let register =
        tokio::task::block_in_place(|| read_register_params(&cluster.register_params("race")?))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let owner = tokio::task::block_in_place(|| cluster.owner_client())?;
    const ROUNDS: usize = 4;
    const LOOPS: usize = 3;
    for round in 0..ROUNDS {
        let key = Arc::new(identity::NodeKey::generate()?);
        let id = key.node_id();
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let loops: Vec<_> = (0..LOOPS)
            .map(|_| {
                tokio::spawn(register_loop(
                    endpoint,
                    register.clone(),
                    key.clone(),
                    stop.clone(),
                    accepted.clone(),
                    refused.clone(),
                ))
            })
            .collect();
        // Delete once the node exists and its registrations are in full swing.
        let deadline = Instant::now() + e2e::TIMEOUT;
        while accepted.load(Ordering::SeqCst) < 5 {
            if Instant::now() > deadline {
                bail!("round {round}: the node never registered");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        owner
            .call(|c| {
                let id = id.clone();
                async move {
                    api::management_client::ManagementClient::new(c)
                        .delete_node(api::DeleteNodeRequest { id })
                        .await
                }
            })
            .await
            .with_context(|| format!("round {round}: deleting {id}"))?;
        // Registrations keep coming after the deletion: until enough were refused, or
        // (the bug) enough were accepted again.
        let after = accepted.load(Ordering::SeqCst);
        let deadline = Instant::now() + e2e::TIMEOUT;
        while refused.load(Ordering::SeqCst) < 20
            && accepted.load(Ordering::SeqCst) < after + 20
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.store(true, Ordering::SeqCst);
        for l in loops {
            l.await??;
        }
        let listed = tokio::task::block_in_place(|| cluster.node(&id))?;
        assert!(
            listed.is_none(),
            "round {round}: the deleted node {id} registered again: {listed:?}"
        );
    }
    Ok(())
}

/// The certificates the cluster CA and the etcd peer CA recorded for node `id`.
async fn recorded_certificates(owner: &rpc::CuratorClient, id: &str) -> Result<Vec<String>> {
    let listed = owner
        .call(|c| async move {
            api::management_client::ManagementClient::new(c)
                .list_certificates(api::ListCertificatesRequest {})
                .await
        })
        .await?;
    Ok(listed
        .certificates
        .into_iter()
        .filter(|c| c.node_id == id)
        .map(|c| c.name)
        .collect())
}

/// A one-node cluster with one worker: the cluster, the worker, its ID and a client that
/// calls with the worker's node certificate.
fn cluster_with_worker(
    dir: &std::path::Path,
) -> Result<(Cluster, e2e::Node, String, rpc::CuratorClient)> {
    let cluster = Cluster::bootstrap(dir)?;
    let params = cluster.register_params("worker")?;
    let (worker, id) = cluster.add_worker("worker", &params)?;
    let credentials = rpc::Credentials {
        certificate: std::fs::read(worker.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(worker.root.join("data/node/key.der"))?,
    };
    let ca = std::fs::read(worker.root.join("data/node/ca.der"))?;
    let as_worker = rpc::CuratorClient::new(
        vec![SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT)],
        rpc::ServerTrust::PinnedCa(ca),
        Some(credentials),
    )?;
    Ok((cluster, worker, id, as_worker))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_issued_only_when_due_however_often_a_node_asks() -> Result<()> {
    // Before: every RenewCertificates call recorded one more certificate (30 calls, 30
    // records); a worker looping it could fill etcd up to its quota.
    let dir = tempfile::tempdir()?;
    let (cluster, worker, id, as_worker) =
        tokio::task::block_in_place(|| cluster_with_worker(dir.path()))?;
    let owner = tokio::task::block_in_place(|| cluster.owner_client())?;
    let before = recorded_certificates(&owner, &id).await?;
    assert_eq!(before.len(), 1, "{before:?}");

    let certificate = std::fs::read(worker.root.join("data/node/cert.der"))?;
    for call in 0..30 {
        let answer = as_worker
            .call(|c| async move {
                api::curator_client::CuratorClient::new(c)
                    .renew_certificates(api::RenewCertificatesRequest { peer: false })
                    .await
            })
            .await
            .with_context(|| format!("renewal {call}"))?;
        assert!(
            answer.node_certificate == certificate,
            "renewal {call}: a certificate was issued although none was due"
        );
    }
    let after = recorded_certificates(&owner, &id).await?;
    assert_eq!(after, before, "certificates recorded by 30 early renewals");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_see_only_their_own_record() -> Result<()> {
    // Before: a worker's ListNodes returned every node's key, address, labels and status.
    let dir = tempfile::tempdir()?;
    let (cluster, _worker, id, as_worker) =
        tokio::task::block_in_place(|| cluster_with_worker(dir.path()))?;
    let first = cluster.first.key_node_id()?;
    let listed = as_worker
        .call(|c| async move {
            api::management_client::ManagementClient::new(c)
                .list_nodes(api::ListNodesRequest::default())
                .await
        })
        .await?;
    let ids: Vec<_> = listed.nodes.iter().map(|n| n.id.clone()).collect();
    assert_eq!(ids, vec![id.clone()], "a worker listed other nodes");
    let own = as_worker
        .call(|c| {
            let id = id.clone();
            async move {
                api::management_client::ManagementClient::new(c)
                    .describe_node(api::DescribeNodeRequest { id })
                    .await
            }
        })
        .await?;
    assert_eq!(own.id, id);
    let other = as_worker
        .call(|c| {
            let id = first.clone();
            async move {
                api::management_client::ManagementClient::new(c)
                    .describe_node(api::DescribeNodeRequest { id })
                    .await
            }
        })
        .await
        .expect_err("a worker described another node");
    assert!(
        format!("{other:#}").contains("may describe only itself"),
        "{other:#}"
    );
    // The owner still sees everything.
    let all = tokio::task::block_in_place(|| cluster.nodes())?;
    assert_eq!(all.len(), 2, "{all:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_cannot_share_an_address() -> Result<()> {
    // Before: RegisterNode took any address; a node registered with a consensus member's
    // address and then given `remove-role` had that member removed from etcd (members
    // were matched by peer URL, and remove-role did not check the node held the role).
    let dir = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| Cluster::bootstrap(dir.path()))?;
    let register =
        tokio::task::block_in_place(|| read_register_params(&cluster.register_params("twin")?))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let key = identity::NodeKey::generate()?;
    let channel = rpc::connect(endpoint, &trust, Some(&rpc::self_signed(&key)?)).await?;
    let mut curator = api::curator_client::CuratorClient::new(channel);
    let taken = curator
        .register_node(api::RegisterNodeRequest {
            register_ticket: register.register_ticket.clone(),
            address: cluster.first.address.to_string(),
            labels: Default::default(),
            ..Default::default()
        })
        .await
        .expect_err("a second node on the first node's address");
    assert_eq!(taken.code(), tonic::Code::AlreadyExists, "{taken:?}");
    let first = cluster.first.key_node_id()?;
    assert!(taken.message().contains(&first), "{taken:?}");
    let listed = tokio::task::block_in_place(|| cluster.node(&key.node_id()))?;
    assert!(listed.is_none(), "{listed:?}");

    // remove-role on a node that does not hold the role removes nobody from etcd.
    let params = tokio::task::block_in_place(|| cluster.register_params("worker"))?;
    let (_worker, worker_id) =
        tokio::task::block_in_place(|| cluster.add_worker("worker", &params))?;
    tokio::task::block_in_place(|| {
        cluster.ctl_retry(&["node", "remove-role", &worker_id, "ConsensusMember"])
    })?;
    let (quorum, status) =
        tokio::task::block_in_place(|| cluster.status(&cluster.first.address.to_string()))?;
    assert!(quorum, "{status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_ends_its_streams_and_calls_on_open_connections() -> Result<()> {
    // Before: a WatchNode stream was authorized once, when it started, and went on
    // after its certificate was revoked.
    let dir = tempfile::tempdir()?;
    let (cluster, _worker, id, as_worker) =
        tokio::task::block_in_place(|| cluster_with_worker(dir.path()))?;
    let mut updates = as_worker
        .call(|c| async move {
            api::curator_client::CuratorClient::new(c)
                .watch_node(api::WatchNodeRequest {})
                .await
        })
        .await?;
    let first = tokio::time::timeout(e2e::TIMEOUT, updates.message())
        .await??
        .context("a first update")?;
    assert_eq!(first.state, api::NodeState::Up as i32);
    tokio::task::block_in_place(|| cluster.ctl_retry(&["node", "decommission", &id, "--no-wait"]))?;
    let ended = tokio::time::timeout(e2e::TIMEOUT, async {
        loop {
            match updates.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => bail!("the stream ended without saying why"),
                Err(status) => return Ok(status),
            }
        }
    })
    .await
    .context("the stream went on after the node's certificate was revoked")??;
    assert!(rpc::is_revoked(&ended), "{ended:?}");
    // Calls on the connection opened before the revocation are refused too.
    let refused = as_worker
        .call(|c| async move {
            api::curator_client::CuratorClient::new(c)
                .heartbeat(api::HeartbeatRequest::default())
                .await
        })
        .await
        .expect_err("a call with a revoked certificate");
    assert!(format!("{refused:#}").contains(rpc::REVOKED), "{refused:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_repeated_after_its_certificate_expired_gets_a_valid_one() -> Result<()> {
    // Before: CommitNode answered with the first certificate it recorded, even expired.
    let dir = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| {
        Cluster::bootstrap_with(dir.path(), &["--node-certificate-lifetime", "5s"], &[])
    })?;
    let register =
        tokio::task::block_in_place(|| read_register_params(&cluster.register_params("late")?))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let key = identity::NodeKey::generate()?;
    let id = key.node_id();
    let channel = rpc::connect(endpoint, &trust, Some(&rpc::self_signed(&key)?)).await?;
    let mut curator = api::curator_client::CuratorClient::new(channel);
    let mut updates = curator
        .register_node(api::RegisterNodeRequest {
            register_ticket: register.register_ticket.clone(),
            address: "127.0.0.1".into(),
            labels: Default::default(),
            ..Default::default()
        })
        .await?
        .into_inner();
    updates.message().await?.context("NEW")?;
    tokio::task::block_in_place(|| cluster.ctl_retry(&["node", "approve", &id]))?;
    let first = curator
        .commit_node(api::CommitNodeRequest {})
        .await?
        .into_inner()
        .node_certificate;
    let again = curator
        .commit_node(api::CommitNodeRequest {})
        .await?
        .into_inner()
        .node_certificate;
    assert!(again == first, "a repeated commit got another certificate");
    let ends = pki::Validity::of(&first)?.not_after;
    tokio::task::block_in_place(|| {
        e2e::wait_until(
            "the first certificate to expire",
            Duration::from_secs(30),
            || pki::unix_now() > ends,
        )
    })?;
    let late = curator
        .commit_node(api::CommitNodeRequest {})
        .await?
        .into_inner()
        .node_certificate;
    assert!(
        late != first,
        "the commit answered with the expired certificate"
    );
    assert!(pki::Validity::of(&late)?.not_after > pki::unix_now());
    assert_eq!(
        pki::certificate_public_key(&late)?,
        key.public_key().to_vec()
    );
    Ok(())
}

fn copy_files(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

#[test]
fn the_owner_key_rotates_and_every_old_owner_certificate_stops_working() -> Result<()> {
    // Before: owner credentials could be neither rotated nor revoked.
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let stolen = dir.path().join("stolen-config");
    copy_files(&cluster.config, &stolen)?;
    let old_key = std::fs::read(cluster.config.join("owner-key.pem"))?;

    let out = cluster.ctl_retry(&["cluster", "owner", "rotate"])?;
    assert!(out.contains("Replaced the owner key"), "{out}");
    assert_ne!(
        std::fs::read(cluster.config.join("owner-key.pem"))?,
        old_key
    );
    assert!(!cluster.config.join("owner-key.next.pem").exists());
    // The rotated config works.
    assert_eq!(cluster.nodes()?.len(), 1);

    // A copy of the old config: its certificate is revoked, and its key no longer
    // proves the owner (so it cannot escrow a new certificate either).
    let endpoint = cluster.first.address.to_string();
    let stolen_arg = stolen.to_str().context("utf-8 path")?;
    let (status, _, err) = e2e::polisctl(&[
        "--config",
        stolen_arg,
        "--endpoints",
        &endpoint,
        "node",
        "list",
    ])?;
    assert!(!status.success(), "the old owner certificate still works");
    assert!(err.contains("revoked"), "{err}");
    let (status, _, err) = e2e::polisctl(&[
        "--config",
        stolen_arg,
        "--endpoints",
        &endpoint,
        "takeownership",
        "--accept-ca",
    ])?;
    assert!(
        !status.success(),
        "the old owner key escrowed a certificate"
    );
    assert!(err.contains("not this cluster's owner key"), "{err}");
    Ok(())
}

/// Every regular file under `dir`.
fn files_under(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                found.push(entry.path());
            }
        }
    }
    Ok(found)
}

#[test]
fn a_committed_node_forgets_its_register_ticket() -> Result<()> {
    // Before: the parameters in the node's root kept the register ticket for the node's
    // whole life, so a copy of any worker's disk could register new nodes.
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("nodes")?;
    let given = read_register_params(&params)?;
    assert!(!given.register_ticket.is_empty());
    let mut node = cluster.new_node("forgetful")?;
    let esp = node.root.join("esp");
    std::fs::create_dir_all(&esp)?;
    for d in [&node.root, &esp] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
    }
    std::fs::copy(&params, esp.join("parameters.pb"))?;
    node.start(&[])?;
    node.wait_state("Foreign")?;
    let id = node.key_node_id()?;
    cluster.ctl_retry(&["node", "approve", &id])?;
    node.wait_home()?;

    let kept = read_register_params(&esp.join("parameters.pb"))?;
    assert!(kept.register_ticket.is_empty(), "the ticket is still there");
    assert_eq!(kept.ca_certificate, given.ca_certificate);
    for file in files_under(&node.root)? {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !bytes
                .windows(given.register_ticket.len())
                .any(|w| w == given.register_ticket.as_slice()),
            "{} holds the register ticket",
            file.display()
        );
    }
    // Later starts do not need it.
    node.proc().signal(libc::SIGTERM);
    node.proc().wait_exit(e2e::TIMEOUT)?;
    node.start(&[])?;
    node.wait_home()?;
    cluster.wait_node(&id, "UP", None)?;
    Ok(())
}
