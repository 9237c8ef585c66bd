//! Long-lived forwarded calls never starve unary ones: with real polis-node processes, a
//! 2-member control plane, 40 registrations wait for approval through the follower (each
//! a RegisterNode stream it forwards to the leader) while the owner's label writes and the
//! members' heartbeats go through the same follower.
//!
//! Before: the follower forwarded everything over one cached HTTP/2 connection, whose
//! 32 streams the waiting registrations took; every other forwarded call queued behind
//! them until the leader's 30 s request timeout.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, endpoints, read_register_params, unique_loopback};
use proto::api;

/// Registrations held open through the follower: more than one connection's streams.
const WAITING_REGISTRATIONS: usize = 40;
/// How long a unary call through the follower may take while they wait (generous: it
/// takes milliseconds; it took the leader's 30 s request timeout before).
const UNARY_BOUND: Duration = Duration::from_secs(5);

/// `polis_curator_forwarded_calls_total` of the curator at `curator`.
fn forwarded_calls(curator: SocketAddr) -> Result<f64> {
    let text = e2e::scrape(curator.ip())?;
    text.lines()
        .find_map(|l| l.strip_prefix("polis_curator_forwarded_calls_total "))
        .context("no polis_curator_forwarded_calls_total")?
        .trim()
        .parse()
        .context("forwarded calls count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_waiting_registrations_do_not_block_forwarded_calls() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (cluster, _member) = tokio::task::block_in_place(|| -> Result<(Cluster, e2e::Node)> {
        // 40 registrations from one address: past the per-source limit on RegisterNode,
        // which is not what this test is about.
        let cluster = Cluster::bootstrap_with(dir.path(), &[], &["--entry-rate-per-second", "0"])?;
        let params = cluster.register_params("member")?;
        let (mut m1, id_m1) = cluster.add_worker("m1", &params)?;
        cluster.ctl_retry(&["node", "add-role", &id_m1, "ConsensusMember"])?;
        cluster.wait_members(&endpoints(&[&cluster.first, &m1]), 2, 0)?;
        m1.wait_for_curator()?;
        Ok((cluster, m1))
    })?;
    let leader = tokio::task::block_in_place(|| cluster.first.curator_leader_address())?;
    let register =
        tokio::task::block_in_place(|| read_register_params(&cluster.register_params("waiting")?))?;
    let curators: Vec<SocketAddr> = register
        .curator_endpoints
        .iter()
        .map(|e| rpc::parse_endpoint(e))
        .collect::<Result<_, _>>()?;
    let follower = *curators
        .iter()
        .find(|c| c.ip() != leader)
        .context("a curator that does not lead")?;

    // 40 registrations, each from its own key, connection and address (as 40 nodes
    // would: one address holds only a few connections and streams without a cluster
    // certificate), all waiting for approval.
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let mut waiting = Vec::new();
    for n in 0..WAITING_REGISTRATIONS {
        let key = identity::NodeKey::generate()?;
        let slot = rpc::CredentialSlot::new(rpc::self_signed(&key)?)?;
        let channel =
            rpc::connect_from(follower, &trust, Some(&slot), Some(unique_loopback())).await?;
        let mut updates = tokio::time::timeout(
            Duration::from_secs(30),
            api::curator_client::CuratorClient::new(channel).register_node(
                api::RegisterNodeRequest {
                    register_ticket: register.register_ticket.clone(),
                    address: format!("127.251.0.{}", n + 1),
                    ..Default::default()
                },
            ),
        )
        .await
        .with_context(|| format!("registration {n} got no answer within 30 s"))?
        .with_context(|| format!("registration {n}"))?
        .into_inner();
        updates
            .message()
            .await
            .context("first registration update")?;
        waiting.push(updates);
    }

    // The owner's calls through the follower answer at once, every time.
    let owner = tokio::task::block_in_place(|| cluster.owner_client())?;
    owner.set_endpoints(vec![follower]);
    let first_id = tokio::task::block_in_place(|| cluster.first.key_node_id())?;
    let forwarded_before = tokio::task::block_in_place(|| forwarded_calls(follower))?;
    for round in 0..5 {
        // A label write: only the leader makes it, so the follower forwards it.
        let started = Instant::now();
        let request = api::UpdateNodeLabelsRequest {
            id: first_id.clone(),
            upsert: [("round".to_string(), round.to_string())].into(),
            delete: Vec::new(),
        };
        tokio::time::timeout(
            UNARY_BOUND * 2,
            owner.call(|c| {
                let request = request.clone();
                async move {
                    api::management_client::ManagementClient::new(c)
                        .update_node_labels(request)
                        .await
                }
            }),
        )
        .await
        .context("a label write through the follower hung")??;
        let took = started.elapsed();
        println!("round {round}: label write through the follower in {took:?}");
        ensure!(
            took < UNARY_BOUND,
            "a label write through the follower took {took:?}"
        );
    }
    // Forwarded by the follower indeed (not redirected to the leader).
    let forwarded = tokio::task::block_in_place(|| forwarded_calls(follower))? - forwarded_before;
    ensure!(forwarded >= 5.0, "the follower forwarded {forwarded} calls");
    // The members heartbeat on (the follower's own go through itself, forwarded).
    tokio::task::block_in_place(|| -> Result<()> {
        for node in cluster.nodes()? {
            if node["state"] == "UP" {
                let id = node["id"].as_str().context("node id")?;
                cluster.wait_node(id, "UP", Some("HEALTHY"))?;
            }
        }
        Ok(())
    })?;
    // Still waiting, all of them: nothing was dropped to make room.
    ensure!(waiting.len() == WAITING_REGISTRATIONS);
    Ok(())
}
