//! Operator records (`operators/<name>`, `proto::state::Operator`): named users with
//! their own key and a role, besides the owner. Names and keys are unique, never the
//! owner's key, at most [`MAX_OPERATORS`].
//!
//! ```text
//!   add      one guarded transaction: the name absent, the owner key's revision as
//!            read, no operator record written since the read (the prefix's newest
//!            mod revision) ─▶ put operators/<name>
//!   remove   delete operators/<name> (the handler then revokes its certificates)
//!   unfinished_removals   names with no record whose certificates are not all
//!            revoked (a removal whose revocation failed, or is under way): what
//!            ListOperators shows besides the records (pure)
//!   holder   the record holding a key (constant-time comparisons), with the guard an
//!            operator certificate is recorded under: the record's mod revision
//!   owner    RotateOwner: the new owner key checked against every operator's and
//!            written under the same prefix guard, so AddOperator and RotateOwner can
//!            never both take one key
//! ```
//! May import only `error`, `layout`, `election` and `owner`; issues and revokes
//! nothing (the handlers in `service::operators` do).

use std::collections::BTreeMap;

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use prost::Message;
use proto::operators::MAX_OPERATORS;
use proto::state::Operator;

use crate::election::{self, Leadership};
use crate::error::CuratorError;
use crate::layout::{INITIAL_OWNER_KEY, OPERATORS_PREFIX, operator_key, operator_of_certificate};
use crate::owner;

/// Why an operator could not be added (or the owner key not replaced).
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("an operator named {0:?} exists already")]
    Exists(String),
    #[error("the key is operator {0:?}'s already")]
    KeyTaken(String),
    #[error("the key is the cluster owner's key")]
    OwnersKey,
    #[error("the cluster has {MAX_OPERATORS} operators, the most it may have")]
    TooMany,
    #[error("the operators or the owner key changed meanwhile; nothing was written")]
    Changed,
    #[error(transparent)]
    Curator(#[from] CuratorError),
}

/// Compares two keys in constant time (for equal lengths).
pub fn same_key(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Every operator record, by name, with the prefix's newest mod revision (0: none).
pub async fn list(curator: &Namespaced) -> Result<(Vec<Operator>, i64), CuratorError> {
    let prefix = curator.key(OPERATORS_PREFIX);
    let response = curator
        .client()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await?;
    let mut newest = 0;
    let mut operators = Vec::with_capacity(response.kvs().len());
    for kv in response.kvs() {
        newest = newest.max(kv.mod_revision());
        operators.push(
            Operator::decode(kv.value()).map_err(|source| CuratorError::Corrupt {
                what: "operator record".into(),
                source,
            })?,
        );
    }
    operators.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((operators, newest))
}

/// The comparison that holds while no operator record was written after `newest`.
fn unchanged_since(curator: &Namespaced, newest: i64) -> Compare {
    Compare::mod_revision(curator.key(OPERATORS_PREFIX), CompareOp::Less, newest + 1).with_prefix()
}

/// The operator holding `key`, with the comparison that holds while its record stays
/// as read (what its certificate is recorded under). Every record is compared, in
/// constant time, so the answer's timing does not tell how close a key came.
pub async fn holder_of(
    curator: &Namespaced,
    key: &[u8],
) -> Result<Option<(Operator, Compare)>, CuratorError> {
    let prefix = curator.key(OPERATORS_PREFIX);
    let response = curator
        .client()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await?;
    let mut found = None;
    for kv in response.kvs() {
        let Ok(operator) = Operator::decode(kv.value()) else {
            tracing::warn!("an operator record does not decode; skipped");
            continue;
        };
        if same_key(&operator.public_key, key) && found.is_none() {
            let guard = Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision());
            found = Some((operator, guard));
        }
    }
    Ok(found)
}

/// Records `operator` (name, key and role checked by the caller) unless its name or
/// key is taken, its key is the owner's, or the cluster has [`MAX_OPERATORS`]: all
/// checked against one read and written only while that read still holds.
pub async fn add(
    curator: &Namespaced,
    leadership: &Leadership,
    operator: &Operator,
) -> Result<(), OperatorError> {
    let (operators, newest) = list(curator).await?;
    let owner = owner::read_owner_key(curator).await?;
    if operators.iter().any(|o| o.name == operator.name) {
        return Err(OperatorError::Exists(operator.name.clone()));
    }
    if let Some(holder) = operators
        .iter()
        .find(|o| same_key(&o.public_key, &operator.public_key))
    {
        return Err(OperatorError::KeyTaken(holder.name.clone()));
    }
    if owner
        .as_ref()
        .is_some_and(|(key, _)| same_key(key, &operator.public_key))
    {
        return Err(OperatorError::OwnersKey);
    }
    if operators.len() >= MAX_OPERATORS {
        return Err(OperatorError::TooMany);
    }
    let record = operator_key(&operator.name);
    let owner_guard = match owner {
        Some((_, guard)) => guard,
        None => Compare::create_revision(curator.key(INITIAL_OWNER_KEY), CompareOp::Equal, 0),
    };
    let txn = Txn::new()
        .when([
            Compare::create_revision(curator.key(&record), CompareOp::Equal, 0),
            owner_guard,
            unchanged_since(curator, newest),
        ])
        .and_then([TxnOp::put(
            curator.key(&record),
            operator.encode_to_vec(),
            None,
        )]);
    let response = election::leader_txn(curator, leadership, txn).await?;
    if !response.succeeded() {
        return Err(OperatorError::Changed);
    }
    Ok(())
}

/// The names with no record in `records` that certificates in `unrevoked` (names of
/// recorded certificates neither revoked nor expired) are of, each with how many: the
/// removals whose revocation has not finished. Sorted by name. (A name with a record
/// is the current operator's, whatever certificates it holds: AddOperator revokes an
/// earlier operator's before recording the name.)
pub fn unfinished_removals<'a>(
    records: &[Operator],
    unrevoked: impl IntoIterator<Item = &'a str>,
) -> Vec<(String, u32)> {
    let mut left: BTreeMap<&str, u32> = BTreeMap::new();
    for certificate in unrevoked {
        let Some(name) = operator_of_certificate(certificate) else {
            continue;
        };
        if !records.iter().any(|o| o.name == name) {
            *left.entry(name).or_default() += 1;
        }
    }
    left.into_iter()
        .map(|(name, count)| (name.to_string(), count))
        .collect()
}

/// Deletes the record of operator `name`; whether there was one.
pub async fn remove(
    curator: &Namespaced,
    leadership: &Leadership,
    name: &str,
) -> Result<bool, CuratorError> {
    let txn = Txn::new().and_then([TxnOp::delete(curator.key(&operator_key(name)), None)]);
    let response = election::leader_txn(curator, leadership, txn).await?;
    Ok(response
        .op_responses()
        .into_iter()
        .any(|op| matches!(op, etcd_client::TxnOpResponse::Delete(d) if d.deleted() > 0)))
}

/// Makes `new_key` the owner's key unless an operator holds it: checked against one
/// read of the operators and written only while no operator record changed since.
pub async fn replace_owner_key(
    curator: &Namespaced,
    leadership: &Leadership,
    new_key: &[u8; 32],
) -> Result<(), OperatorError> {
    let (operators, newest) = list(curator).await?;
    if let Some(holder) = operators.iter().find(|o| same_key(&o.public_key, new_key)) {
        return Err(OperatorError::KeyTaken(holder.name.clone()));
    }
    owner::replace_owner_key(
        curator,
        leadership,
        new_key,
        unchanged_since(curator, newest),
    )
    .await
    .map_err(|e| match e {
        CuratorError::Protocol(_) => OperatorError::Changed,
        e => OperatorError::Curator(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str) -> Operator {
        Operator {
            name: name.into(),
            ..Operator::default()
        }
    }

    #[test]
    fn names_without_a_record_but_with_unrevoked_certificates_are_unfinished_removals() {
        let records = [record("rita"), record("ada")];
        let unrevoked = [
            "operator-rita.01",
            "operator-bob.02",
            "operator-bob.0a",
            "operator-eve_1.03",
            // Not operator certificates, or not named as Escrow names them.
            "owner-04",
            "node-polis-x-05",
            "operator-zed",
            "operator-.06",
        ];
        assert_eq!(
            unfinished_removals(&records, unrevoked),
            [("bob".to_string(), 2), ("eve_1".to_string(), 1)]
        );
        assert!(unfinished_removals(&records, ["operator-ada.07"]).is_empty());
        assert!(unfinished_removals(&[], []).is_empty());
    }
}
