//! ReissueNodeCertificate: a node that missed a whole CA rotation gets a node
//! certificate of the signing CA back, on its node key and the certificate it holds.
//!
//! ```text
//!   node (off while `rotate-ca --force` retired its CA): its node certificate chains to
//!   no CA trusted now, so every mTLS call is refused ("client certificate rejected")
//!     ── ReissueNodeCertificate(previous certificate), self-signed for the node key ──▶
//!   curator (leader): refusal(previous, key, recorded, trusted, revoked, now) (pure)
//!     the certificate's key is the caller's; this store recorded issuing exactly it
//!     (node-<id>*); not on the CRL; not expired; no CA trusted now issued it
//!   then the record: UP with that key ──▶ issuance::renew (a new node certificate)
//! ```
//! Why this is safe: it hands out nothing the node did not hold. The node proves the
//! key, and shows a certificate this cluster recorded issuing to that key, unrevoked and
//! unexpired: what RenewCertificates would have accepted had the node been up during the
//! rotation. A decommissioned or deleted node is refused (its record), and a retired
//! CA's key is no help (the certificate must be one the store recorded). The window a
//! node has is its certificate's lifetime: after that it registers again.
//!
//! Below the handlers (`nodes` calls it); uses `issuance`.

use proto::api;
use proto::state::NodeState;
use tonic::Status;

use super::issuance;
use super::shared::Shared;
use super::status::{record_address, record_key, status_from};
use crate::{layout, records};

/// Why the certificate `previous` may not be exchanged for a new one by the holder of
/// `key` (pure): `recorded` are the node certificates the store recorded for the node
/// `key` names, `trusted` the CAs trusted now, `revoked` the serials the CRL lists.
pub(crate) fn refusal(
    previous: &[u8],
    key: &[u8; 32],
    recorded: &[Vec<u8>],
    trusted: &[Vec<u8>],
    revoked: &[Vec<u8>],
    now: u64,
) -> Option<Status> {
    if previous.is_empty() {
        return Some(Status::invalid_argument(
            "no previous certificate: show the node certificate this node holds",
        ));
    }
    let Ok(validity) = pki::Validity::of(previous) else {
        return Some(Status::invalid_argument(
            "the previous certificate is not a certificate",
        ));
    };
    if pki::certificate_public_key(previous).ok().as_deref() != Some(key.as_slice()) {
        return Some(Status::permission_denied(
            "the previous certificate is for another key than the one proven",
        ));
    }
    if !recorded.iter().any(|r| r.as_slice() == previous) {
        return Some(Status::permission_denied(
            "this cluster has no record of issuing the previous certificate to this node",
        ));
    }
    let serial = pki::certificate_serial(previous).unwrap_or_default();
    if revoked.contains(&serial) {
        return Some(Status::permission_denied(
            "the previous certificate is revoked",
        ));
    }
    if validity.not_after <= now {
        return Some(Status::permission_denied(
            "the previous certificate has expired: a node off for longer than its \
             certificate's lifetime registers again",
        ));
    }
    if trusted.iter().any(|ca| pki::issued_by(previous, ca)) {
        return Some(Status::failed_precondition(
            "the previous certificate is of a CA trusted now: renew it with \
             RenewCertificates",
        ));
    }
    None
}

/// The handler's body: checks, then a new node certificate (as RenewCertificates).
pub(super) async fn node_certificate(
    shared: &Shared,
    key: &[u8; 32],
    previous: &[u8],
) -> Result<api::RenewCertificatesResponse, Status> {
    // What needs no etcd read is refused before any (a flood of made-up certificates
    // costs no read): malformed, another key, expired. The certificate stands in for
    // the records here, so only those checks can refuse.
    let now = pki::unix_now();
    if let Some(refused) = refusal(previous, key, &[previous.to_vec()], &[], &[], now) {
        return Err(refused);
    }
    let _leadership = shared.leadership().await?;
    let id = identity::node_id(key);
    let store = layout::cluster_pki(&shared.curator);
    let recorded: Vec<Vec<u8>> = store
        .list_issued(&layout::node_certificate_prefix(&id))
        .await
        .map_err(|e| Status::unavailable(format!("reading the node's certificates: {e}")))?
        .into_iter()
        .map(|(_, der)| der)
        .collect();
    let trusted = store
        .trusted()
        .await
        .map_err(|e| Status::unavailable(format!("reading the trusted CAs: {e}")))?
        .cas();
    let crl = store
        .crl()
        .await
        .map_err(|e| Status::unavailable(format!("reading the cluster CRL: {e}")))?;
    let revoked = pki::crl_serials(&crl)
        .map_err(|e| Status::internal(format!("the cluster CRL is unreadable: {e}")))?;
    if let Some(refused) = refusal(
        previous,
        key,
        &recorded,
        &trusted,
        &revoked,
        pki::unix_now(),
    ) {
        tracing::warn!(
            node = id,
            "node certificate reissue refused: {}",
            refused.message()
        );
        return Err(refused);
    }
    let node = records::load_node(&shared.curator, &id)
        .await
        .map_err(status_from)?
        .ok_or_else(|| Status::permission_denied(format!("node {id} has no record")))?;
    if records::node_state(&node) != NodeState::Up || node.public_key != key.as_slice() {
        return Err(Status::permission_denied(format!(
            "node {id} is not UP with this key; only UP nodes get their certificate reissued"
        )));
    }
    let renewed = issuance::renew(
        shared,
        &node,
        &record_key(&node)?,
        record_address(&node)?,
        false,
    )
    .await?;
    let (node_certificate, ca_certificate) = renewed.node;
    tracing::info!(
        node = id,
        "reissued the node certificate of a node that missed a CA rotation"
    );
    Ok(api::RenewCertificatesResponse {
        node_certificate,
        ca_certificate,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct World {
        old: pki::Ca,
        new: pki::Ca,
        key: identity::NodeKey,
        previous: Vec<u8>,
    }

    fn world() -> World {
        let old = pki::Ca::generate("old", pki::CA_LIFETIME).unwrap();
        let new = pki::Ca::generate("new", pki::CA_LIFETIME).unwrap();
        let key = identity::NodeKey::generate().unwrap();
        let previous = old.issue(&template(&key), &key.public_key()).unwrap().der;
        World {
            old,
            new,
            key,
            previous,
        }
    }

    fn template(key: &identity::NodeKey) -> pki::Template {
        crate::templates::node_certificate_template(
            &key.node_id(),
            "127.0.0.2".parse().unwrap(),
            std::time::Duration::from_secs(365 * 86_400),
        )
    }

    fn code(s: Option<Status>) -> Option<tonic::Code> {
        s.map(|s| s.code())
    }

    #[test]
    fn a_recorded_unrevoked_certificate_of_a_retired_ca_is_exchanged() {
        let w = world();
        let key = w.key.public_key();
        let recorded = vec![w.previous.clone()];
        let now = pki::unix_now();
        assert!(
            refusal(
                &w.previous,
                &key,
                &recorded,
                std::slice::from_ref(&w.new.cert_der),
                &[],
                now
            )
            .is_none()
        );
        // Still trusted: the ordinary renewal is the way.
        assert_eq!(
            code(refusal(
                &w.previous,
                &key,
                &recorded,
                std::slice::from_ref(&w.old.cert_der),
                &[],
                now
            )),
            Some(tonic::Code::FailedPrecondition)
        );
    }

    #[test]
    fn anything_else_is_refused() {
        let w = world();
        let key = w.key.public_key();
        let recorded = vec![w.previous.clone()];
        let trusted = vec![w.new.cert_der.clone()];
        let now = pki::unix_now();
        let denied = Some(tonic::Code::PermissionDenied);
        // Nothing shown, or not a certificate.
        assert_eq!(
            code(refusal(&[], &key, &recorded, &trusted, &[], now)),
            Some(tonic::Code::InvalidArgument)
        );
        assert_eq!(
            code(refusal(&[1, 2, 3], &key, &recorded, &trusted, &[], now)),
            Some(tonic::Code::InvalidArgument)
        );
        // Another key proven.
        let other = identity::NodeKey::generate().unwrap().public_key();
        assert_eq!(
            code(refusal(&w.previous, &other, &recorded, &trusted, &[], now)),
            denied
        );
        // Never recorded: minted with the retired CA's key by whoever holds it.
        let minted = w.old.issue(&template(&w.key), &key).unwrap().der;
        assert_eq!(
            code(refusal(&minted, &key, &recorded, &trusted, &[], now)),
            denied
        );
        // Revoked, then expired.
        let serial = pki::certificate_serial(&w.previous).unwrap();
        let refused_with = |revoked: &[Vec<u8>], at: u64| {
            code(refusal(&w.previous, &key, &recorded, &trusted, revoked, at))
        };
        assert_eq!(refused_with(&[serial], now), denied);
        assert_eq!(refused_with(&[], now + 400 * 86_400), denied);
    }
}
