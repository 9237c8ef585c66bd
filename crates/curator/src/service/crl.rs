//! The cluster CAs trusted and their CRLs, held in memory for the per-call certificate
//! check.
//!
//! ```text
//!   etcd cluster-pki/ca/… ──one watch (pki::CaStore::watch_trusted)──▶ Shared::trusted,
//!                                                                      Shared::crl
//!                                                                        │ every call
//!   AuthLayer ◀── TrustSource (reads the cache; no etcd call) ◀──────────┘
//! ```
//! The same CAs and CRLs check the curators this one calls (`Shared::trust`), and reach
//! nodes with their WatchNode stream, for their own calls. One CA is trusted, or two
//! while the CA is rotated (`ca_rotation`); `Shared::crl` is the signing CA's CRL,
//! which lists every revocation (`pki::store::rotation`).
//!
//! A revocation takes effect on this curator with the watch event that carries it
//! (etcd delivers it after the revision is committed, usually within a millisecond).
//! Until the first CRL has arrived, calls with client certificates answer Unavailable:
//! without a CRL no certificate can be judged.

use std::sync::Arc;

use super::shared::{PeerTrust, Shared, WireTrust};
use crate::layout;

/// The `crl` runnable: feeds [`Shared::trusted`], [`Shared::crl`] and
/// [`Shared::trust`] from the watch of the trusted CAs; healthy once it holds them.
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    let mut watched = layout::cluster_pki(&shared.curator).watch_trusted();
    loop {
        tokio::select! {
            trusted = watched.recv() => match trusted {
                Some(trusted) => {
                    take(&shared, trusted);
                    ctx.signal_healthy();
                }
                None => return Err("the watch of the cluster CAs stopped".into()),
            },
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

/// The `peer-trust` runnable: feeds [`Shared::peer_trusted`] from the watch of the etcd
/// peer CAs (nothing here checks a peer certificate: etcd does, from its files).
pub(super) async fn run_peer(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    let mut watched = layout::etcd_pki(shared.curator.client()).watch_trusted();
    loop {
        tokio::select! {
            trusted = watched.recv() => match trusted {
                Some(trusted) => {
                    let previous = shared.peer_trusted.current();
                    if previous.as_ref().map(|p| p.trusted.phase()) != Some(trusted.phase()) {
                        tracing::info!(
                            phase = trusted.phase().name(),
                            signing = rpc::fingerprint(&trusted.current.cert),
                            "etcd peer CAs"
                        );
                    }
                    let wire = trusted.cas().into_iter().map(Into::into).collect();
                    shared.peer_trusted.set(Arc::new(PeerTrust { trusted, wire }));
                    ctx.signal_healthy();
                }
                None => return Err("the watch of the etcd peer CAs stopped".into()),
            },
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

fn take(shared: &Shared, trusted: pki::TrustedCas) {
    // The per-call check uses them whatever this says: etcd is the authority.
    if let Err(e) = shared.trust.trust(trusted.cas()) {
        tracing::error!("the cluster CAs in etcd do not follow the ones held: {e}");
    }
    for crl in trusted.crls() {
        if let Err(e) = shared.trust.offer(&crl) {
            tracing::error!("a cluster CRL in etcd does not check out: {e}");
        }
    }
    let previous = shared.trusted.current();
    if previous.as_ref().map(|p| p.phase()) != Some(trusted.phase()) {
        tracing::info!(
            phase = trusted.phase().name(),
            signing = rpc::fingerprint(&trusted.current.cert),
            "cluster CAs"
        );
    }
    let crl = trusted.current.crl.clone();
    // Before `trusted`, whose change makes WatchNode streams look again.
    shared.trusted_wire.set(Arc::new(WireTrust {
        cas: trusted.cas().into_iter().map(Into::into).collect(),
        crls: trusted.crls().into_iter().map(Into::into).collect(),
    }));
    shared.trusted.set(Arc::new(trusted));
    shared.crl.set(crl.into());
}

/// What the listener's authorization layer checks callers against: the cluster CAs
/// trusted and their cached CRLs.
pub(super) fn source(shared: &Arc<Shared>) -> rpc::TrustSource {
    let shared = shared.clone();
    Arc::new(move || {
        let anchors = shared.trusted.current().map(|t| rpc::Anchors {
            cas: t.cas(),
            crls: t.crls(),
        });
        Box::pin(async move {
            anchors.ok_or_else(|| "the cluster CRL has not been loaded yet".to_string())
        })
    })
}
