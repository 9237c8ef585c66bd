//! Clients never straddle two epochs of a cluster (`proto::epoch`): every curator names
//! its own epoch on every answer ([`EpochLayer`]), and every client keeps the newest
//! epoch it has seen ([`EpochSlot`], like the CRL it keeps by number) and refuses the
//! answer of a curator of an older one, going on to the next curator.
//!
//! ```text
//!   client ──call──▶ curator ──answer, x-polis-epoch: M──▶ CuratorClient:
//!     M older than the slot's ─▶ the answer is refused (next curator; the error names both)
//!     M newer ─▶ slot = M (the owner's hook persists it)
//! ```
//! A curator of an older epoch serves only until it sees the newer one (a few seconds,
//! `node::member::superseded`); what it answers meanwhile is refused by clients that know better.
//! The header value is `<number>-<made_unix_ms>-<kind>-<made_by>` (`0-0--` for the
//! bootstrap's epoch).
//!
//! A client keeps a newer epoch only when it can verify it: the curator signs its
//! epoch with the cluster CA's key (`x-polis-epoch-signature`, hex; re-signed when
//! the signing CA changes) and the client checks that signature against the CAs it
//! trusts ([`verified`]). An answer with a newer epoch it cannot verify is taken (the
//! curator's certificate verified) but the epoch is not kept: whoever holds a curator's
//! key, not the CA's, cannot make clients refuse every other curator with a forged
//! far-future epoch. A leaf beside `tls`: may not connect nor authenticate.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use proto::config::ClusterEpoch;

/// The header every curator answer carries: the curator's own epoch.
pub const EPOCH_HEADER: &str = "x-polis-epoch";

/// The header that carries the curator's signature of its epoch (hex).
pub const EPOCH_SIGNATURE_HEADER: &str = "x-polis-epoch-signature";

/// What the cluster CA signs of an epoch: its header value, with a purpose line.
pub fn signed_message(epoch: &ClusterEpoch) -> Vec<u8> {
    format!("polis cluster epoch v1\n{}", encode(epoch)).into_bytes()
}

/// Whether `epoch` may be kept by a client trusting `cas`: the bootstrap's needs no
/// signature (no epoch is older); any other must carry `signature_hex`, a signature of
/// [`signed_message`] by one of `cas`.
pub fn verified(epoch: &ClusterEpoch, signature_hex: Option<&str>, cas: &[Vec<u8>]) -> bool {
    if proto::epoch::same(epoch, &ClusterEpoch::default()) {
        return true;
    }
    let Some(signature) = signature_hex.and_then(|h| hex::decode(h).ok()) else {
        return false;
    };
    let message = signed_message(epoch);
    cas.iter()
        .any(|ca| pki::signed_by(ca, &message, &signature))
}

/// The header value of `epoch`.
pub fn encode(epoch: &ClusterEpoch) -> String {
    format!(
        "{}-{}-{}-{}",
        epoch.number, epoch.made_unix_ms, epoch.kind, epoch.made_by
    )
}

/// An epoch from its header value (`None`: malformed).
pub fn decode(value: &str) -> Option<ClusterEpoch> {
    let mut parts = value.splitn(4, '-');
    let number = parts.next()?.parse().ok()?;
    let made_unix_ms = parts.next()?.parse().ok()?;
    let kind = parts.next()?.to_string();
    let made_by = parts.next()?.to_string();
    let plain = |s: &str, dash: bool| {
        s.len() <= 128
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || (dash && c == '-'))
    };
    if !plain(&kind, false) || !plain(&made_by, true) {
        return None;
    }
    Some(ClusterEpoch {
        number,
        made_unix_ms,
        kind,
        made_by,
        ..Default::default()
    })
}

/// The file a client keeps its newest epoch in: one line, the header value. The same
/// format for polisctl (`CFG/epoch`) and nodes (`data/node/epoch-seen`).
pub fn saved_text(epoch: &ClusterEpoch) -> String {
    format!("{}\n", encode(epoch))
}

/// An epoch read back from [`saved_text`] (`None`: malformed).
pub fn from_saved_text(text: &str) -> Option<ClusterEpoch> {
    decode(text.trim())
}

type Hook = Arc<dyn Fn(&ClusterEpoch) + Send + Sync>;

/// The newest epoch a client has seen, shared by its calls; `on_newer` (if set) is told
/// of each newer one (to persist it).
#[derive(Clone, Default)]
pub struct EpochSlot {
    held: Arc<Mutex<Option<ClusterEpoch>>>,
    on_newer: Option<Hook>,
}

impl std::fmt::Debug for EpochSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("EpochSlot").field(&self.current()).finish()
    }
}

impl EpochSlot {
    /// A slot holding `seen` (what the client persisted), telling `on_newer` of newer
    /// epochs.
    pub fn new(seen: Option<ClusterEpoch>, on_newer: Option<Hook>) -> EpochSlot {
        EpochSlot {
            held: Arc::new(Mutex::new(seen)),
            on_newer,
        }
    }

    pub fn current(&self) -> Option<ClusterEpoch> {
        self.held.lock().expect("epoch slot lock").clone()
    }

    /// Takes `answered` (a curator's epoch; `verified`: its signature checks out, see
    /// [`verified`]): `Err` with the epoch held when it is older, or of the other line (a
    /// drill's where the client holds the cluster's, or the reverse); otherwise kept
    /// when newer and verified (the hook told). A newer one that is not verified is
    /// taken for this answer only.
    pub fn offer(&self, answered: &ClusterEpoch, verified: bool) -> Result<(), ClusterEpoch> {
        let newer = {
            let mut held = self.held.lock().expect("epoch slot lock");
            match held.as_ref() {
                // A drill and the live cluster are two lines: whichever a client saw
                // first is the one it keeps (`proto::epoch::DRILL`).
                Some(h) if proto::epoch::is_drill(h) != proto::epoch::is_drill(answered) => {
                    return Err(h.clone());
                }
                Some(h) if proto::epoch::newer(h, answered) => return Err(h.clone()),
                Some(h) if proto::epoch::same(h, answered) => false,
                _ if !verified => {
                    tracing::warn!(
                        epoch = proto::epoch::describe(answered),
                        "a curator named a newer cluster epoch without a signature of a CA \
                         this client trusts: not kept"
                    );
                    false
                }
                _ => {
                    *held = Some(answered.clone());
                    true
                }
            }
        };
        if newer && let Some(hook) = &self.on_newer {
            hook(answered);
        }
        Ok(())
    }
}

/// The curator's side: names its epoch on every answer, signed once [`Self::sign`]
/// was given the signature (by the CA that signs now; again when that changes).
#[derive(Clone)]
pub struct EpochLayer {
    epoch: ClusterEpoch,
    headers: Arc<std::sync::RwLock<(http::HeaderValue, Option<http::HeaderValue>)>>,
}

impl EpochLayer {
    pub fn new(own: ClusterEpoch) -> EpochLayer {
        let header = http::HeaderValue::from_str(&encode(&own))
            .unwrap_or_else(|_| http::HeaderValue::from_static("0-0--"));
        EpochLayer {
            epoch: own,
            headers: Arc::new(std::sync::RwLock::new((header, None))),
        }
    }

    /// The epoch named.
    pub fn epoch(&self) -> &ClusterEpoch {
        &self.epoch
    }

    /// Names `signature` (of [`signed_message`] of the epoch) from now on.
    pub fn sign(&self, signature: &[u8]) {
        let value = http::HeaderValue::from_str(&hex::encode(signature)).ok();
        self.headers.write().expect("epoch headers lock").1 = value;
    }
}

impl<S> tower::Layer<S> for EpochLayer {
    type Service = EpochService<S>;

    fn layer(&self, inner: S) -> EpochService<S> {
        EpochService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct EpochService<S> {
    inner: S,
    layer: EpochLayer,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for EpochService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let (header, signature) = self
            .layer
            .headers
            .read()
            .expect("epoch headers lock")
            .clone();
        // The clone is not ready; keep the ready one for this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let mut response = inner.call(request).await?;
            response.headers_mut().insert(EPOCH_HEADER, header);
            if let Some(signature) = signature {
                response
                    .headers_mut()
                    .insert(EPOCH_SIGNATURE_HEADER, signature);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(number: u64, at: u64, by: &str) -> ClusterEpoch {
        ClusterEpoch {
            number,
            made_unix_ms: at,
            made_by: by.into(),
            ..Default::default()
        }
    }

    #[test]
    fn header_values_round_trip_and_junk_is_refused() {
        let e = ClusterEpoch {
            kind: "restore".into(),
            ..epoch(2, 1795674017451, "polis-5b4993252d1ed0f0")
        };
        assert_eq!(decode(&encode(&e)), Some(e));
        assert_eq!(decode("0-0--"), Some(ClusterEpoch::default()));
        for junk in [
            "",
            "1",
            "1-x-r-polis",
            "x-1-r-polis",
            "1-2-r-pol is",
            "1-2-r-\u{1b}[31m",
            "1-2-r!-polis",
        ] {
            assert_eq!(decode(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn the_slot_keeps_the_newest_and_refuses_older() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let t = told.clone();
        let slot = EpochSlot::new(
            None,
            Some(Arc::new(move |e: &ClusterEpoch| {
                t.lock().unwrap().push(e.number)
            })),
        );
        let one = epoch(1, 10, "polis-a");
        let two = epoch(2, 20, "polis-b");
        assert_eq!(slot.offer(&ClusterEpoch::default(), true), Ok(()));
        assert_eq!(slot.offer(&one, true), Ok(()));
        assert_eq!(slot.offer(&one, true), Ok(()));
        assert_eq!(slot.offer(&two, true), Ok(()));
        assert_eq!(slot.offer(&one, true), Err(two.clone()));
        assert_eq!(slot.current(), Some(two));
        assert_eq!(*told.lock().unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn only_an_epoch_signed_by_a_trusted_ca_is_kept() {
        let ca = pki::Ca::generate("cluster", pki::CA_LIFETIME).unwrap();
        let stranger = pki::Ca::generate("stranger", pki::CA_LIFETIME).unwrap();
        let one = epoch(1, 10, "polis-a");
        let far = epoch(u64::MAX, u64::MAX, "polis-forged");
        let signature = hex::encode(ca.sign(&signed_message(&one)).unwrap());
        let forged = hex::encode(stranger.sign(&signed_message(&far)).unwrap());
        let cas = vec![ca.cert_der.clone()];
        assert!(verified(&one, Some(&signature), &cas));
        assert!(verified(&ClusterEpoch::default(), None, &cas));
        // Unsigned, signed by another CA, signed for another epoch, garbage: not verified.
        assert!(!verified(&one, None, &cas));
        assert!(!verified(&far, Some(&forged), &cas));
        assert!(!verified(&far, Some(&signature), &cas));
        assert!(!verified(&one, Some("zz"), &cas));
        // A client offered the forged far-future epoch takes that answer but keeps what
        // it held: the next curator's answer of the real epoch is not refused.
        let slot = EpochSlot::new(Some(one.clone()), None);
        assert_eq!(slot.offer(&far, false), Ok(()));
        assert_eq!(slot.current(), Some(one.clone()));
        assert_eq!(slot.offer(&one, true), Ok(()));
        // An older epoch is refused whatever its signature.
        let newer = epoch(2, 20, "polis-b");
        assert_eq!(slot.offer(&newer, true), Ok(()));
        assert_eq!(slot.offer(&one, true), Err(newer));
    }

    #[test]
    fn a_drill_and_the_live_cluster_never_answer_for_each_other() {
        let live = epoch(1, 10, "polis-a");
        let drill = ClusterEpoch {
            kind: proto::epoch::DRILL.into(),
            ..proto::epoch::successor(&live, 20, "polis-d", "restore", 5)
        };
        assert_eq!(drill.kind, proto::epoch::DRILL);
        // A client of the live cluster refuses the drill, newer as its number is.
        let client = EpochSlot::new(Some(live.clone()), None);
        assert_eq!(client.offer(&drill, true), Err(live.clone()));
        assert_eq!(client.current(), Some(live.clone()));
        // A later epoch of the live cluster is still taken.
        let later = proto::epoch::successor(&live, 30, "polis-b", "recover", 9);
        assert_eq!(client.offer(&later, true), Ok(()));
        // A client of the drill refuses the live cluster, and what continues a drill is
        // a drill's too.
        let rehearsal = EpochSlot::new(Some(drill.clone()), None);
        assert_eq!(rehearsal.offer(&later, true), Err(drill.clone()));
        let recovered = proto::epoch::successor(&drill, 40, "polis-d", "recover", 12);
        assert!(proto::epoch::is_drill(&recovered));
        assert_eq!(rehearsal.offer(&recovered, true), Ok(()));
        assert_eq!(client.offer(&recovered, true), Err(later));
    }
}

/// Properties over arbitrary header values (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn valid_epochs_round_trip(
            number in any::<u64>(),
            made_unix_ms in any::<u64>(),
            kind in "[A-Za-z0-9]{0,20}",
            made_by in "[A-Za-z0-9-]{0,60}",
        ) {
            let e = ClusterEpoch { number, made_unix_ms, kind, made_by, ..Default::default() };
            prop_assert_eq!(decode(&encode(&e)), Some(e));
        }

        #[test]
        fn what_decodes_encodes_to_a_header_that_decodes_the_same(
            value in prop_oneof![any::<String>(), "[0-9+]{1,3}-[0-9]{1,3}-[a-z-]{0,4}-[a-z-]{0,4}"],
        ) {
            if let Some(e) = decode(&value) {
                let header = encode(&e);
                prop_assert!(http::HeaderValue::from_str(&header).is_ok(), "{}", header);
                prop_assert_eq!(decode(&header), Some(e));
            }
        }
    }
}
