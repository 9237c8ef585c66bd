//! `cluster audit`: the audit log (who changed what, with which result), optionally
//! followed as new entries are written; printed as it arrives, resumed after the last
//! entry when the stream breaks.
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
        after_key: String::new(),
    };
    let session = owner_session(config, raw_endpoints).await?;
    if let Some(header) = render::header(format) {
        println!("{header}");
    }
    // The log arrives entry by entry (the curator reads it in pages); a stream that
    // breaks (a leader change, a member restarting) is opened again after the last
    // entry printed, at most RESUMES times in a row without a new entry.
    let mut last_key = String::new();
    let mut attempts = 0;
    loop {
        let resumed = api::AuditLogRequest {
            after_key: last_key.clone(),
            ..request.clone()
        };
        let failure = match session.audit_log(resumed).await {
            Err(e) if attempts < RESUMES && !last_key.is_empty() => e,
            Err(e) => return Err(e),
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(entry)) => {
                        attempts = 0;
                        last_key.clone_from(&entry.key);
                        if let Some(line) = render::entry(&entry, format) {
                            println!("{line}");
                        }
                    }
                    Ok(None) => return Ok(()),
                    Err(s) if attempts < RESUMES && resumable(s.code()) => {
                        break call_error("reading the audit log", s);
                    }
                    Err(s) => return Err(call_error("reading the audit log", s)),
                }
            },
        };
        attempts += 1;
        eprintln!("{failure:#}; reading on after the last entry");
        tokio::time::sleep(RESUME_PAUSE * attempts).await;
    }
}

/// Streams opened again in a row without a new entry before giving up.
const RESUMES: u32 = 3;
/// The pause before the first resumption (doubling, then tripling, …).
const RESUME_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether a broken stream is worth opening again.
fn resumable(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable | tonic::Code::Aborted | tonic::Code::Unknown
    )
}
