//! Enrolment at scale (issue 16, "Scale with streams"): registrations run in parallel
//! on the leader, and what must stay unique stays unique under the race. Many keys
//! registering at once with one address (or one data join key) yield exactly one
//! record; a ticket with three uses registers exactly three of eight racing keys; a
//! deleted node's address is free again, and a decommissioned node's goes to exactly
//! one of the keys racing for it. One real cluster (polis-node, etcd) per case, on
//! 127.x addresses.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use e2e::{Cluster, read_register_params, unique_loopback};
use proto::api;

/// Keys racing for one address or join key (each makes one call).
const RACERS: usize = 16;
/// Keys racing for a three-use ticket.
const TICKET_RACERS: usize = 8;

fn block<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    tokio::task::block_in_place(f)
}

/// A cluster whose curator takes every registration from this one source address.
fn cluster(dir: &Path) -> Result<Cluster> {
    Cluster::bootstrap_with(dir, &[], &["--entry-rate-per-second", "0"])
}

/// RegisterNode with a new key (self-signed, as a new node calls it): its id and the
/// state it was registered in, or the refusal.
async fn register(
    endpoint: SocketAddr,
    params: &Path,
    address: String,
    data_join_key: Vec<u8>,
) -> Result<(String, std::result::Result<i32, tonic::Status>)> {
    let register = read_register_params(params)?;
    let key = identity::NodeKey::generate()?;
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let channel = rpc::connect(endpoint, &trust, Some(&rpc::self_signed(&key)?)).await?;
    let data_cluster_half = if data_join_key.is_empty() {
        Vec::new()
    } else {
        vec![7; 41]
    };
    let answer = api::curator_client::CuratorClient::new(channel)
        .register_node(api::RegisterNodeRequest {
            register_ticket: register.register_ticket.clone(),
            address,
            data_join_key,
            data_cluster_half,
            ..Default::default()
        })
        .await;
    let answer = match answer {
        Ok(mut updates) => Ok(updates
            .get_mut()
            .message()
            .await?
            .context("the registration stream ended at once")?
            .state),
        Err(status) => Err(status),
    };
    Ok((key.node_id(), answer))
}

/// Runs `count` registrations at once, each with the address and join key `request`
/// gives; the ids registered and the refusals.
async fn race(
    endpoint: SocketAddr,
    params: &Path,
    count: usize,
    request: impl Fn() -> (String, Vec<u8>),
) -> Result<(Vec<String>, Vec<tonic::Status>)> {
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..count {
        let (address, join_key) = request();
        let params = params.to_path_buf();
        racers.spawn(async move { register(endpoint, &params, address, join_key).await });
    }
    let (mut registered, mut refused) = (Vec::new(), Vec::new());
    while let Some(racer) = racers.join_next().await {
        match racer?? {
            (id, Ok(_)) => registered.push(id),
            (_, Err(status)) => refused.push(status),
        }
    }
    Ok((registered, refused))
}

/// The ids of the listed records holding `address`.
fn holders(cluster: &Cluster, address: &str) -> Result<Vec<String>> {
    Ok(cluster
        .nodes()?
        .iter()
        .filter(|n| n["address"] == address)
        .filter_map(|n| n["id"].as_str().map(str::to_string))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_registrations_of_one_address_or_join_key_create_one_record() -> Result<()> {
    // Before: the address check and the record's creation were one step only by a mutex
    // of the leader process; without it (the mutex was the enrolment bottleneck) racing
    // registrations all found the address free. Now the address is claimed in the
    // creating transaction (`writes::claims`).
    let dir = tempfile::tempdir()?;
    let cluster = block(|| cluster(dir.path()))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let params = block(|| cluster.register_params("racers"))?;

    let address = unique_loopback().to_string();
    let (registered, refused) =
        race(endpoint, &params, RACERS, || (address.clone(), Vec::new())).await?;
    assert_eq!(
        registered.len(),
        1,
        "{} keys registered with one address: {refused:?}",
        registered.len()
    );
    for status in &refused {
        assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
        assert!(
            status.message().contains(&address) && status.message().contains(&registered[0]),
            "the refusal names the address and its holder: {status:?}"
        );
    }
    assert_eq!(block(|| holders(&cluster, &address))?, registered);

    // One data join key, each key on an address of its own: one record holds it.
    let join_key = vec![9u8; 32];
    let (registered, refused) = race(endpoint, &params, RACERS, || {
        (unique_loopback().to_string(), join_key.clone())
    })
    .await?;
    assert_eq!(
        registered.len(),
        1,
        "{} keys registered with one data join key: {refused:?}",
        registered.len()
    );
    for status in &refused {
        assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
        assert!(status.message().contains("data join key"), "{status:?}");
    }

    // A deleted node's address is free again (its index entry goes with it).
    let deleted = holders_one(&cluster, &address)?;
    block(|| cluster.ctl_retry(&["node", "delete", &deleted]).map(drop))?;
    let (id, answer) = register(endpoint, &params, address.clone(), Vec::new()).await?;
    assert_eq!(answer?, proto::state::NodeState::New as i32);
    assert_eq!(block(|| holders(&cluster, &address))?, vec![id]);
    Ok(())
}

fn holders_one(cluster: &Cluster, address: &str) -> Result<String> {
    let mut holders = block(|| holders(cluster, address))?;
    anyhow::ensure!(holders.len() == 1, "{address} held by {holders:?}");
    Ok(holders.remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_with_three_uses_registers_exactly_three_of_eight_racing_keys() -> Result<()> {
    // Registrations with an unlimited ticket no longer serialize; a limited ticket's
    // uses are still spent exactly (guarded by its revision in the creating txn).
    let dir = tempfile::tempdir()?;
    let cluster = block(|| cluster(dir.path()))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let path = cluster.dir.join("three.params");
    block(|| {
        cluster
            .ctl_retry(&[
                "params",
                "register",
                "--out",
                path.to_str().context("utf-8")?,
                "--uses",
                "3",
            ])
            .map(drop)
    })?;
    let (registered, refused) = race(endpoint, &path, TICKET_RACERS, || {
        (unique_loopback().to_string(), Vec::new())
    })
    .await?;
    assert_eq!(
        registered.len(),
        3,
        "a three-use ticket registered {} of {TICKET_RACERS} keys: {refused:?}",
        registered.len()
    );
    for status in &refused {
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        assert!(status.message().contains("used up"), "{status:?}");
    }
    let listed = block(|| cluster.nodes())?;
    for id in &registered {
        assert!(
            listed.iter().any(|n| n["id"] == id.as_str()),
            "{id} not listed"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decommissioned_nodes_address_goes_to_one_of_the_new_keys_racing_for_it() -> Result<()> {
    // A decommissioned node frees its address, but its index entry stays (nothing is
    // written for the index on decommission): the entry is stale, and exactly one of
    // the keys racing for the address takes it over (guarded by the entry's revision
    // and the old holder's record revision).
    let dir = tempfile::tempdir()?;
    let cluster = block(|| cluster(dir.path()))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let params = block(|| cluster.register_params("racers"))?;
    let (mut worker, worker_id) = block(|| cluster.add_worker("worker", &params))?;
    let address = worker.address.to_string();
    // While it is UP, its address is taken.
    let (_, answer) = register(endpoint, &params, address.clone(), Vec::new()).await?;
    let refused = answer.expect_err("a key registered with an UP node's address");
    assert_eq!(refused.code(), tonic::Code::AlreadyExists, "{refused:?}");
    block(|| {
        let out = cluster.ctl_retry(&["node", "decommission", &worker_id])?;
        anyhow::ensure!(out.contains("DECOMMISSIONED"), "{out}");
        worker.proc().wait_exit(e2e::TIMEOUT).map(drop)
    })?;
    let (registered, refused) =
        race(endpoint, &params, RACERS, || (address.clone(), Vec::new())).await?;
    assert_eq!(
        registered.len(),
        1,
        "{} keys took the decommissioned node's address: {refused:?}",
        registered.len()
    );
    for status in &refused {
        assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
    }
    let mut holders = block(|| holders(&cluster, &address))?;
    holders.sort();
    let mut want = vec![worker_id, registered[0].clone()];
    want.sort();
    assert_eq!(holders, want, "the old record stays, DECOMMISSIONED");
    Ok(())
}
