//! The leader's `pki-prune` runnable: forgets certificates long expired and superseded
//! in both CA stores (`pki::CaStore::prune_superseded`), so that neither grows with
//! every renewal and every CA rotation (nor does every listing of them).
//!
//! ```text
//!   every PERIOD, while leading: cluster-pki/issued/ and etcd-pki/issued/ ─▶ those
//!   expired more than KEEP ago and not the newest of their kind and subject ─▶ deleted
//!   (with their serials/ record), each only if still the one listed
//! ```
//! May delete only such records: never a CA, a CRL, a revocation or a newest
//! certificate.

use std::sync::Arc;
use std::time::Duration;

use super::shared::Shared;
use crate::layout;

/// How often the leader looks.
const PERIOD: Duration = Duration::from_secs(600);

/// How long past its expiry a superseded certificate stays listed (`cluster
/// certificates` shows it): bounds each subject to about (lifetime + KEEP) / (2/3 of
/// the lifetime) certificates.
const KEEP: Duration = Duration::from_secs(3600);

/// The `pki-prune` runnable (see the module documentation).
pub(super) async fn run(
    ctx: supervisor::Context,
    shared: Arc<Shared>,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    // A first look a minute into the tenure, then every PERIOD.
    let mut next = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
        next += PERIOD;
        if !matches!(
            shared.role.current(),
            Some(crate::election::Role::Leader(_))
        ) {
            continue;
        }
        let now = pki::unix_now();
        for (what, store) in [
            ("cluster CA", layout::cluster_pki(&shared.curator)),
            ("etcd peer CA", layout::etcd_pki(shared.curator.client())),
        ] {
            match store.prune_superseded(now, KEEP).await {
                Ok(0) => {}
                Ok(pruned) => tracing::info!(
                    pruned,
                    "forgot the {what}'s certificates expired over {KEEP:?} ago and superseded"
                ),
                Err(e) => tracing::warn!(
                    "pruning the {what}'s expired certificates: {}; next look in {PERIOD:?}",
                    supervisor::error_chain(&e)
                ),
            }
        }
    }
}
