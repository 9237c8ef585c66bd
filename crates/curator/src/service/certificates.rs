//! Every certificate the cluster's two CAs recorded, and the expiry warnings derived
//! from them.
//!
//! ```text
//!   etcd curator/cluster-pki/issued/  (node-…, owner-…) ─┐ one range read each,
//!   etcd etcd-pki/issued/             (peer-…)          ─┤ plus each CA's CRL
//!                                                        ▼
//!   list() ── CertificateInfo: kind (CA mark), node (CN), serial, validity, revoked,
//!             current (newest of its kind for its node) ──▶ ListCertificates
//!   the `certificates` runnable: list() every refresh period (and right after a
//!   renewal on this curator) ──▶ Shared::certificates (per node: current node and peer
//!   validity) ──▶ node_info(): warnings, no etcd read per call
//! ```
//! Reads only (both CA stores): may not issue nor revoke, and imports neither `Shared`
//! nor any other service module (the runnable gets what it updates as arguments).
//!
//! The refresh period follows the shortest lifetime seen (1/12 of it, between 1 s and
//! 60 s), so a renewal made at 2/3 of a lifetime is seen well before the warning point
//! at 5/6 (`pki::Validity::warn_at`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use proto::api::CertificateInfo;
use proto::state::Node;

use crate::error::CuratorError;
use crate::layout;

/// Bounds of the refresh period of `Shared::certificates`.
const REFRESH_MIN: Duration = Duration::from_secs(1);
const REFRESH_MAX: Duration = Duration::from_secs(60);

/// The current (newest) node and etcd peer certificate of one node, unless revoked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCertificates {
    pub node: Option<pki::Validity>,
    pub peer: Option<pki::Validity>,
}

/// What the warnings are computed from: per node ID.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CertificateView {
    pub nodes: HashMap<String, NodeCertificates>,
    /// The shortest lifetime among current certificates, seconds (0: none).
    pub shortest_lifetime: u64,
}

fn pki_error(what: &str, e: pki::PkiError) -> CuratorError {
    CuratorError::Pki {
        what: what.to_string(),
        source: e,
    }
}

/// Reads every recorded certificate of both CAs (see the module documentation).
pub async fn list(curator: &consensus::Namespaced) -> Result<Vec<CertificateInfo>, CuratorError> {
    let mut all = Vec::new();
    for store in [
        layout::cluster_pki(curator),
        layout::etcd_pki(curator.client()),
    ] {
        let issued = store
            .list_issued("")
            .await
            .map_err(|e| pki_error("listing certificates", e))?;
        let revoked = match store.crl().await {
            Ok(crl) => pki::crl_serials(&crl).map_err(|e| pki_error("reading a CRL", e))?,
            // A CA not created yet (a store never used) has neither CRL nor certificates.
            Err(_) if issued.is_empty() => Vec::new(),
            Err(e) => return Err(pki_error("reading a CRL", e)),
        };
        for (name, der) in issued {
            match describe(&name, &der, &revoked) {
                Some(info) => all.push(info),
                None => tracing::warn!(name, "a recorded certificate does not parse; skipped"),
            }
        }
    }
    mark_current(&mut all);
    Ok(all)
}

/// One recorded certificate; `None` when it does not parse.
fn describe(name: &str, der: &[u8], revoked: &[Vec<u8>]) -> Option<CertificateInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let kind = pki::CertificateKind::of(&cert);
    let node_id = match kind {
        Some(
            pki::CertificateKind::Node
            | pki::CertificateKind::EtcdPeer
            | pki::CertificateKind::Curator
            | pki::CertificateKind::Operator(_),
        ) => pki::common_name(cert.subject()),
        _ => String::new(),
    };
    let validity = pki::Validity::of(der).ok()?;
    let serial = cert.raw_serial().to_vec();
    Some(CertificateInfo {
        name: name.to_string(),
        kind: kind
            .map(|k| k.mark().trim_start_matches("polis:").to_string())
            .unwrap_or_else(|| "unknown".into()),
        node_id,
        serial: hex::encode(&serial),
        not_before_unix: validity.not_before,
        not_after_unix: validity.not_after,
        revoked: revoked.contains(&serial),
        current: false,
        issuer: pki::common_name(cert.issuer()),
    })
}

/// Marks the newest certificate (latest `not_before`, then `not_after`, then name) of
/// each (kind, node) as current; owner certificates share one empty node, an
/// operator's are its name's.
pub fn mark_current(all: &mut [CertificateInfo]) {
    let mut newest: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (i, c) in all.iter().enumerate() {
        let key = (c.kind.clone(), c.node_id.clone());
        let order = |c: &CertificateInfo| (c.not_before_unix, c.not_after_unix, c.name.clone());
        match newest.get(&key) {
            Some(&j) if order(&all[j]) >= order(c) => {}
            _ => {
                newest.insert(key, i);
            }
        }
    }
    for c in all.iter_mut() {
        c.current = false;
    }
    for i in newest.into_values() {
        all[i].current = true;
    }
}

/// The view the warnings need, from a listing.
pub fn view(all: &[CertificateInfo]) -> CertificateView {
    let mut view = CertificateView::default();
    for c in all.iter().filter(|c| c.current && !c.revoked) {
        let validity = pki::Validity {
            not_before: c.not_before_unix,
            not_after: c.not_after_unix,
        };
        let is_node = match c.kind.as_str() {
            "node" => true,
            "etcd-peer" => false,
            _ => continue,
        };
        let entry = view.nodes.entry(c.node_id.clone()).or_default();
        if is_node {
            entry.node = Some(validity);
        } else {
            entry.peer = Some(validity);
        }
        let lifetime = validity.lifetime();
        if lifetime > 0 && (view.shortest_lifetime == 0 || lifetime < view.shortest_lifetime) {
            view.shortest_lifetime = lifetime;
        }
    }
    view
}

/// How long until the next refresh of the view.
pub fn refresh_period(view: &CertificateView) -> Duration {
    if view.shortest_lifetime == 0 {
        return REFRESH_MAX;
    }
    (Duration::from_secs(view.shortest_lifetime) / 12).clamp(REFRESH_MIN, REFRESH_MAX)
}

/// Warnings about `node`'s current certificates at `now` (Unix seconds): one per
/// certificate past 5/6 of its lifetime (its holder should have renewed it at 2/3),
/// for UP nodes; the peer certificate only while the node is a consensus member.
pub fn warnings(node: &Node, certificates: Option<&NodeCertificates>, now: u64) -> Vec<String> {
    if node.state != proto::state::NodeState::Up as i32 {
        return Vec::new();
    }
    let Some(certificates) = certificates else {
        return Vec::new();
    };
    let member = node
        .roles
        .as_ref()
        .is_some_and(|r| r.consensus_member.is_some());
    let mut out = Vec::new();
    let mut check = |what: &str, v: Option<pki::Validity>| {
        let Some(v) = v else { return };
        if now >= v.not_after {
            out.push(format!(
                "its {what} certificate expired {} s ago and was not renewed",
                now - v.not_after
            ));
        } else if now >= v.warn_at() {
            out.push(format!(
                "its {what} certificate expires in {} s and was not renewed (renewal was due {} s ago)",
                v.not_after - now,
                now.saturating_sub(v.renew_at())
            ));
        }
    };
    check("node", certificates.node);
    if member {
        check("etcd peer", certificates.peer);
    }
    out
}

/// The `certificates` runnable: keeps `current` (`Shared::certificates`) up to date,
/// listing again early when `changed` is notified (a certificate was issued here).
pub(super) async fn run(
    ctx: supervisor::Context,
    curator: &consensus::Namespaced,
    current: &event::Value<Arc<CertificateView>>,
    changed: &tokio::sync::Notify,
) -> supervisor::RunnableResult {
    let mut failures = 0u32;
    loop {
        let period = match list(curator).await {
            Ok(all) => {
                let view = view(&all);
                let period = refresh_period(&view);
                current.set(Arc::new(view));
                if failures > 0 {
                    tracing::info!("certificate listing works again");
                }
                failures = 0;
                ctx.signal_healthy();
                period
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(
                        "listing certificates for expiry warnings: {}; retrying",
                        supervisor::error_chain(&e)
                    );
                }
                REFRESH_MIN * 2
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = changed.notified() => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(kind: &str, node: &str, name: &str, nb: u64, na: u64) -> CertificateInfo {
        CertificateInfo {
            name: name.into(),
            kind: kind.into(),
            node_id: node.into(),
            not_before_unix: nb,
            not_after_unix: na,
            ..Default::default()
        }
    }

    #[test]
    fn the_newest_of_each_kind_and_node_is_current() {
        let mut all = vec![
            info("node", "a", "node-a", 100, 200),
            info("node", "a", "node-a-2", 150, 250),
            info("node", "b", "node-b", 100, 200),
            info("etcd-peer", "a", "peer-a", 160, 260),
            info("owner", "", "owner-1", 100, 200),
            info("owner", "", "owner-2", 90, 190),
        ];
        mark_current(&mut all);
        let current: Vec<&str> = all
            .iter()
            .filter(|c| c.current)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(current, ["node-a-2", "node-b", "peer-a", "owner-1"]);
        let v = view(&all);
        assert_eq!(v.nodes["a"].node.unwrap().not_after, 250);
        assert_eq!(v.nodes["a"].peer.unwrap().not_after, 260);
        assert!(!v.nodes.contains_key(""), "owners are no nodes");
    }

    #[test]
    fn warnings_past_five_sixths_for_up_nodes() {
        let b = pki::BACKDATE.as_secs();
        // Issued at 1000 for 60 s: renew at 1040, warn at 1050, expire at 1060.
        let v = pki::Validity {
            not_before: 1000 - b,
            not_after: 1060,
        };
        let certs = NodeCertificates {
            node: Some(v),
            peer: Some(v),
        };
        let up = |member: bool| Node {
            state: proto::state::NodeState::Up as i32,
            roles: member.then_some(proto::state::NodeRoles {
                consensus_member: Some(proto::state::ConsensusMemberRole::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cases = [
            (up(true), 1045, 0),
            (up(true), 1050, 2),
            (up(false), 1050, 1),
            (up(true), 1070, 2),
            (
                Node {
                    state: proto::state::NodeState::Standby as i32,
                    ..Default::default()
                },
                1070,
                0,
            ),
        ];
        for (node, now, count) in cases {
            let w = warnings(&node, Some(&certs), now);
            assert_eq!(w.len(), count, "{now}: {w:?}");
        }
        assert!(warnings(&up(true), Some(&certs), 1070)[0].contains("expired 10 s ago"));
        assert!(warnings(&up(true), None, 1070).is_empty());
    }

    #[test]
    fn refresh_follows_the_shortest_lifetime() {
        let view = |shortest| CertificateView {
            shortest_lifetime: shortest,
            ..Default::default()
        };
        assert_eq!(refresh_period(&view(0)), REFRESH_MAX);
        assert_eq!(refresh_period(&view(6)), REFRESH_MIN);
        assert_eq!(refresh_period(&view(24)), Duration::from_secs(2));
        assert_eq!(refresh_period(&view(365 * 86400)), REFRESH_MAX);
    }
}
