//! Nodes join a cluster: register with a ticket, owner approval, commit, restarts. Real
//! polis-node processes on 127.x addresses, a real etcd on the first node, polisctl.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, TIMEOUT, process_alive, read_register_params, wait_until};
use proto::api;

fn start_with_params(node: &mut Node, params: &std::path::Path) -> Result<()> {
    node.start(&["--params", params.to_str().context("utf-8 path")?])?;
    Ok(())
}

/// Waits for the registering node to log its node ID, and returns it.
fn registering_id(node: &mut Node) -> Result<String> {
    node.wait_state("Foreign")?;
    node.key_node_id()
}

#[test]
fn two_workers_register_at_once_one_approval_brings_both_up_and_they_restart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    // takeownership remembered the endpoints: no --endpoints from here on.
    let remembered = std::fs::read_to_string(cluster.config.join("endpoints"))?;
    assert!(
        remembered.contains(&format!("{}:7835", cluster.first.address)),
        "{remembered}"
    );

    let params = cluster.register_params("workers")?;
    let mut a = cluster.new_node("a")?;
    let mut b = cluster.new_node("b")?;
    start_with_params(&mut a, &params)?;
    start_with_params(&mut b, &params)?;
    let (id_a, id_b) = (registering_id(&mut a)?, registering_id(&mut b)?);
    assert_ne!(id_a, id_b);

    let new = cluster.ctl_retry(&["node", "list", "--state", "new", "-o", "json"])?;
    let new: Vec<serde_json::Value> = serde_json::from_str(&new)?;
    let mut listed: Vec<&str> = new.iter().filter_map(|n| n["id"].as_str()).collect();
    listed.sort();
    let mut expected = vec![id_a.as_str(), id_b.as_str()];
    expected.sort();
    assert_eq!(listed, expected, "both workers wait for approval");
    // The owner sees the key before approving.
    let described = cluster.ctl_retry(&["node", "describe", &id_a, "-o", "json"])?;
    let described: serde_json::Value = serde_json::from_str(&described)?;
    let key_hex = described["public_key"].as_str().unwrap_or_default();
    assert_eq!(key_hex.len(), 64, "{described}");
    assert!(
        id_a.ends_with(&key_hex[..32]),
        "{id_a} is named after its key {key_hex}"
    );

    // One call approves both.
    let out = cluster.ctl_retry(&["node", "approve", &id_a, &id_b])?;
    assert!(out.contains(&id_a) && out.contains(&id_b), "{out}");
    for (node, id) in [(&mut a, &id_a), (&mut b, &id_b)] {
        node.wait_home()?;
        cluster.wait_node(id, "UP", Some("HEALTHY"))?;
        // A worker runs no etcd and keeps no etcd data; it knows the curators.
        assert!(!node.proc().output().contains("started etcd"));
        assert!(!node.root.join("data/etcd/data/member").exists());
        assert!(node.root.join("esp/directory.pb").exists());
        assert!(node.root.join("esp/sealed_configuration.pb").exists());
        let listed = cluster.node(id)?.context("listed")?;
        assert_eq!(listed["address"], node.address.to_string());
        assert_eq!(listed["roles"], serde_json::json!([]));
    }
    // Approving an UP node changes nothing.
    let again = cluster.ctl_retry(&["node", "approve", &id_a])?;
    assert!(again.contains("UP"), "{again}");

    // kill -9 in Home; the next start needs no parameters and keeps the node's identity.
    a.proc().signal(libc::SIGKILL);
    a.proc().wait_exit(TIMEOUT)?;
    a.start(&[])?;
    a.wait_home()?;
    assert_eq!(a.key_node_id()?, id_a);
    cluster.wait_node(&id_a, "UP", Some("HEALTHY"))?;
    assert_eq!(
        cluster.nodes()?.len(),
        3,
        "no second record for the restarted node"
    );
    Ok(())
}

#[test]
fn kill_9_at_each_registration_step_resumes_with_the_same_key() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("workers")?;
    // (crash point, whether the owner must approve before the crash can happen)
    let steps = [
        ("register-key", false),
        ("register-foreign", false),
        ("register-trusted", true),
        ("register-committed", true),
        ("register-credentials", true),
        ("register-sealed", true),
    ];
    for (step, approve_first) in steps {
        let mut node = cluster.new_node(step)?;
        node.start_with_env(
            &["--params", params.to_str().context("utf-8 path")?],
            &[("POLIS_CRASH_AFTER", step)],
        )?;
        if approve_first {
            let id = registering_id(&mut node)?;
            cluster.ctl_retry(&["node", "approve", &id])?;
        }
        let status = node.proc().wait_exit(TIMEOUT)?;
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "{step}: {}",
            node.proc().output()
        );
        let id = node.key_node_id()?;
        // Restart exactly as an operator would: with the parameters until the node
        // joined (they are ignored once the sealed configuration exists).
        start_with_params(&mut node, &params)?;
        if !approve_first {
            registering_id(&mut node)?;
            cluster.ctl_retry(&["node", "approve", &id])?;
        }
        node.wait_home()
            .with_context(|| format!("after a crash at {step}"))?;
        assert_eq!(node.key_node_id()?, id, "{step}: the key changed");
        cluster.wait_node(&id, "UP", None)?;
    }
    // One record per worker: no crash registered a second key.
    assert_eq!(cluster.nodes()?.len(), 1 + steps.len());
    Ok(())
}

/// CPU time (user + system) a process used so far, in clock ticks.
fn cpu_ticks(pid: i32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(") ").context("stat format")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

#[test]
fn refusals_wrong_ticket_wrong_ca_unreachable_curators_and_no_approval() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("old")?;

    // A node the owner never approves stays Foreign, waiting on a stream.
    let mut waiting = cluster.new_node("waiting")?;
    start_with_params(&mut waiting, &params)?;
    waiting.wait_state("Foreign")?;
    let waiting_since = (Instant::now(), cpu_ticks(waiting.proc().pid())?);

    // Rotating the ticket: parameters made before stop working for new nodes.
    let out = cluster.ctl_retry(&["cluster", "rotate-ticket"])?;
    assert!(out.contains("no longer"), "{out}");
    let mut late = cluster.new_node("late")?;
    start_with_params(&mut late, &params)?;
    let status = late.proc().wait_exit(TIMEOUT)?;
    assert_eq!(status.code(), Some(1));
    let output = late.proc().output();
    assert!(
        output.contains("register ticket is wrong or was rotated"),
        "{output}"
    );

    // Parameters that pin another cluster's CA: refused, naming the CA as the problem.
    let foreign_ca = pki::Ca::generate("Another Cluster CA", pki::CA_LIFETIME)?;
    let mut wrong_ca = read_register_params(&cluster.register_params("fresh")?)?;
    wrong_ca.ca_certificate = foreign_ca.cert_der.clone();
    let wrong_ca_path = dir.path().join("wrong-ca.params");
    write_register_params(&wrong_ca_path, wrong_ca)?;
    let mut misled = cluster.new_node("misled")?;
    start_with_params(&mut misled, &wrong_ca_path)?;
    let status = misled.proc().wait_exit(TIMEOUT)?;
    assert_eq!(status.code(), Some(1));
    let output = misled.proc().output();
    assert!(output.contains("wrong CA in the parameters"), "{output}");

    // Curators that do not answer: the node keeps trying and says so once per change.
    let mut nowhere = read_register_params(&cluster.register_params("nowhere")?)?;
    let gone: SocketAddr = SocketAddr::new(e2e::unique_loopback(), 7835);
    nowhere.curator_endpoints = vec![gone.to_string()];
    let nowhere_path = dir.path().join("nowhere.params");
    write_register_params(&nowhere_path, nowhere)?;
    let mut lonely = cluster.new_node("lonely")?;
    lonely.start_with_env(
        &["--params", nowhere_path.to_str().context("utf-8 path")?],
        &[("POLIS_LOG", "info,polis_node::start::register=debug")],
    )?;
    wait_until("four registration attempts", TIMEOUT, || {
        lonely
            .proc()
            .output()
            .matches("registration attempt failed")
            .count()
            >= 4
    })?;
    let output = lonely.proc().output();
    assert_eq!(
        output.matches("retrying").count(),
        1,
        "one warning for one unchanged problem:\n{output}"
    );
    assert!(process_alive(lonely.proc().pid()), "it keeps trying");

    // Meanwhile the unapproved node neither left Foreign nor spun. The steps above may
    // take well under a second on a fast machine, and ten-millisecond clock ticks need a
    // window of a few seconds to tell a wait from a polling loop.
    let (since, ticks) = waiting_since;
    wait_until("a measuring window of three seconds", TIMEOUT, || {
        since.elapsed() >= Duration::from_secs(3)
    })?;
    let used = cpu_ticks(waiting.proc().pid())? - ticks;
    let elapsed = since.elapsed();
    // Clock ticks are 10 ms: well under 10 % of one core, i.e. no polling loop.
    let cpu_ms = used * 10;
    assert!(
        cpu_ms <= elapsed.as_millis() as u64 / 10 + 50,
        "{cpu_ms} ms of CPU in {elapsed:?} while waiting for approval"
    );
    let id = waiting.key_node_id()?;
    cluster.wait_node(&id, "NEW", None)?;
    if waiting.proc().output().contains("Trusted") {
        bail!("the unapproved node left Foreign");
    }
    Ok(())
}

fn write_register_params(
    path: &std::path::Path,
    register: proto::config::ClusterRegister,
) -> Result<()> {
    use prost::Message;
    let params = proto::config::NodeParameters {
        cluster: Some(proto::config::node_parameters::Cluster::Register(register)),
    };
    std::fs::write(path, params.encode_to_vec())?;
    Ok(())
}

/// Every registration call repeated, as a node would after lost replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_registration_call_is_idempotent() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| Cluster::bootstrap(dir.path()))?;
    let register =
        tokio::task::block_in_place(|| read_register_params(&cluster.register_params("rpc")?))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let key = identity::NodeKey::generate()?;
    let id = key.node_id();
    let self_signed = rpc::self_signed(&key)?;
    let channel = rpc::connect(endpoint, &trust, Some(&self_signed)).await?;
    let mut curator = api::curator_client::CuratorClient::new(channel);
    let request = api::RegisterNodeRequest {
        register_ticket: register.register_ticket.clone(),
        address: "127.0.0.1".into(),
        labels: [("rack".to_string(), "r1".to_string())].into(),
        ..Default::default()
    };

    // Register twice: one NEW node.
    for _ in 0..2 {
        let mut updates = curator.register_node(request.clone()).await?.into_inner();
        let first = updates.message().await?.context("a first update")?;
        assert_eq!(first.node_id, id);
        assert_eq!(first.state, api::NodeState::New as i32);
    }
    let ours = |nodes: &[serde_json::Value]| nodes.iter().filter(|n| n["id"] == id).count();
    let nodes = tokio::task::block_in_place(|| cluster.nodes())?;
    assert_eq!(ours(&nodes), 1);

    // Committing before approval is refused, and changes nothing.
    let early = curator
        .commit_node(api::CommitNodeRequest {})
        .await
        .expect_err("commit before approval");
    assert_eq!(early.code(), tonic::Code::FailedPrecondition, "{early:?}");
    assert!(early.message().contains("not approved"), "{early:?}");

    // The approval arrives on the open registration stream.
    let mut updates = curator.register_node(request.clone()).await?.into_inner();
    updates.message().await?.context("NEW")?;
    for _ in 0..2 {
        tokio::task::block_in_place(|| cluster.ctl_retry(&["node", "approve", &id]))?;
    }
    let approved = tokio::time::timeout(TIMEOUT, updates.message())
        .await??
        .context("an update after approval")?;
    assert_eq!(approved.state, api::NodeState::Standby as i32);

    // Commit twice: the same certificate, for our key, from the cluster CA.
    let first = curator
        .commit_node(api::CommitNodeRequest {})
        .await?
        .into_inner();
    let second = curator
        .commit_node(api::CommitNodeRequest {})
        .await?
        .into_inner();
    assert_eq!(first.node_certificate, second.node_certificate);
    assert_eq!(first.ca_certificate, register.ca_certificate);
    assert_eq!(
        pki::certificate_public_key(&first.node_certificate)?,
        key.public_key()
    );
    assert!(first.roles.is_empty(), "a new node is a worker");
    assert_eq!(
        first.curator_endpoints,
        vec![endpoint.to_string()],
        "the curators a node should know"
    );
    // The certificate works: the node calls as itself.
    let node_credentials = rpc::Credentials {
        certificate: first.node_certificate.clone(),
        key_pkcs8: key.pkcs8_der().to_vec(),
    };
    let channel = rpc::connect(endpoint, &trust, Some(&node_credentials)).await?;
    let mut as_node = api::curator_client::CuratorClient::new(channel);
    as_node.heartbeat(api::HeartbeatRequest::default()).await?;
    let mut watch = as_node
        .watch_node(api::WatchNodeRequest {})
        .await?
        .into_inner();
    let own = watch.message().await?.context("own record")?;
    assert_eq!(own.state, api::NodeState::Up as i32);
    assert_eq!(own.curator_endpoints, vec![endpoint.to_string()]);

    // Register and approve again after UP: the same outcome, nothing changes.
    let mut updates = curator.register_node(request.clone()).await?.into_inner();
    assert_eq!(
        updates.message().await?.context("UP")?.state,
        api::NodeState::Up as i32
    );
    let nodes = tokio::task::block_in_place(|| cluster.nodes())?;
    assert_eq!(ours(&nodes), 1);
    let listed = nodes.iter().find(|n| n["id"] == id).context("listed")?;
    assert_eq!(listed["state"], "UP");
    assert_eq!(listed["labels"]["rack"], "r1");

    // A different key cannot commit someone else's registration, nor register without
    // a ticket.
    let stranger = identity::NodeKey::generate()?;
    let channel = rpc::connect(endpoint, &trust, Some(&rpc::self_signed(&stranger)?)).await?;
    let mut stranger_client = api::curator_client::CuratorClient::new(channel);
    let refused = stranger_client
        .commit_node(api::CommitNodeRequest {})
        .await
        .expect_err("an unregistered key commits nothing");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    let refused = stranger_client
        .register_node(api::RegisterNodeRequest {
            register_ticket: vec![0; 32],
            ..request.clone()
        })
        .await
        .err()
        .context("a wrong ticket is refused")?;
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    // Labels are validated by the curator too.
    let refused = stranger_client
        .register_node(api::RegisterNodeRequest {
            labels: [("bad key".to_string(), "v".to_string())].into(),
            ..request.clone()
        })
        .await
        .err()
        .context("invalid labels are refused")?;
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    Ok(())
}
