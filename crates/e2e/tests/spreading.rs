//! Nodes spread over the curators: with real polis-node processes on 127.x addresses, a
//! 3-member control plane and three workers whose addresses make each prefer another
//! curator (`rpc::spread`), every worker watches its record through its own preferred
//! curator — not all through the first one listed, as they did before.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};
use e2e::{Cluster, TIMEOUT, endpoints, unique_loopback};

/// A fresh loopback address whose first choice among `curators` is `wanted`.
fn address_preferring(wanted: SocketAddr, curators: &[SocketAddr]) -> IpAddr {
    loop {
        let address = unique_loopback();
        if rpc::spread::by_preference(address.to_string().as_bytes(), curators)[0] == wanted {
            return address;
        }
    }
}

#[test]
fn workers_spread_over_the_curators() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("members")?;
    let (mut m1, id_m1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id_m2) = cluster.add_worker("m2", &params)?;
    for id in [&id_m1, &id_m2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    cluster.wait_members(&endpoints(&[&cluster.first, &m1, &m2]), 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;
    let curators: Vec<SocketAddr> = [&cluster.first, &m1, &m2]
        .iter()
        .map(|n| SocketAddr::new(n.address, rpc::CURATOR_PORT))
        .collect();

    // Parameters written now name all three curators.
    let params = cluster.register_params("workers")?;
    let mut workers = Vec::new();
    for (i, curator) in curators.iter().enumerate() {
        let mut node = cluster.new_node(&format!("w{i}"))?;
        node.address = address_preferring(*curator, &curators);
        node.start(&["--params", params.to_str().context("utf-8 path")?])?;
        node.wait_state("Foreign")?;
        let id = node.key_node_id()?;
        cluster.ctl_retry(&["node", "approve", &id])?;
        node.wait_home()?;
        workers.push((node, id, *curator));
    }
    for (node, id, curator) in &mut workers {
        cluster.wait_node(id, "UP", Some("HEALTHY"))?;
        let line = format!("watching this node's record through curator {curator}");
        node.proc()
            .wait_for_line(TIMEOUT, |l| l.contains(&line))
            .with_context(|| format!("worker {} never watched through {curator}", node.address))?;
    }
    Ok(())
}
