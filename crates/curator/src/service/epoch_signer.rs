//! The curator's epoch signature: the epoch named on every answer (`rpc::epoch`) is
//! signed with the key of the cluster CA that signs now, so that clients keep only
//! epochs a CA they trust vouches for (a stolen curator key cannot lock them out with
//! a forged far-future epoch).
//!
//! ```text
//!   listener start ─▶ run(layer): load the signing CA ─▶ layer.sign(Ca::sign(message))
//!     again whenever the trusted CAs change (a rotation made another CA sign);
//!     retried every 2 s while the CA cannot be read (no quorum yet)
//! ```
//! Below the listener (which owns the layer); reads the PKI store only.

use std::time::Duration;

use super::shared::Shared;
use crate::layout;

/// How long to wait before reading the CA again when it could not be read.
const RETRY: Duration = Duration::from_secs(2);
/// How often the CA is read again once the watch of the trusted CAs ended.
const POLL: Duration = Duration::from_secs(30);

/// How long the listener waits for the first signature before it serves.
const FIRST: Duration = Duration::from_secs(2);

/// Signs `layer`'s epoch once, before the listener serves (its first answers already
/// carry the signature): the CA that signed, if it could be read within [`FIRST`].
pub(super) async fn sign_first(shared: &Shared, layer: &rpc::epoch::EpochLayer) -> Option<Vec<u8>> {
    let store = layout::cluster_pki(&shared.curator);
    let ca = tokio::time::timeout(FIRST, store.load_ca())
        .await
        .ok()?
        .ok()??;
    let signature = ca.sign(&rpc::epoch::signed_message(layer.epoch())).ok()?;
    layer.sign(&signature);
    Some(ca.cert_der)
}

/// Keeps `layer`'s epoch signed by the signing CA (`signed_by`: the one that signed it
/// so far) until `stop` is cancelled.
pub(super) async fn run(
    shared: std::sync::Arc<Shared>,
    layer: rpc::epoch::EpochLayer,
    mut signed_by: Option<Vec<u8>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let store = layout::cluster_pki(&shared.curator);
    let mut changes = store.watch_trusted();
    let message = rpc::epoch::signed_message(layer.epoch());
    // The watch ends with the store's client: then the CA is read every POLL instead.
    let mut watching = true;
    loop {
        match store.load_ca().await {
            Ok(Some(ca)) if signed_by.as_ref() != Some(&ca.cert_der) => match ca.sign(&message) {
                Ok(signature) => {
                    layer.sign(&signature);
                    tracing::debug!(
                        ca = rpc::fingerprint(&ca.cert_der),
                        "the cluster epoch named on answers is signed"
                    );
                    signed_by = Some(ca.cert_der);
                }
                Err(e) => tracing::warn!("signing the cluster epoch: {e}"),
            },
            Ok(_) => {}
            Err(e) => tracing::debug!("reading the cluster CA to sign the epoch: {e}"),
        }
        let wait = if signed_by.is_none() { RETRY } else { POLL };
        tokio::select! {
            _ = stop.cancelled() => return,
            change = changes.recv(), if watching => watching = change.is_some(),
            _ = tokio::time::sleep(wait), if signed_by.is_none() || !watching => {}
        }
    }
}
