//! What the local etcd member says about itself before it serves clients: etcd 3.4
//! serves its client socket only once it has published itself through raft (which takes
//! a quorum), but its metrics listener — a second unix socket next to the client one,
//! `metrics.sock:0` — answers from the start. A member started without a quorum can thus
//! still say whether it has a leader, how far its raft log goes, how big its database
//! is, and which of its peers it is connected to.
//!
//! Its peers, as etcd 3.4 shows them (checked against a running 3.4.23):
//! `etcd_network_active_peers{Local,Remote}` is 1 while a stream to `Remote` is up and
//! 0 once it dropped; a peer never connected since the start has no series at all, but
//! raft's messages to it fail (`etcd_network_peer_sent_failures_total{To}`). Member IDs
//! are hex. The raft term is not among etcd's metrics: a report from them cannot say it.
//!
//! Reads only; the HTTP exchange is bounded by the caller.

use std::collections::BTreeMap;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::ConsensusError;
use crate::membership::Member;

/// The metrics listener's socket name (relative to etcd's working directory, as the
/// client socket's: `config::CLIENT_SOCKET_NAME`).
pub const METRICS_SOCKET_NAME: &str = "metrics.sock:0";

/// The local member's own account of itself, from its metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelfReport {
    /// `etcd_server_id`: this member's ID (0: not exposed).
    pub member_id: u64,
    pub has_leader: bool,
    pub is_leader: bool,
    pub is_learner: bool,
    /// The raft index this member got to: the greater of the last entry it knows
    /// committed and the last it applied (after a restart only the applied one is set
    /// until its raft state changes).
    pub raft_index: u64,
    /// Leader changes this member has seen since its etcd started.
    pub leader_changes_seen: u64,
    pub db_size: i64,
    pub db_size_in_use: i64,
    /// `etcd_server_quota_backend_bytes`.
    pub quota_backend_bytes: u64,
    /// `etcd_debugging_mvcc_current_revision`: the revision its applied data reaches.
    pub revision: i64,
    /// Every peer etcd shows (by member ID): connected now or not.
    pub peers: BTreeMap<u64, bool>,
}

/// One other member as this member sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerView {
    pub id: u64,
    /// Its name (Polis: the node ID) and peer URL when known; empty otherwise.
    pub name: String,
    pub peer_url: String,
    pub reachable: bool,
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

/// A label's value in a sample's label set (`{A="x",B="y"}` without the braces).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"'))
    })
}

fn member_id(hex: &str) -> Option<u64> {
    u64::from_str_radix(hex, 16).ok().filter(|id| *id != 0)
}

/// The values that matter, from Prometheus text (pure; missing ones stay zero).
pub fn parse(text: &str) -> SelfReport {
    let mut report = SelfReport::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((sample, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let sample = sample.trim();
        let (name, labels) = match sample.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (sample, ""),
        };
        match name {
            "etcd_server_has_leader" => report.has_leader = value >= 1.0,
            "etcd_server_is_leader" => report.is_leader = value >= 1.0,
            "etcd_server_is_learner" => report.is_learner = value >= 1.0,
            "etcd_server_id" if value >= 1.0 => {
                if let Some(id) = label(labels, "server_id").and_then(member_id) {
                    report.member_id = id;
                }
            }
            "etcd_server_proposals_committed_total" | "etcd_server_proposals_applied_total" => {
                report.raft_index = report.raft_index.max(value as u64)
            }
            "etcd_server_leader_changes_seen_total" => report.leader_changes_seen = value as u64,
            "etcd_server_quota_backend_bytes" => report.quota_backend_bytes = value as u64,
            "etcd_mvcc_db_total_size_in_bytes" => report.db_size = value as i64,
            "etcd_debugging_mvcc_current_revision" => report.revision = value as i64,
            "etcd_mvcc_db_total_size_in_use_in_bytes" => report.db_size_in_use = value as i64,
            "etcd_network_active_peers" => {
                if let Some(id) = label(labels, "Remote").and_then(member_id) {
                    report.peers.insert(id, value >= 1.0);
                }
            }
            "etcd_network_peer_sent_failures_total" => {
                if let Some(id) = label(labels, "To").and_then(member_id) {
                    report.peers.entry(id).or_insert(false);
                }
            }
            _ => {}
        }
    }
    report
}

/// This member's view of every other member (pure): those in `members` (the cluster's
/// list, or the one last recorded) and any other etcd shows, reachable when etcd has an
/// active stream to it. Sorted by member ID; `own` left out.
pub fn peer_view(report: &SelfReport, own: u64, members: &[Member]) -> Vec<PeerView> {
    let mut view: BTreeMap<u64, PeerView> = BTreeMap::new();
    for m in members.iter().filter(|m| m.id != own && m.id != 0) {
        view.insert(
            m.id,
            PeerView {
                id: m.id,
                name: m.name.clone(),
                peer_url: m.peer_urls.first().cloned().unwrap_or_default(),
                reachable: false,
            },
        );
    }
    for (&id, &active) in report.peers.iter().filter(|(id, _)| **id != own) {
        view.entry(id)
            .or_insert_with(|| PeerView {
                id,
                name: String::new(),
                peer_url: String::new(),
                reachable: false,
            })
            .reachable = active;
    }
    view.into_values().collect()
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
                    etcd_debugging_mvcc_current_revision 57\n\
                    etcd_mvcc_db_total_size_in_use_in_bytes 65536\n\
                    etcd_server_leader_changes_seen_total 3\n\
                    etcd_server_is_leader 0\n\
                    etcd_server_is_learner 0\n\
                    etcd_server_quota_backend_bytes 2.147483648e+09\n\
                    etcd_server_id{server_id=\"bdae9bbc11dd390d\"} 1\n";
        assert_eq!(
            parse(text),
            SelfReport {
                member_id: 0xbdae_9bbc_11dd_390d,
                has_leader: false,
                is_leader: false,
                is_learner: false,
                raft_index: 1234,
                leader_changes_seen: 3,
                db_size: 2_097_152,
                db_size_in_use: 65536,
                quota_backend_bytes: 2 << 30,
                revision: 57,
                peers: BTreeMap::new(),
            }
        );
        assert!(parse("etcd_server_has_leader 1\n").has_leader);
        assert!(parse("etcd_server_is_leader 1\n").is_leader);
    }

    /// As a real etcd 3.4.23 shows them: one peer connected, one dropped, one never
    /// reached since the start (only failed sends).
    const PEERS: &str = "\
etcd_network_active_peers{Local=\"bdae9bbc11dd390d\",Remote=\"2943212f5e2cf73\"} 1
etcd_network_active_peers{Local=\"bdae9bbc11dd390d\",Remote=\"11\"} 0
etcd_network_disconnected_peers_total{Local=\"bdae9bbc11dd390d\",Remote=\"11\"} 1
etcd_network_peer_sent_failures_total{To=\"2943212f5e2cf73\"} 8
etcd_network_peer_sent_failures_total{To=\"3760a4ec3b84f7fa\"} 43
etcd_network_peer_received_bytes_total{From=\"0\"} 120
";

    #[test]
    fn peers_are_read_connected_dropped_and_never_reached() {
        let report = parse(PEERS);
        assert_eq!(
            report.peers,
            BTreeMap::from([
                (0x11, false),
                (0x0294_3212_f5e2_cf73, true),
                (0x3760_a4ec_3b84_f7fa, false),
            ])
        );
    }

    fn member(id: u64, name: &str) -> Member {
        Member {
            id,
            name: name.into(),
            peer_urls: vec![format!("https://127.0.0.{id}:7834")],
            is_learner: false,
        }
    }

    #[test]
    fn the_peer_view_names_known_members_and_keeps_unknown_ones() {
        let report = parse(
            "etcd_network_active_peers{Local=\"1\",Remote=\"2\"} 1\n\
                            etcd_network_peer_sent_failures_total{To=\"9\"} 1\n\
                            etcd_network_peer_sent_failures_total{To=\"1\"} 1\n",
        );
        let view = peer_view(
            &report,
            1,
            &[member(1, "own"), member(2, "b"), member(3, "c")],
        );
        let summary: Vec<(u64, &str, &str, bool)> = view
            .iter()
            .map(|p| (p.id, p.name.as_str(), p.peer_url.as_str(), p.reachable))
            .collect();
        assert_eq!(
            summary,
            [
                (2, "b", "https://127.0.0.2:7834", true),
                (3, "c", "https://127.0.0.3:7834", false),
                (9, "", "", false),
            ]
        );
        // Nothing recorded, nothing seen: no peers (a one-member cluster).
        assert!(peer_view(&SelfReport::default(), 1, &[member(1, "own")]).is_empty());
    }
}

/// Properties over arbitrary metrics text (proptest): it never fails, and what a line
/// says is read whatever surrounds it.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "# [A-Z]{4} .{0,20}",
            (
                prop_oneof![
                    Just("etcd_server_has_leader"),
                    Just("etcd_server_id"),
                    Just("etcd_network_active_peers"),
                    Just("etcd_network_peer_sent_failures_total"),
                    Just("etcd_server_proposals_committed_total"),
                    Just("etcd_mvcc_db_total_size_in_bytes"),
                ],
                "(\\{[A-Za-z_]{1,9}=\"[0-9a-f]{0,17}\"(,[A-Za-z]{1,6}=\"[0-9a-f]{0,17}\")?\\})?",
                prop_oneof![
                    any::<f64>().prop_map(|v| v.to_string()),
                    Just("NaN".to_string()),
                    Just("+Inf".to_string()),
                    Just("-1e400".to_string()),
                    "[0-9.e+-]{1,12}",
                ],
            )
                .prop_map(|(name, labels, value)| format!("{name}{labels} {value}")),
        ]
    }

    proptest! {
        #[test]
        fn any_text_gives_a_report(lines in prop::collection::vec(line(), 0..12)) {
            let report = parse(&lines.join("\n"));
            prop_assert!(!report.peers.contains_key(&0));
            let view = peer_view(&report, report.member_id, &[]);
            prop_assert!(view.iter().all(|p| p.id != report.member_id && p.id != 0));
        }

        #[test]
        fn a_peer_line_is_read_among_any_others(
            before in prop::collection::vec(line(), 0..5),
            remote in 1u64..,
            active in any::<bool>(),
        ) {
            let mut text = before.join("\n");
            text.push_str(&format!(
                "\netcd_network_active_peers{{Local=\"1\",Remote=\"{remote:x}\"}} {}\n",
                u8::from(active)
            ));
            prop_assert_eq!(parse(&text).peers.get(&remote).copied(), Some(active));
        }
    }
}
