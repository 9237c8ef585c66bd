//! `node logs ID`: a node's own log lines, read from the node itself (NodeLogs on its
//! address, port 7836) with the owner's certificate; optionally followed.
//! May not format lines itself (`render::logs` does).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use proto::api;

use crate::output::Format;
use crate::render::logs as render;
use crate::session::{call_error, owner_session};

/// What `node logs` asks for.
pub(crate) struct LogsArgs<'a> {
    pub(crate) id: &'a str,
    pub(crate) follow: bool,
    pub(crate) lines: u32,
    pub(crate) runnable: Option<&'a str>,
    pub(crate) since_seconds: Option<u64>,
}

/// `node logs ID [-f] [-n N] [--runnable DN-PREFIX] [--since D]`.
pub(crate) async fn logs(
    config: &Path,
    raw_endpoints: &[String],
    args: LogsArgs<'_>,
    format: Format,
) -> Result<()> {
    identity::validate_node_id(args.id)
        .map_err(|e| anyhow!("{:?}: not a node ID: {e}", args.id))?;
    let since_unix_micros = match args.since_seconds {
        None => 0,
        Some(s) => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros() as u64;
            now.saturating_sub(s.saturating_mul(1_000_000))
        }
    };
    let session = owner_session(config, raw_endpoints).await?;
    let id = args.id.to_string();
    let node = session
        .management("describing the node", |mut m| {
            let id = id.clone();
            async move { m.describe_node(api::DescribeNodeRequest { id }).await }
        })
        .await?;
    let address: std::net::IpAddr = node
        .address
        .parse()
        .with_context(|| format!("node {id} has no usable address ({:?})", node.address))?;
    let endpoint = SocketAddr::new(address, rpc::NODE_LOGS_PORT);
    // The node serves its logs with its own node certificate: only that node is accepted.
    let trust = match session.trust() {
        rpc::ServerTrust::ClusterCa { trust } => rpc::ServerTrust::ClusterNode {
            trust: trust.clone(),
            node_id: id.clone(),
        },
        other => other.clone(),
    };
    let channel = rpc::connect(endpoint, &trust, Some(&session.credentials()))
        .await
        .with_context(|| format!("connecting to node {id} at {endpoint}"))?;
    let mut stream = api::node_logs_client::NodeLogsClient::new(channel)
        .node_logs_tail(api::NodeLogsRequest {
            lines: args.lines,
            runnable_prefix: args.runnable.unwrap_or_default().to_string(),
            since_unix_micros,
            follow: args.follow,
        })
        .await
        .map_err(|s| call_error(&format!("reading the logs of node {id}"), s))?
        .into_inner();
    while let Some(line) = stream
        .message()
        .await
        .map_err(|s| call_error(&format!("reading the logs of node {id}"), s))?
    {
        if let Some(text) = render::line(&line, format) {
            println!("{text}");
        }
    }
    Ok(())
}
