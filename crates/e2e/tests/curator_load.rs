//! The curator under load and hostile requests, with a real polis-node: revocations
//! through the CRL cache, concurrent writers on one node record, oversized requests.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::Cluster;
use proto::api;
use rpc::{CallError, CuratorClient};

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

async fn list_nodes(client: &CuratorClient) -> Result<api::ListNodesResponse, CallError> {
    client
        .call(|ch| async move {
            api::management_client::ManagementClient::new(ch)
                .list_nodes(api::ListNodesRequest::default())
                .await
        })
        .await
}

async fn update_labels(
    client: &CuratorClient,
    id: &str,
    upsert: HashMap<String, String>,
    delete: Vec<String>,
) -> Result<api::UpdateNodeLabelsResponse, CallError> {
    client
        .call(|ch| {
            let request = api::UpdateNodeLabelsRequest {
                id: id.to_string(),
                upsert: upsert.clone(),
                delete: delete.clone(),
            };
            async move {
                api::management_client::ManagementClient::new(ch)
                    .update_node_labels(request)
                    .await
            }
        })
        .await
}

async fn etcd_curator(cluster: &Cluster) -> Result<consensus::Namespaced> {
    let client = consensus::client::connect_unix(&cluster.first.socket()).await?;
    Ok(consensus::Namespaced::new(
        client,
        curator::layout::NAMESPACE,
    ))
}

fn owner_certificate(cluster: &Cluster) -> Result<Vec<u8>> {
    let text = std::fs::read_to_string(cluster.config.join("owner.pem"))?;
    Ok(pem::parse(text)?.into_contents())
}

fn first_node_id(cluster: &Cluster) -> Result<String> {
    cluster.first.key_node_id()
}

#[test]
fn a_revoked_owner_certificate_is_refused_once_the_crl_watch_delivers_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let client = cluster.owner_client()?;
    let serial = pki::certificate_serial(&owner_certificate(&cluster)?)?;
    runtime()?.block_on(async {
        // Allowed before the revocation, on the same connection as the calls after it.
        for _ in 0..3 {
            list_nodes(&client).await.context("before the revocation")?;
        }
        let store = curator::cluster_pki(&etcd_curator(&cluster).await?);
        store.load_ca().await?.context("the cluster has a CA")?;
        let revoked_at = Instant::now();
        store.revoke(&serial).await?;
        let refused = loop {
            match list_nodes(&client).await {
                Err(CallError::Status(s)) if s.code() == tonic::Code::Unauthenticated => {
                    break s;
                }
                Ok(_) => {}
                Err(e) => bail!("unexpected failure: {e}"),
            }
            ensure!(
                revoked_at.elapsed() < Duration::from_secs(10),
                "the revoked certificate was still accepted 10 s after the revocation"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(
            refused.message().to_lowercase().contains("revoked"),
            "{refused:?}"
        );
        eprintln!("refused {:?} after the revocation", revoked_at.elapsed());
        // And it stays refused, on a new connection too.
        let fresh = cluster.owner_client()?;
        for c in [&client, &fresh] {
            match list_nodes(c).await {
                Err(CallError::Status(s)) if s.code() == tonic::Code::Unauthenticated => {}
                other => bail!("a revoked certificate got {other:?}"),
            }
        }
        Ok(())
    })
}

#[test]
fn sixteen_concurrent_label_writers_on_one_node_all_succeed_and_nothing_is_lost() -> Result<()> {
    const WRITERS: usize = 16;
    const CALLS: usize = 40;
    const KEYS_PER_WRITER: usize = 4;
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap(dir.path())?;
    let id = first_node_id(&cluster)?;
    let clients: Vec<_> = (0..WRITERS)
        .map(|_| cluster.owner_client())
        .collect::<Result<_>>()?;
    let rt = runtime()?;
    let failures = rt.block_on(async {
        let tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(w, client)| {
                let id = id.clone();
                tokio::spawn(async move {
                    let mut failures = Vec::new();
                    for i in 0..CALLS {
                        let upsert = HashMap::from([(
                            format!("w{w}-{}", i % KEYS_PER_WRITER),
                            i.to_string(),
                        )]);
                        if let Err(e) = update_labels(&client, &id, upsert, vec![]).await {
                            failures.push(format!("writer {w} call {i}: {e}"));
                        }
                    }
                    failures
                })
            })
            .collect();
        let mut failures = Vec::new();
        for t in tasks {
            failures.extend(t.await?);
        }
        anyhow::Ok(failures)
    })?;
    assert!(
        failures.is_empty(),
        "{} failed: {failures:#?}",
        failures.len()
    );
    // Combined inside the leader, the writers never make each other's writes conflict.
    let conflicts = cluster
        .first
        .proc()
        .output()
        .matches("changed by another writer")
        .count();
    assert_eq!(
        conflicts, 0,
        "compare-and-swap conflicts between the leader's own writes"
    );
    // The record holds every writer's last value for each of its keys.
    let record = cluster
        .first
        .etcd_get(&format!("namespaced:curator/nodes/{id}"))?
        .context("node record")?;
    let node = <proto::state::Node as prost::Message>::decode(record.as_slice())?;
    for w in 0..WRITERS {
        for k in 0..KEYS_PER_WRITER {
            let last = (0..CALLS).rev().find(|i| i % KEYS_PER_WRITER == k).unwrap();
            assert_eq!(
                node.labels.get(&format!("w{w}-{k}")),
                Some(&last.to_string()),
                "label w{w}-{k} in {:?}",
                node.labels
            );
        }
    }
    Ok(())
}

/// The election key of the current leader: (key, create revision, lease).
async fn election_key(curator: &consensus::Namespaced) -> Result<(Vec<u8>, i64, i64)> {
    let response = curator
        .client()
        .get(
            curator.key("leader/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    let kv = response.kvs().first().context("no leader key")?;
    Ok((kv.key().to_vec(), kv.create_revision(), kv.lease()))
}

#[test]
fn huge_label_requests_are_refused_early_and_the_leader_keeps_its_lease() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let id = first_node_id(&cluster)?;
    let (a, b, probe) = (
        cluster.owner_client()?,
        cluster.owner_client()?,
        cluster.owner_client()?,
    );
    runtime()?.block_on(async {
        let curator = etcd_curator(&cluster).await?;
        list_nodes(&probe).await?;
        let leader_before = election_key(&curator).await?;
        // ~700 KiB each: 5,500 upserts and 5,500 deletes of 63-character keys.
        let key = |i: usize| format!("{i:0>63}");
        let upsert: HashMap<String, String> = (0..5_500).map(|i| (key(i), "v".into())).collect();
        let delete: Vec<String> = (5_500..11_000).map(key).collect();
        let huge = |client: CuratorClient| {
            let (id, upsert, delete) = (id.clone(), upsert.clone(), delete.clone());
            tokio::spawn(async move {
                let mut codes = Vec::new();
                for _ in 0..5 {
                    codes.push(
                        match update_labels(&client, &id, upsert.clone(), delete.clone()).await {
                            Err(CallError::Status(s)) => s.code(),
                            Ok(_) => tonic::Code::Ok,
                            Err(e) => bail!("{e}"),
                        },
                    );
                }
                anyhow::Ok(codes)
            })
        };
        let (first, second) = (huge(a), huge(b));
        // Meanwhile another caller is served promptly, again and again.
        let mut slowest = Duration::ZERO;
        while !(first.is_finished() && second.is_finished()) {
            let started = Instant::now();
            list_nodes(&probe).await?;
            slowest = slowest.max(started.elapsed());
        }
        for codes in [first.await??, second.await??] {
            assert!(
                codes.iter().all(|c| *c == tonic::Code::ResourceExhausted),
                "{codes:?}"
            );
        }
        assert!(
            slowest < Duration::from_millis(500),
            "a call took {slowest:?}"
        );
        assert_eq!(
            election_key(&curator).await?,
            leader_before,
            "leadership changed"
        );

        // Below the limit, a long delete list (60 KiB) is served, in linear time.
        let delete: Vec<String> = (0..900).map(key).collect();
        let started = Instant::now();
        update_labels(
            &probe,
            &id,
            HashMap::from([("kept".into(), "yes".into())]),
            delete,
        )
        .await?;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        Ok(())
    })
}
