//! `cluster audit`: the audit log (who changed what, with which result), optionally
//! followed as new entries are written.
//! May not format entries itself (`render::audit` does).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use proto::api;

use crate::output::Format;
use crate::render::audit as render;
use crate::session::{call_error, owner_session};

/// `cluster audit [-f] [--node ID] [--since SECONDS]`.
pub(crate) async fn audit(
    config: &Path,
    raw_endpoints: &[String],
    follow: bool,
    node: Option<&str>,
    since_seconds: Option<u64>,
    format: Format,
) -> Result<()> {
    if let Some(node) = node {
        identity::validate_node_id(node)
            .map_err(|e| anyhow::anyhow!("--node {node:?}: not a node ID: {e}"))?;
    }
    let since_unix_micros = match since_seconds {
        None => 0,
        Some(s) => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros() as u64;
            now.saturating_sub(s.saturating_mul(1_000_000))
        }
    };
    let request = api::AuditLogRequest {
        node_id: node.unwrap_or_default().to_string(),
        since_unix_micros,
        follow,
    };
    let session = owner_session(config, raw_endpoints).await?;
    let mut stream = session.audit_log(request).await?;
    if let Some(header) = render::header(format) {
        println!("{header}");
    }
    while let Some(entry) = stream
        .message()
        .await
        .map_err(|s| call_error("reading the audit log", s))?
    {
        if let Some(line) = render::entry(&entry, format) {
            println!("{line}");
        }
    }
    Ok(())
}
