//! The cluster owner's key (`global/initial_owner`): named at bootstrap, replaced by a
//! rotation. AAA.Escrow issues owner certificates only for this key, and records each
//! under the guard [`read_owner_key`] gives: only while the key is still the one it
//! checked. A rotation replaces the key first and then lists and revokes the owner
//! certificates: one recorded before the replacement is listed and revoked, one whose
//! recording comes after it fails the guard and is never recorded nor handed out (the
//! same order as `service::fence` for node certificates).
//!
//! May import only `error`, `layout` and `election` (its write is a leader write);
//! touches no node record and issues or revokes nothing (the handler revokes the old
//! owner certificates).

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::election::{self, Leadership};
use crate::error::CuratorError;
use crate::layout::INITIAL_OWNER_KEY;

/// The owner's key as it is now (`None`: the cluster has none), with the comparison that
/// holds while it stays so (its mod revision): what an owner certificate for it is
/// recorded under.
pub async fn read_owner_key(
    curator: &Namespaced,
) -> Result<Option<(Vec<u8>, Compare)>, CuratorError> {
    let key = curator.key(INITIAL_OWNER_KEY);
    let response = curator.kv().get(key.clone(), None).await?;
    Ok(response.kvs().first().map(|kv| {
        (
            kv.value().to_vec(),
            Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision()),
        )
    }))
}

/// Makes `new_key` (raw Ed25519) the owner's key while `guard` holds (`operators`:
/// no operator record written since it checked that none holds the key). A failed
/// guard is [`CuratorError::Protocol`] ([`GUARD_FAILED`]).
pub async fn replace_owner_key(
    curator: &Namespaced,
    leadership: &Leadership,
    new_key: &[u8; 32],
    guard: Compare,
) -> Result<(), CuratorError> {
    let txn = Txn::new().when([guard]).and_then([TxnOp::put(
        curator.key(INITIAL_OWNER_KEY),
        new_key.to_vec(),
        None,
    )]);
    let response = election::leader_txn(curator, leadership, txn).await?;
    if !response.succeeded() {
        return Err(CuratorError::Protocol(GUARD_FAILED));
    }
    Ok(())
}

/// What [`replace_owner_key`] fails with when its guard no longer holds.
pub const GUARD_FAILED: &str = "the owner key's guard failed";
