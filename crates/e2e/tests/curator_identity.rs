//! A node certificate is not a curator (issue 15): clients require a curator
//! certificate, which only consensus members get and lose with the role. Real
//! polis-node and etcd processes on 127.x addresses; the impostor is a TLS server this
//! test runs on an address a client dials, with a node's real certificate and key.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use e2e::{Cluster, TIMEOUT, wait_until};
use proto::api;

/// A TLS server on `at` presenting `credentials` to whoever connects, until dropped.
struct Impostor(tokio::task::JoinHandle<()>);

impl Drop for Impostor {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves `credentials` on `at` (binding as soon as the address is free).
async fn impostor(at: SocketAddr, credentials: rpc::Credentials) -> Result<Impostor> {
    let tls = rpc::tls::server_config(&credentials)?;
    let deadline = std::time::Instant::now() + TIMEOUT;
    let listener = loop {
        match tokio::net::TcpListener::bind(at).await {
            Ok(l) => break l,
            Err(e) if std::time::Instant::now() > deadline => {
                return Err(e).with_context(|| format!("binding {at}"));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    Ok(Impostor(tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = acceptor.accept(tcp).await;
            });
        }
    })))
}

/// A node's node certificate and key, from its root.
fn node_credentials(root: &Path) -> Result<rpc::Credentials> {
    Ok(rpc::Credentials {
        certificate: std::fs::read(root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(root.join("data/node/key.der"))?,
    })
}

/// `polisctl node list` with the owner's config against `endpoint` only; fails with
/// its error output when polisctl does.
fn list_at(cluster: &Cluster, endpoint: std::net::IpAddr) -> Result<String, String> {
    let config = cluster.config.to_str().expect("utf-8 path");
    let endpoint = endpoint.to_string();
    let args = ["--config", config, "--endpoints", &endpoint, "node", "list"];
    let (status, out, err) =
        tokio::task::block_in_place(|| e2e::polisctl(&args)).map_err(|e| format!("{e:#}"))?;
    if status.success() { Ok(out) } else { Err(err) }
}

/// The certificate the server at `at` presents (trusting anything, as a first contact).
async fn served_certificate(at: SocketAddr) -> Result<Vec<u8>> {
    let config = rpc::tls::client_config(&rpc::ServerTrust::FirstUse, None)?;
    let tcp = tokio::net::TcpStream::connect(at).await?;
    let name = rustls::pki_types::ServerName::IpAddress(at.ip().into());
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    let chain = tls
        .get_ref()
        .1
        .peer_certificates()
        .context("no certificate")?;
    Ok(chain.first().context("empty chain")?.to_vec())
}

fn kind_of(der: &[u8]) -> Option<pki::CertificateKind> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    pki::CertificateKind::of(&cert)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_is_not_a_curator_and_a_curator_certificate_goes_with_the_role()
-> Result<()> {
    // Before: clients took any cluster-CA certificate naming the dialled address for a
    // curator's: against main's binaries polisctl completed the TLS handshake with the
    // worker and failed only after it ("listing nodes: failed: transport error", the
    // impostor speaking no HTTP/2), and no curator certificate existed to revoke.
    let dir = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| Cluster::bootstrap(dir.path()))?;
    let params = cluster.register_params("workers")?;
    let (worker, _) = tokio::task::block_in_place(|| cluster.add_worker("w1", &params))?;
    let (mut member, member_id) =
        tokio::task::block_in_place(|| cluster.add_worker("w2", &params))?;

    // Case 1: the worker poses as a curator at its own address with its own, valid
    // node certificate.
    let at = SocketAddr::new(worker.address, rpc::CURATOR_PORT);
    let worker_credentials = node_credentials(&worker.root)?;
    let _impostor = impostor(at, worker_credentials.clone()).await?;
    let refused = list_at(&cluster, worker.address).expect_err("polisctl took the worker");
    println!("polisctl facing the worker: {refused}");
    assert!(
        refused.contains("is no curator of this cluster")
            && refused.contains("not a curator certificate")
            && refused.contains("polis:node"),
        "{refused}"
    );
    // A node's curator client (ClusterCa with the CRL, as `curator_client` builds it).
    let ca = std::fs::read(member.root.join("data/node/ca.der"))?;
    let crl = rpc::TrustSlot::new(ca.clone());
    let client = rpc::CuratorClient::new(
        vec![at],
        rpc::ServerTrust::ClusterCa { trust: crl.clone() },
        Some(node_credentials(&member.root)?),
    )?;
    let answer = client
        .call(|c| async move {
            api::curator_local_client::CuratorLocalClient::new(c)
                .get_current_leader(api::GetCurrentLeaderRequest {})
                .await
        })
        .await;
    let refused = format!(
        "{:#}",
        answer.expect_err("the node's client took the worker")
    );
    println!("a node's client facing the worker: {refused}");
    assert!(refused.contains("not a curator certificate"), "{refused}");
    drop(_impostor);

    // The real curator serves a curator certificate, and polisctl accepts it.
    let first = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let served = served_certificate(first).await?;
    assert_eq!(kind_of(&served), Some(pki::CertificateKind::Curator));
    list_at(&cluster, cluster.first.address).expect("the real curator");

    // Case 2: a member's curator certificate is revoked when it loses the role.
    tokio::task::block_in_place(|| {
        cluster.ctl_retry(&["node", "add-role", &member_id, "ConsensusMember"])
    })?;
    tokio::task::block_in_place(|| member.wait_for_curator())?;
    // Both members' records hold their etcd member IDs (bootstrap, join): removals
    // match members by them, not by address.
    for (node, id) in [
        (&cluster.first, cluster.first.key_node_id()?),
        (&member, member_id.clone()),
    ] {
        let (recorded, actual) = tokio::task::block_in_place(|| {
            anyhow::Ok((node.recorded_member_id(&id)?, node.etcd_ids()?.1))
        })?;
        assert_eq!(recorded, actual, "node {id}");
    }
    let member_at = SocketAddr::new(member.address, rpc::CURATOR_PORT);
    let member_curator = served_certificate(member_at).await?;
    assert_eq!(
        kind_of(&member_curator),
        Some(pki::CertificateKind::Curator)
    );
    list_at(&cluster, member.address).expect("the new member's curator");
    let (ok, _, err) = tokio::task::block_in_place(|| {
        cluster.ctl(&["node", "remove-role", &member_id, "ConsensusMember"])
    })?;
    assert!(ok, "remove-role: {err}");
    // The owner's polisctl learns the CRL from the real curator (once per session).
    list_at(&cluster, cluster.first.address).expect("the real curator");
    let stolen = rpc::Credentials {
        certificate: member_curator,
        key_pkcs8: node_credentials(&member.root)?.key_pkcs8,
    };
    // The member's curator stops with the role; the old certificate serves on.
    let _impostor = impostor(member_at, stolen).await?;
    let mut last = String::new();
    tokio::task::block_in_place(|| {
        wait_until(
            "polisctl refusing the revoked curator certificate",
            TIMEOUT,
            || match list_at(&cluster, member.address) {
                Ok(out) => {
                    last = out;
                    false
                }
                Err(err) => {
                    last = err;
                    last.to_lowercase().contains("revoked")
                }
            },
        )
    })
    .with_context(|| format!("last answer: {last}"))?;
    println!("polisctl facing the removed member's certificate: {last}");
    // The node's client refuses it too, once it holds the CRL that revokes it.
    let current = tokio::task::block_in_place(|| cluster.owner_client())?;
    let answer = current
        .call(|c| async move {
            api::curator_local_client::CuratorLocalClient::new(c)
                .get_ca_certificate(api::GetCaCertificateRequest::default())
                .await
        })
        .await?;
    crl.offer(&answer.crl)?;
    let client = rpc::CuratorClient::new(
        vec![member_at],
        rpc::ServerTrust::ClusterCa { trust: crl },
        Some(worker_credentials),
    )?;
    let answer = client
        .call(|c| async move {
            api::curator_local_client::CuratorLocalClient::new(c)
                .get_current_leader(api::GetCurrentLeaderRequest {})
                .await
        })
        .await;
    let refused = format!("{:#}", answer.expect_err("the node's client took it"));
    assert!(refused.to_lowercase().contains("revoked"), "{refused}");
    println!("a node's client facing the removed member's certificate: {refused}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_certificate_is_renewed_when_due_and_served_at_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| {
        Cluster::bootstrap_with(dir.path(), &["--node-certificate-lifetime", "6s"], &[])
    })?;
    let at = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let first = served_certificate(at).await?;
    assert_eq!(kind_of(&first), Some(pki::CertificateKind::Curator));
    // Renewed at 2/3 of its 6 s: a new one is served without a restart.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let renewed = loop {
        let served = served_certificate(at).await?;
        if served != first {
            break served;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the curator certificate was never renewed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(kind_of(&renewed), Some(pki::CertificateKind::Curator));
    let (first_validity, renewed_validity) =
        (pki::Validity::of(&first)?, pki::Validity::of(&renewed)?);
    assert!(renewed_validity.not_after > first_validity.not_after);
    // Issued only when due (at 2/3 of 6 s), not once per poll: recorded as
    // curator-<id>-<serial>.
    let id = cluster.first.key_node_id()?;
    let owner = tokio::task::block_in_place(|| cluster.owner_client())?;
    let listed = owner
        .call(|c| async move {
            api::management_client::ManagementClient::new(c)
                .list_certificates(api::ListCertificatesRequest {})
                .await
        })
        .await?;
    let elapsed = pki::unix_now().saturating_sub(first_validity.issued());
    let curator: Vec<_> = listed
        .certificates
        .iter()
        .filter(|c| c.name.starts_with(&format!("curator-{id}-")))
        .collect();
    assert!(
        curator.len() >= 2 && curator.len() as u64 <= elapsed / 4 + 2,
        "{} curator certificates in {elapsed} s",
        curator.len()
    );
    assert!(
        curator
            .iter()
            .all(|c| c.kind == "curator" && c.node_id == id)
    );
    Ok(())
}
