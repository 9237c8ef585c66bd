//! A consensus member's etcd trusts the etcd peer CAs the cluster trusts: the
//! `root.role.controlplane.peertrust` runnable.
//!
//! ```text
//!   WatchNode etcd_peer_cas (NodeValues::etcd_peer_cas, the signing CA first)
//!     └─▶ data/etcd/peer/ca.pem, written atomically (etcd's --peer-trusted-ca-file)
//!   the running etcd loaded other CAs (NodeValues::etcd_peer_trust_loaded)?
//!     └─▶ take /cluster/etcd-restart (put if absent, with a lease: one member at a time)
//!         ─▶ every other voter reachable (etcd's own metrics)? ─▶ restart the local etcd
//!         ─▶ it runs again with the file's CAs and answers a linearizable read
//!         ─▶ lease revoked (the key goes with it; a crashed holder's lease expires)
//!     └─▶ or, its etcd cut off from every leader for CUT_OFF_GRACE (it missed a
//!         rotation: the others refuse it and it them): restart without the key
//! ```
//! Runs from the moment the local etcd serves, before it is a voter: a member that
//! missed a rotation comes back through it (its peer certificate is renewed by `renew`,
//! which asks a curator, not etcd).
//! etcd 3.4 reads its peer trust file only when it starts, while it reads its
//! certificate, key and CRL files on every handshake: a renewal or a revocation needs no
//! restart, a change of the CAs does. A CA rotation (curator `ca_rotation`) waits for
//! what each member's etcd loaded and which CA issued the peer certificate it presents,
//! both reported with the node's heartbeats ([`report`]).
//!
//! Also here: `crlsync` ([`crl_sync`]), which keeps `crl.pem` equal to the etcd peer
//! CRL (read per connection: no restart).
//!
//! May write only ca.pem and crl.pem, restart only the local etcd, and only while it
//! holds the restart key (or is cut off, or a learner); never touches the peer
//! certificate (`renew` does).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::curators::retry::{ProblemLog, pause};
use crate::disk::files::{peer_trust_pem, read_pem_certificate};
use crate::disk::storage::write_atomic;
use crate::state::settings::Settings;
use crate::state::values::NodeValues;

/// How often the runnable compares what etcd loaded with what the cluster trusts.
const CHECK: Duration = Duration::from_secs(1);

/// The restart key's lease: longer than etcd may take to come back
/// (`consensus::process::READY_TIMEOUT`), so that a slow start does not let a second
/// member restart meanwhile; a holder that crashed blocks the others this long.
const RESTART_LEASE_TTL: i64 = 150;

/// How long a restarted etcd gets to run again with the new CAs and answer a
/// linearizable read.
const RESTART_PATIENCE: Duration = Duration::from_secs(120);

/// How long the local etcd must have known no leader before it is restarted without the
/// restart key (which takes a quorum to write): longer than an election, so that a
/// member does not take a leader change for being cut off.
const CUT_OFF_GRACE: Duration = Duration::from_secs(15);

/// The CA certificates (DER) of a PEM trust file; unreadable blocks are left out.
fn certificates(pem_text: &[u8]) -> Vec<Vec<u8>> {
    pem::parse_many(pem_text)
        .map(|blocks| {
            blocks
                .into_iter()
                .filter(|b| b.tag() == "CERTIFICATE")
                .map(|b| b.into_contents())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether an etcd that loaded `loaded` (PEM) trusts exactly `cas` (order aside). Pure.
pub fn loaded_exactly(loaded: &[u8], cas: &[Vec<u8>]) -> bool {
    let loaded: BTreeSet<Vec<u8>> = certificates(loaded).into_iter().collect();
    let wanted: BTreeSet<Vec<u8>> = cas.iter().cloned().collect();
    loaded == wanted
}

/// Why `cas` (a WatchNode update's peer CAs) must not become etcd's trust (pure): none
/// or more than `rpc::tls::MAX_TRUSTED_CAS`, one that is no certificate, or a set without
/// the CA that issued the peer certificate this member presents (`presented`): an
/// update older than one applied (a curator whose view lags) would lock it out.
pub fn refusal(cas: &[Vec<u8>], presented: Option<&[u8]>) -> Option<String> {
    if cas.is_empty() || cas.len() > rpc::tls::MAX_TRUSTED_CAS {
        return Some(format!(
            "{} CAs (1 to {} are trusted)",
            cas.len(),
            rpc::tls::MAX_TRUSTED_CAS
        ));
    }
    if cas
        .iter()
        .any(|ca| pki::certificate_public_key(ca).is_err())
    {
        return Some("one is no certificate".to_string());
    }
    match presented {
        Some(cert) if !cas.iter().any(|ca| pki::issued_by(cert, ca)) => Some(
            "none of them issued the peer certificate this member presents (renewed first, \
             or a stale update)"
                .to_string(),
        ),
        _ => None,
    }
}

/// What the node reports of its etcd's peer TLS with each heartbeat: the fingerprints
/// of the peer CAs its running etcd loaded (none while none runs), and of the CA that
/// issued the peer certificate it presents.
pub fn report(settings: &Settings, values: &NodeValues) -> (Vec<String>, String) {
    let loaded = certificates(&values.etcd_peer_trust_loaded.current().unwrap_or_default());
    if loaded.is_empty() {
        return (Vec::new(), String::new());
    }
    let known = values.etcd_peer_cas.current().unwrap_or_default();
    let issuer = read_pem_certificate(&settings.root.etcd_peer_dir().join("cert.pem"))
        .ok()
        .and_then(|cert| {
            loaded
                .iter()
                .chain(known.iter())
                .find(|ca| pki::issued_by(&cert, ca))
                .map(|ca| rpc::fingerprint(ca))
        })
        .unwrap_or_default();
    (
        loaded.iter().map(|ca| rpc::fingerprint(ca)).collect(),
        issuer,
    )
}

/// The `peerloaded` runnable: publishes what each start of the local etcd loaded
/// (`NodeValues::etcd_peer_trust_loaded`; empty while it is stopped).
pub async fn publish_loaded(
    ctx: supervisor::Context,
    status: event::Value<consensus::Status>,
    values: NodeValues,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let mut watcher = status.watch();
    loop {
        tokio::select! {
            s = watcher.get() => match s? {
                consensus::Status::Running(r) => {
                    values.etcd_peer_trust_loaded.set(r.peer_trust_loaded.clone())
                }
                consensus::Status::Stopped => values.etcd_peer_trust_loaded.set(Vec::new()),
            },
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

/// The `peertrust` runnable (see the module documentation).
pub async fn run(
    ctx: supervisor::Context,
    settings: Settings,
    values: NodeValues,
    client: etcd_client::Client,
    restart: Arc<tokio::sync::Notify>,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let mut problems = ProblemLog::default();
    let mut leaderless_since = None;
    // A key this node held before this runnable started (it was killed, or its control
    // plane restarted, mid-restart) is given back first, whether or not its etcd needs
    // a restart now: otherwise the others wait for its lease (RESTART_LEASE_TTL).
    let mut stale_key_checked = false;
    loop {
        if !pause(&ctx, CHECK).await {
            return Ok(());
        }
        if !stale_key_checked {
            // No quorum yet (a member coming back, or one cut off, which must still get
            // to its restart below): tried again next look. This run's own key is always
            // released before `follow` returns, so a later give-back never takes a key
            // this run holds.
            if let Ok(gave_back) = give_back_stale_key(&values, client.clone()).await {
                stale_key_checked = true;
                if gave_back {
                    tracing::info!("gave back the etcd restart key an earlier run held");
                }
            }
        }
        let cas = values.etcd_peer_cas.current().unwrap_or_default();
        if cas.is_empty() {
            continue;
        }
        let look = Look {
            ctx: &ctx,
            settings: &settings,
            values: &values,
            restart: &restart,
            cas: &cas,
        };
        match follow(&look, client.clone(), &mut leaderless_since).await {
            Ok(None) => problems.resolved("etcd trusts the cluster's etcd peer CAs again"),
            Ok(Some(waiting)) => problems.problem(waiting),
            Err(e) => problems.problem(format!(
                "bringing etcd to the cluster's etcd peer CAs: {}",
                supervisor::error_chain(e.as_ref())
            )),
        }
    }
}

/// What one look works with.
struct Look<'a> {
    ctx: &'a supervisor::Context,
    settings: &'a Settings,
    values: &'a NodeValues,
    restart: &'a tokio::sync::Notify,
    /// The peer CAs the cluster trusts, the signing one first.
    cas: &'a [Vec<u8>],
}

/// One look: the trust file follows the cluster's CAs; etcd is restarted when it loaded
/// others and this member may: holding the restart key, or cut off from every leader
/// for [`CUT_OFF_GRACE`] (a member that missed a rotation: the others refuse its
/// certificate and it theirs, so it cannot reach the key, and restarting it costs no
/// one a quorum). `Some(why)` when it has to wait.
async fn follow(
    look: &Look<'_>,
    mut client: etcd_client::Client,
    leaderless_since: &mut Option<std::time::Instant>,
) -> Result<Option<String>> {
    let Look {
        settings,
        values,
        cas,
        ..
    } = *look;
    let file = settings.root.etcd_peer_dir().join("ca.pem");
    let presented = read_pem_certificate(&settings.root.etcd_peer_dir().join("cert.pem")).ok();
    if let Some(why) = refusal(cas, presented.as_deref()) {
        return Ok(Some(format!(
            "not taking the etcd peer CAs a curator named: {why}"
        )));
    }
    let on_disk = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    if !loaded_exactly(&on_disk, cas) {
        write_atomic(&file, &peer_trust_pem(cas))
            .with_context(|| format!("writing {}", file.display()))?;
        tracing::info!(
            cas = cas.len(),
            signing = rpc::fingerprint(&cas[0]),
            "etcd peer trust file updated"
        );
    }
    let loaded = values.etcd_peer_trust_loaded.current().unwrap_or_default();
    if loaded.is_empty() || loaded_exactly(&loaded, cas) {
        // No etcd runs (it loads the file when it starts), or it trusts these already.
        *leaderless_since = None;
        return Ok(None);
    }
    let own = client
        .status()
        .await
        .context("asking the local etcd member for its status")?;
    if own.leader() == 0 {
        let since = *leaderless_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < CUT_OFF_GRACE {
            return Ok(Some(
                "etcd must restart to load changed etcd peer CAs; it knows no leader (waiting \
                 whether it is cut off)"
                    .to_string(),
            ));
        }
        tracing::warn!(
            "etcd knows no leader since {:?} and loaded other etcd peer CAs than the cluster \
             trusts: restarting it without the restart key",
            since.elapsed()
        );
        *leaderless_since = None;
        return restart_and_wait(look, &mut client, false).await;
    }
    *leaderless_since = None;
    if own.is_learner() {
        // etcd refuses a learner leases and transactions, and a learner's restart costs
        // no one a quorum.
        return restart_and_wait(look, &mut client, false).await;
    }
    let node_id = node_id(values)?;
    let ns = consensus::Namespaced::new(client.clone(), curator::layout::NAMESPACE);
    let key = ns.key(curator::layout::ETCD_RESTART_KEY);
    // Held by another member: waiting costs no write (a local read).
    let held = client
        .get(
            key.clone(),
            Some(etcd_client::GetOptions::new().with_serializable()),
        )
        .await
        .context("reading the etcd restart key")?;
    if let Some(kv) = held.kvs().first()
        && kv.value() != node_id.as_bytes()
    {
        return Ok(Some(format!(
            "etcd must restart to load changed etcd peer CAs; node {} restarts its etcd \
             first (one member at a time)",
            String::from_utf8_lossy(kv.value())
        )));
    }
    let lease = client
        .lease_grant(RESTART_LEASE_TTL, None)
        .await
        .context("granting the etcd restart lease")?
        .id();
    let taken = client
        .txn(
            Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    node_id.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(key.clone(), None)]),
        )
        .await
        .context("taking the etcd restart key")?;
    if !taken.succeeded() {
        let _ = client.lease_revoke(lease).await;
        let holder = consensus::client::txn_get_value(taken.op_responses().first())
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default();
        return Ok(Some(format!(
            "etcd must restart to load changed etcd peer CAs; node {holder} restarts its etcd \
             first (one member at a time)"
        )));
    }
    let outcome = restart_when_safe(look, &mut client, own.header().map(|h| h.member_id())).await;
    // The key goes with the lease; an unanswered revoke lets the lease expire.
    if let Err(e) = client.lease_revoke(lease).await {
        tracing::warn!("releasing the etcd restart key: {e}; it expires with its lease");
    }
    outcome
}

/// Deletes the restart key when it names this node (held by an earlier run: this one
/// has not taken it yet); whether it did.
async fn give_back_stale_key(values: &NodeValues, mut client: etcd_client::Client) -> Result<bool> {
    let node_id = node_id(values)?;
    let ns = consensus::Namespaced::new(client.clone(), curator::layout::NAMESPACE);
    let key = ns.key(curator::layout::ETCD_RESTART_KEY);
    let txn = Txn::new()
        .when([Compare::value(key.clone(), CompareOp::Equal, node_id)])
        .and_then([TxnOp::delete(key, None)]);
    Ok(client
        .txn(txn)
        .await
        .context("giving back the etcd restart key an earlier run of this node held")?
        .succeeded())
}

/// With the restart key held: restarts etcd unless another voter is unreachable.
async fn restart_when_safe(
    look: &Look<'_>,
    client: &mut etcd_client::Client,
    own: Option<u64>,
) -> Result<Option<String>> {
    let members = consensus::membership::members(client)
        .await
        .context("listing the etcd members")?;
    let report = consensus::selfreport::self_report(&look.settings.root.consensus_run_dir())
        .await
        .context("reading etcd's metrics")?;
    let voters: Vec<&consensus::membership::Member> =
        members.iter().filter(|m| !m.is_learner).collect();
    let unreachable: Vec<String> =
        consensus::selfreport::peer_view(&report, own.unwrap_or_default(), &members)
            .into_iter()
            .filter(|p| !p.reachable && voters.iter().any(|v| v.id == p.id))
            .map(|p| {
                if p.name.is_empty() {
                    format!("{:x}", p.id)
                } else {
                    p.name
                }
            })
            .collect();
    if !unreachable.is_empty() {
        return Ok(Some(format!(
            "etcd must restart to load changed etcd peer CAs, but voters {} do not answer \
             it: a restart now could cost the quorum",
            unreachable.join(", ")
        )));
    }
    restart_and_wait(look, client, true).await
}

/// Restarts etcd and waits until it runs with the cluster's CAs and, when `quorum`,
/// answers a linearizable read.
async fn restart_and_wait(
    look: &Look<'_>,
    client: &mut etcd_client::Client,
    quorum: bool,
) -> Result<Option<String>> {
    let cas = look.cas;
    tracing::warn!(
        cas = cas.len(),
        signing = rpc::fingerprint(&cas[0]),
        "restarting etcd: it loads changed etcd peer CAs only at start"
    );
    // Only a start that is running now restarts: a request stored for a later start
    // would restart that one without the key.
    look.restart.notify_waiters();
    let mut loaded = look.values.etcd_peer_trust_loaded.watch();
    let back = async {
        loaded
            .get_matching(|l| !l.is_empty() && loaded_exactly(l, cas))
            .await
            .map_err(|_| anyhow!("the control plane stopped"))?;
        if quorum {
            // Caught up with a leader: a linearizable read through it succeeds.
            while client.get("\0polis-readiness-probe", None).await.is_err() {
                if !pause(look.ctx, Duration::from_millis(100)).await {
                    return Err(anyhow!("cancelled"));
                }
            }
        }
        Ok::<(), anyhow::Error>(())
    };
    tokio::time::timeout(RESTART_PATIENCE, back)
        .await
        .map_err(|_| anyhow!("etcd did not come back within {RESTART_PATIENCE:?}"))??;
    tracing::info!("etcd restarted with the cluster's etcd peer CAs");
    Ok(None)
}

/// This node's ID, from its membership (known once the control plane runs).
fn node_id(values: &NodeValues) -> Result<String> {
    values
        .membership
        .current()
        .map(|m| m.key().node_id())
        .ok_or_else(|| anyhow!("the node's membership is not known yet"))
}

/// Keeps `--peer-crl-file` equal to the etcd peer CRL in etcd: etcd re-reads the file on
/// every inbound peer connection, so a revoked peer is refused without a restart.
pub async fn crl_sync(
    ctx: supervisor::Context,
    client: etcd_client::Client,
    path: std::path::PathBuf,
) -> supervisor::RunnableResult {
    let mut crls = curator::layout::etcd_pki(client).watch_crl();
    ctx.signal_healthy();
    loop {
        let crl = tokio::select! {
            c = crls.recv() => c.ok_or("the etcd peer CRL watch ended")?,
            _ = ctx.cancelled() => return Ok(()),
        };
        let pem = crate::disk::storage::pem("X509 CRL", &crl);
        if std::fs::read(&path).ok().as_deref() != Some(pem.as_slice()) {
            crate::disk::storage::write_atomic(&path, &pem)?;
            tracing::info!(
                revoked = pki::crl_serials(&crl).map(|s| s.len()).unwrap_or_default(),
                "etcd peer CRL file updated"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_trusts_exactly_the_cas_of_its_file_in_any_order() {
        let a = pki::Ca::generate("a", pki::CA_LIFETIME).unwrap().cert_der;
        let b = pki::Ca::generate("b", pki::CA_LIFETIME).unwrap().cert_der;
        let both = peer_trust_pem(&[a.clone(), b.clone()]);
        assert!(loaded_exactly(&both, &[b.clone(), a.clone()]));
        assert!(loaded_exactly(&both, &[a.clone(), b.clone()]));
        assert!(!loaded_exactly(&both, std::slice::from_ref(&b)));
        assert!(!loaded_exactly(
            &peer_trust_pem(std::slice::from_ref(&a)),
            &[a.clone(), b]
        ));
        assert!(!loaded_exactly(b"", &[a]));
        assert_eq!(certificates(b"not pem"), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn peer_cas_that_would_lock_the_member_out_are_refused() {
        let old = pki::Ca::generate("old", pki::CA_LIFETIME).unwrap();
        let new = pki::Ca::generate("new", pki::CA_LIFETIME).unwrap();
        let template = pki::Template {
            common_name: "polis-x".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            usage: pki::Usage::ServerAndClient,
            lifetime: Duration::from_secs(3600),
            kind: pki::CertificateKind::EtcdPeer,
        };
        let presented = new.issue(&template, &[7; 32]).unwrap().der;
        let both = [new.cert_der.clone(), old.cert_der.clone()];
        assert_eq!(refusal(&both, Some(&presented)), None);
        assert_eq!(refusal(&both[..1], Some(&presented)), None);
        assert_eq!(refusal(&both, None), None);
        // A stale set without the issuer of what the member presents.
        assert!(refusal(&both[1..], Some(&presented)).is_some());
        assert!(refusal(&[], None).is_some());
        assert!(refusal(&vec![old.cert_der.clone(); 5], None).is_some());
        assert!(refusal(&[vec![1, 2, 3]], None).is_some());
    }
}
