//! The PKI's etcd storage, with create-if-absent ("ensure") semantics.
//!
//! Layout inside the store's namespace (e.g. `namespaced:curator/cluster-pki/`):
//! ```text
//!   ca/cert           DER of the CA certificate
//!   ca/key            PKCS#8 of the CA key
//!   ca/crl            DER of the current CRL (empty list at creation)
//!   ca/next/…         while a rotation introduces a successor: its cert, key, crl
//!   ca/previous/…     while a rotation replaces certificates: the old CA's cert, key, crl
//!   issued/<name>     DER of a named certificate, e.g. issued/node-polis-…; one long
//!                     expired and superseded is forgotten (`prune_superseded`)
//!   serials/<hex>     what the serial was issued for (the CA, or a certificate name)
//!   revoked/<hex>     the end of validity (Unix seconds, 8 bytes big-endian) of a
//!                     revoked certificate on the CRL, so that it can leave it
//! ```
//!
//! The CRL stays bounded: a revocation drops the entries whose certificates expired
//! (an expired certificate is refused on its dates anyway), and every new CRL carries a
//! number above the one it replaces, so clients that take only newer CRLs
//! (`rpc::TrustSlot`) take a shorter one too. That number is also at least the time of
//! issue in Unix microseconds ([`next_crl_number`]): a cluster restored from a backup
//! (or recovered from a lagging member) holds an older CRL than some clients saw, and
//! its next CRL ([`CaStore::reissue_crl`] at once) must still be newer than those.
//! Listings are read in pages.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};

use consensus::Namespaced;
use consensus::client::txn_get_value;
use consensus::pages::Pages;

use crate::PkiError;
use crate::inspect::{crl_serials, time_to_expiry};
use crate::issue::{Ca, Issued};

mod prune;
mod rotation;
pub use rotation::{RotationPhase, TrustedCa, TrustedCas};

/// How often a store operation retries after losing a race or a serial collision.
const MAX_ATTEMPTS: usize = 5;

/// Records per range read when listing (etcd refuses answers over its request limit,
/// ~1.5 MiB, which a single read of every certificate passes after a few thousand).
const PAGE: i64 = 500;

/// An expired certificate leaves the CRL only this long after its end of validity:
/// room for clocks that differ (the same allowance as before issue, `BACKDATE`).
const EXPIRY_GRACE: Duration = crate::BACKDATE;

/// The serials of `on_crl` to keep on the next CRL at `now` (Unix seconds): all but
/// those whose certificate is known (`expiry`) to have ended more than
/// [`EXPIRY_GRACE`] ago. Pure.
fn unexpired(
    on_crl: Vec<Vec<u8>>,
    expiry: &std::collections::HashMap<Vec<u8>, u64>,
    now: u64,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    on_crl.into_iter().partition(|serial| {
        expiry
            .get(serial)
            .is_none_or(|not_after| not_after + EXPIRY_GRACE.as_secs() > now)
    })
}

/// The number of a CRL that replaces the one numbered `previous`, issued at `now_micros`
/// (Unix microseconds): above `previous`, and never below the clock, so that it also
/// passes every CRL issued earlier by a copy of this CA's store that this one does not
/// know of (the cluster a backup was taken from, after the backup), as long as the
/// issuers' clocks roughly agree. Numbers of the old rule (previous + 1 from 1) lie far
/// below. Pure.
fn next_crl_number(previous: u64, now_micros: u64) -> u64 {
    previous.saturating_add(1).max(now_micros)
}

/// The clock CRL numbers follow (Unix microseconds; 0 before 1970).
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Decodes what a watched key (or the keys under it) holds, from (key within the
/// namespace, value) pairs in key order.
pub(crate) type Decode<T> = fn(&[(String, Vec<u8>)]) -> Result<T, PkiError>;

/// Pause before re-establishing a failed CRL watch, doubling up to the maximum.
const WATCH_RETRY_FIRST: Duration = Duration::from_millis(100);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);

/// How [`CaStore::record_new_certificate_guarded`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewRecord {
    /// Recorded.
    Recorded,
    /// Nothing recorded: a certificate is recorded under the name already (DER).
    Exists(Vec<u8>),
    /// Nothing recorded: a guard failed (or, 2^-64, the serial is taken).
    NotRecorded,
}

/// One CA's storage in etcd.
#[derive(Debug, Clone)]
pub struct CaStore {
    ns: Namespaced,
}

/// The serial number of a DER certificate (as the CRL lists it).
pub fn certificate_serial(der: &[u8]) -> Result<Vec<u8>, PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::Invalid {
        what: "certificate",
        reason: e.to_string(),
    })?;
    Ok(cert.raw_serial().to_vec())
}

impl CaStore {
    /// A store rooted at `ns` (one CA per namespace).
    pub fn new(ns: Namespaced) -> CaStore {
        CaStore { ns }
    }

    /// Stores `candidate()` as this store's CA unless a CA is already stored; returns the
    /// stored CA and whether this call created it. Racing callers all get the same CA.
    pub async fn ensure_ca(
        &self,
        candidate: impl FnOnce() -> Result<Ca, PkiError>,
    ) -> Result<(Ca, bool), PkiError> {
        if let Some(ca) = self.load_ca().await? {
            return Ok((ca, false));
        }
        let ca = candidate()?;
        let serial = certificate_serial(&ca.cert_der)?;
        let empty_crl = ca.crl(&[], 1)?;
        let cert_key = self.ns.key("ca/cert");
        let txn = Txn::new()
            .when([Compare::create_revision(
                cert_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(cert_key.clone(), ca.cert_der.clone(), None),
                TxnOp::put(self.ns.key("ca/key"), ca.key_pkcs8().to_vec(), None),
                TxnOp::put(self.ns.key("ca/crl"), empty_crl, None),
                TxnOp::put(
                    self.ns.key(&format!("serials/{}", hex::encode(&serial))),
                    "ca",
                    None,
                ),
            ])
            .or_else([
                TxnOp::get(cert_key, None),
                TxnOp::get(self.ns.key("ca/key"), None),
            ]);
        let response = self.ns.client().txn(txn).await?;
        if response.succeeded() {
            return Ok((ca, true));
        }
        let ops = response.op_responses();
        let stored = Self::ca_from(txn_get_value(ops.first()), txn_get_value(ops.get(1)))?
            .ok_or_else(|| PkiError::Inconsistent("CA vanished during ensure".into()))?;
        Ok((stored, false))
    }

    fn ca_from(cert: Option<Vec<u8>>, key: Option<Vec<u8>>) -> Result<Option<Ca>, PkiError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(Ca::from_parts(cert, key)?)),
            (None, None) => Ok(None),
            _ => Err(PkiError::Inconsistent(
                "CA certificate and key are not both present".into(),
            )),
        }
    }

    /// The stored CA, if any.
    pub async fn load_ca(&self) -> Result<Option<Ca>, PkiError> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.ns.key("ca/cert"), None),
            TxnOp::get(self.ns.key("ca/key"), None),
        ]);
        let response = self.ns.client().txn(txn).await?;
        let ops = response.op_responses();
        Self::ca_from(txn_get_value(ops.first()), txn_get_value(ops.get(1)))
    }

    /// [`Self::load_ca`] from the local etcd member alone (serializable): answered
    /// without a quorum, possibly behind it (a member signing what it says of itself).
    pub async fn load_ca_local(&self) -> Result<Option<Ca>, PkiError> {
        let slot = self.range_local(&self.ns.key("ca/")).await?;
        let value = |part: &str| {
            let key = self.ns.key(part);
            slot.iter()
                .find(|(k, _)| k.as_slice() == key.as_bytes())
                .map(|(_, v)| v.clone())
        };
        Self::ca_from(value("ca/cert"), value("ca/key"))
    }

    /// Returns the certificate stored under `name`; if there is none, stores the one
    /// `issue` returns (with its serial). Racing callers get the same certificate.
    pub async fn ensure_certificate(
        &self,
        name: &str,
        issue: impl FnMut() -> Result<Issued, PkiError>,
    ) -> Result<Vec<u8>, PkiError> {
        self.ensure_certificate_guarded(name, Vec::new(), issue)
            .await
    }

    /// Records `issued` under `name` in one transaction, without reading first: only if
    /// nothing is recorded under `name` yet, its serial is unused, and every `guard`
    /// comparison holds (see [`CaStore::ensure_certificate_guarded`], which reads first
    /// and retries). The common case of a first issue costs one round trip; any other
    /// outcome is for the caller to decide on with a read.
    pub async fn record_new_certificate_guarded(
        &self,
        name: &str,
        guard: Vec<Compare>,
        issued: &Issued,
    ) -> Result<NewRecord, PkiError> {
        let cert_key = self.ns.key(&format!("issued/{name}"));
        let serial_key = self
            .ns
            .key(&format!("serials/{}", hex::encode(&issued.serial)));
        let mut when = vec![
            Compare::create_revision(cert_key.clone(), CompareOp::Equal, 0),
            Compare::create_revision(serial_key.clone(), CompareOp::Equal, 0),
        ];
        when.extend(guard);
        let txn = Txn::new()
            .when(when)
            .and_then([
                TxnOp::put(cert_key.clone(), issued.der.clone(), None),
                TxnOp::put(serial_key, name, None),
            ])
            .or_else([TxnOp::get(cert_key, None)]);
        let response = self.ns.client().txn(txn).await?;
        if response.succeeded() {
            return Ok(NewRecord::Recorded);
        }
        Ok(match txn_get_value(response.op_responses().first()) {
            Some(existing) => NewRecord::Exists(existing),
            None => NewRecord::NotRecorded,
        })
    }

    /// [`CaStore::ensure_certificate`], recording only while every `guard` comparison
    /// holds, in the same transaction (e.g. the recipient's record unchanged since it
    /// was checked): a certificate is either recorded before the guarded keys changed
    /// or not at all ([`PkiError::Fenced`]). One already recorded under `name` is
    /// returned as before.
    pub async fn ensure_certificate_guarded(
        &self,
        name: &str,
        guard: Vec<Compare>,
        mut issue: impl FnMut() -> Result<Issued, PkiError>,
    ) -> Result<Vec<u8>, PkiError> {
        let cert_key = self.ns.key(&format!("issued/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            if let Some(existing) = self.ns.get(&format!("issued/{name}")).await? {
                return Ok(existing);
            }
            let Issued { der, serial } = issue()?;
            let serial_key = self.ns.key(&format!("serials/{}", hex::encode(&serial)));
            let mut when = vec![
                Compare::create_revision(cert_key.clone(), CompareOp::Equal, 0),
                Compare::create_revision(serial_key.clone(), CompareOp::Equal, 0),
            ];
            when.extend(guard.iter().cloned());
            let txn = Txn::new()
                .when(when)
                .and_then([
                    TxnOp::put(cert_key.clone(), der.clone(), None),
                    TxnOp::put(serial_key, name, None),
                ])
                .or_else([TxnOp::get(cert_key.clone(), None)]);
            let response = self.ns.client().txn(txn).await?;
            if response.succeeded() {
                return Ok(der);
            }
            if let Some(existing) = txn_get_value(response.op_responses().first()) {
                return Ok(existing);
            }
            if !guard.is_empty() {
                // Not a serial collision (a 2^-64 event) but the guard: the recipient
                // changed since it was checked.
                return Err(PkiError::Fenced(format!(
                    "certificate {name} not recorded: its recipient changed while it was issued"
                )));
            }
            // Serial collision with another certificate: issue again with a new serial.
        }
        Err(PkiError::Inconsistent(format!(
            "could not store certificate {name} after {MAX_ATTEMPTS} attempts"
        )))
    }

    /// Revokes every certificate stored under a name starting with `prefix` (e.g. all
    /// etcd peer certificates of one node) that has not expired yet (an expired one is
    /// refused anyway; leaving it out keeps the CRL short); returns how many that were.
    /// Revoking an already revoked certificate changes nothing.
    pub async fn revoke_issued(&self, prefix: &str) -> Result<usize, PkiError> {
        self.revoke_issued_where(prefix, |_| true).await
    }

    /// [`CaStore::revoke_issued`] for the certificates `issuer` (a CA certificate, DER)
    /// issued: a CA rotation revokes what the CA it retires issued, for verifiers that
    /// keep trusting that CA until they restart (etcd 3.4's peer TLS).
    pub async fn revoke_issued_by(&self, prefix: &str, issuer: &[u8]) -> Result<usize, PkiError> {
        self.revoke_issued_where(prefix, |der| crate::issued_by(der, issuer))
            .await
    }

    async fn revoke_issued_where(
        &self,
        prefix: &str,
        wanted: impl Fn(&[u8]) -> bool,
    ) -> Result<usize, PkiError> {
        let mut serials = Vec::new();
        for (_, der) in self.list_issued(prefix).await? {
            if wanted(&der) && time_to_expiry(&der)?.is_some() {
                serials.push(certificate_serial(&der)?);
            }
        }
        for serial in &serials {
            self.revoke(serial).await?;
        }
        Ok(serials.len())
    }

    /// Every certificate recorded under a name starting with `prefix` ("" for all), as
    /// (name, DER), in name order, read in pages of [`PAGE`].
    pub async fn list_issued(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, PkiError> {
        let base = self.ns.key("issued/");
        let records = self.range(&format!("{base}{prefix}")).await?;
        records
            .into_iter()
            .map(|(key, value)| {
                let key = String::from_utf8(key)
                    .map_err(|_| PkiError::Inconsistent("non-UTF-8 certificate name".into()))?;
                let name = key.strip_prefix(base.as_str()).unwrap_or(&key).to_string();
                Ok((name, value))
            })
            .collect()
    }

    /// Every (key, value) under the full key prefix `prefix`, in key order, read in
    /// pages of [`PAGE`] at one revision (`consensus::pages`).
    async fn range(&self, prefix: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>, PkiError> {
        self.read_pages(Pages::prefix(&self.ns.client(), prefix).page_keys(PAGE))
            .await
    }

    /// [`Self::range`] from the local etcd member alone (serializable): answered without
    /// a quorum, possibly behind it.
    async fn range_local(&self, prefix: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>, PkiError> {
        self.read_pages(
            Pages::prefix(&self.ns.client(), prefix)
                .page_keys(PAGE)
                .serializable(),
        )
        .await
    }

    async fn read_pages(&self, pages: Pages) -> Result<Vec<(Vec<u8>, Vec<u8>)>, PkiError> {
        Ok(consensus::pages::read(pages)
            .await?
            .kvs
            .into_iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect())
    }

    /// The current CRL (DER).
    pub async fn crl(&self) -> Result<Vec<u8>, PkiError> {
        self.ns
            .get("ca/crl")
            .await?
            .ok_or_else(|| PkiError::Inconsistent("CA has no CRL".into()))
    }

    /// The CA's CRL (DER), kept current from one etcd watch: the stored CRL first, then
    /// every CRL that differs from the last one sent, in order (see
    /// [`CaStore::watch_state`]).
    ///
    /// Consumers: anything that keeps a file copy of a CRL current (etcd's
    /// `--peer-crl-file`).
    pub fn watch_crl(&self) -> tokio::sync::mpsc::Receiver<Vec<u8>> {
        self.watch_state("ca/crl", false, |kvs| {
            kvs.first()
                .map(|(_, value)| value.clone())
                .ok_or_else(|| PkiError::Inconsistent("CA has no CRL".into()))
        })
    }

    /// What is stored under `key` (every key under it when `prefix`), decoded by
    /// `decode` from (key within the namespace, value) pairs in key order: sent first as
    /// read, then again on every change that decodes to something else. A broken watch
    /// (etcd restarting, compaction, a lost connection) is logged and re-established
    /// after a backoff of 0.1 s doubling to 5 s, starting again from a read, so no
    /// change is missed. The background task ends when the receiver is dropped; the
    /// channel never closes otherwise. Needs a tokio runtime.
    pub(crate) fn watch_state<T>(
        &self,
        key: &'static str,
        prefix: bool,
        decode: Decode<T>,
    ) -> tokio::sync::mpsc::Receiver<T>
    where
        T: Clone + PartialEq + Send + 'static,
    {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let store = self.clone();
        tokio::spawn(async move {
            let mut last: Option<T> = None;
            let mut pause = WATCH_RETRY_FIRST;
            loop {
                let outcome = tokio::select! {
                    o = store.follow_state(key, prefix, decode, &tx, &mut last, &mut pause) => o,
                    _ = tx.closed() => return,
                };
                match outcome {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(
                        namespace = store.ns.key(""),
                        key,
                        "watching the PKI store: {}; retrying in {pause:?}",
                        supervisor::error_chain(&e)
                    ),
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = tx.closed() => return,
                }
                pause = (pause * 2).min(WATCH_RETRY_MAX);
            }
        });
        rx
    }

    /// Reads `key` (or the keys under it) as (key within the namespace, value) pairs,
    /// with the revision read at.
    async fn read_state(
        &self,
        key: &str,
        prefix: bool,
    ) -> Result<(i64, Vec<(String, Vec<u8>)>), PkiError> {
        let options = prefix.then(|| GetOptions::new().with_prefix());
        let response = self.ns.client().get(self.ns.key(key), options).await?;
        let revision = response
            .header()
            .ok_or_else(|| PkiError::Inconsistent("etcd range response without header".into()))?
            .revision();
        let base = self.ns.key("");
        let kvs = response
            .kvs()
            .iter()
            .map(|kv| {
                let full = String::from_utf8_lossy(kv.key()).into_owned();
                let name = full
                    .strip_prefix(base.as_str())
                    .unwrap_or(&full)
                    .to_string();
                (name, kv.value().to_vec())
            })
            .collect();
        Ok((revision, kvs))
    }

    /// One watch for [`CaStore::watch_state`]: sends what changed since `last`; `Ok`
    /// only when the receiver is gone.
    async fn follow_state<T: Clone + PartialEq>(
        &self,
        key: &str,
        prefix: bool,
        decode: Decode<T>,
        tx: &tokio::sync::mpsc::Sender<T>,
        last: &mut Option<T>,
        pause: &mut Duration,
    ) -> Result<(), PkiError> {
        let (revision, kvs) = self.read_state(key, prefix).await?;
        let mut options = WatchOptions::new().with_start_revision(revision + 1);
        if prefix {
            options = options.with_prefix();
        }
        let mut stream = self
            .ns
            .client()
            .watch(self.ns.key(key), Some(options))
            .await?;
        let mut send = async |state: T| {
            if last.as_ref() == Some(&state) {
                return true;
            }
            *last = Some(state.clone());
            tx.send(state).await.is_ok()
        };
        if !send(decode(&kvs)?).await {
            return Ok(());
        }
        // The watch is established and the state read: the next failure is a new one.
        *pause = WATCH_RETRY_FIRST;
        loop {
            let Some(response) = stream.message().await? else {
                return Err(PkiError::Inconsistent("the etcd watch ended".into()));
            };
            if response.canceled() {
                return Err(PkiError::Inconsistent(format!(
                    "etcd cancelled the watch ({})",
                    response.cancel_reason()
                )));
            }
            if response.events().is_empty() {
                continue;
            }
            // Several keys change in one transaction (a rotation's step): decode what
            // is stored once the events are in, not each event alone.
            let (_, kvs) = self.read_state(key, prefix).await?;
            match decode(&kvs) {
                Ok(state) => {
                    if !send(state).await {
                        return Ok(());
                    }
                }
                // Keep checking against the last state rather than accept everything.
                Err(e) => tracing::error!(key, "the PKI store holds {e}; keeping the last state"),
            }
        }
    }

    /// Adds `serial` to the CRL, dropping the entries of certificates that expired (see
    /// the module documentation); returns the current CA's CRL. While a rotation runs,
    /// the serial goes on the CRL of every CA trusted (the current one's last, so that
    /// it lists every revocation once it is done). Concurrent revocations are serialized
    /// by a compare-and-swap on each CRL's revision; none is lost.
    pub async fn revoke(&self, serial: &[u8]) -> Result<Vec<u8>, PkiError> {
        self.revoke_as_of(serial, crate::unix_now()).await
    }

    /// [`CaStore::revoke`] with the time (Unix seconds) against which expiry is judged.
    pub async fn revoke_as_of(&self, serial: &[u8], now: u64) -> Result<Vec<u8>, PkiError> {
        let not_after = self.end_of(serial).await?;
        let added = Some((serial, not_after));
        for slot in [rotation::PREVIOUS, rotation::NEXT] {
            // None: no rotation holds a CA there (or it moved meanwhile: the current
            // CA's CRL, written last, is then the one that counts).
            self.replace_crl(slot, now, added).await?;
        }
        self.current_crl_replaced(self.replace_crl(rotation::CURRENT, now, added).await?)
    }

    fn current_crl_replaced(&self, crl: Option<Vec<u8>>) -> Result<Vec<u8>, PkiError> {
        crl.ok_or_else(|| PkiError::Inconsistent("CA has no CRL".into()))
    }

    /// Signs the CRL again with the same entries (less those of certificates that
    /// expired, as a revocation drops them) and a new number from
    /// [`next_crl_number`]; returns it. For a store just brought back from a backup:
    /// clients that took CRLs issued after the backup keep only a newer one, so until
    /// this CRL reaches them they would ignore the restored cluster's CRLs.
    pub async fn reissue_crl(&self) -> Result<Vec<u8>, PkiError> {
        for slot in [rotation::PREVIOUS, rotation::NEXT] {
            self.replace_crl(slot, crate::unix_now(), None).await?;
        }
        self.current_crl_replaced(
            self.replace_crl(rotation::CURRENT, crate::unix_now(), None)
                .await?,
        )
    }

    /// Replaces the CRL of the CA in `slot` (`ca`, or a rotation's `ca/previous` or
    /// `ca/next`) by one listing its unexpired entries at `now` (Unix seconds) and
    /// `added` (a serial and, when this store recorded it, its end of validity),
    /// numbered by [`next_crl_number`] and signed by that CA as it is read with the CRL
    /// (a rotation may move CAs between slots meanwhile). A compare-and-swap on the
    /// CRL's revision serializes concurrent replacements; none is lost. A serial
    /// already listed changes nothing. `None`: no CA is in `slot`.
    async fn replace_crl(
        &self,
        slot: &str,
        now: u64,
        added: Option<(&[u8], Option<u64>)>,
    ) -> Result<Option<Vec<u8>>, PkiError> {
        let crl_key = self.ns.key(&format!("{slot}/crl"));
        for _ in 0..MAX_ATTEMPTS * 4 {
            let response = self
                .ns
                .client()
                .txn(Txn::new().and_then([
                    TxnOp::get(crl_key.clone(), None),
                    TxnOp::get(self.ns.key(&format!("{slot}/cert")), None),
                    TxnOp::get(self.ns.key(&format!("{slot}/key")), None),
                ]))
                .await?;
            let ops = response.op_responses();
            let ca = Self::ca_from(txn_get_value(ops.get(1)), txn_get_value(ops.get(2)))?;
            let crl = ops.first().and_then(|op| match op {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().cloned(),
                _ => None,
            });
            let (kv, ca) = match (crl, ca) {
                (Some(kv), Some(ca)) => (kv, ca),
                (None, None) => return Ok(None),
                _ => return Err(PkiError::Inconsistent(format!("CA {slot} has no CRL"))),
            };
            let on_crl = crl_serials(kv.value())?;
            if let Some((serial, _)) = added
                && on_crl.iter().any(|s| s == serial)
            {
                return Ok(Some(kv.value().to_vec()));
            }
            let expiry = self.revoked_expiries().await?;
            let (mut kept, dropped) = unexpired(on_crl, &expiry, now);
            let mut ops = Vec::new();
            if let Some((serial, not_after)) = added {
                kept.push(serial.to_vec());
                if let Some(not_after) = not_after {
                    ops.push(TxnOp::put(
                        self.revoked_key(serial),
                        not_after.to_be_bytes().to_vec(),
                        None,
                    ));
                }
            }
            let previous = crate::verified_crl_number(kv.value(), &ca.cert_der)?;
            let crl = ca.crl(&kept, next_crl_number(previous, unix_micros()))?;
            ops.push(TxnOp::put(crl_key.clone(), crl.clone(), None));
            // The ends of validity are shared by every CA's CRL: they go with the
            // current one's, which a rotation's other CRLs never outlive.
            if slot == rotation::CURRENT {
                ops.extend(
                    dropped
                        .iter()
                        .map(|s| TxnOp::delete(self.revoked_key(s), None)),
                );
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    crl_key.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then(ops);
            if self.ns.client().txn(txn).await?.succeeded() {
                return Ok(Some(crl));
            }
        }
        Err(PkiError::Inconsistent(
            "CRL kept changing while it was replaced".into(),
        ))
    }

    fn revoked_key(&self, serial: &[u8]) -> String {
        self.ns.key(&format!("revoked/{}", hex::encode(serial)))
    }

    /// When the certificate with `serial` ends (Unix seconds), from its record; `None`
    /// when this store recorded no certificate with that serial.
    async fn end_of(&self, serial: &[u8]) -> Result<Option<u64>, PkiError> {
        let Some(name) = self
            .ns
            .get(&format!("serials/{}", hex::encode(serial)))
            .await?
        else {
            return Ok(None);
        };
        let name = String::from_utf8(name)
            .map_err(|_| PkiError::Inconsistent("non-UTF-8 certificate name".into()))?;
        let der = match name.as_str() {
            "ca" => self.ns.get("ca/cert").await?,
            name => self.ns.get(&format!("issued/{name}")).await?,
        };
        der.map(|der| crate::Validity::of(&der).map(|v| v.not_after))
            .transpose()
    }

    /// The recorded ends of validity of the certificates on the CRL, by serial.
    async fn revoked_expiries(&self) -> Result<std::collections::HashMap<Vec<u8>, u64>, PkiError> {
        let base = self.ns.key("revoked/");
        let mut out = std::collections::HashMap::new();
        for (key, value) in self.range(&base).await? {
            let serial = std::str::from_utf8(&key[base.len()..])
                .ok()
                .and_then(|h| hex::decode(h).ok());
            let not_after = <[u8; 8]>::try_from(value.as_slice()).ok();
            if let (Some(serial), Some(not_after)) = (serial, not_after) {
                out.insert(serial, u64::from_be_bytes(not_after));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_certificates_leave_the_crl_after_the_grace() {
        let grace = EXPIRY_GRACE.as_secs();
        let expiry: std::collections::HashMap<Vec<u8>, u64> =
            [(vec![1], 1000), (vec![2], 5000)].into();
        let on_crl = vec![vec![1], vec![2], vec![3]];
        // Before the first ends (plus grace): all stay; [3] has no recorded end: stays.
        let (kept, dropped) = unexpired(on_crl.clone(), &expiry, 1000 + grace - 1);
        assert_eq!((kept.len(), dropped.len()), (3, 0));
        let (kept, dropped) = unexpired(on_crl, &expiry, 1000 + grace);
        assert_eq!(kept, vec![vec![2], vec![3]]);
        assert_eq!(dropped, vec![vec![1]]);
    }

    #[test]
    fn crl_numbers_grow_and_follow_the_clock() {
        let now = 1_780_000_000_000_000; // 2026, in microseconds
        // The old rule's small numbers jump to the clock.
        assert_eq!(next_crl_number(1, now), now);
        assert_eq!(next_crl_number(41, now), now);
        // Two CRLs within a microsecond, or a clock that went back: still above.
        assert_eq!(next_crl_number(now, now), now + 1);
        assert_eq!(next_crl_number(now + 500, now), now + 501);
        // A CRL issued after a backup (later clock) is passed by a restore's next one.
        let after_backup = next_crl_number(next_crl_number(1, now), now + 10);
        assert!(next_crl_number(1, now + 20) > after_backup);
    }
}
