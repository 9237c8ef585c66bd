//! The cluster owner's key (`global/initial_owner`): named at bootstrap, replaced by a
//! rotation. AAA.Escrow issues owner certificates only for this key.
//!
//! May import only `error`, `layout` and `election` (its write is a leader write);
//! touches no node record and issues or revokes nothing (the handler revokes the old
//! owner certificates).

use consensus::Namespaced;
use etcd_client::{Txn, TxnOp};

use crate::election::{self, Leadership};
use crate::error::CuratorError;
use crate::layout::INITIAL_OWNER_KEY;

/// Makes `new_key` (raw Ed25519) the owner's key.
pub async fn replace_owner_key(
    curator: &Namespaced,
    leadership: &Leadership,
    new_key: &[u8; 32],
) -> Result<(), CuratorError> {
    let txn = Txn::new().and_then([TxnOp::put(
        curator.key(INITIAL_OWNER_KEY),
        new_key.to_vec(),
        None,
    )]);
    election::leader_txn(curator, leadership, txn).await?;
    Ok(())
}
