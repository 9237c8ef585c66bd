//! Rotating a CA online: the cluster CA, or the etcd peer CA. Management.RotateCa
//! starts a rotation, the leader's `ca-rotation` runnable moves it on,
//! Management.GetCaRotation shows where it stands.
//!
//! ```text
//!   RotateCa (admin; refused while a node is unreachable, unless forced)
//!     └─▶ successor generated ─▶ pki introduce_successor ─▶ rotation record
//!   phase introduced: the successor is trusted, it does not sign yet
//!     cluster CA: every curator trusts both (`crl` runnable); every node learns both
//!       with WatchNode, trusts both, reports their fingerprints in its status
//!     etcd peer CA: every member learns both with WatchNode, writes them to its etcd's
//!       trust file and restarts its etcd to load them (etcd 3.4 reads the file only at
//!       start), one member at a time (`node::runnables::peertrust`); it reports what
//!       its etcd loaded
//!     ── every UP node (member) has (or forced) ──▶ pki promote_successor
//!   phase reissuing: the successor signs
//!     cluster CA: each node renews its node certificate, each curator its curator
//!       certificate, owners and operators theirs (polisctl, on their next command)
//!     etcd peer CA: each member renews its peer certificate (etcd reads it on every
//!       handshake: no restart)
//!     ── every UP node uses a certificate of the successor, and every curator serves
//!        one (or forced) ──▶ [peer CA: the old CA's peer certificates revoked, for
//!        the etcds that hold it in memory] ──▶ pki retire_previous
//!   settled: the old CA is trusted nowhere; its certificates are refused
//!     etcd peer CA: each member restarts its etcd once more to drop the old CA from
//!       memory; the record goes when none holds it any more (or forced)
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

/// Which CA a rotation replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rotated {
    /// The cluster CA: node, curator, owner and operator certificates.
    Cluster,
    /// The etcd peer CA: etcd's member-to-member TLS.
    EtcdPeer,
}

impl Rotated {
    pub(super) fn from_request(etcd_peer: bool) -> Rotated {
        if etcd_peer {
            Rotated::EtcdPeer
        } else {
            Rotated::Cluster
        }
    }

    fn store(self, shared: &Shared) -> pki::CaStore {
        match self {
            Rotated::Cluster => layout::cluster_pki(&shared.curator),
            Rotated::EtcdPeer => layout::etcd_pki(shared.curator.client()),
        }
    }

    fn record_key(self) -> &'static str {
        match self {
            Rotated::Cluster => layout::CA_ROTATION_KEY,
            Rotated::EtcdPeer => layout::ETCD_PEER_CA_ROTATION_KEY,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Rotated::Cluster => "cluster CA",
            Rotated::EtcdPeer => "etcd peer CA",
        }
    }

    /// The name of a successor CA: distinct from every earlier one, since clients pick a
    /// certificate's CRL by its issuer's name.
    fn successor_name(self, now_unix: u64) -> String {
        match self {
            Rotated::Cluster => format!("Polis Cluster CA (from {now_unix})"),
            Rotated::EtcdPeer => format!("Polis etcd Peer CA (from {now_unix})"),
        }
    }

    /// The nodes whose state counts: committed ones (a NEW or STANDBY node holds no
    /// certificate yet; a decommissioned one needs none); for the etcd peer CA only
    /// consensus members (only they run an etcd), DECOMMISSIONING ones too while they
    /// hold the role (their etcd may still vote: locking it out could cost the quorum).
    fn counts(self, node: &Node) -> bool {
        let member = node
            .roles
            .as_ref()
            .is_some_and(|r| r.consensus_member.is_some());
        match self {
            Rotated::Cluster => node.state == NodeState::Up as i32,
            Rotated::EtcdPeer => {
                member
                    && (node.state == NodeState::Up as i32
                        || node.state == NodeState::Decommissioning as i32)
            }
        }
    }

    /// The CAs of this kind the leader follows in memory.
    fn watched(self, shared: &Shared) -> Option<pki::TrustedCas> {
        match self {
            Rotated::Cluster => shared.trusted.current().map(|t| (*t).clone()),
            Rotated::EtcdPeer => shared.peer_trusted.current().map(|t| t.trusted.clone()),
        }
    }
}

/// The record of the running rotation, if any.
async fn record(shared: &Shared, which: Rotated) -> Result<Option<CaRotationRecord>, Status> {
    let stored = shared
        .curator
        .get(which.record_key())
        .await
        .map_err(|e| unavailable("reading the CA rotation", e))?;
    stored
        .map(|bytes| {
            prost::Message::decode(bytes.as_slice())
                .map_err(|e| Status::internal(format!("the CA rotation record: {e}")))
        })
        .transpose()
}

async fn write_record(
    shared: &Shared,
    which: Rotated,
    record: &CaRotationRecord,
) -> Result<(), Status> {
    shared
        .curator
        .put(which.record_key(), prost::Message::encode_to_vec(record))
        .await
        .map_err(|e| unavailable("recording the CA rotation", e))
}

/// Why the counted `nodes` could not follow a rotation, one line per node, in node ID
/// order (pure): heartbeats timed out, or a status that names no trusted CA (never
/// reported, or a polis-node from before rotations, which would wait forever).
fn unable_to_follow<'a>(which: Rotated, nodes: impl Iterator<Item = &'a Node>) -> Vec<String> {
    let mut nodes: Vec<&Node> = nodes.filter(|n| which.counts(n)).collect();
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    nodes
        .into_iter()
        .filter_map(|n| {
            let status = n.status.clone().unwrap_or_default();
            let (reported, what) = match which {
                Rotated::Cluster => (
                    !status.trusted_ca_fingerprints.is_empty(),
                    "the CAs it trusts",
                ),
                Rotated::EtcdPeer => (
                    !status.etcd_loaded_peer_ca_fingerprints.is_empty(),
                    "the etcd peer CAs its etcd loaded",
                ),
            };
            if n.health == HealthVerdict::HeartbeatTimeout as i32 {
                Some(format!("node {} does not answer (heartbeat timeout)", n.id))
            } else if !reported {
                Some(format!(
                    "node {} (version {:?}) has not reported {what}: it cannot follow a \
                     rotation until it runs a version that does",
                    n.id, status.version
                ))
            } else {
                None
            }
        })
        .collect()
}

/// What a rotation waits for from `node` itself, if anything, as a predicate ("does not
/// trust the new CA yet") (pure). Cluster CA: introduced — that it trusts the
/// successor; reissuing — that it uses a certificate of the signing CA. etcd peer CA
/// (members): introduced — that its etcd loaded the successor; reissuing — that its etcd
/// presents a peer certificate of the signing CA; settled — that its etcd loaded no CA
/// but the signing one (a node that never reported is not held to it). Nodes that do
/// not count hold nothing up. Also a node warning in ListNodes (and so in `cluster
/// status`) while a rotation runs.
pub(super) fn node_holds_up(
    which: Rotated,
    trusted: &pki::TrustedCas,
    node: &Node,
) -> Option<String> {
    // Asked for every node of every ListNodes: the common case (no cluster CA rotation)
    // costs no copy and no hash.
    if !which.counts(node)
        || (which == Rotated::Cluster && trusted.phase() == pki::RotationPhase::Settled)
    {
        return None;
    }
    let unreported = proto::state::NodeStatus::default();
    let status = node.status.as_ref().unwrap_or(&unreported);
    let signing = rpc::fingerprint(&trusted.current.cert);
    let next = trusted.next.as_ref().map(|n| rpc::fingerprint(&n.cert));
    let holds = |fingerprints: &[String]| next.as_ref().is_some_and(|fp| fingerprints.contains(fp));
    match (which, trusted.phase()) {
        (Rotated::Cluster, pki::RotationPhase::Settled) => None,
        (Rotated::Cluster, pki::RotationPhase::Introduced) => {
            (!holds(&status.trusted_ca_fingerprints))
                .then(|| "does not trust the new CA yet".to_string())
        }
        (Rotated::Cluster, pki::RotationPhase::Reissuing) => (status.certificate_ca_fingerprint
            != signing)
            .then(|| "still uses a certificate of the old CA".to_string()),
        (Rotated::EtcdPeer, pki::RotationPhase::Introduced) => {
            (!holds(&status.etcd_loaded_peer_ca_fingerprints)).then(|| {
                "has an etcd that did not load the new etcd peer CA yet (it restarts its etcd \
                 for that, one member at a time)"
                    .to_string()
            })
        }
        (Rotated::EtcdPeer, pki::RotationPhase::Reissuing) => {
            (status.etcd_peer_certificate_ca_fingerprint != signing).then(|| {
                "has an etcd presenting a peer certificate of the old etcd peer CA".to_string()
            })
        }
        (Rotated::EtcdPeer, pki::RotationPhase::Settled) => status
            .etcd_loaded_peer_ca_fingerprints
            .iter()
            .any(|fp| *fp != signing)
            .then(|| {
                "has an etcd that still holds a retired etcd peer CA in memory (it restarts \
                 its etcd to drop it)"
                    .to_string()
            }),
    }
}

/// What the rotation waits for, one line per node, in node ID order (pure): what
/// [`node_holds_up`] says of each counted node, and for the cluster CA while reissuing
/// every curator serving a certificate of the signing CA (`curator_certificates`: each
/// member's newest recorded curator certificate).
fn waiting_for<'a>(
    which: Rotated,
    trusted: &pki::TrustedCas,
    nodes: impl Iterator<Item = &'a Node>,
    curator_certificates: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Vec<String> {
    let mut nodes: Vec<&Node> = nodes.filter(|n| which.counts(n)).collect();
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    let mut waiting = Vec::new();
    for n in nodes {
        waiting.extend(node_holds_up(which, trusted, n).map(|why| format!("node {} {why}", n.id)));
        let member = n
            .roles
            .as_ref()
            .is_some_and(|r| r.consensus_member.is_some());
        if which == Rotated::Cluster
            && trusted.phase() == pki::RotationPhase::Reissuing
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

/// The etcd voters this curator's own etcd member cannot reach now (from its metrics;
/// one line saying so when they cannot be read): an etcd peer CA rotation restarts the members' etcds
/// one at a time, which with one of these down would cost the quorum. Seen before the
/// heartbeats time out, and also when only etcd is down.
async fn unreachable_voters(shared: &Shared) -> Result<Vec<String>, Status> {
    let mut client = shared.curator.client();
    let own = super::member_status(
        &mut client,
        &shared.config.node_id,
        shared.config.etcd_quota_bytes,
    )
    .await?;
    let answer = super::with_peer_view(own, shared.config.etcd_run_dir.as_deref()).await;
    if !answer.peers_known {
        return Ok(vec![
            "this curator cannot read its etcd's view of the other members (its metrics)"
                .to_string(),
        ]);
    }
    let voters: std::collections::HashSet<u64> = answer
        .members
        .iter()
        .filter(|m| !m.is_learner)
        .map(|m| m.id)
        .collect();
    Ok(answer
        .peers
        .iter()
        .filter(|p| !p.reachable && voters.contains(&p.member_id))
        .map(|p| {
            format!(
                "etcd member {:x} (node {}) does not answer this curator's etcd",
                p.member_id, p.node_id
            )
        })
        .collect())
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
pub(super) async fn status(shared: &Shared, which: Rotated) -> Result<api::CaRotation, Status> {
    let store = which.store(shared);
    let trusted = store
        .trusted()
        .await
        .map_err(|e| unavailable(&format!("reading the {}s", which.what()), e))?;
    let record = record(shared, which).await?;
    // A settled cluster CA waits for nothing; a settled etcd peer CA may still be held
    // in the memory of etcds that did not restart since.
    let waiting = if which == Rotated::Cluster && trusted.phase() == pki::RotationPhase::Settled {
        Vec::new()
    } else {
        let nodes = shared
            .nodes
            .current()
            .ok_or_else(|| Status::unavailable("the node records are not loaded yet"))?;
        let curators = if which == Rotated::Cluster {
            newest_curator_certificates(&store).await?
        } else {
            Default::default()
        };
        waiting_for(which, &trusted, nodes.nodes.values(), &|id| {
            curators.get(id).cloned()
        })
    };
    Ok(api::CaRotation {
        phase: trusted.phase().name().to_string(),
        trusted_ca_fingerprints: trusted.cas().iter().map(|c| rpc::fingerprint(c)).collect(),
        waiting_for: waiting,
        forced: record.is_some_and(|r| r.forced),
        started: false,
        etcd_peer: which == Rotated::EtcdPeer,
    })
}

/// RotateCa: starts a rotation (or marks the running one forced).
pub(super) async fn rotate(
    shared: &Shared,
    caller: &str,
    request: &api::RotateCaRequest,
) -> Result<api::CaRotation, Status> {
    let which = Rotated::from_request(request.etcd_peer);
    let force = request.force;
    if force && which == Rotated::EtcdPeer {
        // Passing over a member would not lock it out alone: every other member's etcd
        // restarts, which a member down turns into a lost quorum.
        return Err(Status::invalid_argument(
            "an etcd peer CA rotation cannot be forced: it restarts every member's etcd, one \
             at a time, which with a member down would cost the quorum; bring the member \
             back, or take its ConsensusMember role first (polisctl node remove-role)",
        ));
    }
    if request.signing_ca_fingerprint.is_empty() {
        return Err(Status::invalid_argument(format!(
            "name the signing {} to rotate away from (its SHA-256 fingerprint)",
            which.what()
        )));
    }
    shared.leadership().await?;
    let store = which.store(shared);
    let trusted = store
        .trusted()
        .await
        .map_err(|e| unavailable(&format!("reading the {}s", which.what()), e))?;
    let mut started = false;
    let signing = rpc::fingerprint(&trusted.current.cert);
    // A settled store with a record left: the etcd peer CA's last rotation still waits
    // for etcds to drop the old CA; a new one would stack a third CA on their memory.
    let running = trusted.phase() != pki::RotationPhase::Settled
        || (which == Rotated::EtcdPeer && record(shared, which).await?.is_some());
    if !running && request.signing_ca_fingerprint != signing {
        return Err(Status::failed_precondition(format!(
            "the signing {} is SHA256:{signing}, not the one named: a rotation away from \
             that one has happened already",
            which.what()
        )));
    }
    if !running {
        let nodes = shared
            .nodes
            .current()
            .ok_or_else(|| Status::unavailable("the node records are not loaded yet"))?;
        let mut unable = unable_to_follow(which, nodes.nodes.values());
        if which == Rotated::EtcdPeer {
            unable.extend(unreachable_voters(shared).await?);
        }
        if !unable.is_empty() && !force {
            let remedy = match which {
                Rotated::Cluster => {
                    "a rotation would wait for them, or lock them out if forced once the old \
                     CA is retired; bring them back (or upgrade them), or rotate with --force \
                     and re-register them afterwards"
                }
                Rotated::EtcdPeer => {
                    "an etcd peer CA rotation restarts every member's etcd, one at a time, \
                     which with a member down would cost the quorum; bring them back (or \
                     upgrade them), or take their ConsensusMember role first"
                }
            };
            return Err(Status::failed_precondition(format!(
                "{}: {remedy}",
                unable.join("; ")
            )));
        }
        let now = pki::unix_now();
        let successor = pki::Ca::generate(&which.successor_name(now), pki::CA_LIFETIME)
            .map_err(|e| Status::internal(format!("generating the new {}: {e}", which.what())))?;
        // The record first: a rotation is never running without one saying who started
        // it (a failed introduction leaves a record the runnable removes).
        write_record(
            shared,
            which,
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
            .map_err(|e| unavailable(&format!("introducing the new {}", which.what()), e))?;
        if started {
            tracing::warn!(
                caller,
                force,
                new_ca = rpc::fingerprint(&successor.cert_der),
                "{} rotation started: the new CA is trusted, not signing yet",
                which.what()
            );
        }
    } else if force {
        let mut running = record(shared, which).await?.unwrap_or_default();
        if !running.forced {
            running.forced = true;
            write_record(shared, which, &running).await?;
            tracing::warn!(caller, "the running {} rotation is forced on", which.what());
        }
    }
    Ok(api::CaRotation {
        started,
        ..status(shared, which).await?
    })
}

/// One look, as leader: moves the rotation on when what it waits for is done (or it
/// is forced); removes the record once settled (for the etcd peer CA: once no etcd
/// holds the old one in memory). Returns whether a rotation still runs.
async fn step(shared: &Shared, which: Rotated) -> Result<bool, Status> {
    let store = which.store(shared);
    let now = status(shared, which).await?;
    let forced = now.forced;
    let ready = now.waiting_for.is_empty() || forced;
    match now.phase.as_str() {
        "introduced" if ready => {
            let promoted = store
                .promote_successor()
                .await
                .map_err(|e| unavailable(&format!("promoting the new {}", which.what()), e))?;
            if promoted {
                tracing::warn!(
                    forced,
                    "{} rotation: the new CA signs; certificates of the old one are being \
                     replaced",
                    which.what()
                );
            }
            Ok(true)
        }
        "reissuing" if ready => {
            if which == Rotated::EtcdPeer {
                // etcd keeps the CAs it loaded until it restarts: what the old CA
                // issued is refused by serial (the CRL etcd re-reads per connection).
                let trusted = store
                    .trusted()
                    .await
                    .map_err(|e| unavailable("reading the etcd peer CAs", e))?;
                if let Some(previous) = &trusted.previous {
                    let revoked = store
                        .revoke_issued_by("peer-", &previous.cert)
                        .await
                        .map_err(|e| unavailable("revoking the old etcd peer certificates", e))?;
                    tracing::info!(revoked, "revoked the old etcd peer CA's peer certificates");
                }
            }
            let retired = store
                .retire_previous()
                .await
                .map_err(|e| unavailable(&format!("retiring the old {}", which.what()), e))?;
            if retired {
                tracing::warn!(
                    forced,
                    "{} rotation: the old CA is retired, its certificates refused",
                    which.what()
                );
            }
            Ok(true)
        }
        "settled" => {
            if record(shared, which).await?.is_none() {
                return Ok(false);
            }
            if !ready {
                return Ok(true);
            }
            shared
                .curator
                .kv()
                .delete(shared.curator.key(which.record_key()), None)
                .await
                .map_err(|e| unavailable("removing the CA rotation record", e))?;
            tracing::warn!(forced, "{} rotation done", which.what());
            Ok(false)
        }
        _ => Ok(true),
    }
}

/// The `ca-rotation` runnable: while this curator leads, moves running rotations on.
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let kinds = [Rotated::Cluster, Rotated::EtcdPeer];
    let mut last_problem: [Option<String>; 2] = Default::default();
    // Whether the last step found a rotation running (true at first: look at once).
    let mut busy = [true; 2];
    let mut next_settled_look = [tokio::time::Instant::now(); 2];
    loop {
        tokio::select! {
            _ = tokio::time::sleep(STEP_PERIOD) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
        if !matches!(
            shared.role.current(),
            Some(crate::election::Role::Leader(_))
        ) {
            busy = [true; 2];
            continue;
        }
        for (i, which) in kinds.into_iter().enumerate() {
            let running = which
                .watched(&shared)
                .is_some_and(|t| t.phase() != pki::RotationPhase::Settled);
            if !running && !busy[i] && last_problem[i].is_none() {
                if tokio::time::Instant::now() < next_settled_look[i] {
                    continue;
                }
                next_settled_look[i] = tokio::time::Instant::now() + SETTLED_PERIOD;
            }
            match step(&shared, which).await {
                Ok(still) => {
                    busy[i] = still;
                    last_problem[i] = None;
                }
                Err(e) => {
                    let problem = e.message().to_string();
                    if last_problem[i].as_ref() != Some(&problem) {
                        tracing::warn!("{} rotation: {problem}; trying again", which.what());
                    }
                    last_problem[i] = Some(problem);
                }
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
                ..Default::default()
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
            waiting_for(Rotated::Cluster, &t, nodes.iter(), &none),
            vec!["node b does not trust the new CA yet".to_string()]
        );
        let all = [node("a", true, &[&old, &new], &old)];
        assert!(waiting_for(Rotated::Cluster, &t, all.iter(), &none).is_empty());
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
            waiting_for(Rotated::Cluster, &t, nodes.iter(), &serving_old),
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
        assert!(waiting_for(Rotated::Cluster, &t, done.iter(), &serving_new).is_empty());
    }

    /// A member whose etcd loaded `loaded` and presents a peer certificate of `uses`.
    fn member(id: &str, loaded: &[&pki::Ca], uses: &pki::Ca) -> Node {
        let mut n = node(id, true, &[], uses);
        let status = n.status.as_mut().unwrap();
        status.etcd_loaded_peer_ca_fingerprints = loaded
            .iter()
            .map(|c| rpc::fingerprint(&c.cert_der))
            .collect();
        status.etcd_peer_certificate_ca_fingerprint = rpc::fingerprint(&uses.cert_der);
        n
    }

    #[test]
    fn an_etcd_peer_rotation_waits_for_members_etcds_through_every_phase() {
        let (old, new) = (ca("old"), ca("new"));
        let none = |_: &str| None;
        let worker = node("w", false, &[], &old);
        let peer = Rotated::EtcdPeer;
        // Introduced: each member's etcd must have loaded the new CA (a worker runs none).
        let t = trusted(&old, None, Some(&new));
        let nodes = [
            member("a", &[&old, &new], &old),
            member("b", &[&old], &old),
            worker.clone(),
        ];
        let waiting = waiting_for(peer, &t, nodes.iter(), &none);
        assert_eq!(waiting.len(), 1, "{waiting:?}");
        assert!(
            waiting[0].starts_with("node b has an etcd that did not load"),
            "{waiting:?}"
        );
        // Reissuing: each member's etcd presents a certificate of the new CA.
        let t = trusted(&new, Some(&old), None);
        let nodes = [
            member("a", &[&old, &new], &new),
            member("b", &[&old, &new], &old),
            worker.clone(),
        ];
        let waiting = waiting_for(peer, &t, nodes.iter(), &none);
        assert_eq!(waiting.len(), 1, "{waiting:?}");
        assert!(
            waiting[0].starts_with("node b has an etcd presenting"),
            "{waiting:?}"
        );
        // Settled: each member's etcd restarted without the old CA; a member that never
        // reported what its etcd loaded is not held to it.
        let t = trusted(&new, None, None);
        let silent = member("c", &[], &new);
        let nodes = [
            member("a", &[&new], &new),
            member("b", &[&old, &new], &new),
            silent,
            worker,
        ];
        let waiting = waiting_for(peer, &t, nodes.iter(), &none);
        assert_eq!(waiting.len(), 1, "{waiting:?}");
        assert!(
            waiting[0].starts_with("node b has an etcd that still holds"),
            "{waiting:?}"
        );
        // Only members that report what their etcd loaded can follow.
        let unable = unable_to_follow(peer, nodes.iter());
        assert_eq!(unable.len(), 1, "{unable:?}");
        assert!(unable[0].starts_with("node c (version"), "{unable:?}");
        // The cluster CA's rotation does not look at etcd.
        assert!(waiting_for(Rotated::Cluster, &t, nodes.iter(), &none).is_empty());
        // A member being decommissioned still runs a voting etcd until its role goes.
        let leaving = Node {
            state: NodeState::Decommissioning as i32,
            ..member("d", &[&old, &new], &new)
        };
        assert!(peer.counts(&leaving));
        assert!(!Rotated::Cluster.counts(&leaving));
        let waiting = waiting_for(peer, &t, std::iter::once(&leaving), &none);
        assert_eq!(waiting.len(), 1, "{waiting:?}");
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
        let unable = unable_to_follow(Rotated::Cluster, nodes.iter());
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
        assert_ne!(
            Rotated::Cluster.successor_name(1),
            Rotated::Cluster.successor_name(2)
        );
        assert_ne!(
            Rotated::Cluster.successor_name(1),
            Rotated::EtcdPeer.successor_name(1)
        );
    }
}
