//! The curator's API over real mTLS against a real polis-node: the README flow with
//! polisctl, and the authorization matrix.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{Node, TIMEOUT, polisctl};
use proto::api;

fn ctl(node: &Node, config: &str, args: &[&str]) -> Result<(bool, String, String)> {
    let config = node.dir.join(config);
    let endpoint = node.address.to_string();
    let mut all = vec![
        "--config",
        config.to_str().unwrap(),
        "--endpoints",
        endpoint.as_str(),
    ];
    all.extend_from_slice(args);
    let (status, out, err) = polisctl(&all)?;
    Ok((status.success(), out, err))
}

/// polisctl until it succeeds (the curator may still be electing itself).
fn ctl_ok(node: &Node, config: &str, args: &[&str]) -> Result<String> {
    let mut last = String::new();
    for _ in 0..100 {
        let (ok, out, err) = ctl(node, config, args)?;
        if ok {
            return Ok(out);
        }
        last = err;
        if !last.contains("unavailable") && !last.contains("cannot reach") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("polisctl {args:?} failed: {last}")
}

#[test]
fn readme_flow_takeownership_and_manage_nodes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::bootstrapped(dir.path())?;

    // Before ownership: a clear refusal, not a crash.
    let (ok, _, err) = ctl(&node, "config", &["node", "list"])?;
    assert!(
        !ok && err.contains("run `polisctl takeownership` first"),
        "{err}"
    );
    // Without a terminal and without --accept-ca it refuses, showing the fingerprint.
    let (ok, _, err) = ctl(&node, "config", &["takeownership"])?;
    assert!(
        !ok && err.contains("no terminal") && err.contains("SHA256:"),
        "{err}"
    );
    // A wrong fingerprint is refused.
    let (ok, _, err) = ctl(
        &node,
        "config",
        &["takeownership", "--ca-fingerprint", "00ff"],
    )?;
    assert!(!ok && err.contains("CA fingerprint mismatch"), "{err}");

    let out = ctl_ok(&node, "config", &["takeownership", "--accept-ca"])?;
    assert!(out.contains("Took ownership"), "{out}");
    // Harmless to repeat; and the right fingerprint pins without asking.
    ctl_ok(&node, "config", &["takeownership"])?;
    for file in ["owner.pem", "ca.pem", "owner-key.pem"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("config").join(file))?
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{file}");
    }

    let nodes: serde_json::Value =
        serde_json::from_str(&ctl_ok(&node, "config", &["node", "list", "-o", "json"])?)?;
    let nodes = nodes.as_array().context("an array")?;
    assert_eq!(nodes.len(), 1);
    let n = &nodes[0];
    assert_eq!(n["state"], "UP");
    assert_eq!(n["roles"], serde_json::json!(["ConsensusMember"]));
    assert_eq!(n["address"], node.address.to_string());
    assert!(n["health"] == "HEALTHY" || n["health"] == "UNKNOWN", "{n}");
    let id = n["id"].as_str().context("id")?.to_string();

    let table = ctl_ok(&node, "config", &["node", "list"])?;
    assert!(
        table.starts_with("ID") && table.contains(&id) && table.contains("ConsensusMember"),
        "{table}"
    );
    let yaml = ctl_ok(&node, "config", &["node", "list", "-o", "yaml"])?;
    assert!(
        yaml.contains(&format!("- \"address\": \"{}\"", node.address)),
        "{yaml}"
    );

    let info: serde_json::Value = serde_json::from_str(&ctl_ok(
        &node,
        "config",
        &["cluster", "info", "-o", "json"],
    )?)?;
    let sealed_ca = std::fs::read(node.root.join("data/node/ca.der"))?;
    assert_eq!(info["ca_fingerprint"], rpc::fingerprint(&sealed_ca));

    let described: serde_json::Value = serde_json::from_str(&ctl_ok(
        &node,
        "config",
        &["node", "label", &id, "zone=a", "rack=r1", "-o", "json"],
    )?)?;
    assert_eq!(
        described["labels"],
        serde_json::json!({"zone": "a", "rack": "r1"})
    );
    let described: serde_json::Value = serde_json::from_str(&ctl_ok(
        &node,
        "config",
        &["node", "label", &id, "rack-", "-o", "json"],
    )?)?;
    assert_eq!(described["labels"], serde_json::json!({"zone": "a"}));
    let filtered: serde_json::Value = serde_json::from_str(&ctl_ok(
        &node,
        "config",
        &["node", "list", "--label", "zone=b", "-o", "json"],
    )?)?;
    assert_eq!(filtered, serde_json::json!([]));
    let (ok, _, err) = ctl(&node, "config", &["node", "label", &id, "bad key=1"])?;
    assert!(!ok && err.contains("invalid label key"), "{err}");
    let described = ctl_ok(&node, "config", &["node", "describe", &id])?;
    assert!(described.contains("zone=a"), "{described}");

    // Errors: unknown node, unreachable endpoint, a different owner key.
    let (ok, _, err) = ctl(
        &node,
        "config",
        &["node", "describe", "polis-00000000000000000000000000000000"],
    )?;
    assert!(!ok && err.contains("does not exist"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let (status, _, err) = polisctl(&[
        "--config",
        dir.path().join("config").to_str().unwrap(),
        "--endpoints",
        &e2e::unique_loopback().to_string(),
        "node",
        "list",
    ])?;
    assert!(!status.success() && err.contains("cannot reach"), "{err}");

    let (status, _, err) = polisctl(&[
        "--config",
        dir.path().join("intruder").to_str().unwrap(),
        "params",
        "bootstrap",
        "--out",
        dir.path().join("other-params.pb").to_str().unwrap(),
    ])?;
    assert!(status.success(), "{err}");
    let (ok, _, err) = ctl(&node, "intruder", &["takeownership", "--accept-ca"])?;
    assert!(!ok && err.contains("not this cluster's owner key"), "{err}");
    assert!(!dir.path().join("intruder/owner.pem").exists());
    Ok(())
}

/// The identities of the matrix, as client credentials (None: no certificate).
struct Identities {
    anonymous: Option<rpc::Credentials>,
    self_signed: Option<rpc::Credentials>,
    node: Option<rpc::Credentials>,
    owner: Option<rpc::Credentials>,
    expired_owner: Option<rpc::Credentials>,
    revoked_owner: Option<rpc::Credentials>,
    foreign_ca: Option<rpc::Credentials>,
}

fn owner_template(lifetime: Duration) -> pki::Template {
    pki::Template {
        common_name: "owner".into(),
        dns_names: vec![],
        ip_addresses: vec![],
        usage: pki::Usage::Client,
        lifetime,
        kind: pki::CertificateKind::Owner,
    }
}

async fn identities(node: &Node, owner_key: &identity::NodeKey) -> Result<Identities> {
    let client = consensus::connect_unix(&node.socket()).await?;
    let store = curator::cluster_pki(&consensus::Namespaced::new(client, "curator"));
    let ca = store.load_ca().await?.context("cluster CA")?;
    let creds = |der: Vec<u8>, key: &identity::NodeKey| rpc::Credentials {
        certificate: der,
        key_pkcs8: key.pkcs8_der().to_vec(),
    };
    let day = Duration::from_secs(24 * 3600);
    let owner = ca.issue(&owner_template(day), &owner_key.public_key())?;
    let expired = ca.issue_at(
        &owner_template(day),
        &owner_key.public_key(),
        time::OffsetDateTime::now_utc() - 2 * day,
    )?;
    let revoked = ca.issue(&owner_template(day), &owner_key.public_key())?;
    store.revoke(&ca, &revoked.serial).await?;
    let foreign = pki::Ca::generate("Foreign CA", pki::CA_LIFETIME)?
        .issue(&owner_template(day), &owner_key.public_key())?;
    let node_key =
        identity::NodeKey::from_pkcs8(&std::fs::read(node.root.join("data/node/key.der"))?)?;
    Ok(Identities {
        anonymous: None,
        self_signed: Some(rpc::self_signed(owner_key)?),
        node: Some(creds(
            std::fs::read(node.root.join("data/node/cert.der"))?,
            &node_key,
        )),
        owner: Some(creds(owner.der, owner_key)),
        expired_owner: Some(creds(expired.der, owner_key)),
        revoked_owner: Some(creds(revoked.der, owner_key)),
        foreign_ca: Some(creds(foreign.der, owner_key)),
    })
}

/// A well-formed node ID no node has.
const ABSENT_NODE: &str = "polis-00000000000000000000000000000000";

/// Calls `method` as the holder of `credentials`; true if authorization let it through
/// (the handler may still refuse, e.g. a commit before approval).
async fn allowed(
    endpoint: SocketAddr,
    ca: &[u8],
    credentials: Option<&rpc::Credentials>,
    method: &str,
    owner_key: &identity::NodeKey,
    node_id: &str,
    ticket: &[u8],
) -> Result<bool> {
    let channel = rpc::connect(
        endpoint,
        &rpc::ServerTrust::PinnedCa(ca.to_vec()),
        credentials,
    )
    .await?;
    let mut management = api::management_client::ManagementClient::new(channel.clone());
    let mut aaa = api::aaa_client::AaaClient::new(channel.clone());
    let channel_for_curator = channel.clone();
    let mut local = api::curator_local_client::CuratorLocalClient::new(channel);
    let status = match method {
        "GetCurrentLeader" => local
            .get_current_leader(api::GetCurrentLeaderRequest {})
            .await
            .err(),
        "GetCACertificate" => local
            .get_ca_certificate(api::GetCaCertificateRequest {})
            .await
            .err(),
        "Escrow" => aaa
            .escrow(api::EscrowRequest {
                public_key: owner_key.public_key().to_vec(),
            })
            .await
            .err(),
        "GetClusterInfo" => management
            .get_cluster_info(api::GetClusterInfoRequest {})
            .await
            .err(),
        "ListNodes" => management
            .list_nodes(api::ListNodesRequest::default())
            .await
            .err(),
        "DescribeNode" => management
            .describe_node(api::DescribeNodeRequest {
                id: node_id.to_string(),
            })
            .await
            .err(),
        "UpdateNodeLabels" => management
            .update_node_labels(api::UpdateNodeLabelsRequest {
                id: node_id.to_string(),
                upsert: [("matrix".to_string(), "1".to_string())].into(),
                delete: vec![],
            })
            .await
            .err(),
        "GetRegisterTicket" => management
            .get_register_ticket(api::GetRegisterTicketRequest {})
            .await
            .err(),
        "RotateRegisterTicket" => management
            .rotate_register_ticket(api::RotateRegisterTicketRequest {})
            .await
            .err(),
        "ApproveNode" => management
            .approve_node(api::ApproveNodeRequest {
                id: node_id.to_string(),
            })
            .await
            .err(),
        // Of a node that does not exist: a NotFound answer means the call got through.
        "DecommissionNode" => management
            .decommission_node(api::DecommissionNodeRequest {
                id: ABSENT_NODE.to_string(),
            })
            .await
            .err(),
        "DeleteNode" => management
            .delete_node(api::DeleteNodeRequest {
                id: ABSENT_NODE.to_string(),
            })
            .await
            .err(),
        "GetConsensusStatus" => local
            .get_consensus_status(api::GetConsensusStatusRequest {})
            .await
            .err(),
        "UpdateNodeRoles" => management
            .update_node_roles(api::UpdateNodeRolesRequest {
                id: ABSENT_NODE.to_string(),
                add: vec!["ConsensusMember".into()],
                remove: vec![],
            })
            .await
            .err(),
        "ListCertificates" => management
            .list_certificates(api::ListCertificatesRequest {})
            .await
            .err(),
        // With a malformed key: InvalidArgument means the call got through (a real
        // rotation would revoke the owner certificate the matrix goes on with).
        "RotateOwner" => management
            .rotate_owner(api::RotateOwnerRequest {
                new_public_key: vec![],
            })
            .await
            .err(),
        // The node already is a voter: the handler refuses (FailedPrecondition).
        "JoinConsensus" => api::curator_client::CuratorClient::new(channel_for_curator.clone())
            .join_consensus(api::JoinConsensusRequest {})
            .await
            .err(),
        // Not due: the answer is the certificate the node holds.
        "RenewCertificates" => api::curator_client::CuratorClient::new(channel_for_curator.clone())
            .renew_certificates(api::RenewCertificatesRequest { peer: false })
            .await
            .err(),
        "Heartbeat" => api::curator_client::CuratorClient::new(channel_for_curator.clone())
            .heartbeat(api::HeartbeatRequest::default())
            .await
            .err(),
        "WatchNode" => api::curator_client::CuratorClient::new(channel_for_curator.clone())
            .watch_node(api::WatchNodeRequest {})
            .await
            .err(),
        "RegisterNode" => api::curator_client::CuratorClient::new(channel_for_curator.clone())
            .register_node(api::RegisterNodeRequest {
                register_ticket: ticket.to_vec(),
                address: "127.0.0.1".into(),
                labels: Default::default(),
            })
            .await
            .err(),
        "CommitNode" => api::curator_client::CuratorClient::new(channel_for_curator.clone())
            .commit_node(api::CommitNodeRequest {})
            .await
            .err(),
        other => anyhow::bail!("no such method in the matrix: {other}"),
    };
    // Refusals by the permission layer name the permission or the certificate; the
    // handler's own refusals (a commit before approval) mean the call got through.
    let by_authz = |s: &tonic::Status| {
        s.message().contains(" requires ") || s.message().contains("client certificate rejected")
    };
    match status {
        None => Ok(true),
        Some(s)
            if matches!(
                s.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
            ) && by_authz(&s) =>
        {
            Ok(false)
        }
        Some(s)
            if ["CommitNode", "JoinConsensus"].contains(&method)
                && s.code() == tonic::Code::FailedPrecondition =>
        {
            Ok(true)
        }
        Some(s)
            if ["DecommissionNode", "DeleteNode", "UpdateNodeRoles"].contains(&method)
                && s.code() == tonic::Code::NotFound =>
        {
            Ok(true)
        }
        Some(s) if method == "RotateOwner" && s.code() == tonic::Code::InvalidArgument => Ok(true),
        Some(s) => anyhow::bail!("{method}: unexpected error {s:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_matrix_over_real_tls() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = tokio::task::block_in_place(|| Node::bootstrapped(dir.path()))?;
    let owner_key = {
        let pem_text = std::fs::read_to_string(dir.path().join("config/owner-key.pem"))?;
        identity::NodeKey::from_pkcs8(pem::parse(&pem_text)?.contents())?
    };
    let ids = identities(&node, &owner_key).await?;
    let ca = std::fs::read(node.root.join("data/node/ca.der"))?;
    let node_id = node_id(&node)?;
    let endpoint = SocketAddr::new(node.address, rpc::CURATOR_PORT);

    // Wait for the curator to lead.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !allowed(
        endpoint,
        &ca,
        ids.owner.as_ref(),
        "ListNodes",
        &owner_key,
        &node_id,
        &[],
    )
    .await
    .unwrap_or(false)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "curator never served the owner"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The revocation reaches the curator's CRL cache with one etcd watch event.
    while allowed(
        endpoint,
        &ca,
        ids.revoked_owner.as_ref(),
        "ListNodes",
        &owner_key,
        &node_id,
        &[],
    )
    .await?
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the revoked owner certificate was never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let who: [(&str, Option<&rpc::Credentials>); 7] = [
        ("none", ids.anonymous.as_ref()),
        ("self-signed", ids.self_signed.as_ref()),
        ("node", ids.node.as_ref()),
        ("owner", ids.owner.as_ref()),
        ("expired", ids.expired_owner.as_ref()),
        ("revoked", ids.revoked_owner.as_ref()),
        ("foreign", ids.foreign_ca.as_ref()),
    ];
    let expected: &[(&str, &[&str])] = &[
        (
            "GetCurrentLeader",
            &["none", "self-signed", "node", "owner"],
        ),
        (
            "GetCACertificate",
            &["none", "self-signed", "node", "owner"],
        ),
        ("Escrow", &["self-signed"]),
        ("GetClusterInfo", &["node", "owner"]),
        ("ListNodes", &["node", "owner"]),
        ("DescribeNode", &["node", "owner"]),
        ("UpdateNodeLabels", &["owner"]),
        ("GetRegisterTicket", &["owner"]),
        ("ApproveNode", &["owner"]),
        ("DecommissionNode", &["owner"]),
        ("DeleteNode", &["owner"]),
        ("UpdateNodeRoles", &["owner"]),
        ("ListCertificates", &["owner"]),
        ("RotateOwner", &["owner"]),
        ("GetConsensusStatus", &["node", "owner"]),
        ("Heartbeat", &["node"]),
        ("WatchNode", &["node"]),
        ("JoinConsensus", &["node"]),
        ("RenewCertificates", &["node"]),
        ("RegisterNode", &["self-signed"]),
        ("CommitNode", &["self-signed"]),
        // Last: it replaces the ticket RegisterNode uses above.
        ("RotateRegisterTicket", &["owner"]),
    ];
    // Every declared RPC is in the matrix.
    let mut missing: Vec<_> = rpc::authz::METHODS
        .iter()
        .map(|(path, _)| path.rsplit('/').next().unwrap_or(path))
        .filter(|m| !expected.iter().any(|(e, _)| e == m))
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "RPCs missing from the matrix: {missing:?}"
    );
    let ticket = {
        let channel = rpc::connect(
            endpoint,
            &rpc::ServerTrust::PinnedCa(ca.clone()),
            ids.owner.as_ref(),
        )
        .await?;
        api::management_client::ManagementClient::new(channel)
            .get_register_ticket(api::GetRegisterTicketRequest {})
            .await?
            .into_inner()
            .ticket
    };
    let mut failures = Vec::new();
    for (method, allowed_for) in expected {
        for (name, creds) in &who {
            let got = allowed(endpoint, &ca, *creds, method, &owner_key, &node_id, &ticket).await?;
            let want = allowed_for.contains(name);
            println!(
                "{method:<18} × {name:<12} → {}",
                if got { "allow" } else { "deny" }
            );
            if got != want {
                failures.push(format!("{method} × {name}: got {got}, want {want}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "authorization mismatches:\n{}",
        failures.join("\n")
    );

    // The curator validates labels itself (polisctl checking first is only a courtesy).
    let channel = rpc::connect(
        endpoint,
        &rpc::ServerTrust::PinnedCa(ca.clone()),
        ids.owner.as_ref(),
    )
    .await?;
    let refused = api::management_client::ManagementClient::new(channel)
        .update_node_labels(api::UpdateNodeLabelsRequest {
            id: node_id.clone(),
            upsert: [("bad key".to_string(), "v".to_string())].into(),
            delete: vec![],
        })
        .await
        .expect_err("an invalid label key must be refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

    // The register ticket is 32 bytes and stable.
    let channel = rpc::connect(
        endpoint,
        &rpc::ServerTrust::PinnedCa(ca.clone()),
        ids.owner.as_ref(),
    )
    .await?;
    let mut management = api::management_client::ManagementClient::new(channel);
    let t1 = management
        .get_register_ticket(api::GetRegisterTicketRequest {})
        .await?
        .into_inner()
        .ticket;
    let t2 = management
        .get_register_ticket(api::GetRegisterTicketRequest {})
        .await?
        .into_inner()
        .ticket;
    assert_eq!(t1.len(), 32);
    assert_eq!(t1, t2);
    assert_ne!(t1, ticket, "RotateRegisterTicket replaced the ticket");
    Ok(())
}

fn node_id(node: &Node) -> Result<String> {
    use prost::Message;
    let sealed = std::fs::read(node.root.join("esp/sealed_configuration.pb"))?;
    Ok(proto::config::SealedConfiguration::decode(sealed.as_slice())?.node_id)
}

/// Runs polisctl takeownership on a pseudo-terminal (util-linux `script`), typing `answer`.
fn takeownership_on_terminal(node: &Node, answer: &str) -> Result<(bool, String)> {
    use std::io::Write;
    let command = format!(
        "{} --config {} --endpoints {} takeownership",
        e2e::bin("polisctl").display(),
        node.dir.join("config").display(),
        node.address
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running script(1) from util-linux")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(answer.as_bytes())?;
    let out = child.wait_with_output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

#[test]
fn takeownership_asks_on_a_terminal() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::bootstrapped(dir.path())?;
    let ca = std::fs::read(node.root.join("data/node/ca.der"))?;
    let fingerprint = rpc::fingerprint(&ca);

    // The curator may still be starting or electing itself: retry those answers only.
    let settled = |answer: &str| -> Result<(bool, String)> {
        let mut last = (false, String::new());
        for _ in 0..50 {
            last = takeownership_on_terminal(&node, answer)?;
            if !(last.1.contains("cannot reach") || last.1.contains("unavailable")) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(last)
    };
    let (ok, text) = settled("n\n")?;
    assert!(
        !ok && text.contains(&fingerprint) && text.contains("not accepted"),
        "{text}"
    );
    assert!(!dir.path().join("config/ca.pem").exists());

    let (ok, text) = settled("y\n")?;
    assert!(
        ok && text.contains(&fingerprint) && text.contains("Took ownership"),
        "{text}"
    );
    assert!(dir.path().join("config/owner.pem").exists());
    Ok(())
}

#[test]
fn completions_are_generated() -> Result<()> {
    for shell in ["bash", "zsh", "fish"] {
        let (status, out, err) = polisctl(&["completion", shell])?;
        assert!(status.success(), "{shell}: {err}");
        assert!(
            out.contains("takeownership") && out.contains("polisctl"),
            "{shell}"
        );
    }
    let (status, _, err) = polisctl(&["completion", "tcsh"])?;
    assert!(!status.success() && err.contains("tcsh"), "{err}");
    Ok(())
}

fn node_health(node: &Node) -> Result<String> {
    let nodes: serde_json::Value =
        serde_json::from_str(&ctl_ok(node, "config", &["node", "list", "-o", "json"])?)?;
    Ok(nodes[0]["health"].as_str().unwrap_or_default().to_string())
}

#[test]
fn heartbeats_make_the_node_healthy_and_the_curator_survives_kill_9() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    // A lease far longer than polisctl's retries: waiting it out would fail the test.
    node.extra_args = vec!["--curator-lease-ttl".into(), "60".into()];
    let params = node.bootstrap_params()?;
    node.start(&["--params", params.to_str().unwrap()])?;
    node.wait_home()?;
    ctl_ok(&node, "config", &["takeownership", "--accept-ca"])?;
    e2e::wait_until("node HEALTHY", TIMEOUT, || {
        node_health(&node).is_ok_and(|h| h == "HEALTHY")
    })?;

    node.proc().signal(libc::SIGKILL);
    node.proc().wait_exit(TIMEOUT)?;
    node.start(&[])?;
    node.wait_home()?;
    // The restarted curator removes its previous lifetime's election key instead of
    // waiting for that lease to expire, and serves the owner again.
    let restarted = std::time::Instant::now();
    ctl_ok(&node, "config", &["node", "list"])?;
    println!("owner served {:?} after Home", restarted.elapsed());
    e2e::wait_until("node HEALTHY again", TIMEOUT, || {
        node_health(&node).is_ok_and(|h| h == "HEALTHY")
    })?;
    Ok(())
}

#[test]
fn curator_serves_again_after_etcd_crashes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    ctl_ok(&node, "config", &["takeownership", "--accept-ca"])?;
    let etcd = node.etcd_pid()?;
    // SAFETY: kill(2) on the etcd child of our own polis-node.
    unsafe { libc::kill(etcd, libc::SIGKILL) };
    let proc = node.proc();
    e2e::wait_until("etcd ready again", TIMEOUT, || {
        proc.output().matches("etcd is ready").count() >= 2
    })?;
    let listed: serde_json::Value =
        serde_json::from_str(&ctl_ok(&node, "config", &["node", "list", "-o", "json"])?)?;
    assert_eq!(listed[0]["state"], "UP");
    ctl_ok(
        &node,
        "config",
        &[
            "node",
            "label",
            listed[0]["id"].as_str().unwrap(),
            "after=crash",
        ],
    )?;
    Ok(())
}
