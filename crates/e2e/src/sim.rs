//! Simulated nodes for benchmarks: real node identities (their own keys, their own
//! 127.x source addresses) enrolled through the real flow (RegisterNode, ApproveNode,
//! CommitNode), then driven from one process instead of a polis-node each.
//!
//! A leaf: may not start processes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use proto::api;

/// The source address of simulated node `n` (127.100.0.0 upwards: apart from the
/// addresses `unique_loopback` hands out to real nodes).
pub fn sim_address(n: usize) -> String {
    format!("127.{}.{}.{}", 100 + n / 65_536, (n / 256) % 256, n % 256)
}

/// What enrolling needs: how the curators are trusted, the owner (who approves) and a
/// register ticket.
pub struct Enrolment<'a> {
    pub trust: &'a rpc::ServerTrust,
    pub owner: &'a rpc::CuratorClient,
    pub ticket: &'a [u8],
}

/// Registers `key` at `endpoint` from `address` (as a real node on its own machine: the
/// curator caps connections and streams per source), has the owner approve it and
/// commits it: its node certificate, and how long each of the three calls took.
pub async fn enrol_at(
    enrolment: &Enrolment<'_>,
    endpoint: SocketAddr,
    key: &identity::NodeKey,
    address: &str,
) -> Result<(Vec<u8>, [Duration; 3])> {
    let mut laps = [Duration::ZERO; 3];
    let mut t = Instant::now();
    let mut lap = |i: usize| {
        laps[i] = t.elapsed();
        t = Instant::now();
    };
    let slot = rpc::CredentialSlot::new(rpc::self_signed(key)?)?;
    let channel = rpc::connect_from(
        endpoint,
        enrolment.trust,
        Some(&slot),
        Some(address.parse()?),
    )
    .await?;
    let mut curator = api::curator_client::CuratorClient::new(channel);
    let mut updates = curator
        .register_node(api::RegisterNodeRequest {
            register_ticket: enrolment.ticket.to_vec(),
            address: address.to_string(),
            labels: Default::default(),
            ..Default::default()
        })
        .await
        .context("RegisterNode")?
        .into_inner();
    updates.message().await.context("RegisterNode stream")?;
    drop(updates);
    lap(0);
    let id = key.node_id();
    enrolment
        .owner
        .call(|c| {
            let id = id.clone();
            async move {
                api::management_client::ManagementClient::new(c)
                    .approve_node(api::ApproveNodeRequest { id })
                    .await
            }
        })
        .await
        .context("ApproveNode")?;
    lap(1);
    let committed = curator
        .commit_node(api::CommitNodeRequest {})
        .await
        .context("CommitNode")?
        .into_inner();
    lap(2);
    Ok((committed.node_certificate, laps))
}

/// A register ticket, as the owner gets it.
pub async fn register_ticket(owner: &rpc::CuratorClient) -> Result<Vec<u8>> {
    Ok(owner
        .call(|c| async move {
            api::management_client::ManagementClient::new(c)
                .get_register_ticket(api::GetRegisterTicketRequest {})
                .await
        })
        .await
        .context("GetRegisterTicket")?
        .ticket)
}
