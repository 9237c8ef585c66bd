//! Where the curator's state lives: the consensus namespaces, the etcd keys inside
//! them, the two CA stores, and the names certificates are recorded under in those
//! stores.
//!
//! Inside `namespaced:curator/`:
//! ```text
//!   nodes/<node id>            proto::state::Node (protobuf)             records, writes
//!   deleted/<node id>          the record of a deleted node (tombstone:   writes::delete_node
//!                              never registers again)
//!   addresses/<ip>             node id holding the address (counts only   writes::claims
//!                              while that record holds it: not deleted,
//!                              not DECOMMISSIONED)
//!   join-keys/<hex>            node id holding the data join key          writes::claims
//!   global/initial_owner       raw Ed25519 public key of the owner named  bootstrap
//!                              at bootstrap
//!   global/register_ticket     the single ticket of earlier versions:     ticket
//!                              deleted by rotate-ticket, never honoured
//!   tickets/<id>               proto::state::RegisterTicket (secret only  ticket
//!                              as its SHA-256)
//!   operators/<name>           proto::state::Operator: name, key, role    operators
//!   cluster/configuration      config::ClusterConfiguration (protobuf)   bootstrap
//!   cluster-pki/…              the cluster CA and issued certificates     cluster_pki
//!                              (pki crate): node-<id>[-<serial>], owner-<serial>,
//!                              operator-<name>.<serial>
//!   leader/<lease>             LeaderElectionValue of the elected curator election
//!   audit/<µs>-<seq>-<curator> api::AuditEntry: one audited call          audit
//!   cluster/epochs/<ms>-<node> config::ClusterEpoch: one recover or       epochs
//!                              restore since the bootstrap (the chain)
//!   cluster/layout-format      the format of this layout, a decimal       election
//!                              number ([`LAYOUT_FORMAT`])
//! ```
//! A curator leads only a layout it knows ([`layout_decision`]): before it acts as the
//! leader it reads `cluster/layout-format`; a newer one makes it hand the leadership
//! over (an older polis-node never misreads a layout a newer one wrote), an absent one
//! (written before format numbers: the same layout as format 1) is recorded, and an
//! older one would be migrated there, by the leader, before it serves. Format 1 is the
//! first: no migration exists yet. A release that changes the layout raises the number
//! and migrates only once every node runs it (`cluster versions`), so that the older
//! curators of a cluster being upgraded still lead if the newer ones go away.
//! and inside `namespaced:etcd-pki/` the etcd peer CA ([`etcd_pki`]), whose certificates
//! are recorded as `peer-<id>[-<member>[-<serial>]]`.
//!
//! Names only: may not do I/O nor import any other module of this crate.

use consensus::Namespaced;

/// The consensus user this crate's keys live under.
pub const NAMESPACE: &str = "curator";

pub const INITIAL_OWNER_KEY: &str = "global/initial_owner";
pub const CLUSTER_CONFIGURATION_KEY: &str = "cluster/configuration";
/// The format of the key layout (module doc).
pub const LAYOUT_FORMAT_KEY: &str = "cluster/layout-format";
/// The layout format this build writes and reads.
pub const LAYOUT_FORMAT: u32 = 1;

/// What a curator about to lead does with the layout format it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutDecision {
    /// The format this build reads: lead.
    Lead,
    /// None recorded (a cluster older than format numbers, same layout): record
    /// [`LAYOUT_FORMAT`], then lead.
    Record,
    /// Written by a newer polis-node: hand the leadership over.
    TooNew(u32),
    /// Not a format number.
    Unreadable,
}

/// The decision on the value of [`LAYOUT_FORMAT_KEY`] (`None`: absent).
pub fn layout_decision(found: Option<&[u8]>) -> LayoutDecision {
    let Some(found) = found else {
        return LayoutDecision::Record;
    };
    match std::str::from_utf8(found)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
    {
        Some(0) | None => LayoutDecision::Unreadable,
        Some(n) if n > LAYOUT_FORMAT => LayoutDecision::TooNew(n),
        // Older formats would be migrated here; format 1 is the first there is.
        Some(_) => LayoutDecision::Lead,
    }
}
pub const REGISTER_TICKET_KEY: &str = "global/register_ticket";

/// Prefix of the cluster's epochs ([`epoch_key`]).
pub const EPOCHS_PREFIX: &str = "cluster/epochs/";

/// Where one epoch is recorded: by its identity, so the keys sort as the epochs do.
pub fn epoch_key(made_unix_ms: u64, made_by: &str) -> String {
    format!("{EPOCHS_PREFIX}{made_unix_ms:020}-{made_by}")
}

/// Prefix of every register ticket's key ([`ticket_key`]).
pub const TICKETS_PREFIX: &str = "tickets/";

pub fn ticket_key(id: &str) -> String {
    format!("{TICKETS_PREFIX}{id}")
}

/// Prefix of every operator record's key ([`operator_key`]).
pub const OPERATORS_PREFIX: &str = "operators/";

/// Where operator `name`'s record lives (`proto::state::Operator`).
pub fn operator_key(name: &str) -> String {
    format!("{OPERATORS_PREFIX}{name}")
}

/// Prefix of the names of every operator certificate, whatever its operator.
pub const OPERATOR_CERTIFICATES_PREFIX: &str = "operator-";

/// Prefix of the names of every certificate of operator `name`: `operator-<name>.`
/// (no name holds a '.', so no name's prefix is another's).
pub fn operator_certificate_prefix(name: &str) -> String {
    format!("{OPERATOR_CERTIFICATES_PREFIX}{name}.")
}

/// The operator a certificate name ([`operator_certificate_name`]) is of; `None` for
/// any other name.
pub fn operator_of_certificate(certificate: &str) -> Option<&str> {
    let (name, serial) = certificate
        .strip_prefix(OPERATOR_CERTIFICATES_PREFIX)?
        .split_once('.')?;
    (!name.is_empty() && !serial.is_empty()).then_some(name)
}

/// Name of a certificate of operator `name` (Escrow), named by its serial.
pub fn operator_certificate_name(name: &str, serial: &[u8]) -> String {
    format!(
        "{}{}",
        operator_certificate_prefix(name),
        hex::encode(serial)
    )
}

/// Prefix of every node record's key ([`node_key`]).
pub const NODES_PREFIX: &str = "nodes/";

pub fn node_key(id: &str) -> String {
    format!("{NODES_PREFIX}{id}")
}

/// Prefix of the address index ([`address_key`]).
pub const ADDRESSES_PREFIX: &str = "addresses/";

/// The index entry naming the node that holds `address` (its canonical spelling).
pub fn address_key(address: std::net::IpAddr) -> String {
    format!("{ADDRESSES_PREFIX}{address}")
}

/// Prefix of the data join key index ([`join_key_key`]).
pub const JOIN_KEYS_PREFIX: &str = "join-keys/";

/// The index entry naming the node that holds the data join key `key`.
pub fn join_key_key(key: &[u8]) -> String {
    format!("{JOIN_KEYS_PREFIX}{}", hex::encode(key))
}

/// Where a deleted node's record stays, as a tombstone: its key never registers again.
pub fn tombstone_key(id: &str) -> String {
    format!("deleted/{id}")
}

/// The cluster CA's store: `namespaced:curator/cluster-pki/`.
pub fn cluster_pki(curator: &Namespaced) -> pki::CaStore {
    pki::CaStore::new(curator.sub("cluster-pki"))
}

/// The consensus user holding the etcd peer CA: `namespaced:etcd-pki/`.
pub const ETCD_PKI_NAMESPACE: &str = "etcd-pki";

/// The etcd peer CA's store.
pub fn etcd_pki(client: etcd_client::Client) -> pki::CaStore {
    pki::CaStore::new(Namespaced::new(client, ETCD_PKI_NAMESPACE))
}

/// Prefix of the names under which the cluster CA records a node's certificates; also
/// the name of its first one (CommitNode, bootstrap).
pub fn node_certificate_prefix(node_id: &str) -> String {
    format!("node-{node_id}")
}

/// Prefix of the names under which the etcd peer CA records a node's certificates; also
/// the name of a bootstrap node's first one (its member ID is not known yet).
pub fn peer_certificate_prefix(node_id: &str) -> String {
    format!("peer-{node_id}")
}

/// Name under which a node's peer certificate for one etcd membership is stored; the
/// member ID makes a re-joining node get a fresh certificate (the old one is revoked).
pub fn peer_certificate_name(node_id: &str, member_id: u64) -> String {
    format!("{}-{member_id:x}", peer_certificate_prefix(node_id))
}

/// Prefix of the names under which the cluster CA records a node's curator
/// certificates (`curator-<id>-<serial>`): revoked by this prefix when the node loses
/// the ConsensusMember role, is decommissioned or deleted.
pub fn curator_certificate_prefix(node_id: &str) -> String {
    format!("curator-{node_id}-")
}

/// Name of one curator certificate of a node.
/// The node a curator certificate's name (`curator_certificate_name`) is for.
pub fn curator_certificate_node(name: &str) -> Option<&str> {
    name.strip_prefix("curator-")?
        .rsplit_once('-')
        .map(|(id, _serial)| id)
}

/// The running cluster CA rotation (`proto::state::CaRotationRecord`): who started it,
/// whether it is forced. Present only while one runs.
pub const CA_ROTATION_KEY: &str = "cluster/ca-rotation";

/// The running etcd peer CA rotation (`proto::state::CaRotationRecord`), present from
/// its start until no member's etcd holds the retired CA in memory any more.
pub const ETCD_PEER_CA_ROTATION_KEY: &str = "cluster/etcd-peer-ca-rotation";

/// Held (put if absent, with a lease) by the one consensus member that restarts its etcd
/// to load changed etcd peer CAs (`node::runnables::peertrust`): the value is its node ID. One
/// member at a time keeps the quorum of the others.
pub const ETCD_RESTART_KEY: &str = "cluster/etcd-restart";

pub fn curator_certificate_name(node_id: &str, serial: &[u8]) -> String {
    format!(
        "{}{}",
        curator_certificate_prefix(node_id),
        hex::encode(serial)
    )
}

/// Name of a node certificate issued by renewal: keeps the `node-<id>` prefix that
/// CommitNode's first certificate is recorded under, so that revoking a node's
/// certificates by prefix catches every one.
pub fn renewed_node_certificate_name(node_id: &str, serial: &[u8]) -> String {
    format!(
        "{}-{}",
        node_certificate_prefix(node_id),
        hex::encode(serial)
    )
}

/// Name of an etcd peer certificate issued by renewal (prefix `peer-<id>`, see
/// [`peer_certificate_name`]).
pub fn renewed_peer_certificate_name(node_id: &str, member_id: u64, serial: &[u8]) -> String {
    format!(
        "{}-{}",
        peer_certificate_name(node_id, member_id),
        hex::encode(serial)
    )
}

/// Name of an owner certificate (Escrow): each one is new, named by its serial.
pub fn owner_certificate_name(serial: &[u8]) -> String {
    format!("{}{}", owner_certificate_prefix(), hex::encode(serial))
}

/// Prefix of the names of every owner certificate (see [`owner_certificate_name`]).
pub fn owner_certificate_prefix() -> String {
    "owner-".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_is_led_recorded_or_handed_over() {
        assert_eq!(layout_decision(None), LayoutDecision::Record);
        assert_eq!(layout_decision(Some(b"1")), LayoutDecision::Lead);
        assert_eq!(layout_decision(Some(b"1\n")), LayoutDecision::Lead);
        assert_eq!(layout_decision(Some(b"2")), LayoutDecision::TooNew(2));
        assert_eq!(layout_decision(Some(b"0")), LayoutDecision::Unreadable);
        assert_eq!(layout_decision(Some(b"two")), LayoutDecision::Unreadable);
        assert_eq!(
            layout_decision(Some(&[0xff, 0x31])),
            LayoutDecision::Unreadable
        );
    }
}
