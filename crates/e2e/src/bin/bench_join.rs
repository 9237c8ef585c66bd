//! Benchmark: owner approval → node UP. A one-node cluster is bootstrapped; for each
//! sample a fresh worker registers and waits (Foreign), the owner's ApproveNode is sent,
//! and the clock stops when the worker has committed (record UP) and written its sealed
//! configuration. Prints each sample; the last line is one JSON object.
//!
//! Usage: bench-join [JOINS]   (default 9, at least 5)

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, median};
use proto::api;

fn main() -> Result<()> {
    let joins: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()
        .context("JOINS must be a number")?
        .unwrap_or(9)
        .max(5);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("bench")?;
    let owner = cluster.owner_client()?;
    let mut samples = Vec::new();
    for i in 0..joins {
        let mut node = cluster.new_node(&format!("w{i}"))?;
        node.start(&["--params", params.to_str().context("utf-8 path")?])?;
        node.wait_state("Foreign")?;
        let id = node.key_node_id()?;
        let sealed = node.root.join("esp/sealed_configuration.pb");

        let started = Instant::now();
        runtime.block_on(owner.call(|channel| {
            let id = id.clone();
            async move {
                api::management_client::ManagementClient::new(channel)
                    .approve_node(api::ApproveNodeRequest { id })
                    .await
            }
        }))?;
        let deadline = started + Duration::from_secs(30);
        while !sealed.exists() {
            if Instant::now() > deadline {
                bail!("node {id} did not commit within 30 s");
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let state = cluster.node(&id)?.context("the node is listed")?["state"].clone();
        if state != "UP" {
            bail!("node {id} wrote its sealed configuration but is {state}");
        }
        println!("join {i}: approve → UP + sealed configuration {ms:.1} ms");
        samples.push(ms);
    }
    let (min, max) = samples
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
    println!(
        "{}",
        serde_json::json!({
            "bench": "join",
            "approve_to_up_ms": (median(samples.clone()) * 10.0).round() / 10.0,
            "min_ms": (min * 10.0).round() / 10.0,
            "max_ms": (max * 10.0).round() / 10.0,
            "joins": joins,
            "target_ms": 250,
        })
    );
    Ok(())
}
