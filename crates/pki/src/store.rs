//! The PKI's etcd storage, with create-if-absent ("ensure") semantics.
//!
//! Layout inside the store's namespace (e.g. `namespaced:curator/cluster-pki/`):
//! ```text
//!   ca/cert           DER of the CA certificate
//!   ca/key            PKCS#8 of the CA key
//!   ca/crl            DER of the current CRL (empty list at creation)
//!   issued/<name>     DER of a named certificate, e.g. issued/node-polis-…
//!   serials/<hex>     what the serial was issued for (the CA, or a certificate name)
//! ```

use std::time::Duration;

use etcd_client::{Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, WatchOptions};

use consensus::Namespaced;
use consensus::client::txn_get_value;

use crate::PkiError;
use crate::inspect::{crl_serials, time_to_expiry};
use crate::issue::{Ca, Issued};

/// How often a store operation retries after losing a race or a serial collision.
const MAX_ATTEMPTS: usize = 5;

/// Pause before re-establishing a failed CRL watch, doubling up to the maximum.
const WATCH_RETRY_FIRST: Duration = Duration::from_millis(100);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);

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

    /// Returns the certificate stored under `name`; if there is none, stores the one
    /// `issue` returns (with its serial). Racing callers get the same certificate.
    pub async fn ensure_certificate(
        &self,
        name: &str,
        mut issue: impl FnMut() -> Result<Issued, PkiError>,
    ) -> Result<Vec<u8>, PkiError> {
        let cert_key = self.ns.key(&format!("issued/{name}"));
        for _ in 0..MAX_ATTEMPTS {
            if let Some(existing) = self.ns.get(&format!("issued/{name}")).await? {
                return Ok(existing);
            }
            let Issued { der, serial } = issue()?;
            let serial_key = self.ns.key(&format!("serials/{}", hex::encode(&serial)));
            let txn = Txn::new()
                .when([
                    Compare::create_revision(cert_key.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(serial_key.clone(), CompareOp::Equal, 0),
                ])
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
    pub async fn revoke_issued(&self, ca: &Ca, prefix: &str) -> Result<usize, PkiError> {
        let key = self.ns.key(&format!("issued/{prefix}"));
        let response = self
            .ns
            .client()
            .get(key, Some(GetOptions::new().with_prefix()))
            .await?;
        let mut serials = Vec::new();
        for kv in response.kvs() {
            if time_to_expiry(kv.value())?.is_some() {
                serials.push(certificate_serial(kv.value())?);
            }
        }
        for serial in &serials {
            self.revoke(ca, serial).await?;
        }
        Ok(serials.len())
    }

    /// Every certificate recorded under a name starting with `prefix` ("" for all), as
    /// (name, DER), in name order. One etcd range read.
    pub async fn list_issued(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, PkiError> {
        let base = self.ns.key("issued/");
        let response = self
            .ns
            .client()
            .get(
                format!("{base}{prefix}"),
                Some(GetOptions::new().with_prefix()),
            )
            .await?;
        response
            .kvs()
            .iter()
            .map(|kv| {
                let key = std::str::from_utf8(kv.key())
                    .map_err(|_| PkiError::Inconsistent("non-UTF-8 certificate name".into()))?;
                let name = key.strip_prefix(base.as_str()).unwrap_or(key);
                Ok((name.to_string(), kv.value().to_vec()))
            })
            .collect()
    }

    /// The current CRL (DER).
    pub async fn crl(&self) -> Result<Vec<u8>, PkiError> {
        self.ns
            .get("ca/crl")
            .await?
            .ok_or_else(|| PkiError::Inconsistent("CA has no CRL".into()))
    }

    /// The CA's CRL (DER), kept current from one etcd watch: the stored CRL first, then
    /// every CRL that differs from the last one sent, in order. A broken watch (etcd
    /// restarting, compaction, a lost connection) is logged and re-established after a
    /// backoff of 0.1 s doubling to 5 s, starting again from a read of the stored CRL,
    /// so no revocation is missed. The background task ends when the receiver is
    /// dropped; the channel never closes otherwise. Needs a tokio runtime.
    ///
    /// Consumers: the curator's per-call certificate check, and anything that keeps a
    /// file copy of a CRL current (etcd's `--peer-crl-file`).
    pub fn watch_crl(&self) -> tokio::sync::mpsc::Receiver<Vec<u8>> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let store = self.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<u8>> = None;
            let mut pause = WATCH_RETRY_FIRST;
            loop {
                let outcome = tokio::select! {
                    o = store.follow_crl(&tx, &mut last, &mut pause) => o,
                    _ = tx.closed() => return,
                };
                match outcome {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(
                        namespace = store.ns.key(""),
                        "watching the CRL: {}; retrying in {pause:?}",
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

    /// One watch of the CRL for [`CaStore::watch_crl`]: sends what changed since `last`;
    /// `Ok` only when the receiver is gone.
    async fn follow_crl(
        &self,
        tx: &tokio::sync::mpsc::Sender<Vec<u8>>,
        last: &mut Option<Vec<u8>>,
        pause: &mut Duration,
    ) -> Result<(), PkiError> {
        let key = self.ns.key("ca/crl");
        let mut client = self.ns.client();
        let response = client.get(key.clone(), None::<GetOptions>).await?;
        let revision = response
            .header()
            .ok_or_else(|| PkiError::Inconsistent("etcd range response without header".into()))?
            .revision();
        let mut stream = client
            .watch(
                key.clone(),
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await?;
        let mut send = async |crl: &[u8]| {
            if last.as_deref() == Some(crl) {
                return true;
            }
            *last = Some(crl.to_vec());
            tx.send(crl.to_vec()).await.is_ok()
        };
        match response.kvs().first() {
            Some(kv) => {
                if !send(kv.value()).await {
                    return Ok(());
                }
            }
            None => return Err(PkiError::Inconsistent("CA has no CRL".into())),
        }
        // The watch is established and the CRL read: the next failure is a new one.
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
            for event in response.events() {
                match (event.event_type(), event.kv()) {
                    (EventType::Put, Some(kv)) => {
                        if !send(kv.value()).await {
                            return Ok(());
                        }
                    }
                    // Keep checking against the last CRL rather than accept everything.
                    _ => tracing::error!("the CRL was deleted from etcd; keeping the last one"),
                }
            }
        }
    }

    /// Adds `serial` to the CRL. Concurrent revocations are serialized by a
    /// compare-and-swap on the CRL's revision; none is lost.
    pub async fn revoke(&self, ca: &Ca, serial: &[u8]) -> Result<Vec<u8>, PkiError> {
        let crl_key = self.ns.key("ca/crl");
        for _ in 0..MAX_ATTEMPTS * 4 {
            let response = self
                .ns
                .client()
                .get(crl_key.clone(), None::<GetOptions>)
                .await?;
            let kv = response
                .kvs()
                .first()
                .ok_or_else(|| PkiError::Inconsistent("CA has no CRL".into()))?;
            let mut serials = crl_serials(kv.value())?;
            if serials.iter().any(|s| s == serial) {
                return Ok(kv.value().to_vec());
            }
            serials.push(serial.to_vec());
            // Revocations only ever append, so the count is a growing CRL number.
            let crl = ca.crl(&serials, serials.len() as u64 + 1)?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    crl_key.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(crl_key.clone(), crl.clone(), None)]);
            if self.ns.client().txn(txn).await?.succeeded() {
                return Ok(crl);
            }
        }
        Err(PkiError::Inconsistent(
            "CRL kept changing during revocation".into(),
        ))
    }
}
