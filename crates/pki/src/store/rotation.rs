//! Replacing a store's CA while it is in use: the successor is introduced (trusted,
//! not yet signing), promoted (signing; the old CA stays trusted), and the old CA is
//! retired (no longer trusted). Each step is one guarded etcd transaction, so a
//! rotation interrupted anywhere (a curator failover) is resumed from what is stored.
//!
//! ```text
//!                 introduce_successor      promote_successor       retire_previous
//!   ca/  = O   ──────────────────────▶ ca/ = O            ──────▶ ca/ = N        ──────▶ ca/ = N
//!                                      ca/next/ = N               ca/previous/ = O
//!   phase: settled                     introduced                 reissuing              settled
//!   trusted: {O}                       {O, N}                     {N, O}                 {N}
//!   signing: O                         O                          N                      N
//! ```
//!
//! The introduction also records the old CA's handover to the successor
//! (`handover/<µs>`: `crate::handover`) and deletes all but the newest
//! [`MAX_HANDOVERS`] of them, in the same transaction.
//!
//! Every slot (`ca/`, `ca/previous/`, `ca/next/`) holds `cert`, `key` and `crl`. The
//! successor's first CRL lists every serial the current CRL lists, and revocations go
//! to every CRL present (`CaStore::revoke`), so the current CA's CRL always lists every
//! revoked certificate of the store, whatever CA issued it (serials are unique across
//! CAs, and a CRL listing another CA's serials changes nothing for that CA's checks).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::{CaStore, next_crl_number, unix_micros};
use crate::PkiError;
use crate::handover::MAX_HANDOVERS;
use crate::inspect::crl_serials;
use crate::issue::Ca;
use crate::store::certificate_serial;

/// The slot of the CA that signs.
pub(crate) const CURRENT: &str = "ca";
/// The slot of the CA a rotation replaces, trusted until it is retired.
pub(crate) const PREVIOUS: &str = "ca/previous";
/// The slot of the CA a rotation introduced, trusted before it signs.
pub(crate) const NEXT: &str = "ca/next";

/// One trusted CA: its certificate and current CRL (DER).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedCa {
    pub cert: Vec<u8>,
    pub crl: Vec<u8>,
}

/// Where a rotation stands, from which slots hold a CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotationPhase {
    /// One CA, no rotation running.
    Settled,
    /// The successor is trusted but does not sign yet.
    Introduced,
    /// The successor signs; certificates of the old CA are being replaced.
    Reissuing,
}

impl RotationPhase {
    pub fn name(self) -> &'static str {
        match self {
            RotationPhase::Settled => "settled",
            RotationPhase::Introduced => "introduced",
            RotationPhase::Reissuing => "reissuing",
        }
    }
}

/// The CAs a store's certificates are checked against: the one that signs, and while a
/// rotation runs the one it replaces or introduces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedCas {
    pub current: TrustedCa,
    pub previous: Option<TrustedCa>,
    pub next: Option<TrustedCa>,
}

impl TrustedCas {
    pub fn phase(&self) -> RotationPhase {
        match (&self.previous, &self.next) {
            (Some(_), _) => RotationPhase::Reissuing,
            (None, Some(_)) => RotationPhase::Introduced,
            (None, None) => RotationPhase::Settled,
        }
    }

    fn all(&self) -> impl Iterator<Item = &TrustedCa> {
        std::iter::once(&self.current)
            .chain(self.next.as_ref())
            .chain(self.previous.as_ref())
    }

    /// The CA certificates trusted (DER), the signing one first.
    pub fn cas(&self) -> Vec<Vec<u8>> {
        self.all().map(|ca| ca.cert.clone()).collect()
    }

    /// Their CRLs (DER), in the same order.
    pub fn crls(&self) -> Vec<Vec<u8>> {
        self.all().map(|ca| ca.crl.clone()).collect()
    }

    /// From the keys under `ca/` (names within the store's namespace). Pure.
    pub(crate) fn decode(kvs: &[(String, Vec<u8>)]) -> Result<TrustedCas, PkiError> {
        let get = |name: String| kvs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone());
        let slot = |slot: &str| -> Result<Option<TrustedCa>, PkiError> {
            match (get(format!("{slot}/cert")), get(format!("{slot}/crl"))) {
                (Some(cert), Some(crl)) => Ok(Some(TrustedCa { cert, crl })),
                (None, None) => Ok(None),
                _ => Err(PkiError::Inconsistent(format!(
                    "CA {slot}: a certificate without a CRL or the reverse"
                ))),
            }
        };
        let current = slot(CURRENT)?.ok_or_else(|| PkiError::Inconsistent("no CA".into()))?;
        let (previous, next) = (slot(PREVIOUS)?, slot(NEXT)?);
        if previous.is_some() && next.is_some() {
            return Err(PkiError::Inconsistent(
                "a rotation both introducing and retiring a CA".into(),
            ));
        }
        Ok(TrustedCas {
            current,
            previous,
            next,
        })
    }
}

/// Where the handovers of a store's rotations are kept (`handover/<µs>`), one per
/// rotation: the CA replaced certifies its successor (`crate::handover`).
const HANDOVERS: &str = "handover/";

/// Most old handovers one introduction deletes (etcd allows 128 operations per
/// transaction); each introduction keeps the log at [`MAX_HANDOVERS`] or shrinks it.
const MAX_PRUNED_PER_ROTATION: usize = 64;

/// The current CA (as its slot was read) certifying `successor`.
fn handover_from(current: &[SlotKey], successor: &Ca) -> Result<Vec<u8>, PkiError> {
    let part = |name: &str| {
        current
            .iter()
            .find(|k| k.part == name)
            .and_then(|k| k.value.clone())
            .ok_or_else(|| PkiError::Inconsistent(format!("the current CA has no {name}")))
    };
    Ca::from_parts(part("cert")?, part("key")?)?.hand_over_to(successor)
}

/// One key of a CA slot as read: which part, its full key, mod revision, value.
struct SlotKey {
    part: &'static str,
    key: String,
    revision: i64,
    value: Option<Vec<u8>>,
}

impl SlotKey {
    /// The comparison that holds while the key is as read (absent: mod revision 0).
    fn unchanged(&self) -> Compare {
        Compare::mod_revision(self.key.clone(), CompareOp::Equal, self.revision)
    }
}

impl CaStore {
    /// The CAs trusted now (one read).
    pub async fn trusted(&self) -> Result<TrustedCas, PkiError> {
        let (_, kvs) = self.read_state("ca/", true).await?;
        TrustedCas::decode(&kvs)
    }

    /// The CAs trusted, kept current from one etcd watch (see `watch_state`): what
    /// every party that checks certificates of this store follows.
    pub fn watch_trusted(&self) -> tokio::sync::mpsc::Receiver<TrustedCas> {
        self.watch_state("ca/", true, TrustedCas::decode)
    }

    /// The keys of `slot` (part, full key), each with its mod revision (0: absent) and
    /// value, read in one transaction, for a guarded move.
    async fn read_slot(&self, slot: &str) -> Result<Vec<SlotKey>, PkiError> {
        let parts = ["cert", "key", "crl"];
        let keys: Vec<String> = parts
            .iter()
            .map(|part| self.ns.key(&format!("{slot}/{part}")))
            .collect();
        let response = self
            .ns
            .client()
            .txn(
                Txn::new().and_then(
                    keys.iter()
                        .map(|k| TxnOp::get(k.clone(), None))
                        .collect::<Vec<_>>(),
                ),
            )
            .await?;
        Ok(parts
            .iter()
            .zip(keys)
            .zip(response.op_responses())
            .map(|((part, key), op)| {
                let kv = match op {
                    etcd_client::TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                    _ => None,
                };
                SlotKey {
                    part,
                    key,
                    revision: kv.as_ref().map_or(0, |kv| kv.mod_revision()),
                    value: kv.map(|kv| kv.value().to_vec()),
                }
            })
            .collect())
    }

    /// Introduces `successor` (trusted, not signing) unless a rotation runs already;
    /// returns whether this call introduced it. Its first CRL lists what the current
    /// CRL lists, read and compared in the same transaction (a revocation meanwhile
    /// makes it read again).
    pub async fn introduce_successor(&self, successor: &Ca) -> Result<bool, PkiError> {
        for _ in 0..super::MAX_ATTEMPTS * 4 {
            let trusted = self.trusted().await?;
            if trusted.phase() != RotationPhase::Settled {
                return Ok(false);
            }
            let current = self.read_slot(CURRENT).await?;
            let handover = handover_from(&current, successor)?;
            // The log of handovers keeps the newest MAX_HANDOVERS, this one included.
            let stored = self.range(&self.ns.key(HANDOVERS)).await?;
            let pruned: Vec<TxnOp> = stored
                .iter()
                .take(stored.len().saturating_sub(MAX_HANDOVERS - 1))
                .take(MAX_PRUNED_PER_ROTATION)
                .map(|(key, _)| TxnOp::delete(key.clone(), None))
                .collect();
            let listed = crl_serials(&trusted.current.crl)?;
            let crl = successor.crl(&listed, next_crl_number(0, unix_micros()))?;
            let serial = certificate_serial(&successor.cert_der)?;
            let mut when: Vec<Compare> = current.iter().map(SlotKey::unchanged).collect();
            for slot in [PREVIOUS, NEXT] {
                when.push(Compare::create_revision(
                    self.ns.key(&format!("{slot}/cert")),
                    CompareOp::Equal,
                    0,
                ));
            }
            let txn = Txn::new().when(when).and_then(
                [
                    TxnOp::put(
                        self.ns.key(&format!("{NEXT}/cert")),
                        successor.cert_der.clone(),
                        None,
                    ),
                    TxnOp::put(
                        self.ns.key(&format!("{NEXT}/key")),
                        successor.key_pkcs8().to_vec(),
                        None,
                    ),
                    TxnOp::put(self.ns.key(&format!("{NEXT}/crl")), crl, None),
                    TxnOp::put(
                        self.ns.key(&format!("serials/{}", hex::encode(&serial))),
                        "ca",
                        None,
                    ),
                    TxnOp::put(
                        self.ns.key(&format!("{HANDOVERS}{:020}", unix_micros())),
                        handover.clone(),
                        None,
                    ),
                ]
                .into_iter()
                .chain(pruned)
                .collect::<Vec<_>>(),
            );
            if self.ns.client().txn(txn).await?.succeeded() {
                return Ok(true);
            }
        }
        Err(PkiError::Inconsistent(
            "the CA kept changing while a successor was introduced".into(),
        ))
    }

    /// The handovers of every rotation of this store, oldest first, at most the last
    /// [`MAX_HANDOVERS`] (see `crate::handover`). Read from the local member alone, so
    /// that a curator without quorum still answers them (GetCACertificate is answered
    /// without one): a list behind the cluster's can only fail a client's check (it
    /// verifies every signature itself), never make it trust a CA it should not.
    pub async fn handovers(&self) -> Result<Vec<Vec<u8>>, PkiError> {
        let all = self.range_local(&self.ns.key(HANDOVERS)).await?;
        let skip = all.len().saturating_sub(MAX_HANDOVERS);
        Ok(all.into_iter().skip(skip).map(|(_, v)| v).collect())
    }

    /// Makes the introduced successor sign and keeps the old CA trusted (phase
    /// reissuing), in one transaction guarded by every key it moves; returns whether
    /// this call did (false: nothing was introduced, e.g. another curator promoted it).
    pub async fn promote_successor(&self) -> Result<bool, PkiError> {
        self.move_slots(
            RotationPhase::Introduced,
            &[(CURRENT, PREVIOUS), (NEXT, CURRENT)],
        )
        .await
    }

    /// Stops trusting the CA a promotion replaced (phase settled); returns whether this
    /// call did.
    pub async fn retire_previous(&self) -> Result<bool, PkiError> {
        self.move_slots(RotationPhase::Reissuing, &[(PREVIOUS, "")])
            .await
    }

    /// Moves each `(from, to)` slot's keys (to "" deletes them), in one transaction
    /// guarded by the mod revisions of every key of every slot involved, while the
    /// store is in `phase`. Retries when a revocation changed a CRL meanwhile.
    async fn move_slots(
        &self,
        phase: RotationPhase,
        moves: &[(&str, &str)],
    ) -> Result<bool, PkiError> {
        for _ in 0..super::MAX_ATTEMPTS * 4 {
            if self.trusted().await?.phase() != phase {
                return Ok(false);
            }
            let mut when = Vec::new();
            let mut puts = Vec::new();
            let mut deletes = Vec::new();
            for (from, to) in moves {
                for slot_key in self.read_slot(from).await? {
                    when.push(slot_key.unchanged());
                    if let (false, Some(value)) = (to.is_empty(), slot_key.value) {
                        puts.push((self.ns.key(&format!("{to}/{}", slot_key.part)), value));
                    }
                    deletes.push(slot_key.key);
                }
            }
            // A key both moved away and moved into (the current slot) is written, not
            // deleted.
            let written: Vec<String> = puts.iter().map(|(k, _)| k.clone()).collect();
            let ops: Vec<TxnOp> = deletes
                .into_iter()
                .filter(|k| !written.contains(k))
                .map(|k| TxnOp::delete(k, None))
                .chain(puts.into_iter().map(|(k, v)| TxnOp::put(k, v, None)))
                .collect();
            if self
                .ns
                .client()
                .txn(Txn::new().when(when).and_then(ops))
                .await?
                .succeeded()
            {
                return Ok(true);
            }
        }
        Err(PkiError::Inconsistent(
            "the CAs kept changing while a rotation moved them".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: &str, v: &[u8]) -> (String, Vec<u8>) {
        (k.to_string(), v.to_vec())
    }

    #[test]
    fn phases_follow_the_slots_held() {
        let settled = [kv("ca/cert", b"O"), kv("ca/crl", b"o"), kv("ca/key", b"k")];
        let t = TrustedCas::decode(&settled).unwrap();
        assert_eq!(
            (t.phase(), t.cas()),
            (RotationPhase::Settled, vec![b"O".to_vec()])
        );
        let mut introduced = settled.to_vec();
        introduced.extend([kv("ca/next/cert", b"N"), kv("ca/next/crl", b"n")]);
        let t = TrustedCas::decode(&introduced).unwrap();
        assert_eq!(t.phase(), RotationPhase::Introduced);
        assert_eq!(t.cas(), vec![b"O".to_vec(), b"N".to_vec()]);
        assert_eq!(t.crls(), vec![b"o".to_vec(), b"n".to_vec()]);
        let reissuing = [
            kv("ca/cert", b"N"),
            kv("ca/crl", b"n"),
            kv("ca/previous/cert", b"O"),
            kv("ca/previous/crl", b"o"),
        ];
        let t = TrustedCas::decode(&reissuing).unwrap();
        assert_eq!(t.phase(), RotationPhase::Reissuing);
        assert_eq!(t.cas(), vec![b"N".to_vec(), b"O".to_vec()]);
    }

    #[test]
    fn half_a_slot_or_both_rotations_at_once_is_inconsistent() {
        assert!(TrustedCas::decode(&[kv("ca/crl", b"o")]).is_err());
        assert!(TrustedCas::decode(&[]).is_err());
        let both = [
            kv("ca/cert", b"N"),
            kv("ca/crl", b"n"),
            kv("ca/previous/cert", b"O"),
            kv("ca/previous/crl", b"o"),
            kv("ca/next/cert", b"M"),
            kv("ca/next/crl", b"m"),
        ];
        assert!(TrustedCas::decode(&both).is_err());
        let half = [
            kv("ca/cert", b"N"),
            kv("ca/crl", b"n"),
            kv("ca/next/cert", b"M"),
        ];
        assert!(TrustedCas::decode(&half).is_err());
    }
}
