//! What every part of one curator shares: its settings ([`CuratorConfig`]), the node
//! snapshot, the role, and the in-memory state the runnables keep ([`Shared`]), with the
//! questions any part may ask of them (who leads, is the snapshot fresh, whom may this
//! curator trust).
//!
//! The service layer's base: may not import any handler, runnable or operation module
//! (`issuance`, `membership`, `decommission`, …); they all import this.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use consensus::Namespaced;
use proto::state::Node;
use tonic::Status;

use super::certificates::CertificateView;
use super::health_book::HealthBook;
use crate::election::{self, Leadership, Role};
use crate::health as rules;

/// Settings of one curator.
#[derive(Clone)]
pub struct CuratorConfig {
    pub node_id: String,
    pub listen: SocketAddr,
    /// This node's certificate and key: presented when forwarding or asking peers (the
    /// listener serves a curator certificate for the same key, `curator_certificate`).
    pub credentials: rpc::CredentialSlot,
    pub ca_certificate: Vec<u8>,
    pub lease_ttl: Duration,
    /// Heartbeat period and timeout (the nodes' period must be the one given here).
    pub heartbeat: rules::Timing,
    /// The backend quota this node's etcd member runs with (bytes).
    pub etcd_quota_bytes: u64,
    /// This node's etcd run directory (its metrics socket: the member's view of its
    /// peers in GetConsensusStatus); `None`: not shown (curators in tests).
    pub etcd_run_dir: Option<PathBuf>,
    /// How often the leader looks after etcd, and its defragmentation floor.
    pub upkeep: crate::upkeep::Settings,
    /// Scheduled snapshots: where they go, the interval bounds accepted.
    pub snapshots: SnapshotSettings,
    /// Per-source limits on the calls anyone may make (RegisterNode, Escrow).
    pub entry_rate: rpc::server::RateSettings,
    /// Set true once the listener accepts connections (with its curator certificate),
    /// false when it stops: the node calls itself Home only then.
    pub serving: event::Value<bool>,
}

/// What `cluster status` shows of this member's scheduled snapshots.
#[derive(Debug, Clone, Default)]
pub struct ScheduledOutcome {
    /// When the newest snapshot was taken (ms since the Unix epoch; 0: none).
    pub last_success_unix_ms: u64,
    /// Why the last attempt failed; empty when it did not.
    pub last_error: String,
}

/// Where scheduled snapshots go, and the interval bounds this node accepts.
#[derive(Debug, Clone)]
pub struct SnapshotSettings {
    /// `ROOT/data/snapshots`; `None`: no scheduled snapshots (curators in unit tests).
    pub dir: Option<PathBuf>,
    pub bounds: proto::snapshots::Bounds,
}

impl Default for SnapshotSettings {
    fn default() -> Self {
        SnapshotSettings {
            dir: None,
            bounds: proto::snapshots::Bounds::NORMAL,
        }
    }
}

/// Every node record, as of one etcd revision.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    /// Shares unchanged chunks with the snapshot before it (`ChunkMap`).
    pub nodes: crate::chunkmap::ChunkMap<Node>,
    /// Every change of a node record up to this revision is in `nodes`.
    pub revision: i64,
    /// Each record's last-modified etcd revision (`mod_revision`), by node ID: what a
    /// WatchNode update about that node reflects (nodes never go back to an older one).
    pub record_revisions: crate::records::RecordRevisions,
    /// The election key under which the watch's first read was made: a snapshot based
    /// on a read after this curator won holds every earlier leader's writes.
    pub based_as_leader: Option<Vec<u8>>,
    /// `records::curator_endpoints` of `nodes`, computed once per snapshot: every WatchNode
    /// stream sends it, and scanning every record per stream per change would cost
    /// streams × nodes on each write (a status or health verdict is one).
    pub curator_endpoints: Vec<String>,
}

pub type NodeSnapshot = Arc<Snapshot>;

/// The trusted CAs and their CRLs as WatchNode updates carry them: built once per
/// change (the `crl` runnable) and shared (a reference count, not a copy) by every
/// stream's every update.
pub(super) struct WireTrust {
    pub(super) cas: Vec<prost::bytes::Bytes>,
    pub(super) crls: Vec<prost::bytes::Bytes>,
}

/// The etcd peer CAs trusted, and their certificates as WatchNode updates carry them
/// (built once per change, shared by every update).
pub(super) struct PeerTrust {
    pub(super) trusted: pki::TrustedCas,
    pub(super) wire: Vec<prost::bytes::Bytes>,
}

/// Node `id`'s record in `snapshot`, with its mod revision (`writes::Known`).
pub(super) fn known_in(snapshot: &Snapshot, id: &str) -> Option<crate::writes::Known> {
    Some(crate::writes::Known {
        node: snapshot.nodes.get(id)?.clone(),
        revision: *snapshot.record_revisions.by_node.get(id)?,
    })
}

/// A leader tenure: its election key and that key's create revision.
pub type Tenure = (Vec<u8>, i64);

/// The handovers read (DER, oldest first), with the CAs trusted when they were read.
pub(super) type HandoversRead = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Shared by all services of one curator.
pub struct Shared {
    pub(super) config: CuratorConfig,
    pub(super) curator: Namespaced,
    pub(super) role: event::Value<Role>,
    /// Heartbeats and health verdicts of this leader tenure (see [`HealthBook`]).
    pub(super) health: Mutex<HealthBook>,
    /// Node records, fed by one etcd watch (the `nodes` runnable).
    pub(super) nodes: event::Value<NodeSnapshot>,
    /// Whether that watch runs: when this curator's etcd member stops serving (e.g. it
    /// was removed from consensus) the snapshot is stale, and streams fed by it end.
    pub(super) nodes_live: event::Value<bool>,
    /// Whether this curator's own etcd member has a leader (the `quorum` runnable;
    /// unset until first looked at). Without one, calls that need the cluster are
    /// refused at once (`quorum::QuorumLayer`).
    pub(super) etcd_leader: event::Value<bool>,
    /// Held while etcd membership changes: etcd 3.4 has at most one learner, so a join
    /// holds it until its learner is promoted, and joins and removals queue behind it.
    pub(super) membership: Arc<tokio::sync::Mutex<()>>,
    /// The cluster CRL (DER), fed by one etcd watch (the `crl` runnable); shared, not
    /// copied, by every WatchNode update that carries it.
    pub(super) crl: event::Value<prost::bytes::Bytes>,
    /// The cluster CAs trusted and their CRLs (the `crl` runnable), for every check
    /// of a caller's certificate and every WatchNode update.
    pub(super) trusted: event::Value<Arc<pki::TrustedCas>>,
    /// The same as WatchNode updates carry them (set with `trusted`, just before it).
    pub(super) trusted_wire: event::Value<Arc<WireTrust>>,
    /// The etcd peer CAs trusted (the `peer-trust` runnable), for WatchNode updates
    /// (consensus members keep their etcd's trust file equal to them) and the peer CA
    /// rotation.
    pub(super) peer_trusted: event::Value<Arc<PeerTrust>>,
    /// The same CAs and CRLs for this curator's own calls to other curators
    /// (forwarding, quorum questions): a removed node cannot pose as one. Empty until
    /// the first read of the store: etcd, not a file, says which CAs are trusted.
    pub(super) trust: rpc::TrustSlot,
    /// What holds up each DECOMMISSIONING node, by node ID (the `decommission` runnable).
    pub(super) decommission_problems: Mutex<HashMap<String, String>>,
    /// Current certificates per node, for expiry warnings (the `certificates` runnable).
    pub(super) certificates: event::Value<Arc<CertificateView>>,
    /// Wakes the `certificates` runnable early: a certificate was just issued here.
    pub(super) certificates_changed: tokio::sync::Notify,
    /// Held while a registration spends a limited ticket (those spends conflict in
    /// etcd; one at a time on the leader, none retries). Uniqueness of addresses and
    /// join keys needs no lock: it is the `writes::claims` index.
    pub(super) limited_spends: tokio::sync::Mutex<()>,
    /// The leader tenure (election key, revision) whose `writes::claims::backfill` is
    /// done: registrations wait for it, once per tenure.
    pub(super) claims_indexed: tokio::sync::Mutex<Option<Tenure>>,
    /// How this member's last scheduled snapshot went (the `snapshots` runnable).
    pub(super) scheduled: Mutex<ScheduledOutcome>,
    /// The cluster CA (with its key) as loaded in one leader tenure (election key,
    /// revision), for `issuance` (see `issuance::tenure_cluster_ca`).
    /// The cluster configuration read once per tenure, for issuing (see
    /// `issuance::tenure_configuration`).
    pub(super) tenure_configuration: Mutex<Option<(Tenure, proto::config::ClusterConfiguration)>>,
    pub(super) tenure_ca: Mutex<Option<(Tenure, pki::Ca)>>,
    /// The cluster CA's handovers as last read, with the CAs trusted then: read again
    /// only once a rotation changed those (`local`, GetCACertificate), so callers
    /// without credentials cannot make it read etcd per call.
    pub(super) handovers: tokio::sync::Mutex<Option<HandoversRead>>,
    /// Followed audit logs open on this curator, by caller (see `follows`).
    pub(super) follows: Arc<super::follows::Follows>,
    /// WatchNode streams open on this curator, by node (see `watchers`).
    pub(super) watchers: Arc<super::watchers::Watchers>,
}

impl Shared {
    /// Node `id`'s record as etcd has it now, or NotFound naming the node.
    pub(super) async fn existing_node(&self, id: &str) -> Result<Node, Status> {
        crate::records::load_node(&self.curator, id)
            .await
            .map_err(super::status::status_from)?
            .ok_or_else(|| Status::not_found(format!("node {id} does not exist")))
    }

    /// The current leadership, or Unavailable naming the leader.
    pub(super) async fn leadership(&self) -> Result<Leadership, Status> {
        if let Some(Role::Leader(l)) = self.role.current() {
            return Ok(l);
        }
        let leader = election::current_leader(&self.curator).await.ok().flatten();
        Err(Status::unavailable(match leader {
            // Won, but acts only once its predecessor's reads have ended (or it is
            // stepping down while etcd still holds its key).
            Some(l) if l.node_id == self.config.node_id => format!(
                "the election names this curator, which does not act as leader now (just \
                 elected, it acts within {:?}; or stepping down); retry",
                election::TAKEOVER
            ),
            Some(l) => format!(
                "this curator is not the leader; the leader is {} at {}",
                l.node_id, l.endpoint
            ),
            None => "no curator leader is elected yet; retry shortly".to_string(),
        }))
    }

    /// The node snapshot, once it holds every write made before this tenure and by it:
    /// reads served from it are as fresh as reads from etcd. `None` when it does not get
    /// there quickly (the caller reads etcd instead).
    pub(super) async fn fresh_nodes(&self, leadership: &Leadership) -> Option<NodeSnapshot> {
        let written = crate::writes::written_by(leadership);
        let fresh = |s: &NodeSnapshot| {
            s.based_as_leader.as_ref() == Some(&leadership.key) && s.revision >= written
        };
        if let Some(s) = self.nodes.current().filter(|s| fresh(s)) {
            return Some(s);
        }
        let mut snapshots = self.nodes.watch();
        tokio::time::timeout(FRESHNESS_WAIT, snapshots.get_matching(fresh))
            .await
            .ok()?
            .ok()
    }

    /// Node `id`'s record as the watched snapshot last showed it, with its mod revision,
    /// for a write to start from (`writes::Known`: a stale one only costs a failed
    /// comparison and a read).
    pub(super) fn known_record(&self, id: &str) -> Option<crate::writes::Known> {
        let snapshot = self.nodes.current()?;
        known_in(&snapshot, id)
    }

    /// How this curator checks the curators it calls: the cluster CA and the CRL.
    pub(super) fn server_trust(&self) -> rpc::ServerTrust {
        rpc::ServerTrust::ClusterCa {
            trust: self.trust.clone(),
        }
    }

    /// Whether `id` is a curator's node: UP with the ConsensusMember role. Only such
    /// nodes may forward a caller's identity.
    /// The cluster CAs trusted now (DER), the signing one first: as the `crl` runnable
    /// follows them, or the CA this node joined under before it has read them.
    pub(super) fn trusted_cas(&self) -> Vec<Vec<u8>> {
        self.trusted
            .current()
            .map(|t| t.cas())
            .unwrap_or_else(|| vec![self.config.ca_certificate.clone()])
    }

    pub(super) fn is_curator_node(&self, id: &str) -> bool {
        self.nodes.current().is_some_and(|nodes| {
            nodes.nodes.get(id).is_some_and(|n| {
                n.state == proto::state::NodeState::Up as i32
                    && n.roles
                        .as_ref()
                        .is_some_and(|r| r.consensus_member.is_some())
            })
        })
    }
}

/// How long a read waits for the node snapshot to catch up before reading etcd.
const FRESHNESS_WAIT: Duration = Duration::from_millis(300);

#[derive(Clone)]
pub struct Services(pub(super) Arc<Shared>);
