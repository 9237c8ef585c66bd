//! The authorization matrix over real mTLS against a real polis-node: every declared
//! RPC called by every kind of caller (none, self-signed, node, owner, the operator
//! roles admin, operator and reader, expired, revoked, foreign CA), each allowed or
//! denied exactly as `rpc::authz::METHODS` (and the handlers' own role checks) say.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{Node, TIMEOUT};
use proto::api;

/// The identities of the matrix, as client credentials (None: no certificate).
struct Identities {
    anonymous: Option<rpc::Credentials>,
    self_signed: Option<rpc::Credentials>,
    node: Option<rpc::Credentials>,
    owner: Option<rpc::Credentials>,
    admin: Option<rpc::Credentials>,
    operator: Option<rpc::Credentials>,
    reader: Option<rpc::Credentials>,
    expired_owner: Option<rpc::Credentials>,
    revoked_owner: Option<rpc::Credentials>,
    foreign_ca: Option<rpc::Credentials>,
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
    let owner = ca.issue(
        &curator::templates::owner_certificate_template(day),
        &owner_key.public_key(),
    )?;
    let expired = ca.issue_at(
        &curator::templates::owner_certificate_template(day),
        &owner_key.public_key(),
        time::OffsetDateTime::now_utc() - 2 * day,
    )?;
    let revoked = ca.issue(
        &curator::templates::owner_certificate_template(day),
        &owner_key.public_key(),
    )?;
    store.revoke(&revoked.serial).await?;
    let foreign = pki::Ca::generate("Foreign CA", pki::CA_LIFETIME)?.issue(
        &curator::templates::owner_certificate_template(day),
        &owner_key.public_key(),
    )?;
    let role = |name: &str, role: pki::OperatorRole| -> Result<rpc::Credentials> {
        let template = curator::templates::operator_certificate_template(name, role, day);
        Ok(creds(
            ca.issue(&template, &owner_key.public_key())?.der,
            owner_key,
        ))
    };
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
        admin: Some(role("ada", pki::OperatorRole::Admin)?),
        operator: Some(role("otto", pki::OperatorRole::Operator)?),
        reader: Some(role("rita", pki::OperatorRole::Reader)?),
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
            .get_ca_certificate(api::GetCaCertificateRequest::default())
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
        // Served on the node's own port, not the curator's.
        "NodeLogsTail" => {
            let channel = rpc::connect(
                SocketAddr::new(endpoint.ip(), rpc::NODE_LOGS_PORT),
                // The node serves with its own node certificate (a one-node cluster:
                // `node_id` is the node at `endpoint`).
                &rpc::ServerTrust::ClusterNode {
                    trust: rpc::TrustSlot::new(ca.to_vec()),
                    node_id: node_id.to_string(),
                },
                credentials,
            )
            .await?;
            api::node_logs_client::NodeLogsClient::new(channel)
                .node_logs_tail(api::NodeLogsRequest::default())
                .await
                .err()
        }
        "AuditLog" => api::audit_client::AuditClient::new(channel_for_curator.clone())
            .audit_log(api::AuditLogRequest::default())
            .await
            .err(),
        "TakeBackup" => api::backup_client::BackupClient::new(channel_for_curator.clone())
            .take_backup(api::TakeBackupRequest {})
            .await
            .err(),
        "GetConsensusStatus" => local
            .get_consensus_status(api::GetConsensusStatusRequest {})
            .await
            .err(),
        // Of member 0, which is nobody: the handler refuses (FailedPrecondition).
        "DefragmentMember" => local
            .defragment_member(api::DefragmentMemberRequest { member_id: 0 })
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
        // Naming no signing CA: InvalidArgument means the call got through (a real
        // rotation would replace the CA the matrix pins).
        "RotateCa" => management
            .rotate_ca(api::RotateCaRequest::default())
            .await
            .err(),
        "GetCaRotation" => management
            .get_ca_rotation(api::GetCaRotationRequest::default())
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
        // Asking for no certificate: InvalidArgument means the call got through.
        "IssueKubernetesCertificates" => {
            api::curator_client::CuratorClient::new(channel_for_curator.clone())
                .issue_kubernetes_certificates(api::IssueKubernetesCertificatesRequest::default())
                .await
                .err()
        }
        // With no key: InvalidArgument means the call got through.
        "IssueKubernetesCredentials" => management
            .issue_kubernetes_credentials(api::IssueKubernetesCredentialsRequest::default())
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
                ..Default::default()
            })
            .await
            .err(),
        "CommitNode" => api::curator_client::CuratorClient::new(channel_for_curator.clone())
            .commit_node(api::CommitNodeRequest {})
            .await
            .err(),
        // No certificate shown: InvalidArgument means the call got through.
        "ReissueNodeCertificate" => {
            api::curator_client::CuratorClient::new(channel_for_curator.clone())
                .reissue_node_certificate(api::ReissueNodeCertificateRequest::default())
                .await
                .err()
        }
        // Scheduled snapshots: a bad name (InvalidArgument) means the call got through.
        "ListSnapshots" => api::backup_client::BackupClient::new(channel_for_curator.clone())
            .list_snapshots(api::ListSnapshotsRequest {})
            .await
            .err(),
        "FetchSnapshot" => api::backup_client::BackupClient::new(channel_for_curator.clone())
            .fetch_snapshot(api::FetchSnapshotRequest {
                node_id: node_id.to_string(),
                name: "../matrix".into(),
            })
            .await
            .err(),
        "SnapshotsListLocal" => local
            .snapshots_list_local(api::SnapshotsListLocalRequest {})
            .await
            .err(),
        "SnapshotsFetchLocal" => local
            .snapshots_fetch_local(api::SnapshotsFetchLocalRequest {
                name: "../matrix".into(),
            })
            .await
            .err(),
        // Nothing to change: InvalidArgument means the call got through.
        "SetSnapshotSchedule" => management
            .set_snapshot_schedule(api::SetSnapshotScheduleRequest::default())
            .await
            .err(),
        "CreateRegisterTicket" => management
            .create_register_ticket(api::CreateRegisterTicketRequest {
                ttl_seconds: 60,
                uses: 1,
            })
            .await
            .err(),
        "ListRegisterTickets" => management
            .list_register_tickets(api::ListRegisterTicketsRequest {})
            .await
            .err(),
        // A bad role: InvalidArgument means the call got through.
        "AddOperator" => management
            .add_operator(api::AddOperatorRequest {
                name: "matrix".into(),
                role: "root".into(),
                public_key: vec![7; 32],
            })
            .await
            .err(),
        "ListOperators" => management
            .list_operators(api::ListOperatorsRequest {})
            .await
            .err(),
        // Nobody of that name: NotFound means the call got through.
        "RemoveOperator" => management
            .remove_operator(api::RemoveOperatorRequest {
                name: "nobody".into(),
            })
            .await
            .err(),
        // No such ticket: NotFound means the call got through.
        "RevokeRegisterTicket" => management
            .revoke_register_ticket(api::RevokeRegisterTicketRequest {
                id: "00000000".into(),
            })
            .await
            .err(),
        // No record holds this key as a data join key: the handler refuses
        // (PermissionDenied, naming the join key) once the call got through.
        "UnlockData" => api::data_unlock_client::DataUnlockClient::new(channel_for_curator.clone())
            .unlock_data(api::UnlockDataRequest {})
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
            if ["CommitNode", "JoinConsensus", "DefragmentMember"].contains(&method)
                && s.code() == tonic::Code::FailedPrecondition =>
        {
            Ok(true)
        }
        Some(s)
            if [
                "DecommissionNode",
                "DeleteNode",
                "UpdateNodeRoles",
                "RevokeRegisterTicket",
                "RemoveOperator",
            ]
            .contains(&method)
                && s.code() == tonic::Code::NotFound =>
        {
            Ok(true)
        }
        Some(s)
            if ["RotateOwner", "AddOperator", "RotateCa"].contains(&method)
                && s.code() == tonic::Code::InvalidArgument =>
        {
            Ok(true)
        }
        Some(s)
            if method == "UnlockData"
                && s.code() == tonic::Code::PermissionDenied
                && s.message().contains("join key") =>
        {
            Ok(true)
        }
        Some(s)
            if [
                "FetchSnapshot",
                "SnapshotsFetchLocal",
                "SetSnapshotSchedule",
                "IssueKubernetesCertificates",
                "IssueKubernetesCredentials",
                "ReissueNodeCertificate",
            ]
            .contains(&method)
                && s.code() == tonic::Code::InvalidArgument =>
        {
            Ok(true)
        }
        Some(s) => anyhow::bail!("{method}: unexpected error {s:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_matrix_over_real_tls() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // The matrix calls the methods limited per source (RegisterNode, CommitNode, Escrow,
    // UnlockData) about 30 times from one address: past that limit, which is not what
    // this test is about (`entry_rate_limits`, `hostile_connections`).
    let node = tokio::task::block_in_place(|| -> Result<Node> {
        let mut node = Node::new(dir.path());
        node.extra_args = vec!["--entry-rate-per-second".into(), "0".into()];
        let params = node.bootstrap_params()?;
        node.start(&["--params", params.to_str().context("utf-8 path")?])?;
        node.wait_home()?;
        Ok(node)
    })?;
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

    // The node serves its logs on its own port once Home and once it holds the cluster
    // CRL (from its first WatchNode answer), moments after the curator.
    while !allowed(
        endpoint,
        &ca,
        ids.owner.as_ref(),
        "NodeLogsTail",
        &owner_key,
        &node_id,
        &[],
    )
    .await
    .unwrap_or(false)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never served its logs to the owner"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let who: [(&str, Option<&rpc::Credentials>); 10] = [
        ("none", ids.anonymous.as_ref()),
        ("self-signed", ids.self_signed.as_ref()),
        ("node", ids.node.as_ref()),
        ("owner", ids.owner.as_ref()),
        ("admin", ids.admin.as_ref()),
        ("operator", ids.operator.as_ref()),
        ("reader", ids.reader.as_ref()),
        ("expired", ids.expired_owner.as_ref()),
        ("revoked", ids.revoked_owner.as_ref()),
        ("foreign", ids.foreign_ca.as_ref()),
    ];
    // Users by role: reader ⊂ operator ⊂ admin; the owner is an admin.
    const USERS: &[&str] = &["owner", "admin", "operator", "reader"];
    const OPERATORS: &[&str] = &["owner", "admin", "operator"];
    const ADMINS: &[&str] = &["owner", "admin"];
    let public = [
        "none",
        "self-signed",
        "node",
        "owner",
        "admin",
        "operator",
        "reader",
    ];
    let read_status = ["node", "owner", "admin", "operator", "reader"];
    let expected: &[(&str, &[&str])] = &[
        ("GetCurrentLeader", &public),
        ("GetCACertificate", &public),
        ("Escrow", &["self-signed"]),
        ("GetClusterInfo", &read_status),
        ("ListNodes", &read_status),
        ("DescribeNode", &read_status),
        ("UpdateNodeLabels", OPERATORS),
        ("GetRegisterTicket", ADMINS),
        ("ApproveNode", OPERATORS),
        ("DecommissionNode", OPERATORS),
        ("DeleteNode", OPERATORS),
        // Adding ConsensusMember (what the matrix asks) needs an admin.
        ("UpdateNodeRoles", ADMINS),
        ("ListCertificates", USERS),
        // Only the owner itself.
        ("RotateOwner", &["owner"]),
        ("RotateCa", ADMINS),
        ("GetCaRotation", USERS),
        ("TakeBackup", ADMINS),
        ("AuditLog", OPERATORS),
        ("NodeLogsTail", OPERATORS),
        ("GetConsensusStatus", &read_status),
        ("DefragmentMember", &["node"]),
        ("ListSnapshots", OPERATORS),
        ("FetchSnapshot", ADMINS),
        ("SnapshotsListLocal", &["node"]),
        ("SnapshotsFetchLocal", &["node"]),
        ("SetSnapshotSchedule", OPERATORS),
        ("Heartbeat", &["node"]),
        ("WatchNode", &["node"]),
        ("JoinConsensus", &["node"]),
        ("RenewCertificates", &["node"]),
        ("IssueKubernetesCertificates", &["node"]),
        // A person's Kubernetes identity: the owner and every operator, never a node.
        ("IssueKubernetesCredentials", USERS),
        ("RegisterNode", &["self-signed"]),
        ("CommitNode", &["self-signed"]),
        ("ReissueNodeCertificate", &["self-signed"]),
        ("CreateRegisterTicket", ADMINS),
        ("ListRegisterTickets", USERS),
        ("RevokeRegisterTicket", ADMINS),
        ("AddOperator", ADMINS),
        ("ListOperators", USERS),
        ("RemoveOperator", ADMINS),
        ("UnlockData", &["self-signed"]),
        // Last: it replaces the ticket RegisterNode uses above.
        ("RotateRegisterTicket", ADMINS),
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

    // RotateRegisterTicket revoked every ticket: the one RegisterNode used above no
    // longer registers a new key; each GetRegisterTicket creates a new one.
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
    assert_ne!(t1, t2);
    assert_ne!(t1, ticket, "RotateRegisterTicket replaced the ticket");
    let stranger = rpc::self_signed(&identity::NodeKey::generate()?)?;
    let channel = rpc::connect(
        endpoint,
        &rpc::ServerTrust::PinnedCa(ca.clone()),
        Some(&stranger),
    )
    .await?;
    let refused = api::curator_client::CuratorClient::new(channel)
        .register_node(api::RegisterNodeRequest {
            register_ticket: ticket.clone(),
            address: "127.0.0.2".into(),
            ..Default::default()
        })
        .await
        .expect_err("a rotated ticket must not register a new key");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    Ok(())
}

fn node_id(node: &Node) -> Result<String> {
    use prost::Message;
    let sealed = std::fs::read(node.root.join("esp/sealed_configuration.pb"))?;
    Ok(proto::config::SealedConfiguration::decode(sealed.as_slice())?.node_id)
}
