//! Fenced issuing (issue 15): a certificate being issued while its node is
//! decommissioned or deleted is either revoked by it or never recorded nor handed
//! out. The curator's test hooks (`POLIS_PAUSE_AT`, built with `--features
//! node/crash-points`) widen the window between the fence's read and the recording:
//! `node-certificate-signed:<ms>` for a renewal (the node is decommissioned inside it),
//! `node-commit-fenced:<ms>` for a first commit (the STANDBY node is deleted inside it),
//! `owner-certificate-signed:<ms>` for an Escrow (the owner key is rotated inside it),
//! `operator-certificate-signed:<ms>` for an operator's Escrow (the operator is removed
//! inside it). Also (issue 28) `operator-record-deleted:<ms>`: a removal held between
//! deleting the operator's record and revoking its certificates, the state a failed
//! revocation leaves, which `operator list` shows as an unfinished removal.
//! Real polis-node and etcd processes on 127.x addresses.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{Cluster, Node, read_register_params};
use proto::api;

/// How long the curator pauses between signing and recording a renewed certificate.
const PAUSE: &str = "node-certificate-signed:8000";

/// A one-node cluster whose curator pauses at `pause` (`POLIS_PAUSE_AT`), owned.
fn paused_cluster(dir: &std::path::Path, pause: &str) -> Result<Cluster> {
    tokio::task::block_in_place(|| -> Result<Cluster> {
        let first_dir = dir.join("n0");
        std::fs::create_dir_all(&first_dir)?;
        let mut first = Node::new(&first_dir);
        let params = first.bootstrap_params_with(&["--node-certificate-lifetime", "60s"])?;
        first.start_with_env(
            &["--params", params.to_str().context("utf-8 path")?],
            &[("POLIS_PAUSE_AT", pause)],
        )?;
        first.wait_home()?;
        let cluster = Cluster {
            dir: dir.to_path_buf(),
            config: first_dir.join("config"),
            first,
            node_args: Vec::new(),
        };
        let endpoint = cluster.first.address.to_string();
        cluster.ctl_retry(&["--endpoints", &endpoint, "takeownership", "--accept-ca"])?;
        Ok(cluster)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_racing_a_decommission_leaves_no_valid_certificate() -> Result<()> {
    // Before: the renewal recorded its certificate after the decommission listed and
    // revoked the node's certificates, and handed it out: valid and not revoked.
    let dir = tempfile::tempdir()?;
    let mut cluster = paused_cluster(dir.path(), PAUSE)?;
    let register =
        tokio::task::block_in_place(|| read_register_params(&cluster.register_params("racer")?))?;
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
    let validity = pki::Validity::of(&first)?;
    // The curator renews only when due (a quarter of the lifetime before the renewal
    // point on): wait for that.
    tokio::task::block_in_place(|| {
        e2e::wait_until("the renewal to be due", Duration::from_secs(60), || {
            pki::unix_now() + validity.lifetime() / 4 > validity.renew_at()
        })
    })?;
    let credentials = rpc::Credentials {
        certificate: first.clone(),
        key_pkcs8: key.pkcs8_der().to_vec(),
    };
    let channel = rpc::connect(endpoint, &trust, Some(&credentials)).await?;
    let renewal = tokio::spawn(async move {
        let answer = api::curator_client::CuratorClient::new(channel)
            .renew_certificates(api::RenewCertificatesRequest { peer: false })
            .await;
        anyhow::Ok(answer)
    });
    // The renewal signed its certificate and waits to record it: decommission now.
    tokio::task::block_in_place(|| -> Result<()> {
        cluster
            .first
            .proc()
            .wait_for_line(Duration::from_secs(60), |l| {
                l.contains("pause point reached") && l.contains(&id)
            })
            .context("the renewal to reach its pause point")?;
        cluster.ctl_retry(&["node", "decommission", &id])?;
        cluster.wait_node(&id, "DECOMMISSIONED", None)
    })?;
    let answer = renewal.await??;
    let listed = listed_certificates(&cluster).await?;
    let valid = valid_names(&listed, &id);
    assert!(
        valid.is_empty(),
        "the decommissioned node holds valid, unrevoked certificates: {valid:?}"
    );
    match answer {
        Ok(renewed) => {
            // Handed out: it must be one the decommission revoked.
            let serial: String = pki::certificate_serial(&renewed.into_inner().node_certificate)?
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let record = listed
                .certificates
                .iter()
                .find(|c| c.serial.eq_ignore_ascii_case(&serial))
                .context("the renewed certificate is not recorded")?;
            assert!(
                record.revoked,
                "the renewed certificate {} is not revoked",
                record.name
            );
        }
        Err(status) => assert!(
            matches!(
                status.code(),
                tonic::Code::Aborted | tonic::Code::FailedPrecondition
            ),
            "renewal refused with an unexpected status: {status}"
        ),
    }
    // Keep the cluster alive until here.
    cluster.first.proc();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_commit_racing_a_deletion_records_no_certificate() -> Result<()> {
    // CommitNode reads the record once, for its lifecycle check and for the guard its
    // certificate is recorded under; the curator pauses (`node-commit-fenced`) between
    // that read and the recording, and the owner deletes the STANDBY node inside it.
    // Unguarded, the certificate would be recorded after the deletion revoked the
    // node's certificates: valid and unrevoked, for a node that no longer exists.
    let dir = tempfile::tempdir()?;
    let mut cluster = paused_cluster(dir.path(), "node-commit-fenced:8000")?;
    let register =
        tokio::task::block_in_place(|| read_register_params(&cluster.register_params("racer")?))?;
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
    let commit =
        tokio::spawn(
            async move { anyhow::Ok(curator.commit_node(api::CommitNodeRequest {}).await) },
        );
    tokio::task::block_in_place(|| -> Result<()> {
        cluster
            .first
            .proc()
            .wait_for_line(Duration::from_secs(60), |l| {
                l.contains("pause point reached") && l.contains(&id)
            })
            .context("the commit to reach its pause point")?;
        cluster.ctl_retry(&["node", "delete", &id])?;
        Ok(())
    })?;
    let answer = commit.await??;
    let valid = valid_names(&listed_certificates(&cluster).await?, &id);
    assert!(
        valid.is_empty(),
        "the deleted node holds valid, unrevoked certificates: {valid:?}"
    );
    match answer {
        Ok(committed) => panic!(
            "a deleted node was committed: {} byte certificate handed out",
            committed.into_inner().node_certificate.len()
        ),
        Err(status) => assert_eq!(
            status.code(),
            tonic::Code::Aborted,
            "commit refused with an unexpected status: {status}"
        ),
    }
    // Keep the cluster alive until here.
    cluster.first.proc();
    Ok(())
}

/// Lines of the curator's output saying a call reached the pause point `point`.
fn pauses_at(cluster: &mut Cluster, point: &str) -> usize {
    cluster
        .first
        .proc()
        .output()
        .lines()
        .filter(|l| l.contains("pause point reached") && l.contains(point))
        .count()
}

type EscrowAnswer = Result<tonic::Response<api::EscrowResponse>, tonic::Status>;

/// An Escrow of `public_key` over `channel`, in a task of its own (it pauses).
fn spawn_escrow(
    channel: tonic::transport::Channel,
    public_key: Vec<u8>,
) -> tokio::task::JoinHandle<Result<EscrowAnswer>> {
    tokio::spawn(async move {
        let answer = api::aaa_client::AaaClient::new(channel)
            .escrow(api::EscrowRequest { public_key })
            .await;
        anyhow::Ok(answer)
    })
}

/// An Escrow that raced a revocation was refused (Aborted: its guard failed), or
/// handed out a certificate that is recorded, and revoked.
fn assert_revoked_or_aborted(
    answer: EscrowAnswer,
    listed: &api::ListCertificatesResponse,
) -> Result<()> {
    match answer {
        Ok(escrowed) => {
            let serial: String = pki::certificate_serial(&escrowed.into_inner().owner_certificate)?
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let record = listed
                .certificates
                .iter()
                .find(|c| c.serial.eq_ignore_ascii_case(&serial))
                .context("the escrowed certificate is not recorded")?;
            assert!(record.revoked, "{} is not revoked", record.name);
        }
        Err(status) => assert_eq!(
            status.code(),
            tonic::Code::Aborted,
            "escrow refused with an unexpected status: {status}"
        ),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escrow_racing_an_owner_rotation_leaves_no_certificate_for_the_old_key() -> Result<()> {
    // Escrow checks the caller's key against the owner key, then records a certificate;
    // the curator pauses (`owner-certificate-signed`) in between, and the owner rotates
    // the key inside it. Before: the certificate was recorded after the rotation listed
    // and revoked the owner certificates, and handed out: a valid certificate for the
    // replaced key (one that a thief of the old key could hold on to).
    let dir = tempfile::tempdir()?;
    // Every Escrow pauses, takeownership's and the rotation's own too.
    let mut cluster = paused_cluster(dir.path(), "owner-certificate-signed:8000")?;
    let config = cluster.config.clone();
    let read_pem = |name: &str| -> Result<Vec<u8>> {
        let text = std::fs::read_to_string(config.join(name))?;
        Ok(pem::parse(text)?.into_contents())
    };
    let old_key = identity::NodeKey::from_pkcs8(&read_pem("owner-key.pem")?)?;
    let ca = read_pem("ca.pem")?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let channel = rpc::connect(
        endpoint,
        &rpc::ServerTrust::PinnedCa(ca),
        Some(&rpc::self_signed(&old_key)?),
    )
    .await?;
    let paused_before = pauses_at(&mut cluster, "owner-certificate-signed");
    let escrow = spawn_escrow(channel, old_key.public_key().to_vec());
    tokio::task::block_in_place(|| -> Result<()> {
        e2e::wait_until(
            "the old key's escrow to reach its pause point",
            Duration::from_secs(60),
            || pauses_at(&mut cluster, "owner-certificate-signed") > paused_before,
        )?;
        // RotateOwner replaces the key and revokes while the escrow waits; the
        // rotation's own Escrow (new key) pauses after that.
        let out = cluster.ctl_retry(&["cluster", "owner", "rotate"])?;
        println!("{}", out.trim_end());
        Ok(())
    })?;
    let answer = escrow.await??;
    let listed = listed_certificates(&cluster).await?;
    let now = pki::unix_now();
    let valid: Vec<&api::CertificateInfo> = listed
        .certificates
        .iter()
        .filter(|c| c.kind == "owner" && !c.revoked && c.not_after_unix > now)
        .collect();
    let new_owner = pki::certificate_serial(&read_pem("owner.pem")?)?;
    let new_serial: String = new_owner.iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        valid.len() == 1 && valid[0].serial.eq_ignore_ascii_case(&new_serial),
        "owner certificates valid after the rotation, the new one is {new_serial}: {:?}",
        valid.iter().map(|c| &c.serial).collect::<Vec<_>>()
    );
    match answer {
        Ok(escrowed) => {
            // Handed out: it must be one the rotation revoked.
            let serial: String = pki::certificate_serial(&escrowed.into_inner().owner_certificate)?
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let record = listed
                .certificates
                .iter()
                .find(|c| c.serial.eq_ignore_ascii_case(&serial))
                .context("the escrowed certificate is not recorded")?;
            assert!(
                record.revoked,
                "the old key's certificate {} is not revoked",
                record.name
            );
        }
        Err(status) => assert_eq!(
            status.code(),
            tonic::Code::Aborted,
            "escrow refused with an unexpected status: {status}"
        ),
    }
    // Keep the cluster alive until here.
    cluster.first.proc();
    Ok(())
}

/// Adds operator "ada" (admin) with a new key; returns a channel to the first curator
/// proving that key (self-signed, as a first escrow does) and the key.
async fn add_ada(cluster: &Cluster) -> Result<(tonic::transport::Channel, Vec<u8>)> {
    let ca = {
        let text = std::fs::read_to_string(cluster.config.join("ca.pem"))?;
        pem::parse(text)?.into_contents()
    };
    let key = identity::NodeKey::generate()?;
    let owner = tokio::task::block_in_place(|| cluster.owner_client())?;
    let public_key = key.public_key().to_vec();
    owner
        .call(|c| {
            let public_key = public_key.clone();
            async move {
                api::management_client::ManagementClient::new(c)
                    .add_operator(api::AddOperatorRequest {
                        name: "ada".into(),
                        role: "admin".into(),
                        public_key,
                    })
                    .await
            }
        })
        .await?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let channel = rpc::connect(
        endpoint,
        &rpc::ServerTrust::PinnedCa(ca),
        Some(&rpc::self_signed(&key)?),
    )
    .await?;
    Ok((channel, public_key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_escrow_racing_its_removal_leaves_no_valid_certificate() -> Result<()> {
    // Escrow finds the operator holding the key, then records its certificate; the
    // curator pauses (`operator-certificate-signed`) in between, and the owner removes
    // the operator inside it. The recording is guarded by the operator's record: it
    // fails (Aborted), or the certificate is recorded in time to be revoked.
    let dir = tempfile::tempdir()?;
    let mut cluster = paused_cluster(dir.path(), "operator-certificate-signed:8000")?;
    let (channel, public_key) = add_ada(&cluster).await?;
    let escrow = spawn_escrow(channel, public_key);
    tokio::task::block_in_place(|| -> Result<()> {
        e2e::wait_until(
            "ada's escrow to reach its pause point",
            Duration::from_secs(60),
            || pauses_at(&mut cluster, "operator-certificate-signed") > 0,
        )?;
        let out = cluster.ctl_retry(&["cluster", "operator", "remove", "ada"])?;
        println!("{}", out.trim_end());
        Ok(())
    })?;
    let answer = escrow.await??;
    let listed = listed_certificates(&cluster).await?;
    let valid = valid_names(&listed, "ada");
    assert!(
        valid.is_empty(),
        "the removed operator holds valid, unrevoked certificates: {valid:?}"
    );
    assert_revoked_or_aborted(answer, &listed)?;
    // Keep the cluster alive until here.
    cluster.first.proc();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_held_before_its_revocation_is_listed_as_unfinished() -> Result<()> {
    // RemoveOperator deletes the record, then revokes the certificates; the curator
    // pauses (`operator-record-deleted`) in between: what a revocation that failed
    // (etcd trouble, a leader change) leaves. `operator list` names the operator as
    // removing, with its certificate not yet revoked and the command that finishes it;
    // once the revocation is done, not at all.
    let dir = tempfile::tempdir()?;
    let mut cluster = paused_cluster(dir.path(), "operator-record-deleted:8000")?;
    let (channel, public_key) = add_ada(&cluster).await?;
    spawn_escrow(channel, public_key)
        .await??
        .map_err(|s| anyhow::anyhow!("{s}"))?;

    let config = cluster.config.clone();
    let removal = tokio::task::spawn_blocking(move || {
        let config = config.to_str().context("utf-8 path")?;
        e2e::polisctl(&["--config", config, "cluster", "operator", "remove", "ada"])
    });
    tokio::task::block_in_place(|| -> Result<()> {
        e2e::wait_until(
            "ada's removal to reach its pause point",
            Duration::from_secs(60),
            || pauses_at(&mut cluster, "operator-record-deleted") > 0,
        )?;
        let out = cluster.ctl_retry(&["cluster", "operator", "list", "-o", "json"])?;
        let listed: Vec<serde_json::Value> = serde_json::from_str(&out)?;
        assert!(
            listed.len() == 1
                && listed[0]["name"] == "ada"
                && listed[0]["state"] == "removing"
                && listed[0]["unrevoked_certificates"] == 1,
            "{out}"
        );
        let table = cluster.ctl_retry(&["cluster", "operator", "list"])?;
        assert!(
            table.contains("removing: 1 certificate(s) not yet revoked; run `polisctl cluster operator remove ada` again"),
            "{table}"
        );
        Ok(())
    })?;
    let (status, out, err) = removal.await??;
    assert!(status.success(), "the removal failed: {err}");
    assert!(out.contains("1 certificate(s) revoked"), "{out}");
    let out = tokio::task::block_in_place(|| {
        cluster.ctl_retry(&["cluster", "operator", "list", "-o", "json"])
    })?;
    assert_eq!(out.trim(), "[]", "listed after the removal finished");
    let listed = listed_certificates(&cluster).await?;
    let valid = valid_names(&listed, "ada");
    assert!(valid.is_empty(), "{valid:?}");
    // Keep the cluster alive until here.
    cluster.first.proc();
    Ok(())
}

/// Every certificate the cluster recorded, as the owner lists them.
async fn listed_certificates(cluster: &Cluster) -> Result<api::ListCertificatesResponse> {
    let owner = tokio::task::block_in_place(|| cluster.owner_client())?;
    Ok(owner
        .call(|c| async move {
            api::management_client::ManagementClient::new(c)
                .list_certificates(api::ListCertificatesRequest {})
                .await
        })
        .await?)
}

/// The names of node `id`'s certificates in `listed` that are unrevoked and unexpired.
fn valid_names(listed: &api::ListCertificatesResponse, id: &str) -> Vec<String> {
    let now = pki::unix_now();
    listed
        .certificates
        .iter()
        .filter(|c| c.node_id == id && !c.revoked && c.not_after_unix > now)
        .map(|c| c.name.clone())
        .collect()
}
