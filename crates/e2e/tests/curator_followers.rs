//! Two curators on one real etcd, serving over real mTLS: one leads, the follower answers
//! CuratorLocal itself and forwards Management calls to the leader, and takes over when
//! the leader stops.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use consensus::Namespaced;
use e2e::{BareEtcd, TIMEOUT, unique_loopback};
use proto::api;

struct Curator {
    node_id: String,
    endpoint: SocketAddr,
    supervisor: Option<supervisor::Supervisor>,
}

fn node_record(key: &identity::NodeKey, address: std::net::IpAddr) -> proto::state::Node {
    proto::state::Node {
        id: key.node_id(),
        public_key: key.public_key().to_vec(),
        state: proto::state::NodeState::Up as i32,
        roles: Some(proto::state::NodeRoles {
            consensus_member: Some(proto::state::ConsensusMemberRole::default()),
            ..Default::default()
        }),
        address: address.to_string(),
        labels: Default::default(),
        ..Default::default()
    }
}

fn start_curator(
    ns: &Namespaced,
    ca: &pki::Ca,
    key: &identity::NodeKey,
    address: std::net::IpAddr,
) -> Result<Curator> {
    let node_id = key.node_id();
    let cert = ca.issue(
        &pki::Template {
            common_name: node_id.clone(),
            dns_names: vec![node_id.clone()],
            ip_addresses: vec![address],
            usage: pki::Usage::ServerAndClient,
            lifetime: pki::CERTIFICATE_LIFETIME,
            kind: pki::CertificateKind::Node,
        },
        &key.public_key(),
    )?;
    let endpoint = SocketAddr::new(address, rpc::CURATOR_PORT);
    let config = curator::service::CuratorConfig {
        node_id: node_id.clone(),
        listen: endpoint,
        credentials: rpc::CredentialSlot::new(rpc::Credentials {
            certificate: cert.der,
            key_pkcs8: key.pkcs8_der().to_vec(),
        })?,
        ca_certificate: ca.cert_der.clone(),
        lease_ttl: Duration::from_secs(2),
        heartbeat: curator::health::Timing::DEFAULT,
        etcd_quota_bytes: proto::quota::DEFAULT_QUOTA_BYTES,
        etcd_run_dir: None,
        upkeep: curator::upkeep::Settings::DEFAULT,
        snapshots: Default::default(),
        entry_rate: rpc::server::RateSettings::DEFAULT,
        serving: event::Value::new(),
    };
    let ns = ns.clone();
    let supervisor = supervisor::Supervisor::start(supervisor::Config::default(), move |ctx| {
        curator::service::run(ctx, config.clone(), ns.clone())
    });
    Ok(Curator {
        node_id,
        endpoint,
        supervisor: Some(supervisor),
    })
}

async fn list_nodes(
    endpoint: SocketAddr,
    ca: &[u8],
    owner: &rpc::Credentials,
) -> Result<Result<usize, tonic::Status>> {
    let channel = rpc::connect(
        endpoint,
        &rpc::ServerTrust::PinnedCa(ca.to_vec()),
        Some(owner),
    )
    .await?;
    let response = api::management_client::ManagementClient::new(channel)
        .list_nodes(api::ListNodesRequest::default())
        .await;
    Ok(response.map(|r| r.into_inner().nodes.len()))
}

async fn leader_of(endpoint: SocketAddr, ca: &[u8]) -> Result<api::GetCurrentLeaderResponse> {
    let channel = rpc::connect(endpoint, &rpc::ServerTrust::PinnedCa(ca.to_vec()), None).await?;
    Ok(api::curator_local_client::CuratorLocalClient::new(channel)
        .get_current_leader(api::GetCurrentLeaderRequest {})
        .await?
        .into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_serves_local_api_and_takes_over() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let etcd = BareEtcd::spawn(
        dir.path(),
        unique_loopback(),
        consensus::RaftTiming {
            heartbeat: Duration::from_millis(20),
            election_timeout: Duration::from_millis(200),
        },
    )?;
    let ns = Namespaced::new(
        etcd.ready_client(TIMEOUT).await?,
        curator::layout::NAMESPACE,
    );

    // Cluster state as a bootstrap would leave it, for two consensus members.
    let (ca, _) = curator::cluster_pki(&ns)
        .ensure_ca(|| pki::Ca::generate("Polis Cluster CA", pki::CA_LIFETIME))
        .await?;
    let owner_key = identity::NodeKey::generate()?;
    let (key_a, key_b) = (
        identity::NodeKey::generate()?,
        identity::NodeKey::generate()?,
    );
    let (addr_a, addr_b) = (unique_loopback(), unique_loopback());
    curator::create_bootstrap_records(
        &ns,
        &curator::BootstrapRecords {
            node: node_record(&key_a, addr_a),
            owner_public_key: owner_key.public_key().to_vec(),
            configuration: proto::config::ClusterConfiguration {
                cluster_domain: "test".into(),
                ..Default::default()
            },
        },
    )
    .await?;
    use prost::Message;
    ns.put(
        &curator::layout::node_key(&key_b.node_id()),
        node_record(&key_b, addr_b).encode_to_vec(),
    )
    .await?;
    let owner_cert = ca.issue(
        &pki::Template {
            common_name: "owner".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            usage: pki::Usage::Client,
            lifetime: Duration::from_secs(3600),
            kind: pki::CertificateKind::Owner,
        },
        &owner_key.public_key(),
    )?;
    let owner = rpc::Credentials {
        certificate: owner_cert.der,
        key_pkcs8: owner_key.pkcs8_der().to_vec(),
    };

    let mut curators = [
        start_curator(&ns, &ca, &key_a, addr_a)?,
        start_curator(&ns, &ca, &key_b, addr_b)?,
    ];

    // Both agree on one leader.
    let deadline = Instant::now() + TIMEOUT;
    let leader_id = loop {
        let a = leader_of(curators[0].endpoint, &ca.cert_der).await;
        let b = leader_of(curators[1].endpoint, &ca.cert_der).await;
        if let (Ok(a), Ok(b)) = (a, b)
            && !a.leader_node_id.is_empty()
            && a.leader_node_id == b.leader_node_id
        {
            break a.leader_node_id;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "curators never agreed on a leader"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let leader = curators
        .iter()
        .position(|c| c.node_id == leader_id)
        .context("leader is one of ours")?;
    let follower = 1 - leader;

    // The leader serves Management (once it acts: `election::TAKEOVER` after its win),
    // and so does the follower: it forwards the call to the leader with the owner's
    // verified identity.
    let deadline = Instant::now() + TIMEOUT;
    let served = loop {
        match list_nodes(curators[leader].endpoint, &ca.cert_der, &owner).await? {
            Err(s) if s.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answer => break answer,
        }
    };
    assert_eq!(served?, 2);
    let forwarded = list_nodes(curators[follower].endpoint, &ca.cert_der, &owner).await?;
    assert_eq!(forwarded.map_err(|s| s.to_string()), Ok(2));
    // The follower serves the local API.
    let local = leader_of(curators[follower].endpoint, &ca.cert_der).await?;
    assert_eq!(local.this_node_id, curators[follower].node_id);
    assert_eq!(local.leader_endpoint, curators[leader].endpoint.to_string());

    // polisctl pointed at the follower only still reaches the leader it names.
    let config = dir.path().join("polisctl");
    std::fs::create_dir(&config)?;
    let pem = |tag: &str, der: &[u8]| pem::encode(&pem::Pem::new(tag, der));
    for (file, text) in [
        ("owner-key.pem", pem("PRIVATE KEY", owner_key.pkcs8_der())),
        ("owner.pem", pem("CERTIFICATE", &owner.certificate)),
        ("ca.pem", pem("CERTIFICATE", &ca.cert_der)),
    ] {
        privatefs::write_atomic(&config.join(file), text.as_bytes())?;
    }
    let follower_endpoint = curators[follower].endpoint.to_string();
    let (status, out, err) = tokio::task::block_in_place(|| {
        e2e::polisctl(&[
            "--config",
            config.to_str().unwrap(),
            "--endpoints",
            &follower_endpoint,
            "node",
            "list",
            "-o",
            "json",
        ])
    })?;
    assert!(status.success(), "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{out}");

    // Stop the leader: the follower takes over Management.
    let stopped = Instant::now();
    curators[leader]
        .supervisor
        .take()
        .context("running")?
        .shutdown()
        .await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Ok(Ok(n)) = list_nodes(curators[follower].endpoint, &ca.cert_der, &owner).await {
            assert_eq!(n, 2);
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the follower never took over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "Management served by the new leader {:?} after the old one stopped",
        stopped.elapsed()
    );
    if let Some(s) = curators[follower].supervisor.take() {
        s.shutdown().await;
    }
    Ok(())
}
