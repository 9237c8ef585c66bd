//! Leader election through etcd's election API, with a lease.
//!
//! ```text
//!   lease grant (TTL) ──▶ campaign(namespaced:curator/leader) ──won──▶ Role::Leader{key, rev}
//!        ▲  keepalive ≤ 300 ms                                           │ lease lost / cancelled
//!        └──────────────────────────────────────────────────────────────┘──▶ Role::Follower
//! ```
//! Every leader write is guarded by `create_revision(key) == rev` ([`guard`]): once the
//! lease expires, etcd deletes the key and a deposed leader's writes fail even before it
//! notices. Reads a leader answers from memory are covered by a read lease instead
//! (`service::confirm`): a winner acts ([`Role::Leader`]) only [`TAKEOVER`] after it won,
//! once any read lease ([`READ_LEASE`]) its predecessor may still hold has run out.
//!
//! The TTL that counts is the one etcd *granted* (it raises requests below its minimum,
//! 1.5 election timeouts rounded up to a second): keepalives and loss detection use it.
//! Every etcd call here is bounded ([`ETCD_CALL_TIMEOUT`]) except the campaign, which
//! waits for the current leader by design and is cut by losing the lease instead.

use std::time::{Duration, Instant};

use consensus::Namespaced;
use etcd_client::{Client, Compare, CompareOp, GetOptions, ResignOptions, Txn, TxnOp};
use prost::Message;
use proto::state::LeaderElectionValue;
use tokio_util::sync::CancellationToken;

use crate::error::CuratorError;

/// How long a stopping leader tries to resign before giving up (the lease then expires).
const HANDOVER_TIMEOUT: Duration = Duration::from_millis(500);

/// Bound on each of the election's own etcd calls (lease grant, cleanup, keepalive
/// start): a stalled etcd makes the election fail and restart rather than hang.
pub const ETCD_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Election name inside the curator namespace.
pub const ELECTION: &str = "leader";

/// How long a leader's reads may leave on one confirmation that it leads
/// (`service::confirm`), counted on its monotonic clock from the moment the confirming
/// etcd read (linearizable) was sent. Short, so that [`TAKEOVER`] stays short; a
/// leader answering reads refreshes it well before it ends.
pub const READ_LEASE: Duration = Duration::from_millis(300);

/// How far the rate of one host's monotonic clock may differ from another's, in per
/// mille. NTP slews a clock by at most 0.5 ‰; 100 ‰ leaves room for badly drifting clocks
/// at the price of a few tens of milliseconds of [`TAKEOVER`].
const CLOCK_RATE_ERROR_PER_MILLE: u128 = 100;

/// How long a curator that won the election holds the key before it acts as leader.
///
/// The arithmetic (ε = [`CLOCK_RATE_ERROR_PER_MILLE`] / 1000; a clock counts between
/// 1 − ε and 1 + ε of its seconds per real second):
/// - leader P sends a linearizable read of its election key at S (its clock) and etcd
///   finds the key at some real moment after S; P answers reads until S + READ_LEASE on
///   its clock, i.e. until at most READ_LEASE / (1 − ε) real time after S;
/// - the key is deleted after that moment (lease revoked or expired, or P resigned), and
///   a successor N wins only once it is gone (a deleted key never returns: a new campaign
///   holds a new lease, so a new key), so after S; N acts TAKEOVER on its clock after
///   its win, i.e. at least TAKEOVER / (1 + ε) real time after S;
/// - so N acts only after P answered its last read once TAKEOVER ≥ READ_LEASE · (1 + ε)
///   / (1 − ε): 300 ms · 1.1 / 0.9 = 366.7 ms, rounded up to 367 ms.
///
/// It assumes that monotonic clocks count while their host runs, also while a process
/// is stopped (CLOCK_MONOTONIC does); a host whose clock stands still while it is frozen
/// (a VM whose hypervisor holds the guest clock) breaks the bound, as it would any lease.
/// This needs nothing of the election's lease timing: a deposed etcd leader that renews
/// the election lease unaware (etcd before 3.4.25, issue 15247), or followers revoking it
/// on the evidence of an etcd leader change 500 ms later ([`revoke_dead_leader`]), cannot
/// move the successor's first act before P's last read; only etcd's linearizable read
/// (confirmed by a majority) and the clock rates count.
pub const TAKEOVER: Duration = takeover_after(READ_LEASE);

/// [`TAKEOVER`] for a read lease of `read_lease`: see there.
const fn takeover_after(read_lease: Duration) -> Duration {
    let micros = read_lease.as_micros() * (1000 + CLOCK_RATE_ERROR_PER_MILLE);
    let denominator = 1000 - CLOCK_RATE_ERROR_PER_MILLE;
    // Rounded up to a whole millisecond.
    let micros = micros.div_ceil(denominator).div_ceil(1000) * 1000;
    Duration::from_micros(micros as u64)
}

/// Proof of leadership: the election key this curator holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub key: Vec<u8>,
    pub revision: i64,
    pub lease: i64,
    /// The lease TTL etcd granted.
    pub ttl: Duration,
    pub since: Instant,
}

/// This curator's role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Follower,
    Leader(Leadership),
}

/// The comparison every leader write must carry.
pub fn guard(leadership: &Leadership) -> Compare {
    Compare::create_revision(
        leadership.key.clone(),
        CompareOp::Equal,
        leadership.revision,
    )
}

/// For a transaction guarded by [`guard`] whose else branch reads the election key
/// (`TxnOp::get(leadership.key)`): whether that key is still this leadership's, i.e.
/// the transaction failed on its other comparisons, not on leadership.
pub fn still_leads(failed: &etcd_client::TxnResponse, leadership: &Leadership) -> bool {
    failed.op_responses().first().is_some_and(|op| match op {
        etcd_client::TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == leadership.revision),
        _ => false,
    })
}

/// Settings of one campaigner.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    pub node_id: String,
    pub endpoint: String,
    pub ttl: Duration,
}

fn ttl_seconds(ttl: Duration) -> i64 {
    (ttl.as_secs_f64().ceil() as i64).max(1)
}

/// The TTL of a lease grant response; etcd reports a refused grant as a TTL ≤ 0.
fn granted_ttl(seconds: i64) -> Result<Duration, CuratorError> {
    u64::try_from(seconds)
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .ok_or(CuratorError::Protocol("lease grant without a positive TTL"))
}

/// Removes election keys a previous lifetime of this node left behind (e.g. after kill
/// -9), so that a restarted curator need not wait for its own old lease to expire.
async fn cleanup_previous_lifetime(
    client: &mut Client,
    prefix: &str,
    node_id: &str,
) -> Result<(), CuratorError> {
    let response = consensus::bounded(
        "the election cleanup read",
        ETCD_CALL_TIMEOUT,
        client.get(prefix, Some(GetOptions::new().with_prefix())),
    )
    .await?;
    for kv in response.kvs() {
        let ours = LeaderElectionValue::decode(kv.value()).is_ok_and(|v| v.node_id == node_id);
        if !ours {
            continue;
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                kv.key().to_vec(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::delete(kv.key().to_vec(), None)]);
        consensus::bounded(
            "the election cleanup delete",
            ETCD_CALL_TIMEOUT,
            client.txn(txn),
        )
        .await?;
        if kv.lease() != 0 {
            let revoke = client.lease_revoke(kv.lease());
            let _ = consensus::bounded("a lease revoke", ETCD_CALL_TIMEOUT, revoke).await;
        }
        tracing::info!("removed election key of a previous lifetime of this node");
    }
    Ok(())
}

async fn keep_lease_alive(
    mut keeper: etcd_client::LeaseKeeper,
    mut stream: etcd_client::LeaseKeepAliveStream,
    ttl: Duration,
) -> CuratorError {
    let period = keepalive_period(ttl);
    let mut last_ack = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(period).await;
        // Without an acknowledgement within the TTL the lease may be gone: stop acting
        // on it even if etcd never says so (a stalled etcd answers nothing).
        let round = async {
            keeper.keep_alive().await?;
            stream.message().await
        };
        match tokio::time::timeout_at(last_ack + ttl, round).await {
            Ok(Ok(Some(r))) if r.ttl() > 0 => last_ack = tokio::time::Instant::now(),
            Ok(Ok(_)) => return CuratorError::LeaseLost,
            Ok(Err(e)) => return e.into(),
            Err(_) => return CuratorError::LeaseLost,
        }
    }
}

/// Campaigns until elected, then holds leadership until the lease is lost (an error, so
/// the supervisor campaigns again) or `cancel` fires (resigns, returns Ok).
/// `campaigning` is called once the lease is held and the campaign runs.
pub async fn run(
    curator: &Namespaced,
    config: &ElectionConfig,
    role: &event::Value<Role>,
    cancel: &CancellationToken,
    campaigning: impl FnOnce(),
) -> Result<(), CuratorError> {
    role.set(Role::Follower);
    metrics::global().set_curator_leader(false);
    let mut client = curator.client();
    let name = curator.key(ELECTION);
    cleanup_previous_lifetime(&mut client, &format!("{name}/"), &config.node_id).await?;
    let granted = consensus::bounded(
        "the election lease grant",
        ETCD_CALL_TIMEOUT,
        client.lease_grant(ttl_seconds(config.ttl), None),
    )
    .await?;
    let lease = granted.id();
    let ttl = granted_ttl(granted.ttl())?;
    if ttl != config.ttl {
        tracing::info!(requested = ?config.ttl, granted = ?ttl, "etcd granted another lease TTL; using it");
    }
    let (keeper, stream) = consensus::bounded(
        "the lease keepalive start",
        ETCD_CALL_TIMEOUT,
        client.lease_keep_alive(lease),
    )
    .await?;
    let keepalive = keep_lease_alive(keeper, stream, ttl);
    tokio::pin!(keepalive);
    let value = LeaderElectionValue {
        node_id: config.node_id.clone(),
        endpoint: config.endpoint.clone(),
    }
    .encode_to_vec();

    let mut campaign_client = client.clone();
    campaigning();
    let dead_leader = revoke_dead_leader(curator.clone(), config.endpoint.clone());
    tokio::pin!(dead_leader);
    let won = tokio::select! {
        won = campaign_client.campaign(name.clone(), value, lease) => won?,
        e = &mut keepalive => return Err(e),
        e = &mut dead_leader => return Err(e),
        _ = cancel.cancelled() => {
            let _ = tokio::time::timeout(HANDOVER_TIMEOUT, client.lease_revoke(lease)).await;
            return Ok(());
        }
    };
    let key = won
        .leader()
        .ok_or(CuratorError::Protocol(
            "campaign response without leader key",
        ))?
        .clone();
    // Hand over at once rather than after the TTL; but etcd may be stopping too (the
    // whole node shuts down), so do not wait long for it.
    let hand_over = |mut client: Client, key: etcd_client::LeaderKey| async move {
        let handover = async {
            let _ = client
                .resign(Some(ResignOptions::new().with_leader(key)))
                .await;
            let _ = client.lease_revoke(lease).await;
        };
        let _ = tokio::time::timeout(HANDOVER_TIMEOUT, handover).await;
    };
    tracing::info!(
        node_id = config.node_id,
        takeover = ?TAKEOVER,
        "elected; acting as the curator leader once the previous one's reads have ended"
    );
    tokio::select! {
        () = tokio::time::sleep(TAKEOVER) => {}
        e = &mut keepalive => return Err(e),
        _ = cancel.cancelled() => {
            hand_over(client, key).await;
            return Ok(());
        }
    }
    let leadership = Leadership {
        key: key.key().to_vec(),
        revision: key.rev(),
        lease,
        ttl,
        since: Instant::now(),
    };
    // A layout this build does not know is never led (crate::layout).
    if let Err(e) = settle_layout(curator, &leadership).await {
        tracing::error!("{e}");
        hand_over(client, key).await;
        return Err(e);
    }
    tracing::info!(node_id = config.node_id, "this curator is now the leader");
    role.set(Role::Leader(leadership));
    metrics::global().set_curator_leader(true);

    let outcome = tokio::select! {
        e = &mut keepalive => Err(e),
        _ = cancel.cancelled() => {
            hand_over(client, key).await;
            Ok(())
        }
    };
    role.set(Role::Follower);
    metrics::global().set_curator_leader(false);
    if let Err(e) = &outcome {
        tracing::warn!("lost leadership: {e}");
    }
    outcome
}

/// How often a campaigning curator polls the leader's lease, and for how long the lease
/// must show no renewal in a row before the leader counts as dead. The span is more than
/// the leader's keepalive period ([`keepalive_period`]) plus a round trip, so a live
/// leader always renews within it.
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);
const SILENCE_TO_REVOKE: Duration = Duration::from_millis(500);

/// How often a leader renews its lease: often enough that followers can tell a silent
/// leader within half a second ([`SILENCE_TO_REVOKE`]), never more than TTL/3.
fn keepalive_period(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(50), Duration::from_millis(300))
}

/// Whether one reading of a lease (`remaining` whole seconds, as etcd truncates them, of
/// `granted`) shows it was not renewed lately. A renewal sets the remaining time to the
/// full TTL, which reads as `granted - 1` a moment later; so a live leader renewing every
/// [`keepalive_period`] reads `granted - 1`. `granted` or more: etcd extended the lease
/// when its own leader changed and nobody renewed it since; `granted - 2` or less: no
/// renewal for over a second.
fn unrenewed(remaining: i64, granted: i64) -> bool {
    remaining >= granted || remaining <= granted - 2
}

/// Evidence, from successive readings of the curator leader's lease, that its keepalives
/// stopped: the same lease read as [`unrenewed`] in every poll for [`SILENCE_TO_REVOKE`].
/// Any failed poll, renewal or other lease starts over.
#[derive(Debug, Default)]
struct Silence {
    lease: i64,
    since: Option<Instant>,
}

impl Silence {
    /// Records one reading; true once the evidence suffices.
    fn observe(&mut self, lease: i64, remaining: i64, granted: i64, now: Instant) -> bool {
        if lease != self.lease {
            *self = Silence { lease, since: None };
        }
        if !unrenewed(remaining, granted) {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= SILENCE_TO_REVOKE
    }

    fn clear(&mut self) {
        self.since = None;
    }
}

/// While this curator campaigns: when the leader's keepalives have stopped reaching etcd
/// (its host died or is cut off from the etcd majority — evidence from etcd itself, via
/// the lease's remaining time, see [`Silence`]), revoke its lease instead of waiting out
/// the TTL, which etcd extends when its own leader changes. A leader whose listener merely
/// restarts still renews, so it keeps leadership. Safe even if wrong: every leader write
/// is guarded by the election key, so a live leader whose lease was revoked only loses
/// leadership and campaigns again. Returns only on an etcd error; runs until the campaign
/// ends otherwise.
async fn revoke_dead_leader(curator: Namespaced, own_endpoint: String) -> CuratorError {
    let mut silence = Silence::default();
    loop {
        tokio::time::sleep(LIVENESS_PERIOD).await;
        let mut client = curator.client();
        let leader =
            match tokio::time::timeout(LIVENESS_PERIOD * 5, client.leader(curator.key(ELECTION)))
                .await
            {
                Ok(Ok(r)) => r.kv().map(|kv| (kv.lease(), kv.value().to_vec())),
                // No leader yet, or etcd is electing its own: nothing to judge now.
                _ => None,
            };
        let Some((lease, value)) = leader else {
            silence.clear();
            continue;
        };
        let Ok(value) = LeaderElectionValue::decode(value.as_slice()) else {
            continue;
        };
        if value.endpoint == own_endpoint || lease == 0 {
            silence.clear();
            continue;
        }
        let reading =
            tokio::time::timeout(LIVENESS_PERIOD * 5, client.lease_time_to_live(lease, None)).await;
        let Ok(Ok(reading)) = reading else {
            // Our member cannot ask the etcd leader: no evidence either way.
            silence.clear();
            continue;
        };
        if !silence.observe(lease, reading.ttl(), reading.granted_ttl(), Instant::now()) {
            continue;
        }
        tracing::warn!(
            leader = value.node_id,
            remaining_s = reading.ttl(),
            granted_s = reading.granted_ttl(),
            "the curator leader stopped renewing its lease: revoking it"
        );
        let revoke = consensus::bounded(
            "revoking a silent leader's lease",
            ETCD_CALL_TIMEOUT,
            client.lease_revoke(lease),
        );
        match revoke.await {
            Ok(_) => {}
            Err(consensus::ConsensusError::Etcd(etcd_client::Error::GRpcStatus(s)))
                if s.message().contains("not found") => {}
            Err(e) => return e.into(),
        }
        silence.clear();
    }
}

/// The current leader, as recorded in etcd (any curator can answer this).
pub async fn current_leader(
    curator: &Namespaced,
) -> Result<Option<LeaderElectionValue>, CuratorError> {
    let mut client = curator.client();
    match client.leader(curator.key(ELECTION)).await {
        Ok(r) => match r.kv() {
            Some(kv) => Ok(Some(LeaderElectionValue::decode(kv.value()).map_err(
                |source| CuratorError::Corrupt {
                    what: "leader election value".into(),
                    source,
                },
            )?)),
            None => Ok(None),
        },
        // etcd answers "election: no leader" as an error.
        Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("no leader") => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Reads the layout format and acts on it (`crate::layout::layout_decision`): records
/// it where none is (guarded by `leadership`), fails where this build may not lead.
async fn settle_layout(curator: &Namespaced, leadership: &Leadership) -> Result<(), CuratorError> {
    use crate::layout::{LAYOUT_FORMAT, LAYOUT_FORMAT_KEY, LayoutDecision, layout_decision};
    let key = curator.key(LAYOUT_FORMAT_KEY);
    let found = consensus::bounded(
        "reading the layout format",
        ETCD_CALL_TIMEOUT,
        curator.kv().get(key.clone(), None),
    )
    .await?;
    let value = found.kvs().first().map(|kv| kv.value().to_vec());
    match layout_decision(value.as_deref()) {
        LayoutDecision::Lead => Ok(()),
        LayoutDecision::TooNew(found) => Err(CuratorError::LayoutTooNew { found }),
        LayoutDecision::Unreadable => Err(CuratorError::LayoutUnreadable(
            String::from_utf8_lossy(value.as_deref().unwrap_or_default())
                .chars()
                .take(40)
                .collect(),
        )),
        LayoutDecision::Record => {
            // Only where it is still absent: a newer leader may have written one since.
            let record = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key, format!("{LAYOUT_FORMAT}\n"), None)]);
            leader_txn(curator, leadership, record).await?;
            tracing::info!(
                format = LAYOUT_FORMAT,
                "recorded the etcd key layout's format"
            );
            Ok(())
        }
    }
}

/// Runs `ops` in a transaction guarded by `leadership`; fails with
/// [`CuratorError::NotLeader`] if leadership was lost.
pub async fn leader_txn(
    curator: &Namespaced,
    leadership: &Leadership,
    inner: Txn,
) -> Result<etcd_client::TxnResponse, CuratorError> {
    let txn = Txn::new()
        .when([guard(leadership)])
        .and_then([TxnOp::txn(inner)]);
    let response = curator.kv().txn(txn).await?;
    if !response.succeeded() {
        return Err(CuratorError::NotLeader);
    }
    match response.op_responses().into_iter().next() {
        Some(etcd_client::TxnOpResponse::Txn(inner)) => Ok(inner),
        _ => Err(CuratorError::Protocol(
            "guarded transaction without inner response",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewing_leader_reads_granted_minus_one() {
        assert!(!unrenewed(2, 3));
        assert!(
            unrenewed(3, 3),
            "extended by an etcd leader change, not renewed"
        );
        assert!(unrenewed(4, 3));
        assert!(unrenewed(1, 3), "over a second without renewal");
        assert!(unrenewed(0, 3));
    }

    #[test]
    fn silence_needs_the_whole_span_on_one_lease() {
        let t0 = Instant::now();
        let mut s = Silence::default();
        assert!(!s.observe(7, 3, 3, t0));
        assert!(!s.observe(7, 3, 3, t0 + SILENCE_TO_REVOKE / 2));
        assert!(s.observe(7, 1, 3, t0 + SILENCE_TO_REVOKE));
        // A renewal in between starts over.
        let mut s = Silence::default();
        assert!(!s.observe(7, 3, 3, t0));
        assert!(!s.observe(7, 2, 3, t0 + SILENCE_TO_REVOKE / 2));
        assert!(!s.observe(7, 3, 3, t0 + SILENCE_TO_REVOKE));
        // So does another lease (a new leader).
        let mut s = Silence::default();
        assert!(!s.observe(7, 3, 3, t0));
        assert!(!s.observe(8, 3, 3, t0 + SILENCE_TO_REVOKE));
        // And a failed poll.
        let mut s = Silence::default();
        assert!(!s.observe(7, 3, 3, t0));
        s.clear();
        assert!(!s.observe(7, 3, 3, t0 + SILENCE_TO_REVOKE));
    }

    #[test]
    fn a_successor_acts_only_after_its_predecessors_last_read_on_any_clock() {
        assert_eq!(TAKEOVER, Duration::from_millis(367));
        let e = CLOCK_RATE_ERROR_PER_MILLE;
        for lease_ms in [1, 7, 100, 300, 333, 1000, 2500] {
            let lease = Duration::from_millis(lease_ms);
            let takeover = takeover_after(lease);
            // In real time, the predecessor's clock slow (its lease lasts longest,
            // lease / (1 − ε)), the successor's fast (its wait ends soonest,
            // takeover / (1 + ε)); both times multiplied by (1 + ε)(1 − ε), in per mille,
            // to stay in integers. Still in order...
            let last_read = lease.as_micros() * (1000 + e);
            let first_act = takeover.as_micros() * (1000 - e);
            assert!(first_act >= last_read, "{lease:?}: {takeover:?}");
            // ...and not much later: a millisecond of rounding.
            assert!(
                first_act - last_read < 1000 * (1000 - e),
                "{lease:?}: {takeover:?}"
            );
        }
        // Short enough not to change what a failover costs much.
        assert!(TAKEOVER < Duration::from_millis(500));
    }

    #[test]
    fn followers_can_tell_silence_before_a_live_leader_misses_a_renewal() {
        let ttl = Duration::from_secs(3);
        assert!(keepalive_period(ttl) * 3 / 2 < SILENCE_TO_REVOKE);
        assert!(keepalive_period(Duration::from_secs(1)) <= Duration::from_millis(334));
    }
}
