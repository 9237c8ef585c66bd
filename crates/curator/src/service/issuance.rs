//! Every certificate the curator issues, one function per call that hands one out:
//! the node certificate (CommitNode), renewed node and etcd peer certificates
//! (RenewCertificates), owner certificates (Escrow) and a joining member's etcd peer
//! certificate (JoinConsensus, through `membership::join`).
//!
//! ```text
//!   call               function                   CA          recorded as
//!   CommitNode         commit_node_certificate    cluster     node-<id> (ensured: same on retry;
//!                                                             a new one once it expired)
//!   RenewCertificates  renew                      cluster     node-<id>-<serial>
//!     with peer          └ (member lookup)        etcd peer   peer-<id>-<member>-<serial>
//!     (only when due: else the newest recorded one is answered again, see `renewal_due`)
//!   Escrow             escrow_owner_certificate   cluster     owner-<serial> (guarded: the
//!                                                             owner key unchanged)
//!   JoinConsensus      join_peer_certificate      etcd peer   peer-<id>-<member> (ensured)
//!     (membership::join)
//!   lifetimes: the cluster configuration's (templates::*_lifetime)
//! ```
//! Node and etcd peer certificates (CommitNode, RenewCertificates) are recorded under
//! `fence`'s guard: not at all once the node's record changed since it was checked.
//! Names come from `layout`, templates and lifetimes from `templates`. Nothing here is
//! guarded by leadership (the PKI store takes no guard; see each function), and nothing
//! here revokes.
//!
//! Below the handlers and `membership`: may not import them; the caller checks the
//! request (identity, record state, key) before calling.

use std::net::IpAddr;

use proto::state::{Node, NodeState};
use tonic::Status;

use super::etcd_members;
use super::fence::{self, Fence};
use super::shared::{Shared, Tenure};
use super::status::{etcd_status, record_address, record_key, status_from};
use crate::election::Leadership;
use crate::{layout, records, templates};

/// The cluster configuration (certificate lifetimes); the default when none is stored.
pub(super) async fn configuration(
    shared: &Shared,
) -> Result<proto::config::ClusterConfiguration, Status> {
    Ok(records::cluster_configuration(&shared.curator)
        .await
        .map_err(status_from)?
        .unwrap_or_default())
}

/// The cluster CA's store and the CA (with its key), for issuing certificates.
pub(super) async fn cluster_ca(shared: &Shared) -> Result<(pki::CaStore, pki::Ca), Status> {
    let store = layout::cluster_pki(&shared.curator);
    let ca = store
        .load_ca()
        .await
        .map_err(|e| Status::unavailable(format!("loading the cluster CA: {e}")))?
        .ok_or_else(|| Status::internal("the cluster has no CA"))?;
    Ok((store, ca))
}

/// [`cluster_ca`], loaded once per leader tenure (`Shared::tenure_ca`): CommitNode's
/// round trip for it saved on every enrolment. Used only while it is the signing CA as
/// this curator's watch of the trusted CAs shows it (`Shared::trusted`): a rotation's
/// promotion changes the signing CA mid-tenure, and the watch shows it within the
/// event's delivery (a certificate of the old CA issued meanwhile is still trusted,
/// and renewed before the old CA is retired: the rotation waits for every node).
async fn tenure_cluster_ca(
    shared: &Shared,
    leadership: &Leadership,
) -> Result<(pki::CaStore, pki::Ca), Status> {
    let tenure: Tenure = (leadership.key.clone(), leadership.revision);
    let Some(signing) = shared.trusted.current().map(|t| t.current.cert.clone()) else {
        return cluster_ca(shared).await;
    };
    let trusted = &signing;
    let cached = shared
        .tenure_ca
        .lock()
        .expect("CA cache poisoned")
        .as_ref()
        .filter(|(t, ca)| *t == tenure && ca.cert_der == *trusted)
        .map(|(_, ca)| ca.clone());
    if let Some(ca) = cached {
        return Ok((layout::cluster_pki(&shared.curator), ca));
    }
    let (store, ca) = cluster_ca(shared).await?;
    if ca.cert_der == *trusted {
        *shared.tenure_ca.lock().expect("CA cache poisoned") = Some((tenure, ca.clone()));
    }
    Ok((store, ca))
}

/// CommitNode: node `id`'s node certificate, for `key`: the newest one recorded while
/// it is valid (a repeated commit gets the same one), else a new one — recorded as
/// `node-<id>` the first time, as a renewal (`node-<id>-<serial>`) after the first
/// expired (a commit repeated after a long time). `admit` decides on the record as read
/// (`None`: no record) and answers the address to certify. Returns the certificate and
/// the cluster CA (DER).
///
/// The record, the cluster configuration, the cluster CA (once per `leadership`
/// tenure) and the recorded certificates are read at once: one round trip instead of
/// four in a row. The record read is the fence's (its guard compares that record's
/// revision), so `admit` and the fence decide on the very record the recording is
/// guarded by; refusals come before any other read's failure.
pub(super) async fn commit_node_certificate(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
    key: &[u8; 32],
    admit: impl Fn(Option<&Node>) -> Result<IpAddr, Status>,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    if let Some(first) = first_certificate(shared, leadership, id, key, &admit).await? {
        return Ok(first);
    }
    let base = layout::node_certificate_prefix(id);
    let store = layout::cluster_pki(&shared.curator);
    let (record, configuration, ca, newest) = tokio::join!(
        fence::read(shared, id),
        configuration(shared),
        tenure_cluster_ca(shared, leadership),
        newest_recorded(&store, &base),
    );
    let record = record?;
    let address = admit(record.as_ref().map(|f| &f.node))?;
    // The record must still be this STANDBY (or UP) node's when the certificate is
    // recorded (see `fence`).
    let Fence { guard, .. } = fence::require(
        record,
        id,
        |n| {
            n.public_key == key.as_slice()
                && matches!(records::node_state(n), NodeState::Standby | NodeState::Up)
        },
        "it is not STANDBY or UP with this key",
    )?;
    let lifetime = templates::node_certificate_lifetime(Some(&configuration?));
    let (store, ca) = ca?;
    let newest = newest?;
    let certificate = match newest {
        Some((der, validity)) if validity.not_after > pki::unix_now() => der,
        None => {
            // Test builds: widen the window between the fence's read and the recording
            // (fenced_issuing test).
            crate::pause::pause_point("node-commit-fenced", id).await;
            // Ensure semantics: racing commits get the certificate the first one recorded.
            store
                .ensure_certificate_guarded(&base, vec![guard], || {
                    ca.issue(
                        &templates::node_certificate_template(id, address, lifetime),
                        key,
                    )
                })
                .await
                .map_err(|e| fence::recording_status("issuing the node certificate", e))?
        }
        Some(_) => {
            tracing::info!(
                node = id,
                "the recorded node certificate expired before the commit: issuing a new one"
            );
            issue_renewed_node_certificate(&store, &ca, id, key, address, lifetime, guard)
                .await?
                .0
        }
    };
    if pki::certificate_public_key(&certificate).ok().as_deref() != Some(key.as_slice()) {
        return Err(Status::internal(format!(
            "the recorded certificate of node {id} is for another key"
        )));
    }
    Ok((certificate, ca.cert_der))
}

/// The common case of [`commit_node_certificate`] in one etcd round trip: the record
/// as the watched snapshot shows it (the fence's guard compares its mod revision), the
/// tenure's CA and configuration, and a first certificate recorded if none is. `None`
/// when that is not the case — no fresh snapshot, no record in it, `admit` or the fence
/// refusing it, a certificate recorded already — and the caller decides on what it
/// reads from etcd. Aborted, as on that path, when the record changed before the
/// recording (the guard failed).
async fn first_certificate(
    shared: &Shared,
    leadership: &Leadership,
    id: &str,
    key: &[u8; 32],
    admit: &impl Fn(Option<&Node>) -> Result<IpAddr, Status>,
) -> Result<Option<(Vec<u8>, Vec<u8>)>, Status> {
    // As fresh as a read (every write of this tenure in it): a guard that fails below
    // means the record changed while the certificate was issued, as on the full path.
    let Some(snapshot) = shared.fresh_nodes(leadership).await else {
        return Ok(None);
    };
    let Some(known) = super::shared::known_in(&snapshot, id) else {
        return Ok(None);
    };
    let Ok(address) = admit(Some(&known.node)) else {
        return Ok(None);
    };
    if known.node.public_key != key.as_slice()
        || !matches!(
            records::node_state(&known.node),
            NodeState::Standby | NodeState::Up
        )
    {
        return Ok(None);
    }
    let guard = etcd_client::Compare::mod_revision(
        shared.curator.key(&layout::node_key(id)),
        etcd_client::CompareOp::Equal,
        known.revision,
    );
    let (configuration, (store, ca)) = tokio::try_join!(
        tenure_configuration(shared, leadership),
        tenure_cluster_ca(shared, leadership)
    )?;
    let lifetime = templates::node_certificate_lifetime(Some(&configuration));
    let issued = ca
        .issue(
            &templates::node_certificate_template(id, address, lifetime),
            key,
        )
        .map_err(|e| Status::internal(format!("issuing the node certificate: {e}")))?;
    // Test builds: widen the window between the snapshot's record and the recording
    // (fenced_issuing test).
    crate::pause::pause_point("node-commit-fenced", id).await;
    let name = layout::node_certificate_prefix(id);
    match store
        .record_new_certificate_guarded(&name, vec![guard], &issued)
        .await
        .map_err(|e| Status::unavailable(format!("recording the node certificate: {e}")))?
    {
        pki::NewRecord::Recorded => Ok(Some((issued.der, ca.cert_der))),
        pki::NewRecord::Exists(_) => Ok(None),
        pki::NewRecord::NotRecorded => Err(fence::recording_status(
            "issuing the node certificate",
            pki::PkiError::Fenced(format!(
                "certificate {name} not recorded: its recipient changed while it was issued"
            )),
        )),
    }
}

/// The cluster configuration, read once per leader tenure (`Shared::tenure_configuration`)
/// for what issuing uses of it (certificate lifetimes): those are set when the cluster
/// is bootstrapped and never written again (the only later write of the configuration,
/// `schedule::set_snapshot_schedule`, changes the snapshot settings only).
async fn tenure_configuration(
    shared: &Shared,
    leadership: &Leadership,
) -> Result<proto::config::ClusterConfiguration, Status> {
    let tenure: Tenure = (leadership.key.clone(), leadership.revision);
    let cached = shared
        .tenure_configuration
        .lock()
        .expect("configuration cache poisoned")
        .as_ref()
        .filter(|(t, _)| *t == tenure)
        .map(|(_, c)| c.clone());
    if let Some(configuration) = cached {
        return Ok(configuration);
    }
    let configuration = configuration(shared).await?;
    *shared
        .tenure_configuration
        .lock()
        .expect("configuration cache poisoned") = Some((tenure, configuration.clone()));
    Ok(configuration)
}

/// A new node certificate for `id`, recorded as `node-<id>-<serial>` under `guard`
/// (see `fence`); returns it (DER) and its serial.
async fn issue_renewed_node_certificate(
    store: &pki::CaStore,
    ca: &pki::Ca,
    id: &str,
    key: &[u8; 32],
    address: IpAddr,
    lifetime: std::time::Duration,
    guard: etcd_client::Compare,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    let issued = ca
        .issue(
            &templates::node_certificate_template(id, address, lifetime),
            key,
        )
        .map_err(|e| Status::internal(format!("issuing the node certificate: {e}")))?;
    // Test builds: widen the window between signing and recording (fencing test).
    crate::pause::pause_point("node-certificate-signed", id).await;
    let name = layout::renewed_node_certificate_name(id, &issued.serial);
    let der = store
        .ensure_certificate_guarded(&name, vec![guard], || Ok(issued.clone()))
        .await
        .map_err(|e| fence::recording_status("recording the node certificate", e))?;
    Ok((der, issued.serial))
}

/// What RenewCertificates hands out: a certificate and its CA's certificate (DER).
pub(super) struct Renewed {
    pub(super) node: (Vec<u8>, Vec<u8>),
    /// Only when asked for.
    pub(super) peer: Option<(Vec<u8>, Vec<u8>)>,
}

/// Whether a certificate may be issued to replace `newest`, the newest one recorded for
/// the same node (and etcd member), at `now` (Unix seconds): from a quarter of its
/// lifetime before its renewal point (2/3) on. Nodes ask at the renewal point, or up to
/// a sixth of the lifetime early to renew both certificates in one call; the rest is
/// room for clocks that differ. So a node, however often it asks, gets at most one new
/// certificate of a kind per 5/12 of a lifetime, and the certificates it is issued
/// stay bounded (before, every call recorded one more, and a looping node could fill
/// etcd).
pub(super) fn renewal_due(newest: &pki::Validity, now: u64) -> bool {
    now + newest.lifetime() / 4 >= newest.renew_at()
}

/// The newest certificate (by issue time) recorded as `name` or `name-<serial>`, with
/// its validity; `None` when there is none.
async fn newest_recorded(
    store: &pki::CaStore,
    name: &str,
) -> Result<Option<(Vec<u8>, pki::Validity)>, Status> {
    let renewed_prefix = format!("{name}-");
    let recorded = store
        .list_issued(name)
        .await
        .map_err(|e| Status::unavailable(format!("listing the certificates of {name}: {e}")))?;
    Ok(recorded
        .into_iter()
        .filter(|(n, _)| n == name || n.starts_with(&renewed_prefix))
        .filter_map(|(_, der)| pki::Validity::of(&der).ok().map(|v| (der, v)))
        .max_by_key(|(_, v)| v.issued()))
}

/// The newest recorded certificate under `name` while replacing it is not due (see
/// [`renewal_due`]) and `signing` issued it: one of a CA a rotation replaced is due at
/// once.
async fn not_yet_due(
    store: &pki::CaStore,
    name: &str,
    signing: &[u8],
) -> Result<Option<Vec<u8>>, Status> {
    let now = pki::unix_now();
    Ok(newest_recorded(store, name)
        .await?
        .filter(|(der, validity)| !renewal_due(validity, now) && pki::issued_by(der, signing))
        .map(|(der, _)| der))
}

/// RenewCertificates for `node` (UP, holding `key` at `address`): a new node
/// certificate, recorded as `node-<id>-<serial>`, and with `peer` a new etcd peer
/// certificate for its current etcd member (refused unless it holds the ConsensusMember
/// role); each only when due, else the newest recorded one again. The previous ones are
/// not revoked: they expire.
pub(super) async fn renew(
    shared: &Shared,
    node: &Node,
    key: &[u8; 32],
    address: IpAddr,
    peer: bool,
) -> Result<Renewed, Status> {
    let id = &node.id;
    // The record read again, for the guard: UP with this key (see `fence`).
    let Fence { guard, .. } = fence::check(
        shared,
        id,
        |n| {
            n.public_key == key.as_slice()
                && records::node_state(n) == NodeState::Up
                && (!peer
                    || n.roles
                        .as_ref()
                        .is_some_and(|r| r.consensus_member.is_some()))
        },
        "it is not UP with this key (and, for a peer certificate, a consensus member)",
    )
    .await?;
    let lifetime = templates::node_certificate_lifetime(Some(&configuration(shared).await?));
    let mut renewed_peer = None;
    if peer {
        // Checked before anything is issued: a refused call issues nothing.
        if node
            .roles
            .as_ref()
            .is_none_or(|r| r.consensus_member.is_none())
        {
            return Err(Status::failed_precondition(format!(
                "node {id} is not a consensus member; it has no etcd peer certificate to renew"
            )));
        }
        renewed_peer = Some(renew_peer(shared, node, key, address, lifetime, guard.clone()).await?);
    }
    // Recording is not guarded by leadership (the PKI store takes no guard, as for
    // owner certificates): a deposed leader could at worst record a certificate for
    // this node's own key, which it then never receives.
    let (store, ca) = cluster_ca(shared).await?;
    if let Some(newest) =
        not_yet_due(&store, &layout::node_certificate_prefix(id), &ca.cert_der).await?
    {
        tracing::info!(
            node = id,
            "node certificate renewal not due yet: answered with the newest one"
        );
        return Ok(Renewed {
            node: (newest, ca.cert_der),
            peer: renewed_peer,
        });
    }
    let (node_certificate, serial) =
        issue_renewed_node_certificate(&store, &ca, id, key, address, lifetime, guard).await?;
    shared.certificates_changed.notify_one();
    tracing::info!(
        node = id,
        serial = hex::encode(&serial),
        peer,
        lifetime_s = lifetime.as_secs(),
        "renewed a node's certificates"
    );
    Ok(Renewed {
        node: (node_certificate, ca.cert_der),
        peer: renewed_peer,
    })
}

/// A new etcd peer certificate for `node`'s current etcd member (RenewCertificates),
/// recorded under `peer-<id>-<member>-<serial>`; returns it and the peer CA (DER). The
/// previous one is not revoked: it expires.
async fn renew_peer(
    shared: &Shared,
    node: &Node,
    key: &[u8; 32],
    address: IpAddr,
    lifetime: std::time::Duration,
    guard: etcd_client::Compare,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    let mut client = shared.curator.client();
    let members = etcd_members::list(&mut client).await?;
    let member = etcd_members::member_of(&members, node).ok_or_else(|| {
        Status::failed_precondition(format!("node {} is no etcd member", node.id))
    })?;
    let peer_pki = layout::etcd_pki(client);
    let peer_ca = peer_pki
        .load_ca()
        .await
        .map_err(|e| etcd_status("loading the etcd peer CA", e))?
        .ok_or_else(|| Status::internal("the cluster has no etcd peer CA"))?;
    let member_name = layout::peer_certificate_name(&node.id, member.id);
    if let Some(newest) = not_yet_due(&peer_pki, &member_name, &peer_ca.cert_der).await? {
        tracing::info!(
            node = node.id,
            "etcd peer certificate renewal not due yet: answered with the newest one"
        );
        return Ok((newest, peer_ca.cert_der));
    }
    let issued = peer_ca
        .issue(
            &templates::peer_certificate_template(&node.id, address, lifetime),
            key,
        )
        .map_err(|e| Status::internal(format!("issuing the etcd peer certificate: {e}")))?;
    let name = layout::renewed_peer_certificate_name(&node.id, member.id, &issued.serial);
    let certificate = peer_pki
        .ensure_certificate_guarded(&name, vec![guard], || Ok(issued.clone()))
        .await
        .map_err(|e| fence::recording_status("recording the etcd peer certificate", e))?;
    Ok((certificate, peer_ca.cert_der))
}

/// Escrow: a new owner certificate for `subject` (the owner's key), recorded as
/// `owner-<serial>` only while `guard` (the owner key as the caller checked it, see
/// `owner::read_owner_key`) holds; returns it and the cluster CA (DER). Refused
/// (Aborted, nothing recorded) when the key was replaced since it was checked.
pub(super) async fn escrow_owner_certificate(
    shared: &Shared,
    subject: &[u8; 32],
    guard: etcd_client::Compare,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    let lifetime = templates::owner_certificate_lifetime(Some(&configuration(shared).await?));
    let (store, ca) = cluster_ca(shared).await?;
    let template = templates::owner_certificate_template(lifetime);
    let issued = ca
        .issue(&template, subject)
        .map_err(|e| Status::internal(format!("issuing the owner certificate: {e}")))?;
    // Test builds: widen the window between the owner key's check and the recording
    // (fenced_issuing test: a rotation inside it).
    crate::pause::pause_point("owner-certificate-signed", &hex::encode(subject)).await;
    let name = layout::owner_certificate_name(&issued.serial);
    // Not guarded by leadership (a deposed leader could still record a certificate it
    // issued, for a key that is the owner's anyway), but by the owner key: a rotation
    // lists and revokes the owner certificates after it replaced the key, so one
    // recorded after that would never be revoked.
    let certificate = store
        .ensure_certificate_guarded(&name, vec![guard], || Ok(issued.clone()))
        .await
        .map_err(|e| match e {
            pki::PkiError::Fenced(_) => Status::aborted(
                "the owner key was replaced while the owner certificate was issued; \
                 nothing was recorded",
            ),
            e => Status::unavailable(format!("recording the owner certificate: {e}")),
        })?;
    tracing::info!(
        serial = hex::encode(&issued.serial),
        "issued an owner certificate"
    );
    Ok((certificate, ca.cert_der))
}

/// JoinConsensus: `node`'s etcd peer certificate as etcd member `member_id`, recorded as
/// `peer-<id>-<member>` (ensured: a node asking again gets the same one); returns it and
/// the peer CA (DER). `client` talks to this curator's etcd member.
pub(super) async fn join_peer_certificate(
    shared: &Shared,
    client: &etcd_client::Client,
    node: &Node,
    member_id: u64,
) -> Result<(Vec<u8>, Vec<u8>), Status> {
    let peer_pki = layout::etcd_pki(client.clone());
    let peer_ca = peer_pki
        .load_ca()
        .await
        .map_err(|e| etcd_status("loading the etcd peer CA", e))?
        .ok_or_else(|| Status::internal("the cluster has no etcd peer CA"))?;
    let key = record_key(node)?;
    let address = record_address(node)?;
    let lifetime = templates::node_certificate_lifetime(Some(&configuration(shared).await?));
    // Recorded only while the record is still this UP member's (see `fence`): a role
    // removal or decommission racing the join revokes it or makes its recording fail.
    let Fence { guard, .. } = fence::check(
        shared,
        &node.id,
        |n| {
            n.public_key == key.as_slice()
                && records::node_state(n) == NodeState::Up
                && n.roles
                    .as_ref()
                    .is_some_and(|r| r.consensus_member.is_some())
        },
        "it is not UP with this key and the ConsensusMember role",
    )
    .await?;
    let certificate = peer_pki
        .ensure_certificate_guarded(
            &layout::peer_certificate_name(&node.id, member_id),
            vec![guard],
            || {
                peer_ca.issue(
                    &templates::peer_certificate_template(&node.id, address, lifetime),
                    &key,
                )
            },
        )
        .await
        .map_err(|e| fence::recording_status("recording the etcd peer certificate", e))?;
    Ok((certificate, peer_ca.cert_der))
}

#[cfg(test)]
mod tests {
    use super::renewal_due;

    #[test]
    fn renewal_is_due_from_five_twelfths_of_the_newest_certificates_life() {
        // Issued at 1000 + BACKDATE, valid for 1200 s: renewal point at 1800.
        let newest = pki::Validity {
            not_before: 1000,
            not_after: 1000 + pki::BACKDATE.as_secs() + 1200,
        };
        let issued = newest.issued();
        assert_eq!(newest.lifetime(), 1200);
        assert_eq!(newest.renew_at(), issued + 800);
        assert!(!renewal_due(&newest, issued));
        assert!(!renewal_due(&newest, issued + 499));
        // The node asks up to a sixth early (pki::Plan), the rest is clock room.
        assert!(renewal_due(&newest, issued + 500));
        assert!(renewal_due(&newest, issued + 800));
        // Expired: due, of course.
        assert!(renewal_due(&newest, newest.not_after + 1));
    }
}
