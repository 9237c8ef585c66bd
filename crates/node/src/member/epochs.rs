//! This node's side of cluster epochs (`proto::epoch`): the epoch its etcd data belongs
//! to (`data/etcd/epoch.pb`; absent: the bootstrap's), the revision its stopped etcd
//! data reaches, and what the other consensus members answer about themselves on their
//! node ports (CuratorLocal.GetConsensusStatus on :7836, answered with or without a
//! quorum) — the question `recover` asks before it changes anything, and that every
//! member asks before and while it serves (`controlplane`), so that a member of an older
//! epoch never serves once a newer one exists. Also whether the others' etcd peer ports
//! answer at all (`answering_peers`, `majority_answering`): what `recover` and
//! `restore` ask before they make a cluster of one.
//!
//! ```text
//!   recover: claim (parent = data's epoch, parent_revision = data's revision)
//!            ─▶ recover.pb CLAIMED ─▶ epoch.pb (record_revision 0)
//!            ─▶ recover.pb FORCING ─▶ etcd forced ─▶ recorded in etcd ─▶ CRLs signed
//!            again, old leases revoked ─▶ epoch.pb (record_revision set) ─▶ recover.pb gone
//!   any start finding recover.pb: CLAIMED (etcd never forced, data unchanged) and not a
//!            `recover`: rolled back (epoch.pb = parent); FORCING: completed (forced
//!            again — idempotent on a one-member cluster — and recorded: create-if-absent)
//!   restore: recorded in the restored etcd ─▶ epoch.pb
//!   joined as a learner: the cluster's latest, once a voter ─▶ epoch.pb
//! ```
//! A leaf: imports only `storage` (and `crash`, for a test build's clock); may not start
//! or stop anything.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use proto::api;
use proto::config::ClusterEpoch;

use proto::config::RecoverProgress;
use proto::config::recover_progress::Phase;

use crate::disk::storage::{Root, read_proto, write_proto};

/// The epoch this node's etcd data belongs to (the bootstrap's when none is recorded).
pub fn load(root: &Root) -> Result<ClusterEpoch> {
    let path = root.etcd_epoch();
    if !path.exists() {
        return Ok(ClusterEpoch::default());
    }
    read_proto(&path, "cluster epoch")
}

/// Records the epoch this node's etcd data belongs to (atomic, 0600).
pub fn keep(root: &Root, epoch: &ClusterEpoch) -> Result<()> {
    write_proto(&root.etcd_epoch(), epoch).with_context(|| {
        format!(
            "recording the cluster epoch in {}",
            root.etcd_epoch().display()
        )
    })
}

/// Starts a recover on disk: its progress (CLAIMED, with the parent to roll back to),
/// then the claim beside the data. Written before etcd is touched.
pub fn begin_recover(root: &Root, parent: &ClusterEpoch, claim: &ClusterEpoch) -> Result<()> {
    let progress = RecoverProgress {
        phase: Phase::Claimed as i32,
        parent: Some(parent.clone()),
        claim: Some(claim.clone()),
    };
    write_proto(&root.recover_progress(), &progress).with_context(|| {
        format!(
            "recording the recover's progress in {}",
            root.recover_progress().display()
        )
    })?;
    keep(root, claim)
}

/// The recover under way on this member, if any.
fn recover_progress(root: &Root) -> Result<Option<RecoverProgress>> {
    let path = root.recover_progress();
    if !path.exists() {
        return Ok(None);
    }
    let progress: RecoverProgress = read_proto(&path, "recover progress")?;
    match (Phase::try_from(progress.phase), &progress.claim) {
        (Ok(Phase::Claimed | Phase::Forcing), Some(_)) => Ok(Some(progress)),
        _ => bail!(
            "{} is corrupt (phase {}, claim {}): a recover was interrupted on this member;              remove the file only if `{}` holds the epoch the data belongs to, then run              `polis-node recover` again",
            path.display(),
            progress.phase,
            if progress.claim.is_some() {
                "present"
            } else {
                "missing"
            },
            root.etcd_epoch().display()
        ),
    }
}

/// What this start does about a recover it finds on disk (`recovering`: this start is
/// `polis-node recover`, past its checks). Returns whether etcd starts forced.
///
/// - none: a plain start (`recovering` then means a recover that was never begun: an
///   error, since preflight begins it).
/// - CLAIMED: etcd was never started forced, so the data is still the parent's. A
///   recover moves to FORCING; any other start rolls the claim back (the epoch file is
///   the parent's again), so that a plain member never advertises a claim nobody will
///   record, which would make the serving members hold back.
/// - FORCING: etcd may have been forced already (the data may be a one-member cluster):
///   rolling back could make a fork that names the old epoch, so the recover is
///   completed, whatever the flags of this start.
pub fn resume_recover(root: &Root, recovering: bool) -> Result<bool> {
    let Some(mut progress) = recover_progress(root)? else {
        if recovering {
            bail!(
                "recover found no claim of its own at {}",
                root.recover_progress().display()
            );
        }
        return Ok(false);
    };
    let claim = progress.claim.clone().unwrap_or_default();
    match Phase::try_from(progress.phase) {
        Ok(Phase::Claimed) if !recovering => {
            let parent = progress.parent.clone().unwrap_or_default();
            keep(root, &parent)?;
            std::fs::remove_file(root.recover_progress())
                .with_context(|| format!("removing {}", root.recover_progress().display()))?;
            tracing::warn!(
                claim = proto::epoch::describe(&claim),
                back_to = proto::epoch::describe(&parent),
                "a recover was interrupted before its etcd was forced: rolled back (the data                  was never changed); run `polis-node recover` again if it is still needed"
            );
            Ok(false)
        }
        Ok(Phase::Claimed) => {
            progress.phase = Phase::Forcing as i32;
            write_proto(&root.recover_progress(), &progress).with_context(|| {
                format!(
                    "recording the recover's progress in {}",
                    root.recover_progress().display()
                )
            })?;
            crate::process::crash::crash_point("recover-forcing");
            Ok(true)
        }
        _ => {
            if !recovering {
                tracing::warn!(
                    claim = proto::epoch::describe(&claim),
                    "a recover was interrupted after its etcd was forced: completing it                      (etcd forced again, the claim recorded, CRLs signed again, old leases                      revoked)"
                );
            }
            Ok(true)
        }
    }
}

/// Whether a recover on this member has its etcd forced and its claim not yet recorded
/// (`resume_recover` moved it to FORCING): every etcd start forces, and the control
/// plane records the claim before anything else.
pub fn recover_pending(root: &Root) -> Result<bool> {
    Ok(recover_progress(root)?.is_some_and(|p| Phase::try_from(p.phase) == Ok(Phase::Forcing)))
}

/// Ends a recover: the recorded claim beside the data, then its progress removed.
pub fn finish_recover(root: &Root, recorded: &ClusterEpoch) -> Result<()> {
    keep(root, recorded)?;
    match std::fs::remove_file(root.recover_progress()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", root.recover_progress().display())),
    }
}

/// The epoch a recover or restore (`kind`) by node `made_by` starts now after `parent`
/// (later than `parent` whatever this machine's clock says: `proto::epoch::successor`).
pub fn successor(
    parent: &ClusterEpoch,
    made_by: &str,
    kind: &str,
    parent_revision: i64,
) -> ClusterEpoch {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
        .saturating_add(crate::process::crash::epoch_clock_offset_ms());
    proto::epoch::successor(parent, now, made_by, kind, parent_revision)
}

/// How far the etcd data under `root` reaches: what its database applied, and what its
/// write-ahead log holds beyond that (after an unclean stop the database lags the log by
/// up to a batch of acknowledged writes; etcd replays them on its next start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRevision {
    /// The revision of the database file (`etcdctl snapshot status`).
    pub applied: i64,
    /// Logged entries past the database's consistent index that may each add a revision.
    pub unapplied_writes: u64,
}

impl DataRevision {
    /// Never below the revision this data holds once etcd replayed its log: what a
    /// decision to drop the data must compare.
    pub fn bound(&self) -> i64 {
        self.applied
            .saturating_add(i64::try_from(self.unapplied_writes).unwrap_or(i64::MAX))
    }
}

/// The revision the etcd data under `root` reaches (see [`DataRevision`]), read from its
/// files (etcd must not run on them); 0 without a database (a member that never started
/// holds no write).
pub fn data_revision(etcdctl: &Path, root: &Root) -> Result<DataRevision> {
    let unapplied = consensus::ondisk::unapplied(&root.etcd_data())
        .context("reading what the etcd write-ahead log holds beyond the database")?;
    let db = root.etcd_data().join("member").join("snap").join("db");
    if !db.exists() {
        return Ok(DataRevision {
            applied: 0,
            unapplied_writes: unapplied.writes,
        });
    }
    let output = std::process::Command::new(etcdctl)
        .arg("snapshot")
        .arg("status")
        .arg(&db)
        .args(["-w", "json"])
        .env("ETCDCTL_API", "3")
        .output()
        .with_context(|| format!("running {} snapshot status", etcdctl.display()))?;
    if !output.status.success() {
        bail!(
            "{} snapshot status {} failed: {}",
            etcdctl.display(),
            db.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let applied = parse_status_revision(&output.stdout).ok_or_else(|| {
        anyhow!(
            "etcdctl snapshot status of {} named no revision",
            db.display()
        )
    })?;
    if unapplied.writes > 0 {
        tracing::info!(
            applied,
            unapplied_writes = unapplied.writes,
            consistent_index = unapplied.consistent_index,
            last_logged_index = unapplied.last_logged_index,
            "the etcd database lags its write-ahead log (an unclean stop): counting the logged \
             writes too"
        );
    }
    Ok(DataRevision {
        applied,
        unapplied_writes: unapplied.writes,
    })
}

/// The `revision` of `etcdctl snapshot status -w json`'s answer.
fn parse_status_revision(json: &[u8]) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    value.get("revision")?.as_i64()
}

/// How long a peer port gets to accept a connection.
const PEER_ANSWER: Duration = Duration::from_millis(700);

/// Whether `answering` of `others` members make a majority of them: then the cluster
/// may still have its quorum, and a recovery would make a second cluster.
pub fn majority_answering(answering: usize, others: usize) -> bool {
    others > 0 && 2 * answering > others
}

/// The etcd peer endpoints of `others` that accept a TCP connection within
/// [`PEER_ANSWER`], asked all at once.
pub async fn answering_peers(others: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut asks = tokio::task::JoinSet::new();
    for peer in others.iter().copied() {
        asks.spawn(async move {
            let connect = tokio::net::TcpStream::connect(peer);
            matches!(tokio::time::timeout(PEER_ANSWER, connect).await, Ok(Ok(_))).then_some(peer)
        });
    }
    let mut answering = Vec::new();
    while let Some(answer) = asks.join_next().await {
        if let Ok(Some(peer)) = answer {
            answering.push(peer);
        }
    }
    answering.sort();
    answering
}

/// What one other member answered on its node port, or why it did not.
pub type MemberAnswer = (IpAddr, Result<api::GetConsensusStatusResponse, String>);

/// Another consensus member to ask on its node port: its address and, when this node's
/// member book names it, its node ID. Only that node's certificate may answer for it:
/// an address a stale directory lists may be another node's now, and a node that is
/// no member must not make this one wipe, hold back or refuse a recover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberToAsk {
    pub ip: IpAddr,
    pub node_id: Option<String>,
}

/// The host of an etcd peer URL (`https://IP:PORT`, IPv6 in brackets) (pure).
pub fn peer_url_ip(url: &str) -> Option<IpAddr> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (host, _port) = rest.rsplit_once(':')?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// The other members to ask (pure): those of `book` (the etcd members this node last
/// listed, `memberbook`) with their node IDs, then the `directory`'s other addresses
/// (curators the book does not name: a member added, or a restore's new node, since
/// the book was written) without one; never `own`.
pub fn members_to_ask(
    book: &[consensus::membership::Member],
    directory: &[IpAddr],
    own: IpAddr,
) -> Vec<MemberToAsk> {
    let mut members: Vec<MemberToAsk> = book
        .iter()
        .filter_map(|m| {
            let ip = m.peer_urls.first().and_then(|u| peer_url_ip(u))?;
            Some(MemberToAsk {
                ip,
                node_id: Some(m.name.clone()).filter(|n| !n.is_empty()),
            })
        })
        .collect();
    for ip in directory {
        if !members.iter().any(|m| m.ip == *ip) {
            members.push(MemberToAsk {
                ip: *ip,
                node_id: None,
            });
        }
    }
    members.retain(|m| m.ip != own);
    // The book's entry first for an address listed twice.
    members.sort_by(|a, b| {
        a.ip.cmp(&b.ip)
            .then(b.node_id.is_some().cmp(&a.node_id.is_some()))
    });
    members.dedup_by(|a, b| a.ip == b.ip);
    members
}

/// The answer of a node this one does not know as a member (pure): taken only when the
/// epoch it names is the bootstrap's or signed by one of `cas` (a cluster CA's key
/// vouches for it); otherwise refused, so that no node can make this one hold back,
/// wipe or refuse a recover with an epoch it made up.
pub fn credible(
    answer: api::GetConsensusStatusResponse,
    cas: &[Vec<u8>],
) -> Result<api::GetConsensusStatusResponse, String> {
    let epoch = answered_epoch(&answer);
    let signature = hex::encode(&answer.epoch_signature);
    if rpc::epoch::verified(&epoch, Some(&signature), cas) {
        Ok(answer)
    } else {
        Err(format!(
            "node {} is not in this node's member book and named {} without a signature of \
             a cluster CA this node trusts: not taken",
            answer.node_id,
            proto::epoch::describe(&epoch)
        ))
    }
}

/// Asks each of `members` on its node port, all at once, each bounded by `bound`,
/// presenting `credentials`. Where this node knows the member's ID, that node's
/// certificate answers, unsigned; otherwise (or when another node holds that address
/// now: a restore at a former member's address) any node of the cluster (`trust`) for
/// the address dialed, whose epoch is then taken only when signed (`credible`).
pub async fn ask_members(
    members: &[MemberToAsk],
    trust: &rpc::TrustSlot,
    credentials: &rpc::CredentialSlot,
    bound: Duration,
) -> Vec<MemberAnswer> {
    let mut asks = tokio::task::JoinSet::new();
    for member in members.iter().cloned() {
        let (trust, credentials) = (trust.clone(), credentials.clone());
        let cas = trust.cas();
        asks.spawn(async move {
            let endpoint = SocketAddr::new(member.ip, rpc::NODE_LOGS_PORT);
            let status = async |server: rpc::ServerTrust| {
                let channel = rpc::connect_with(endpoint, &server, Some(&credentials))
                    .await
                    .map_err(|e| e.to_string())?;
                api::curator_local_client::CuratorLocalClient::new(channel)
                    .get_consensus_status(api::GetConsensusStatusRequest {})
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|s| s.message().to_string())
            };
            let any_node = rpc::ServerTrust::ClusterMember {
                trust: trust.clone(),
            };
            let ask = async {
                let Some(id) = &member.node_id else {
                    return credible(status(any_node).await?, &cas);
                };
                let as_member = rpc::ServerTrust::ClusterNode {
                    trust: trust.clone(),
                    node_id: id.clone(),
                };
                match status(as_member).await {
                    Ok(answer) if answer.node_id == *id => Ok(answer),
                    Ok(answer) => Err(format!(
                        "answered as node {}, not as member {id}",
                        answer.node_id
                    )),
                    // Another node at that address now (a restore at a former member's
                    // address): believed only with a signed epoch, like a stranger.
                    Err(as_member) => match status(any_node).await {
                        Ok(answer) => credible(answer, &cas),
                        Err(_) => Err(as_member),
                    },
                }
            };
            let answer = match tokio::time::timeout(bound, ask).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("no answer within {} ms", bound.as_millis())),
            };
            (member.ip, answer)
        });
    }
    let mut answers = Vec::new();
    while let Some(answer) = asks.join_next().await {
        if let Ok(answer) = answer {
            answers.push(answer);
        }
    }
    answers.sort_by_key(|(ip, _)| *ip);
    answers
}

/// The epoch a member answered (the bootstrap's when it named none).
pub fn answered_epoch(answer: &api::GetConsensusStatusResponse) -> ClusterEpoch {
    answer.epoch.clone().unwrap_or_default()
}

/// The first of `answers` whose epoch is newer than `own`: this node must not serve.
pub fn newer_member<'a>(
    own: &ClusterEpoch,
    answers: &'a [MemberAnswer],
) -> Option<(IpAddr, &'a api::GetConsensusStatusResponse)> {
    answers.iter().find_map(|(ip, answer)| match answer {
        Ok(a) if proto::epoch::newer(&answered_epoch(a), own) => Some((*ip, a)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_of_etcdctls_status() {
        let json = br#"{"hash":1872909544,"revision":3,"totalKey":6,"totalSize":20480}"#;
        assert_eq!(parse_status_revision(json), Some(3));
        assert_eq!(parse_status_revision(b"{}"), None);
        assert_eq!(parse_status_revision(b"not json"), None);
    }

    #[test]
    fn only_the_members_of_the_book_are_asked_by_node_id() {
        let member = |id: u64, name: &str, url: &str| consensus::membership::Member {
            id,
            name: name.into(),
            peer_urls: vec![url.into()],
            is_learner: false,
        };
        let own: IpAddr = "127.0.0.1".parse().unwrap();
        let directory: Vec<IpAddr> = ["127.0.0.2", "127.0.0.9"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let book = vec![
            member(1, "polis-a", "https://127.0.0.1:7834"),
            member(2, "polis-b", "https://127.0.0.2:7834"),
            member(3, "polis-c", "https://[::1]:7834"),
        ];
        // The book's members by ID; the directory's other address without one.
        assert_eq!(
            members_to_ask(&book, &directory, own),
            vec![
                MemberToAsk {
                    ip: "127.0.0.2".parse().unwrap(),
                    node_id: Some("polis-b".into())
                },
                MemberToAsk {
                    ip: "127.0.0.9".parse().unwrap(),
                    node_id: None
                },
                MemberToAsk {
                    ip: "::1".parse().unwrap(),
                    node_id: Some("polis-c".into())
                },
            ]
        );
        // No book: the directory, any node answering for its own address.
        assert_eq!(
            members_to_ask(&[], &directory, own)
                .iter()
                .map(|m| (m.ip, m.node_id.clone()))
                .collect::<Vec<_>>(),
            vec![(directory[0], None), (directory[1], None)]
        );
        assert_eq!(
            peer_url_ip("https://10.0.0.1:7834"),
            Some("10.0.0.1".parse().unwrap())
        );
        assert_eq!(peer_url_ip("garbage"), None);
    }

    #[test]
    fn a_stranger_is_believed_only_with_a_signed_epoch() {
        let ca = pki::Ca::generate("cluster", pki::CA_LIFETIME).unwrap();
        let cas = vec![ca.cert_der.clone()];
        let newer = ClusterEpoch {
            number: 1,
            made_unix_ms: 10,
            made_by: "polis-r".into(),
            kind: "restore".into(),
            ..Default::default()
        };
        let answer = |signature: Vec<u8>| api::GetConsensusStatusResponse {
            node_id: "polis-w".into(),
            epoch: Some(newer.clone()),
            epoch_signature: signature,
            ..Default::default()
        };
        assert!(credible(answer(vec![]), &cas).is_err());
        let forged = pki::Ca::generate("worker's", pki::CA_LIFETIME)
            .unwrap()
            .sign(&rpc::epoch::signed_message(&newer))
            .unwrap();
        assert!(credible(answer(forged), &cas).is_err());
        let signed = ca.sign(&rpc::epoch::signed_message(&newer)).unwrap();
        assert!(credible(answer(signed), &cas).is_ok());
        // The bootstrap's epoch makes no one hold back: no signature needed.
        let plain = api::GetConsensusStatusResponse::default();
        assert!(credible(plain, &cas).is_ok());
    }

    #[test]
    fn only_a_newer_epoch_names_a_member() {
        let own = ClusterEpoch {
            made_unix_ms: 10,
            made_by: "polis-a".into(),
            ..Default::default()
        };
        let older = api::GetConsensusStatusResponse::default();
        let newer = api::GetConsensusStatusResponse {
            epoch: Some(ClusterEpoch {
                made_unix_ms: 11,
                made_by: "polis-b".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let answers = vec![(a, Ok(older)), (b, Err("refused".into()))];
        assert!(newer_member(&own, &answers).is_none());
        let answers = vec![(a, Ok(newer))];
        assert_eq!(newer_member(&own, &answers).map(|(ip, _)| ip), Some(a));
    }
}

/// Properties over arbitrary etcdctl output (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_revision_is_read_from_any_status(revision in any::<i64>(), hash in any::<u32>()) {
            let json = format!(r#"{{"hash":{hash},"revision":{revision},"totalKey":6,"totalSize":20480}}"#);
            prop_assert_eq!(parse_status_revision(json.as_bytes()), Some(revision));
        }

        #[test]
        fn any_output_gives_a_revision_or_none(bytes in prop::collection::vec(any::<u8>(), 0..100)) {
            let _ = parse_status_revision(&bytes);
        }
    }
}
