//! The register ticket: the shared secret a new node presents to RegisterNode. Created
//! (32 random bytes) on first request, replaced on rotation, compared in constant time.
//!
//! May import only `error`, `layout` and `election` (its writes are leader writes);
//! touches no node record.

use consensus::Namespaced;
use consensus::client::txn_get_value;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::election::{self, Leadership};
use crate::error::CuratorError;
use crate::layout::REGISTER_TICKET_KEY;

/// Length of a register ticket.
pub const TICKET_LEN: usize = 32;

/// The register ticket, if one was ever created.
pub async fn register_ticket(curator: &Namespaced) -> Result<Option<Vec<u8>>, CuratorError> {
    Ok(curator.get(REGISTER_TICKET_KEY).await?)
}

fn new_ticket() -> Result<Vec<u8>, CuratorError> {
    let mut ticket = vec![0u8; TICKET_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut ticket)
        .map_err(|_| CuratorError::Protocol("system random source failed"))?;
    Ok(ticket)
}

/// Replaces the register ticket with a new random one.
pub async fn rotate_register_ticket(
    curator: &Namespaced,
    leadership: &Leadership,
) -> Result<(), CuratorError> {
    let txn = Txn::new().and_then([TxnOp::put(
        curator.key(REGISTER_TICKET_KEY),
        new_ticket()?,
        None,
    )]);
    election::leader_txn(curator, leadership, txn).await?;
    Ok(())
}

/// The cluster's register ticket, created (32 random bytes) on first use.
pub async fn ensure_register_ticket(
    curator: &Namespaced,
    leadership: &Leadership,
) -> Result<Vec<u8>, CuratorError> {
    if let Some(t) = curator.get(REGISTER_TICKET_KEY).await? {
        return Ok(t);
    }
    let ticket = new_ticket()?;
    let key = curator.key(REGISTER_TICKET_KEY);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), ticket.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    let response = election::leader_txn(curator, leadership, txn).await?;
    if response.succeeded() {
        return Ok(ticket);
    }
    txn_get_value(response.op_responses().first())
        .ok_or(CuratorError::Protocol("register ticket vanished"))
}

/// Compares a presented ticket with the stored one in constant time.
pub fn ticket_matches(stored: &[u8], presented: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    stored.len() == presented.len() && bool::from(stored.ct_eq(presented))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_compare_exactly() {
        let t = [7u8; TICKET_LEN];
        assert!(ticket_matches(&t, &t));
        let mut other = t;
        other[31] ^= 1;
        assert!(!ticket_matches(&t, &other));
        assert!(!ticket_matches(&t, &t[..31]));
        assert!(!ticket_matches(&t, &[]));
    }
}
