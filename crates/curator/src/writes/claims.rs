//! What a node record holds for itself alone, kept unique across concurrent
//! registrations and leader changes by an index in etcd: its address (while it is not
//! DECOMMISSIONED) and its data join key (any state). Each claim is a key naming its
//! holder (see `layout`):
//!
//! ```text
//!   addresses/<ip>          node id    created in the txn that creates the record,
//!   join-keys/<hex>         node id    guarded by the entry's revision (0: absent)
//! ```
//! An entry counts only while its holder's record still holds the claim (checked on
//! every use, [`standing`]): an entry left by a deleted or decommissioned node is
//! stale, and is taken over in a transaction guarded by the entry's revision and by the
//! old holder's record revision. So decommissioning writes nothing here, and
//! `delete_node` drops the node's entries only to keep the index small.
//!
//! Records written by a version without the index (and the bootstrap record) get their
//! entries from [`backfill`], which each leader runs once per tenure before its first
//! registration: only a leader writes records, so a tenure's backfill sees every record
//! an earlier leader wrote.
//!
//! The rules ([`claims`], [`Claim::held_by`], [`standing`], [`plan_backfill`]) are pure
//! and unit-tested.

use std::collections::HashMap;
use std::net::IpAddr;

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use proto::state::{Node, NodeState};

use crate::election::{self, Leadership};
use crate::error::CuratorError;
use crate::layout::{
    ADDRESSES_PREFIX, JOIN_KEYS_PREFIX, NODES_PREFIX, address_key, join_key_key, node_key,
};
use crate::records::{decode_node, node_state};

/// One thing a record holds for itself alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The index key (inside the curator namespace).
    pub key: String,
    /// What is claimed, for messages: `address 10.0.0.1`, `this data join key`.
    pub what: String,
}

/// The claims of `node`: its address while it is not DECOMMISSIONED (a decommissioned
/// node's address may be taken by a new node), its data join key if it has one.
pub fn claims(node: &Node) -> Vec<Claim> {
    let mut claims = Vec::new();
    if node_state(node) != NodeState::Decommissioned
        && let Ok(address) = node.address.parse::<IpAddr>()
    {
        claims.push(Claim {
            key: address_key(address),
            what: format!("address {address}"),
        });
    }
    if !node.data_join_key.is_empty() {
        claims.push(Claim {
            key: join_key_key(&node.data_join_key),
            what: "this data join key".into(),
        });
    }
    claims
}

impl Claim {
    /// Whether `node`'s record holds this claim.
    pub fn held_by(&self, node: &Node) -> bool {
        claims(node).iter().any(|c| c.key == self.key)
    }
}

/// Where a claim stands for a node about to take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// No entry: created guarded by its absence.
    Free,
    /// The entry names the claimant already.
    Own,
    /// The entry names another node whose record holds the claim: refused.
    Taken(String),
    /// The entry names another node whose record no longer holds it (deleted,
    /// decommissioned): taken over, guarded by that record's revision.
    Stale,
}

/// The standing of a claim whose entry names `holder` (None: no entry), the holder's
/// record being `record` (None: no record).
pub fn standing(
    claim: &Claim,
    claimant: &str,
    holder: Option<&str>,
    record: Option<&Node>,
) -> Standing {
    match holder {
        None => Standing::Free,
        Some(h) if h == claimant => Standing::Own,
        Some(h) if record.is_some_and(|r| claim.held_by(r)) => Standing::Taken(h.to_string()),
        Some(_) => Standing::Stale,
    }
}

/// A claim as read for one transaction: its entry's and its holder record's mod
/// revisions (0: absent), which the transaction compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub claim: Claim,
    pub entry_revision: i64,
    /// The holder named by a stale entry and its record's revision.
    pub stale_holder: Option<(String, i64)>,
}

impl Read {
    /// The comparisons that keep this read true until the transaction.
    pub fn compares(&self, curator: &Namespaced) -> Vec<Compare> {
        let mut compares = vec![Compare::mod_revision(
            curator.key(&self.claim.key),
            CompareOp::Equal,
            self.entry_revision,
        )];
        if let Some((holder, revision)) = &self.stale_holder {
            compares.push(Compare::mod_revision(
                curator.key(&node_key(holder)),
                CompareOp::Equal,
                *revision,
            ));
        }
        compares
    }

    /// The write naming `id` as the holder.
    pub fn take(&self, curator: &Namespaced, id: &str) -> TxnOp {
        TxnOp::put(curator.key(&self.claim.key), id, None)
    }
}

/// The value and mod revision of `key`, if it exists.
async fn get(curator: &Namespaced, key: &str) -> Result<Option<(Vec<u8>, i64)>, CuratorError> {
    let response = curator.kv().get(curator.key(key), None).await?;
    Ok(response
        .kvs()
        .first()
        .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
}

/// Reads `claim` for `claimant`: `Err(holder)` when another node holds it.
pub async fn read(
    curator: &Namespaced,
    claim: &Claim,
    claimant: &str,
) -> Result<Result<Read, String>, CuratorError> {
    let entry = get(curator, &claim.key).await?;
    let holder = entry
        .as_ref()
        .map(|(v, _)| String::from_utf8_lossy(v).into_owned());
    let (record, record_revision) = match holder.as_deref() {
        Some(h) if h != claimant => match get(curator, &node_key(h)).await? {
            Some((bytes, revision)) => (Some(decode_node(h, &bytes)?), revision),
            None => (None, 0),
        },
        _ => (None, 0),
    };
    let entry_revision = entry.map_or(0, |(_, r)| r);
    Ok(
        match standing(claim, claimant, holder.as_deref(), record.as_ref()) {
            Standing::Taken(h) => Err(h),
            Standing::Free | Standing::Own => Ok(Read {
                claim: claim.clone(),
                entry_revision,
                stale_holder: None,
            }),
            Standing::Stale => Ok(Read {
                claim: claim.clone(),
                entry_revision,
                stale_holder: holder.map(|h| (h, record_revision)),
            }),
        },
    )
}

/// The writes that make a record's entries delete with it: each entry it may have had
/// (its address's too when DECOMMISSIONED) is deleted if it names the record
/// (nested transactions; an entry taken over since stays).
pub fn release(curator: &Namespaced, node: &Node) -> Vec<TxnOp> {
    let keys = node
        .address
        .parse()
        .ok()
        .map(address_key)
        .into_iter()
        .chain((!node.data_join_key.is_empty()).then(|| join_key_key(&node.data_join_key)));
    keys.map(|k| {
        let key = curator.key(&k);
        TxnOp::txn(
            Txn::new()
                .when([Compare::value(
                    key.clone(),
                    CompareOp::Equal,
                    node.id.as_str(),
                )])
                .and_then([TxnOp::delete(key, None)]),
        )
    })
    .collect()
}

/// An entry [`backfill`] writes: `claim` for the record `id` at `record_revision`,
/// guarded as `read` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fill {
    pub id: String,
    pub record_revision: i64,
    pub read: Read,
}

/// The entries missing for `records` (each with its mod revision) given the entries
/// that exist (`entries`: key → holder and mod revision). An entry naming another node
/// that holds the claim too (two records with one address, left by a version without
/// the index) is left alone and returned as a conflict: (claim, record, holder).
pub fn plan_backfill(
    records: &[(Node, i64)],
    entries: &HashMap<String, (String, i64)>,
) -> (Vec<Fill>, Vec<(Claim, String, String)>) {
    let by_id: HashMap<&str, &(Node, i64)> = records.iter().map(|r| (r.0.id.as_str(), r)).collect();
    let mut fills = Vec::new();
    let mut conflicts = Vec::new();
    for (node, revision) in records {
        for claim in claims(node) {
            let entry = entries.get(&claim.key);
            let holder = entry.map(|(h, _)| h.as_str());
            let holder_record = holder.and_then(|h| by_id.get(h));
            let entry_revision = entry.map_or(0, |(_, r)| *r);
            let stale_holder = match standing(&claim, &node.id, holder, holder_record.map(|r| &r.0))
            {
                Standing::Own => continue,
                Standing::Taken(h) => {
                    conflicts.push((claim, node.id.clone(), h));
                    continue;
                }
                Standing::Free => None,
                Standing::Stale => {
                    holder.map(|h| (h.to_string(), holder_record.map_or(0, |r| r.1)))
                }
            };
            fills.push(Fill {
                id: node.id.clone(),
                record_revision: *revision,
                read: Read {
                    claim,
                    entry_revision,
                    stale_holder,
                },
            });
        }
    }
    (fills, conflicts)
}

/// Every key under `prefix` with its value and mod revision, keyed inside the namespace.
async fn range(
    curator: &Namespaced,
    prefix: &str,
) -> Result<Vec<(String, Vec<u8>, i64)>, CuratorError> {
    let namespace_len = curator.key("").len();
    // In pages: both the records and the index grow with the cluster.
    let range = consensus::pages::read_prefix(&curator.client(), curator.key(prefix)).await?;
    Ok(range
        .kvs
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key()[namespace_len..]).into_owned(),
                kv.value().to_vec(),
                kv.mod_revision(),
            )
        })
        .collect())
}

/// How many passes [`backfill`] makes while records or entries change under it.
const BACKFILL_PASSES: usize = 5;

/// Writes the entries missing for the records in etcd, each in a transaction guarded by
/// leadership, by the record's revision and by the entry's (see [`plan_backfill`]);
/// repeats while some of them lost a race. Returns how many entries were written.
pub async fn backfill(
    curator: &Namespaced,
    leadership: &Leadership,
) -> Result<usize, CuratorError> {
    let mut written = 0;
    for _ in 0..BACKFILL_PASSES {
        let mut records = Vec::new();
        for (key, value, revision) in range(curator, NODES_PREFIX).await? {
            let id = &key[NODES_PREFIX.len()..];
            records.push((decode_node(id, &value)?, revision));
        }
        let mut entries = HashMap::new();
        for prefix in [ADDRESSES_PREFIX, JOIN_KEYS_PREFIX] {
            for (key, value, revision) in range(curator, prefix).await? {
                entries.insert(
                    key,
                    (String::from_utf8_lossy(&value).into_owned(), revision),
                );
            }
        }
        let (fills, conflicts) = plan_backfill(&records, &entries);
        for (claim, id, holder) in conflicts {
            tracing::warn!(
                node = id,
                holder,
                "{} is held by two nodes (written before the index existed)",
                claim.what
            );
        }
        if fills.is_empty() {
            return Ok(written);
        }
        let mut lost = 0;
        for fill in fills {
            let mut compares = fill.read.compares(curator);
            compares.push(Compare::mod_revision(
                curator.key(&node_key(&fill.id)),
                CompareOp::Equal,
                fill.record_revision,
            ));
            let txn = Txn::new()
                .when(compares)
                .and_then([fill.read.take(curator, &fill.id)]);
            if election::leader_txn(curator, leadership, txn)
                .await?
                .succeeded()
            {
                written += 1;
            } else {
                lost += 1;
            }
        }
        if lost == 0 {
            return Ok(written);
        }
    }
    Err(CuratorError::Protocol(
        "node records kept changing while their address index was built",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, address: &str, state: NodeState, join_key: &[u8]) -> Node {
        Node {
            id: id.into(),
            address: address.into(),
            state: state as i32,
            data_join_key: join_key.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn a_live_record_claims_its_address_and_join_key() {
        let up = node("a", "10.0.0.1", NodeState::Up, &[1; 32]);
        let keys: Vec<_> = claims(&up).into_iter().map(|c| c.key).collect();
        assert_eq!(
            keys,
            vec![
                address_key("10.0.0.1".parse().unwrap()),
                join_key_key(&[1; 32])
            ]
        );
        // A decommissioned node keeps its join key but frees its address.
        let gone = node("a", "10.0.0.1", NodeState::Decommissioned, &[1; 32]);
        assert_eq!(claims(&gone).len(), 1);
        assert_eq!(claims(&gone)[0].key, join_key_key(&[1; 32]));
        // No join key, no claim of one; an unparsable address claims nothing.
        assert_eq!(claims(&node("a", "10.0.0.1", NodeState::New, &[])).len(), 1);
        assert!(claims(&node("a", "nonsense", NodeState::New, &[])).is_empty());
    }

    #[test]
    fn addresses_are_claimed_in_one_spelling() {
        let short = node("a", "fd00::1", NodeState::New, &[]);
        let long = node("b", "fd00:0:0:0:0:0:0:0001", NodeState::New, &[]);
        assert_eq!(claims(&long)[0].key, claims(&short)[0].key);
        assert!(claims(&long)[0].held_by(&short));
    }

    #[test]
    fn an_entry_counts_only_while_its_holder_holds_the_claim() {
        let claim = &claims(&node("new", "10.0.0.1", NodeState::New, &[]))[0];
        assert_eq!(standing(claim, "new", None, None), Standing::Free);
        assert_eq!(standing(claim, "new", Some("new"), None), Standing::Own);
        let holder = node("old", "10.0.0.1", NodeState::Up, &[]);
        assert_eq!(
            standing(claim, "new", Some("old"), Some(&holder)),
            Standing::Taken("old".into())
        );
        // Deleted, decommissioned, or (never) holding another address: stale.
        assert_eq!(standing(claim, "new", Some("old"), None), Standing::Stale);
        let decommissioned = node("old", "10.0.0.1", NodeState::Decommissioned, &[]);
        assert_eq!(
            standing(claim, "new", Some("old"), Some(&decommissioned)),
            Standing::Stale
        );
        let moved = node("old", "10.0.0.2", NodeState::Up, &[]);
        assert_eq!(
            standing(claim, "new", Some("old"), Some(&moved)),
            Standing::Stale
        );
    }

    #[test]
    fn backfill_writes_what_is_missing_or_stale_and_reports_duplicates() {
        let a = node("a", "10.0.0.1", NodeState::Up, &[1; 32]);
        let b = node("b", "10.0.0.2", NodeState::Up, &[]);
        let twin = node("twin", "10.0.0.2", NodeState::New, &[]);
        let records = vec![(a.clone(), 5), (b.clone(), 6), (twin, 7)];
        let mut entries = HashMap::new();
        // a's address is indexed; its join key is not; b's address names a deleted node.
        entries.insert(
            address_key("10.0.0.1".parse().unwrap()),
            ("a".to_string(), 3),
        );
        entries.insert(
            address_key("10.0.0.2".parse().unwrap()),
            ("gone".to_string(), 4),
        );
        let (fills, conflicts) = plan_backfill(&records, &entries);
        let planned: Vec<_> = fills
            .iter()
            .map(|f| {
                (
                    f.id.as_str(),
                    f.read.claim.key.clone(),
                    f.read.entry_revision,
                    f.read.stale_holder.clone(),
                )
            })
            .collect();
        assert_eq!(
            planned,
            vec![
                ("a", join_key_key(&[1; 32]), 0, None),
                (
                    "b",
                    address_key("10.0.0.2".parse().unwrap()),
                    4,
                    Some(("gone".to_string(), 0))
                ),
                // twin sees the entry stale too (in the plan, b has not taken it yet):
                // whichever writes first wins, the other's guard fails and the next
                // pass reports the pair.
                (
                    "twin",
                    address_key("10.0.0.2".parse().unwrap()),
                    4,
                    Some(("gone".to_string(), 0))
                ),
            ]
        );
        assert!(conflicts.is_empty());
        // Once b holds it, twin is a conflict, not a write.
        entries.insert(
            address_key("10.0.0.2".parse().unwrap()),
            ("b".to_string(), 8),
        );
        entries.insert(join_key_key(&[1; 32]), ("a".to_string(), 9));
        let (fills, conflicts) = plan_backfill(&records, &entries);
        assert!(fills.is_empty(), "{fills:?}");
        assert_eq!(conflicts.len(), 1);
        assert_eq!(
            (conflicts[0].1.as_str(), conflicts[0].2.as_str()),
            ("twin", "b")
        );
    }
}
