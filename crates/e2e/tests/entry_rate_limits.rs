//! Per-source rate limits on the calls anyone may make (issue 15): a burst of
//! RegisterNode from one address is answered ResourceExhausted (Escrow from it too),
//! while another address still registers. A real polis-node with its default limits
//! (10 a second, bursts of 20), clients bound to their own 127.x addresses.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use e2e::{Cluster, read_register_params, unique_loopback};
use proto::api;

/// Calls the burst makes at most: three times the burst the curator allows.
const BURST_CALLS: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_from_one_address_is_limited_while_another_address_registers() -> Result<()> {
    // Before: no limit; every call of the burst was answered.
    let dir = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| Cluster::bootstrap(dir.path()))?;
    let register =
        tokio::task::block_in_place(|| read_register_params(&cluster.register_params("rate")?))?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let trust = rpc::ServerTrust::PinnedCa(register.ca_certificate.clone());
    let request = |address: String| api::RegisterNodeRequest {
        register_ticket: register.register_ticket.clone(),
        address,
        ..Default::default()
    };

    // One key from one address, as fast as it goes: the same node registering over
    // and over (it stays one record), until the curator says enough.
    let noisy = unique_loopback();
    let key = identity::NodeKey::generate()?;
    let slot = rpc::CredentialSlot::new(rpc::self_signed(&key)?)?;
    let channel = rpc::connect_from(endpoint, &trust, Some(&slot), Some(noisy)).await?;
    let mut curator = api::curator_client::CuratorClient::new(channel.clone());
    let own_address = unique_loopback().to_string();
    let (mut answered, mut limited) = (0, None);
    for _ in 0..BURST_CALLS {
        match curator.register_node(request(own_address.clone())).await {
            Ok(_) => answered += 1,
            Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                limited = Some(s);
                break;
            }
            Err(s) => anyhow::bail!("RegisterNode failed: {s:?}"),
        }
    }
    let limited = limited.with_context(|| format!("{answered} calls, none limited"))?;
    assert!(answered >= 20, "the burst allows 20, {answered} answered");
    assert!(
        limited.message().contains(&noisy.to_string()) && limited.message().contains("a second"),
        "{limited:?}"
    );
    // The limit is per source, not per method: Escrow from there waits too.
    let escrow = api::aaa_client::AaaClient::new(channel)
        .escrow(api::EscrowRequest {
            public_key: key.public_key().to_vec(),
        })
        .await
        .expect_err("Escrow from the limited address");
    assert_eq!(escrow.code(), tonic::Code::ResourceExhausted, "{escrow:?}");

    // Another address registers a new node at once.
    let quiet = unique_loopback();
    let other = identity::NodeKey::generate()?;
    let slot = rpc::CredentialSlot::new(rpc::self_signed(&other)?)?;
    let channel = rpc::connect_from(endpoint, &trust, Some(&slot), Some(quiet)).await?;
    let mut updates = api::curator_client::CuratorClient::new(channel)
        .register_node(request(unique_loopback().to_string()))
        .await
        .context("RegisterNode from another address")?
        .into_inner();
    let first = updates.message().await?.context("a registration update")?;
    assert_eq!(first.node_id, other.node_id());
    assert_eq!(first.state, proto::state::NodeState::New as i32);
    Ok(())
}
