//! The cluster CRL, held in memory for the per-call certificate check.
//!
//! ```text
//!   etcd cluster-pki/ca/crl ──one watch (pki::CaStore::watch_crl)──▶ Shared::crl
//!                                                                      │ every call
//!   AuthLayer ◀── TrustSource (reads the cache; no etcd call) ◀────────┘
//! ```
//! The same CRL checks the curators this one calls (`Shared::trust`), and reaches
//! nodes with their WatchNode stream, for their own calls.
//!
//! A revocation takes effect on this curator with the watch event that carries it
//! (etcd delivers it after the revision is committed, usually within a millisecond).
//! Until the first CRL has arrived, calls with client certificates answer Unavailable:
//! without a CRL no certificate can be judged.

use std::sync::Arc;

use super::shared::Shared;
use crate::layout;

/// The `crl` runnable: feeds [`Shared::crl`] from the CRL watch; healthy once it holds
/// a CRL.
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    let mut crls = layout::cluster_pki(&shared.curator).watch_crl();
    loop {
        tokio::select! {
            crl = crls.recv() => match crl {
                Some(crl) => {
                    if let Err(e) = shared.trust.offer(&crl) {
                        // The per-call check below still uses it: etcd is the authority.
                        tracing::error!("the cluster CRL in etcd does not check out: {e}");
                    }
                    shared.crl.set(crl.into());
                    ctx.signal_healthy();
                }
                None => return Err("the CRL watch stopped".into()),
            },
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

/// What the listener's authorization layer checks callers against: the cluster CA and
/// the cached CRL.
pub(super) fn source(shared: &Arc<Shared>) -> rpc::TrustSource {
    let shared = shared.clone();
    Arc::new(move || {
        let anchors = shared
            .crl
            .current()
            .map(|crl| rpc::Anchors::one(shared.config.ca_certificate.clone(), Some(crl.to_vec())));
        Box::pin(async move {
            anchors.ok_or_else(|| "the cluster CRL has not been loaded yet".to_string())
        })
    })
}
