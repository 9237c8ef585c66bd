//! `cluster status`, and the voters as the curators' own etcd members report them (for
//! `cluster launch`). Asks every curator it can find, so it answers without a quorum;
//! a member whose curator does not answer (it starts only with a quorum) is asked on its
//! node's port (7836), where polis-node answers about its own etcd member.
//! May not decide the quorum itself (`consensus_summary`) nor format (`render::status`).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Result, bail};
use proto::api;

use crate::commands::node::list_nodes;
use crate::consensus_summary::{
    MemberStatus, alarms, ca_rotation, held_back, not_ready, split, summarize,
};
use crate::output::{self, Format};
use crate::render::snapshots::age;
use crate::render::status::print_status;
use crate::session::owner_session;

/// `cluster status`: asks every curator's own etcd member (no quorum needed to answer),
/// shows the members, and fails when there is no quorum.
pub(crate) async fn cluster_status(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
) -> Result<()> {
    let (members, quorum, unreachable, alarms, snapshots, split) =
        consensus_status(config, raw_endpoints).await?;
    // Node warnings need the leader, so only with a quorum; their absence is no error.
    let mut warnings: Vec<String> = if quorum {
        match list_nodes(config, raw_endpoints).await {
            Ok(nodes) => nodes
                .iter()
                .flat_map(|n| {
                    n.warnings
                        .iter()
                        .map(move |w| format!("node {}: {w}", n.id))
                })
                .collect(),
            Err(e) => vec![format!("could not list nodes for their warnings: {e:#}")],
        }
    } else {
        Vec::new()
    };
    // Scheduled snapshots: each member's own curator says how its last one went.
    warnings.extend(snapshots);
    let leader = curator_leader(config, raw_endpoints).await;
    print_status(
        &members,
        quorum,
        leader.as_ref(),
        &unreachable,
        &warnings,
        &alarms,
        format,
    );
    if let Some(split) = split {
        bail!("{split}");
    }
    if !quorum {
        bail!("the cluster has no etcd quorum");
    }
    Ok(())
}

/// The curator leader (node ID, endpoint) as the first curator that answers names it;
/// `None` when none answers or none leads.
pub(crate) async fn curator_leader(
    config: &Path,
    raw_endpoints: &[String],
) -> Option<(String, String)> {
    let session = owner_session(config, raw_endpoints).await.ok()?;
    for endpoint in session.endpoints() {
        let answer = async {
            let channel = rpc::connect(endpoint, session.trust(), Some(&session.credentials()))
                .await
                .ok()?;
            api::curator_local_client::CuratorLocalClient::new(channel)
                .get_current_leader(api::GetCurrentLeaderRequest {})
                .await
                .ok()
                .map(|r| r.into_inner())
        };
        if let Ok(Some(a)) = tokio::time::timeout(std::time::Duration::from_secs(5), answer).await
            && !a.leader_node_id.is_empty()
        {
            return Some((a.leader_node_id, a.leader_endpoint));
        }
    }
    None
}

/// Whether the consensus members `expected` (node IDs) are all voters in every answering
/// member's view, each answering through its own curator (`consensus_summary::not_ready`):
/// `Err` says what is still missing.
pub(crate) async fn control_plane_ready(
    config: &Path,
    raw_endpoints: &[String],
    expected: &[String],
) -> Result<()> {
    let gathered = gather(config, raw_endpoints).await?;
    match not_ready(
        &gathered.answers,
        &gathered.curators_answering,
        &gathered.unreachable,
        expected,
    ) {
        Some(why) => bail!("{why}"),
        None => Ok(()),
    }
}

/// What the members said when asked: every answer, which of them came from the member's
/// own curator (not from its node's port), and who did not answer and why.
pub(crate) struct Gathered {
    pub(crate) answers: Vec<api::GetConsensusStatusResponse>,
    pub(crate) curators_answering: Vec<String>,
    pub(crate) unreachable: Vec<String>,
}

/// Asks every curator it can find (following the members' peer addresses) for its own
/// etcd member's view; a member whose curator does not answer is asked on its node port.
pub(crate) async fn gather(config: &Path, raw_endpoints: &[String]) -> Result<Gathered> {
    let session = owner_session(config, raw_endpoints).await?;
    let mut to_ask: Vec<SocketAddr> = session.endpoints();
    let mut asked = Vec::new();
    let mut answers: Vec<api::GetConsensusStatusResponse> = Vec::new();
    let mut curators_answering = Vec::new();
    let mut unreachable = Vec::new();
    while let Some(endpoint) = to_ask.pop() {
        if asked.contains(&endpoint) {
            continue;
        }
        asked.push(endpoint);
        let answer = async {
            let channel = rpc::connect(endpoint, session.trust(), Some(&session.credentials()))
                .await
                .map_err(|e| e.to_string())?;
            api::curator_local_client::CuratorLocalClient::new(channel)
                .get_consensus_status(api::GetConsensusStatusRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.message().to_string())
        };
        let answer = match tokio::time::timeout(std::time::Duration::from_secs(5), answer).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("no answer within 5 s".to_string()),
        };
        // A member whose curator cannot run (no quorum since it started) answers about
        // its own etcd member on its node's port.
        let answer = match answer {
            Ok(a) => {
                curators_answering.push(a.node_id.clone());
                Ok(a)
            }
            Err(e) => match member_status(&session, endpoint).await {
                Ok(a) => {
                    unreachable.push(format!(
                        "{endpoint}: {e} (its node answered for its etcd member on port {})",
                        rpc::NODE_LOGS_PORT
                    ));
                    Ok(a)
                }
                Err(node) => Err(format!("{e}; its node's port: {node}")),
            },
        };
        match answer {
            Ok(a) => {
                // Every member runs a curator on its peer address.
                for m in &a.members {
                    for url in &m.peer_urls {
                        if let Some(ip) = rpc::url_address(url) {
                            to_ask.push(SocketAddr::new(ip, rpc::CURATOR_PORT));
                        }
                    }
                }
                answers.push(a);
            }
            Err(e) => unreachable.push(format!("{endpoint}: {e}")),
        }
    }
    Ok(Gathered {
        answers,
        curators_answering,
        unreachable,
    })
}

/// Asks every curator it can find for its own etcd member's view.
pub(crate) async fn consensus_status(
    config: &Path,
    raw_endpoints: &[String],
) -> Result<(
    Vec<MemberStatus>,
    bool,
    Vec<String>,
    Vec<(u64, String)>,
    Vec<String>,
    Option<String>,
)> {
    let Gathered {
        answers,
        unreachable,
        ..
    } = gather(config, raw_endpoints).await?;
    let (members, quorum) = summarize(&answers);
    let split = split(&answers);
    let mut warnings = held_back(&answers);
    warnings.extend(split.clone());
    warnings.extend(ca_rotation(&answers));
    let snapshots: Vec<String> = answers
        .iter()
        .filter(|a| !a.snapshot_last_error.is_empty())
        .map(|a| {
            let last = match a.snapshot_last_success_unix_ms {
                0 => "never".to_string(),
                t => format!("{} ({} ago)", output::utc_time(t), age(t)),
            };
            format!(
                "node {}: scheduled snapshot failed: {} (last success: {last})",
                a.node_id, a.snapshot_last_error
            )
        })
        .collect();
    warnings.extend(snapshots);
    Ok((
        members,
        quorum,
        unreachable,
        alarms(&answers),
        warnings,
        split,
    ))
}

/// GetConsensusStatus on the node port of the member at `curator`'s address (any node
/// certificate of the cluster for that address), bounded.
async fn member_status(
    session: &crate::session::OwnerSession,
    curator: SocketAddr,
) -> Result<api::GetConsensusStatusResponse, String> {
    let endpoint = SocketAddr::new(curator.ip(), rpc::NODE_LOGS_PORT);
    let trust = match session.trust() {
        rpc::ServerTrust::ClusterCa { trust } => rpc::ServerTrust::ClusterMember {
            trust: trust.clone(),
        },
        other => other.clone(),
    };
    let answer = async {
        let channel = rpc::connect(endpoint, &trust, Some(&session.credentials()))
            .await
            .map_err(|e| e.to_string())?;
        api::curator_local_client::CuratorLocalClient::new(channel)
            .get_consensus_status(api::GetConsensusStatusRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| s.message().to_string())
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), answer)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
}
