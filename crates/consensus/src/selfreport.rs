//! What the local etcd member says about itself before it serves clients: etcd 3.4
//! serves its client socket only once it has published itself through raft (which takes
//! a quorum), but its metrics listener — a second unix socket next to the client one,
//! `metrics.sock:0` — answers from the start. A member started without a quorum can thus
//! still say whether it has a leader, how far its raft log goes and how big its database
//! is.
//!
//! Reads only; the HTTP exchange is bounded by the caller.

use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::ConsensusError;

/// The metrics listener's socket name (relative to etcd's working directory, as the
/// client socket's: `config::CLIENT_SOCKET_NAME`).
pub const METRICS_SOCKET_NAME: &str = "metrics.sock:0";

/// The local member's own account of itself, from its metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SelfReport {
    pub has_leader: bool,
    /// The raft index this member got to: the greater of the last entry it knows
    /// committed and the last it applied (after a restart only the applied one is set
    /// until its raft state changes).
    pub raft_index: u64,
    pub db_size: i64,
    pub db_size_in_use: i64,
}

/// Reads the member's metrics over `run_dir`'s metrics socket.
pub async fn self_report(run_dir: &Path) -> Result<SelfReport, ConsensusError> {
    let socket = run_dir.join(METRICS_SOCKET_NAME);
    let io = |e: std::io::Error| ConsensusError::Io {
        context: format!("reading etcd's metrics at {}", socket.display()),
        source: e,
    };
    let mut stream = tokio::net::UnixStream::connect(&socket).await.map_err(io)?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .await
        .map_err(io)?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.map_err(io)?;
    Ok(parse(&text))
}

/// The values that matter, from Prometheus text (pure; missing ones stay zero).
pub fn parse(text: &str) -> SelfReport {
    let mut report = SelfReport::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        match name.trim() {
            "etcd_server_has_leader" => report.has_leader = value >= 1.0,
            "etcd_server_proposals_committed_total" | "etcd_server_proposals_applied_total" => {
                report.raft_index = report.raft_index.max(value as u64)
            }
            "etcd_mvcc_db_total_size_in_bytes" => report.db_size = value as i64,
            "etcd_mvcc_db_total_size_in_use_in_bytes" => report.db_size_in_use = value as i64,
            _ => {}
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_that_matter_are_read() {
        let text = "# HELP etcd_server_has_leader Whether or not a leader exists.\n\
                    # TYPE etcd_server_has_leader gauge\n\
                    etcd_server_has_leader 0\n\
                    etcd_server_proposals_committed_total 0\n\
                    etcd_server_proposals_applied_total 1234\n\
                    etcd_mvcc_db_total_size_in_bytes 2.097152e+06\n\
                    etcd_mvcc_db_total_size_in_use_in_bytes 65536\n\
                    etcd_server_leader_changes_seen_total 3\n";
        assert_eq!(
            parse(text),
            SelfReport {
                has_leader: false,
                raft_index: 1234,
                db_size: 2_097_152,
                db_size_in_use: 65536,
            }
        );
        assert!(parse("etcd_server_has_leader 1\n").has_leader);
    }
}
