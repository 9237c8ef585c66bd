//! Rotating the cluster CA online: Management.RotateCa starts it, the leader's
//! `ca-rotation` runnable moves it on, Management.GetCaRotation shows where it stands.
//!
//! ```text
//!   RotateCa (admin; refused while a node is unreachable, unless forced)
//!     └─▶ successor generated ─▶ pki introduce_successor ─▶ /ca-rotation record
//!   phase introduced: every curator trusts both CAs (`crl` runnable); every node
//!     learns both with WatchNode, trusts both, reports their fingerprints in its status
//!     ── every UP node trusts the successor (or forced) ──▶ pki promote_successor
//!   phase reissuing: the successor signs; each node renews its node certificate, each
//!     curator its curator certificate, owners and operators theirs (polisctl, on
//!     their next command), since the old CA did not issue them
//!     ── every UP node uses a certificate of the successor, and every curator serves
//!        one (or forced) ──▶ pki retire_previous; record deleted
//!   settled: the old CA is trusted nowhere; its certificates are refused
//! ```
//! Each step is one guarded transaction on what is stored, and the leader decides from
//! what is stored (the CAs, the records' statuses, the recorded certificates): a new
//! leader resumes where the last one stopped.

use std::sync::Arc;
use std::time::Duration;

use proto::api;
use proto::state::{CaRotationRecord, HealthVerdict, Node, NodeState};
use tonic::Status;

use super::shared::Shared;
use crate::layout;

/// How often the leader looks at whether the rotation can move on.
const STEP_PERIOD: Duration = Duration::from_secs(1);

/// How often the leader looks, while no rotation runs, for a record a failed start left
/// behind (the only thing a step does then): not an etcd read every second forever.
const SETTLED_PERIOD: Duration = Duration::from_secs(60);

fn unavailable(what: &str, e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("{what}: {e}"))
}

/// The record of the running rotation, if any.
async fn record(shared: &Shared) -> Result<Option<CaRotationRecord>, Status> {
    let stored = shared
        .curator
        .get(layout::CA_ROTATION_KEY)
        .await
        .map_err(|e| unavailable("reading the CA rotation", e))?;
    stored
        .map(|bytes| {
            prost::Message::decode(bytes.as_slice())
                .map_err(|e| Status::internal(format!("the CA rotation record: {e}")))
        })
        .transpose()
}

async fn write_record(shared: &Shared, record: &CaRotationRecord) -> Result<(), Status> {
    shared
        .curator
        .put(
            layout::CA_ROTATION_KEY,
            prost::Message::encode_to_vec(record),
        )
        .await
        .map_err(|e| unavailable("recording the CA rotation", e))
}

/// The nodes whose state counts: committed ones (a NEW or STANDBY node holds no
/// certificate yet; a decommissioned one needs none).
fn counted(node: &Node) -> bool {
    node.state == NodeState::Up as i32
}

/// Why the counted `nodes` could not follow a rotation, one line per node, in node ID
/// order (pure): heartbeats timed out, or a status that names no trusted CA (never
/// reported, or a polis-node from before rotations, which would wait forever).
fn unable_to_follow<'a>(nodes: impl Iterator<Item = &'a Node>) -> Vec<String> {
    let mut nodes: Vec<&Node> = nodes.filter(|n| counted(n)).collect();
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    nodes
        .into_iter()
        .filter_map(|n| {
            let status = n.status.clone().unwrap_or_default();
            if n.health == HealthVerdict::HeartbeatTimeout as i32 {
                Some(format!("node {} does not answer (heartbeat timeout)", n.id))
            } else if status.trusted_ca_fingerprints.is_empty() {
                Some(format!(
                    "node {} (version {:?}) has not reported the CAs it trusts: it cannot \
                     follow a rotation until it runs a version that does",
                    n.id, status.version
                ))
            } else {
                None
            }
        })
        .collect()
}

/// What a rotation waits for from `node` itself, if anything, as a predicate ("does not
/// trust the new CA yet") (pure): introduced — that it trusts the successor; reissuing
/// — that it uses a certificate of the signing CA.
/// Nodes that do not count (not UP) hold nothing up. Also a node warning in ListNodes
/// (and so in `cluster status`) while a rotation runs.
pub(super) fn node_holds_up(trusted: &pki::TrustedCas, node: &Node) -> Option<String> {
    if !counted(node) {
        return None;
    }
    let status = node.status.clone().unwrap_or_default();
    match trusted.phase() {
        pki::RotationPhase::Settled => None,
        pki::RotationPhase::Introduced => {
            let next = trusted.next.as_ref().map(|n| rpc::fingerprint(&n.cert));
            (!next
                .as_ref()
                .is_some_and(|fp| status.trusted_ca_fingerprints.contains(fp)))
            .then(|| "does not trust the new CA yet".to_string())
        }
        pki::RotationPhase::Reissuing => (status.certificate_ca_fingerprint
            != rpc::fingerprint(&trusted.current.cert))
        .then(|| "still uses a certificate of the old CA".to_string()),
    }
}

/// What the rotation waits for, one line per node, in node ID order (pure): what
/// [`node_holds_up`] says of each counted node, and while reissuing every curator
/// serving a certificate of the signing CA (`curator_certificates`: each member's
/// newest recorded curator certificate).
fn waiting_for<'a>(
    trusted: &pki::TrustedCas,
    nodes: impl Iterator<Item = &'a Node>,
    curator_certificates: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Vec<String> {
    let mut nodes: Vec<&Node> = nodes.filter(|n| counted(n)).collect();
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    let mut waiting = Vec::new();
    for n in nodes {
        waiting.extend(node_holds_up(trusted, n).map(|why| format!("node {} {why}", n.id)));
        let member = n
            .roles
            .as_ref()
            .is_some_and(|r| r.consensus_member.is_some());
        if trusted.phase() == pki::RotationPhase::Reissuing
            && member
            && !curator_certificates(&n.id)
                .is_some_and(|der| pki::issued_by(&der, &trusted.current.cert))
        {
            waiting.push(format!(
                "the curator of node {} serves a certificate of the old CA",
                n.id
            ));
        }
    }
    waiting
}

/// Each member's newest recorded curator certificate, by node ID.
async fn newest_curator_certificates(
    store: &pki::CaStore,
) -> Result<std::collections::HashMap<String, Vec<u8>>, Status> {
    let recorded = store
        .list_issued("curator-")
        .await
        .map_err(|e| unavailable("listing the curator certificates", e))?;
    let mut newest: std::collections::HashMap<String, (u64, Vec<u8>)> = Default::default();
    for (name, der) in recorded {
        let Some(id) = layout::curator_certificate_node(&name) else {
            continue;
        };
        let issued = pki::Validity::of(&der).map(|v| v.issued()).unwrap_or(0);
        if newest.get(id).is_none_or(|(at, _)| issued > *at) {
            newest.insert(id.to_string(), (issued, der));
        }
    }
    Ok(newest.into_iter().map(|(id, (_, der))| (id, der)).collect())
}

/// Where the rotation stands, as stored, and what it waits for.
pub(super) async fn status(shared: &Shared) -> Result<api::CaRotation, Status> {
    let store = layout::cluster_pki(&shared.curator);
    let trusted = store
        .trusted()
        .await
        .map_err(|e| unavailable("reading the cluster CAs", e))?;
    let record = record(shared).await?;
    let waiting = match trusted.phase() {
        pki::RotationPhase::Settled => Vec::new(),
        _ => {
            let nodes = shared
                .nodes
                .current()
                .ok_or_else(|| Status::unavailable("the node records are not loaded yet"))?;
            let curators = newest_curator_certificates(&store).await?;
            waiting_for(&trusted, nodes.nodes.values(), &|id| {
                curators.get(id).cloned()
            })
        }
    };
    Ok(api::CaRotation {
        phase: trusted.phase().name().to_string(),
        trusted_ca_fingerprints: trusted.cas().iter().map(|c| rpc::fingerprint(c)).collect(),
        waiting_for: waiting,
        forced: record.is_some_and(|r| r.forced),
        started: false,
    })
}

/// The name of a successor CA: distinct from every earlier one, since clients pick a
/// certificate's CRL by its issuer's name.
fn successor_name(now_unix: u64) -> String {
    format!("Polis Cluster CA (from {now_unix})")
}

/// RotateCa: starts a rotation (or marks the running one forced).
pub(super) async fn rotate(
    shared: &Shared,
    caller: &str,
    request: &api::RotateCaRequest,
) -> Result<api::CaRotation, Status> {
    let force = request.force;
    if request.signing_ca_fingerprint.is_empty() {
        return Err(Status::invalid_argument(
            "name the signing CA to rotate away from (its SHA-256 fingerprint)",
        ));
    }
    shared.leadership().await?;
    let store = layout::cluster_pki(&shared.curator);
    let trusted = store
        .trusted()
        .await
        .map_err(|e| unavailable("reading the cluster CAs", e))?;
    let mut started = false;
    let signing = rpc::fingerprint(&trusted.current.cert);
    if trusted.phase() == pki::RotationPhase::Settled && request.signing_ca_fingerprint != signing {
        return Err(Status::failed_precondition(format!(
            "the signing CA is SHA256:{signing}, not the one named: a rotation away from that \
             one has happened already"
        )));
    }
    if trusted.phase() == pki::RotationPhase::Settled {
        let nodes = shared
            .nodes
            .current()
            .ok_or_else(|| Status::unavailable("the node records are not loaded yet"))?;
        let unable = unable_to_follow(nodes.nodes.values());
        if !unable.is_empty() && !force {
            return Err(Status::failed_precondition(format!(
                "{}: a rotation would wait for them, or lock them out if forced once the old \
                 CA is retired; bring them back (or upgrade them), or rotate with --force and \
                 re-register them afterwards",
                unable.join("; ")
            )));
        }
        let now = pki::unix_now();
        let successor = pki::Ca::generate(&successor_name(now), pki::CA_LIFETIME)
            .map_err(|e| Status::internal(format!("generating the new CA: {e}")))?;
        // The record first: a rotation is never running without one saying who started
        // it (a failed introduction leaves a record the runnable removes).
        write_record(
            shared,
            &CaRotationRecord {
                forced: force,
                started_unix_ms: now * 1000,
                started_by: caller.to_string(),
            },
        )
        .await?;
        started = store
            .introduce_successor(&successor)
            .await
            .map_err(|e| unavailable("introducing the new CA", e))?;
        if started {
            tracing::warn!(
                caller,
                force,
                new_ca = rpc::fingerprint(&successor.cert_der),
                "cluster CA rotation started: the new CA is trusted, not signing yet"
            );
        }
    } else if force {
        let mut running = record(shared).await?.unwrap_or_default();
        if !running.forced {
            running.forced = true;
            write_record(shared, &running).await?;
            tracing::warn!(caller, "the running cluster CA rotation is forced on");
        }
    }
    Ok(api::CaRotation {
        started,
        ..status(shared).await?
    })
}

/// One look, as leader: moves the rotation on when what it waits for is done (or it
/// is forced); removes the record once settled.
async fn step(shared: &Shared) -> Result<(), Status> {
    let store = layout::cluster_pki(&shared.curator);
    let now = status(shared).await?;
    let forced = now.forced;
    let ready = now.waiting_for.is_empty() || forced;
    match now.phase.as_str() {
        "introduced" if ready => {
            let promoted = store
                .promote_successor()
                .await
                .map_err(|e| unavailable("promoting the new CA", e))?;
            if promoted {
                tracing::warn!(
                    forced,
                    "cluster CA rotation: the new CA signs; certificates of the old one are \
                     being replaced"
                );
            }
        }
        "reissuing" if ready => {
            let retired = store
                .retire_previous()
                .await
                .map_err(|e| unavailable("retiring the old CA", e))?;
            if retired {
                tracing::warn!(
                    forced,
                    "cluster CA rotation done: the old CA is retired, its certificates refused"
                );
            }
        }
        "settled" if record(shared).await?.is_some() => {
            shared
                .curator
                .kv()
                .delete(shared.curator.key(layout::CA_ROTATION_KEY), None)
                .await
                .map_err(|e| unavailable("removing the CA rotation record", e))?;
        }
        _ => {}
    }
    Ok(())
}

/// The `ca-rotation` runnable: while this curator leads, moves a running rotation on.
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let mut last_problem: Option<String> = None;
    let mut next_settled_look = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(STEP_PERIOD) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
        let running = shared
            .trusted
            .current()
            .is_some_and(|t| t.phase() != pki::RotationPhase::Settled);
        if !matches!(
            shared.role.current(),
            Some(crate::election::Role::Leader(_))
        ) {
            continue;
        }
        if !running {
            if last_problem.is_none() && tokio::time::Instant::now() < next_settled_look {
                continue;
            }
            next_settled_look = tokio::time::Instant::now() + SETTLED_PERIOD;
        }
        match step(&shared).await {
            Ok(()) => last_problem = None,
            Err(e) => {
                let problem = e.message().to_string();
                if last_problem.as_ref() != Some(&problem) {
                    tracing::warn!("cluster CA rotation: {problem}; trying again");
                }
                last_problem = Some(problem);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::state::{NodeRoles, NodeStatus};

    fn ca(name: &str) -> pki::Ca {
        pki::Ca::generate(name, pki::CA_LIFETIME).unwrap()
    }

    fn trusted(
        current: &pki::Ca,
        previous: Option<&pki::Ca>,
        next: Option<&pki::Ca>,
    ) -> pki::TrustedCas {
        let slot = |ca: &pki::Ca| pki::TrustedCa {
            cert: ca.cert_der.clone(),
            crl: ca.crl(&[], 1).unwrap(),
        };
        pki::TrustedCas {
            current: slot(current),
            previous: previous.map(slot),
            next: next.map(slot),
        }
    }

    fn node(id: &str, member: bool, trusts: &[&pki::Ca], uses: &pki::Ca) -> Node {
        Node {
            id: id.into(),
            state: NodeState::Up as i32,
            roles: Some(NodeRoles {
                consensus_member: member.then(Default::default),
            }),
            status: Some(NodeStatus {
                trusted_ca_fingerprints: trusts
                    .iter()
                    .map(|c| rpc::fingerprint(&c.cert_der))
                    .collect(),
                certificate_ca_fingerprint: rpc::fingerprint(&uses.cert_der),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn introduced_waits_for_every_up_node_to_trust_the_successor() {
        let (old, new) = (ca("old"), ca("new"));
        let t = trusted(&old, None, Some(&new));
        let standby = Node {
            state: NodeState::Standby as i32,
            ..node("c", false, &[], &old)
        };
        let nodes = [
            node("b", false, &[&old], &old),
            node("a", true, &[&old, &new], &old),
            standby,
        ];
        let none = |_: &str| None;
        assert_eq!(
            waiting_for(&t, nodes.iter(), &none),
            vec!["node b does not trust the new CA yet".to_string()]
        );
        let all = [node("a", true, &[&old, &new], &old)];
        assert!(waiting_for(&t, all.iter(), &none).is_empty());
    }

    #[test]
    fn reissuing_waits_for_node_and_curator_certificates_of_the_new_ca() {
        let (old, new) = (ca("old"), ca("new"));
        let t = trusted(&new, Some(&old), None);
        let key = [7u8; 32];
        let template = pki::Template {
            common_name: "a".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            usage: pki::Usage::Server,
            lifetime: Duration::from_secs(3600),
            kind: pki::CertificateKind::Curator,
        };
        let old_curator = old.issue(&template, &key).unwrap().der;
        let new_curator = new.issue(&template, &key).unwrap().der;
        let nodes = [
            node("a", true, &[&new, &old], &new),
            node("w", false, &[&new, &old], &old),
        ];
        let serving_old = |_: &str| Some(old_curator.clone());
        assert_eq!(
            waiting_for(&t, nodes.iter(), &serving_old),
            vec![
                "the curator of node a serves a certificate of the old CA".to_string(),
                "node w still uses a certificate of the old CA".to_string(),
            ]
        );
        let serving_new = |_: &str| Some(new_curator.clone());
        let done = [
            node("a", true, &[&new, &old], &new),
            node("w", false, &[&new], &new),
        ];
        assert!(waiting_for(&t, done.iter(), &serving_new).is_empty());
    }

    #[test]
    fn a_node_that_does_not_answer_or_report_its_trust_cannot_follow() {
        let ca = ca("old");
        let silent = Node {
            health: HealthVerdict::HeartbeatTimeout as i32,
            ..node("b", false, &[&ca], &ca)
        };
        let old_version = Node {
            status: Some(NodeStatus {
                version: "0.1.0".into(),
                ..Default::default()
            }),
            ..node("c", false, &[], &ca)
        };
        let standby = Node {
            state: NodeState::Standby as i32,
            status: None,
            ..node("d", false, &[], &ca)
        };
        let nodes = [node("a", true, &[&ca], &ca), silent, old_version, standby];
        let unable = unable_to_follow(nodes.iter());
        assert_eq!(unable.len(), 2, "{unable:?}");
        assert!(
            unable[0].starts_with("node b does not answer"),
            "{unable:?}"
        );
        assert!(
            unable[1].contains("node c (version \"0.1.0\")"),
            "{unable:?}"
        );
    }

    #[test]
    fn successors_are_named_apart() {
        assert_ne!(successor_name(1), successor_name(2));
    }
}
