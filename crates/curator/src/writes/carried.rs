//! The audit entry a change carries into its own transaction.
//!
//! An audited call's handler runs with its call in reach (`rpc::server::call_in_progress`).
//! The first change it commits takes the call's entry ([`Carried::take`]), puts it in the
//! same transaction as the change ([`Carried::op`]), and marks it recorded once that
//! transaction committed ([`Carried::committed`]): the change and its entry exist
//! together or not at all, and the audit layer writes nothing more for a call that then
//! succeeds. A transaction that does not commit (a failed guard, etcd away) hands the
//! entry back to the call when the `Carried` is dropped, so a retry or another change
//! of the call can carry it, or the audit layer writes it with the call's result.
//!
//! The entry says OK: it is written only with a committed change. Every claim of a call
//! writes under the call's one key (`CallInProgress::entry_key_or`), and so does the
//! audit layer's final entry: a call that fails after its change, or whose change's
//! transaction committed without the handler learning it (an etcd error after the
//! commit, then a retry that finds nothing to change), ends with one entry, its last
//! word the call's result (`rpc::server::audit`).
//!
//! May import only `audit` (the entry's rules).

use std::sync::Arc;

use consensus::Namespaced;
use etcd_client::TxnOp;
use prost::Message;
use rpc::server::CallInProgress;

use crate::audit;

/// A call's entry, held for one change (see the module documentation).
pub struct Carried {
    call: Arc<CallInProgress>,
    /// The entry's key, namespaced, and its encoded value.
    key: String,
    value: Vec<u8>,
    committed: bool,
}

impl Carried {
    /// The entry of the audited call running in this task, unless there is none or
    /// another change of the call holds or wrote it.
    pub fn take(curator: &Namespaced) -> Option<Carried> {
        let call = rpc::server::call_in_progress()?;
        if !call.claim() {
            return None;
        }
        let mut entry = audit::entry_of(call.recorder(), call.call(), 0, "");
        // The call's key, the same for every claim: a retry after a transaction whose
        // commit was not learnt of overwrites its entry (one call, one entry).
        entry.key = call
            .entry_key_or(|| {
                audit::entry_key(
                    entry.time_unix_micros,
                    audit::next_sequence(),
                    &entry.curator,
                )
            })
            .to_string();
        Some(Carried {
            key: curator.key(&entry.key),
            value: entry.encode_to_vec(),
            call,
            committed: false,
        })
    }

    /// The put of the entry, for the change's transaction.
    pub fn op(&self) -> TxnOp {
        TxnOp::put(self.key.clone(), self.value.clone(), None)
    }

    /// The change's transaction committed, with [`Self::op`] in it.
    pub fn committed(mut self) {
        self.committed = true;
        self.call.mark_recorded();
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        if !self.committed {
            self.call.release();
        }
    }
}

/// Commits `carried` if there is one (a transaction carrying its op committed).
pub fn commit(carried: Option<Carried>) {
    if let Some(c) = carried {
        c.committed();
    }
}
