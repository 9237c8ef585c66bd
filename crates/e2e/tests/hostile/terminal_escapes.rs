//! What a compromised node sends reaches the owner's terminal shown, not obeyed (issue
//! 25): a node's reported status and its log lines carrying terminal escape sequences
//! are printed by polisctl's table output with every control character escaped. Real
//! polis-node and etcd processes on 127.x addresses; the compromised node is a worker
//! whose process was stopped and whose credentials this test uses: it heartbeats as the
//! worker and serves the worker's log port with the worker's own node certificate.

use std::net::SocketAddr;

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, TIMEOUT, wait_until};
use proto::api;
use tonic::codegen::tokio_stream;
use tonic::{Request, Response, Status};

/// Red text, a window title and a bell: what a hostile node would like to send.
const HOSTILE: &str = "\x1b[31mred\x1b]0;owned\x07";
/// How polisctl shows it.
const SHOWN: &str = "\\x1b[31mred\\x1b]0;owned\\x07";

/// The worker's log port, answering every request with one hostile line.
struct HostileLogs;

#[tonic::async_trait]
impl api::node_logs_server::NodeLogs for HostileLogs {
    type NodeLogsTailStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<api::NodeLogLine, Status>>>;

    async fn node_logs_tail(
        &self,
        _: Request<api::NodeLogsRequest>,
    ) -> Result<Response<Self::NodeLogsTailStream>, Status> {
        let line = api::NodeLogLine {
            sequence: 1,
            time_unix_micros: 1,
            level: "INFO".into(),
            runnable: "root".into(),
            target: "polis_node".into(),
            text: format!("{HOSTILE}\nfake second line"),
            ..Default::default()
        };
        Ok(Response::new(tokio_stream::iter(vec![Ok(line)])))
    }
}

/// polisctl's output holds no raw control character but newlines, and shows `SHOWN`.
fn shown_escaped(what: &str, out: &str) -> Result<()> {
    ensure!(
        !out.chars().any(|c| c.is_control() && c != '\n'),
        "{what}: a raw control character reached the terminal: {out:?}"
    );
    ensure!(out.contains(SHOWN), "{what}: not shown escaped: {out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compromised_nodes_escape_sequences_are_shown_not_obeyed() -> Result<()> {
    // Before: `node describe` printed the reported version raw (ESC [31m …), and
    // `node logs` the line's text raw, newline included.
    let dir = tempfile::tempdir()?;
    let cluster = tokio::task::block_in_place(|| Cluster::bootstrap(dir.path()))?;
    let params = cluster.register_params("w")?;
    let (mut worker, id) = tokio::task::block_in_place(|| cluster.add_worker("w", &params))?;
    tokio::task::block_in_place(|| worker.stop_cleanly())?;
    let node_dir = worker.root.join("data/node");
    let credentials = rpc::Credentials {
        certificate: std::fs::read(node_dir.join("cert.der"))?,
        key_pkcs8: std::fs::read(node_dir.join("key.der"))?,
    };
    let ca = std::fs::read(node_dir.join("ca.der"))?;

    // A heartbeat as the worker, its status version hostile (only its length is checked).
    let client = rpc::CuratorClient::new(
        vec![SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT)],
        rpc::ServerTrust::PinnedCa(ca),
        Some(credentials.clone()),
    )?;
    let status = proto::state::NodeStatus {
        address: worker.address.to_string(),
        version: HOSTILE.into(),
        started_at_unix_ms: 1,
        ..Default::default()
    };
    client
        .call(|c| {
            let status = status.clone();
            async move {
                api::curator_client::CuratorClient::new(c)
                    .heartbeat(api::HeartbeatRequest {
                        status: Some(status),
                    })
                    .await
            }
        })
        .await
        .context("heartbeating as the worker")?;
    tokio::task::block_in_place(|| -> Result<()> {
        wait_until("the hostile status to be recorded", TIMEOUT, || {
            cluster
                .node(&id)
                .ok()
                .flatten()
                .is_some_and(|n| n["status"]["version"].as_str() == Some(HOSTILE))
        })?;
        let out = cluster.ctl_retry(&["node", "describe", &id])?;
        shown_escaped("node describe", &out)?;
        println!("node describe shows: {}", out.trim_end());
        Ok(())
    })?;

    // The worker's log port, served with its own node certificate.
    let tls = rpc::tls::server_config(&credentials)?;
    let at = SocketAddr::new(worker.address, rpc::NODE_LOGS_PORT);
    let listener = tokio::net::TcpListener::bind(at).await?;
    let server = tokio::spawn(
        rpc::server::builder()
            .add_service(api::node_logs_server::NodeLogsServer::new(HostileLogs))
            .serve_with_incoming(rpc::incoming(listener, tls, rpc::Port::Node)),
    );
    let logs = tokio::task::block_in_place(|| cluster.ctl(&["node", "logs", &id, "-n", "5"]));
    server.abort();
    let (ok, out, err) = logs?;
    ensure!(ok, "node logs failed: {err}");
    shown_escaped("node logs", &out)?;
    ensure!(
        out.lines().count() == 1 && out.contains("\\nfake second line"),
        "a node's newline made a line of its own: {out:?}"
    );
    println!("node logs shows: {}", out.trim_end());
    Ok(())
}
