//! Prometheus metrics of a real 3-node cluster (one consensus member, two workers; real
//! polis-node processes and etcd on 127.x addresses):
//!
//! - every node's `/metrics` (default listener: its own address, port 7839) passes
//!   `promtool check metrics` and carries what it should: the process collector, the
//!   certificates it holds; the curator node also its RPC counters (heartbeats of the
//!   workers, by method and code), leader gauge and node counts;
//! - anything but `GET /metrics` is refused;
//! - a real Prometheus server scrapes the three nodes: `up == 1` for each and a curator
//!   RPC counter above 0, read over its HTTP API;
//! - `cluster status` names the curator leader (table, JSON, YAML with plain keys);
//! - a node whose metrics address cannot be bound refuses to start with one line.
//!
//! One cluster for the whole file: the cases run in turn on it.

use std::net::SocketAddr;

use anyhow::{Context, Result, ensure};
use e2e::{
    Cluster, METRICS_PORT, Node, Prometheus, TIMEOUT, http_get, promtool_check, scrape, wait_until,
};

/// The value of the first sample line of `text` starting with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn check_every_node(cluster: &Cluster, workers: &[&Node]) -> Result<()> {
    for node in std::iter::once(&cluster.first).chain(workers.iter().copied()) {
        let text = scrape(node.address)?;
        promtool_check(&text).with_context(|| format!("/metrics of {}:\n{text}", node.address))?;
        for family in [
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_cpu_seconds_total ",
            "process_start_time_seconds ",
            "polis_certificate_expiry_seconds{certificate=\"node\"} ",
            "polis_certificate_expiry_seconds{certificate=\"cluster-ca\"} ",
        ] {
            let v = sample(&text, family)
                .with_context(|| format!("{family}missing on {}:\n{text}", node.address))?;
            // CPU time may still be 0 ticks on a fresh worker.
            let floor = if family.starts_with("process_cpu") {
                0.0
            } else {
                1.0
            };
            ensure!(v >= floor, "{family}= {v} on {}", node.address);
        }
    }
    // The curator node: the workers' heartbeats are counted and timed, it leads.
    let heartbeats = "polis_curator_rpc_calls_total{service=\"polis.api.Curator\",method=\"Heartbeat\",code=\"OK\"} ";
    wait_until("heartbeats counted on the curator", TIMEOUT, || {
        scrape(cluster.first.address)
            .ok()
            .and_then(|t| sample(&t, heartbeats))
            .is_some_and(|v| v >= 2.0)
    })?;
    // Polled, not read once: on a loaded machine the only member's curator may lose its
    // 3 s lease and campaign again, and reads 0 until it leads again.
    wait_until("the curator node's leader gauge reads 1", TIMEOUT, || {
        scrape(cluster.first.address)
            .ok()
            .and_then(|t| sample(&t, "polis_curator_leader "))
            == Some(1.0)
    })
    .with_context(|| leadership_lines(&cluster.first))?;
    let text = scrape(cluster.first.address)?;
    ensure!(
        sample(&text, "polis_curator_rpc_duration_seconds_count{service=\"polis.api.Curator\",method=\"Heartbeat\"} ")
            .is_some_and(|v| v >= 2.0),
        "latency histogram:\n{text}"
    );
    ensure!(
        sample(
            &text,
            "polis_certificate_expiry_seconds{certificate=\"etcd-peer\"} "
        )
        .is_some_and(|v| v > 0.0),
        "the member's etcd peer certificate:\n{text}"
    );
    for worker in workers {
        let text = scrape(worker.address)?;
        ensure!(
            sample(&text, "polis_curator_leader ").is_none_or(|v| v == 0.0),
            "a worker does not lead:\n{text}"
        );
    }
    Ok(())
}

/// The log lines of `node` that tell of its curator's leadership, for a failure message.
fn leadership_lines(node: &Node) -> String {
    let output = node.proc.as_ref().map(|p| p.output()).unwrap_or_default();
    output
        .lines()
        .filter(|l| l.contains("leader") || l.contains("lease"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn only_get_metrics(node: &Node) -> Result<()> {
    let at = SocketAddr::new(node.address, METRICS_PORT);
    let (status, _) = http_get(at, "/")?;
    ensure!(status == 404, "GET / answered {status}");
    let (status, _) = http_get(at, "/metrics/../secret")?;
    ensure!(status == 404, "GET /metrics/../secret answered {status}");
    Ok(())
}

fn prometheus_scrapes_all(dir: &std::path::Path, nodes: &[&Node]) -> Result<()> {
    let targets: Vec<SocketAddr> = nodes
        .iter()
        .map(|n| SocketAddr::new(n.address, METRICS_PORT))
        .collect();
    let prometheus = Prometheus::start(dir, &targets)?;
    wait_until("Prometheus sees every node up", TIMEOUT, || {
        prometheus
            .query("up == 1")
            .is_ok_and(|r| r.len() == targets.len())
    })
    .with_context(|| prometheus.proc.output())?;
    wait_until(
        "Prometheus has a curator RPC counter above 0",
        TIMEOUT,
        || {
            prometheus
                .query("sum(polis_curator_rpc_calls_total) > 0")
                .is_ok_and(|r| r.len() == 1)
        },
    )?;
    let up = prometheus.query("up")?;
    for target in &targets {
        ensure!(
            up.iter()
                .any(|s| s["metric"]["instance"] == target.to_string() && s["value"][1] == "1"),
            "{target} not up: {up:?}"
        );
    }
    Ok(())
}

/// `cluster status` names the curator leader (node ID and endpoint), in every format.
fn status_names_the_curator_leader(cluster: &Cluster) -> Result<()> {
    let id = cluster.first.key_node_id()?;
    let endpoint = format!("{}:{}", cluster.first.address, rpc::CURATOR_PORT);
    let json: serde_json::Value =
        serde_json::from_str(&cluster.ctl_retry(&["cluster", "status", "-o", "json"])?)?;
    ensure!(json["curator_leader"]["node"] == id.as_str(), "{json}");
    ensure!(
        json["curator_leader"]["endpoint"] == endpoint.as_str(),
        "{json}"
    );
    let table = cluster.ctl_retry(&["cluster", "status"])?;
    ensure!(
        table.contains(&format!("curator leader: {id} at {endpoint}")),
        "{table}"
    );
    let yaml = cluster.ctl_retry(&["cluster", "status", "-o", "yaml"])?;
    ensure!(
        yaml.contains(&format!(
            "curator_leader:\n  endpoint: {endpoint}\n  node: {id}\n"
        )),
        "{yaml}"
    );
    Ok(())
}

fn busy_metrics_address_refuses_to_start(cluster: &Cluster, taken: &Node) -> Result<()> {
    let mut node = cluster.new_node("busy")?;
    let params = cluster.register_params("busy")?;
    let listen = format!("{}:{METRICS_PORT}", taken.address);
    node.start(&[
        "--params",
        params.to_str().context("utf-8")?,
        "--metrics-listen",
        &listen,
    ])?;
    let status = node.proc().wait_exit(TIMEOUT)?;
    ensure!(!status.success(), "started although {listen} is taken");
    let out = node.proc().output();
    ensure!(
        out.contains(&format!("--metrics-listen {listen}: cannot listen there")),
        "{out}"
    );
    ensure!(
        !node.root.join("data/node/key.der").exists(),
        "wrote a key before failing:\n{out}"
    );
    Ok(())
}

#[test]
fn metrics_of_a_three_node_cluster() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("nodes")?;
    let (w1, _) = cluster.add_worker("w1", &params)?;
    let (w2, _) = cluster.add_worker("w2", &params)?;

    check_every_node(&cluster, &[&w1, &w2])?;
    only_get_metrics(&w1)?;
    prometheus_scrapes_all(&dir.path().join("prometheus"), &[&cluster.first, &w1, &w2])?;
    status_names_the_curator_leader(&cluster)?;
    busy_metrics_address_refuses_to_start(&cluster, &w1)?;
    Ok(())
}
