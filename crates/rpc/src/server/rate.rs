//! Per-source limits on the calls anyone may make without a cluster certificate
//! ([`LIMITED`]: RegisterNode, CommitNode, ReissueNodeCertificate, Escrow, UnlockData): a token bucket per
//! source address, in a table of bounded size, answering ResourceExhausted once a
//! source's bucket is empty; and for those answered with a stream that stays open
//! ([`STREAMED`]: RegisterNode), a cap on the streams a source (and all sources) hold
//! open at once.
//!
//! ```text
//!   call ─▶ RateLayer: LIMITED method, not forwarded by a curator?
//!             ├─ STREAMED: a place among the source's open streams? ── no ─▶ ResourceExhausted
//!             └─ Buckets::take(source, now): a token? ── no ─▶ ResourceExhausted
//!                                                 └─ yes ─▶ AuthLayer … (the place is
//!                                                    held until the response ends)
//! ```
//! A source is an IPv4 address, or an IPv6 /64 (one host usually holds a whole /64).
//! The table holds at most `capacity` sources: a new one first drops those whose
//! buckets are full again (as good as absent), then the least recently seen, so a
//! flood of addresses cannot grow memory; it can only reset buckets to full, which a
//! source with that many addresses gets anyway. One bucket per source serves every
//! limited method: a registering node makes a handful of such calls in all.
//! Calls a curator forwarded (header `x-polis-forwarded-identity`) were limited by the
//! curator that received them; a forged header is refused by the AuthLayer right after.
//! [`Buckets`] is pure (time is an argument) and unit-tested; the layer is glue.
//!
//! A leaf beside `auth` (besides `streams` and `admission::source_key`): may not
//! authenticate nor accept connections.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use super::admission::source_key;
use super::conn::PeerInfo;
use super::streams::{HeldBody, OpenStreams, Place};

/// The calls limited per source: those anyone may make (a self-signed certificate is
/// enough to reach their handler), each costing etcd reads or writes or a signature.
pub const LIMITED: &[&str] = &[
    "/polis.api.Curator/RegisterNode",
    "/polis.api.Curator/CommitNode",
    "/polis.api.Curator/ReissueNodeCertificate",
    "/polis.api.AAA/Escrow",
    "/polis.api.DataUnlock/UnlockData",
];

/// Of those, the calls answered with a stream that stays open (a registration waiting
/// for the owner's approval): capped in number open per source.
pub const STREAMED: &[&str] = &["/polis.api.Curator/RegisterNode"];

/// A token bucket's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateSettings {
    /// Tokens added per second (calls per second sustained); 0: no limit.
    pub per_second: f64,
    /// Tokens a bucket holds (calls in a burst).
    pub burst: f64,
    /// Sources tracked at once.
    pub capacity: usize,
    /// Streams of [`STREAMED`] calls one source holds open at once.
    pub streams_per_source: usize,
    /// Streams of [`STREAMED`] calls all sources hold open at once.
    pub streams_total: usize,
}

impl RateSettings {
    /// 10 calls a second, bursts of 20, 4096 sources (a few hundred KiB); a node
    /// registers with one stream, so four per source, and 1024 in all (a quarter of a
    /// curator's connections: each forwarded one is a connection of its own).
    pub const DEFAULT: RateSettings = RateSettings {
        per_second: 10.0,
        burst: 20.0,
        capacity: 4096,
        streams_per_source: 4,
        streams_total: 1024,
    };

    /// `per_second` sustained, bursts of twice that; 0: no limit (nor on streams).
    pub fn per_second(per_second: u32) -> RateSettings {
        RateSettings {
            per_second: f64::from(per_second),
            burst: f64::from(per_second) * 2.0,
            ..RateSettings::DEFAULT
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The buckets of every tracked source (pure: the time is an argument).
#[derive(Debug)]
pub struct Buckets {
    settings: RateSettings,
    table: HashMap<IpAddr, Bucket>,
}

impl Buckets {
    pub fn new(settings: RateSettings) -> Buckets {
        Buckets {
            settings,
            table: HashMap::new(),
        }
    }

    /// Sources tracked now.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn refilled(&self, bucket: &Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        (bucket.tokens + elapsed * self.settings.per_second).min(self.settings.burst)
    }

    /// Takes a token for a call from `address` at `now`; false: none left.
    pub fn take(&mut self, address: IpAddr, now: Instant) -> bool {
        if self.settings.per_second <= 0.0 {
            return true;
        }
        let key = source_key(address);
        if !self.table.contains_key(&key) && self.table.len() >= self.settings.capacity.max(1) {
            self.evict(now);
        }
        let tokens = match self.table.get(&key) {
            Some(bucket) => self.refilled(bucket, now),
            None => self.settings.burst,
        };
        let allowed = tokens >= 1.0;
        self.table.insert(
            key,
            Bucket {
                tokens: if allowed { tokens - 1.0 } else { tokens },
                last: now,
            },
        );
        allowed
    }

    /// Makes room for one source: drops the full buckets, else the least recently seen.
    fn evict(&mut self, now: Instant) {
        let burst = self.settings.burst;
        let per_second = self.settings.per_second;
        self.table.retain(|_, b| {
            let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
            b.tokens + elapsed * per_second < burst
        });
        if self.table.len() >= self.settings.capacity.max(1)
            && let Some(oldest) = self
                .table
                .iter()
                .min_by_key(|(_, b)| b.last)
                .map(|(k, _)| *k)
        {
            self.table.remove(&oldest);
        }
    }
}

/// Tower layer: the per-source limits on [`LIMITED`] calls.
#[derive(Clone)]
pub struct RateLayer {
    buckets: Arc<Mutex<Buckets>>,
    streams: Arc<Mutex<OpenStreams>>,
    settings: RateSettings,
}

impl RateLayer {
    pub fn new(settings: RateSettings) -> RateLayer {
        RateLayer {
            buckets: Arc::new(Mutex::new(Buckets::new(settings))),
            streams: Arc::new(Mutex::new(OpenStreams::new(
                settings.streams_per_source,
                settings.streams_total,
            ))),
            settings,
        }
    }

    /// Whether a call of `method` from `address` may go on (takes a token when limited);
    /// the place its stream holds, for a [`STREAMED`] call.
    fn admit(&self, method: &str, address: Option<IpAddr>) -> Result<Option<Place>, tonic::Status> {
        let Some(address) = address else {
            return Ok(None);
        };
        if !LIMITED.contains(&method) || self.settings.per_second <= 0.0 {
            return Ok(None);
        }
        let source = source_key(address);
        // First, so that a refused stream takes no token.
        let place = if STREAMED.contains(&method) {
            let Some(place) = Place::take(&self.streams, source) else {
                tracing::debug!(method, %address, "too many streams open");
                return Err(tonic::Status::resource_exhausted(format!(
                    "too many {method} streams open: at most {} from {source} at once ({} in all); \
                     try again once one has ended",
                    self.settings.streams_per_source, self.settings.streams_total
                )));
            };
            Some(place)
        } else {
            None
        };
        let admitted = self
            .buckets
            .lock()
            .expect("rate buckets poisoned")
            .take(address, Instant::now());
        if admitted {
            return Ok(place);
        }
        tracing::debug!(method, %address, "rate limited");
        Err(tonic::Status::resource_exhausted(format!(
            "too many calls of {method} from {}: at most {} a second (bursts of {}); try again shortly",
            source_key(address),
            self.settings.per_second,
            self.settings.burst
        )))
    }
}

impl<S> tower::Layer<S> for RateLayer {
    type Service = RateService<S>;
    fn layer(&self, inner: S) -> RateService<S> {
        RateService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RateService<S> {
    inner: S,
    layer: RateLayer,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for RateService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<HeldBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let forwarded = request
            .headers()
            .contains_key(crate::forward::FORWARDED_IDENTITY);
        let address = request
            .extensions()
            .get::<PeerInfo>()
            .map(|p| p.remote.ip())
            .filter(|_| !forwarded);
        let place = match self.layer.admit(request.uri().path(), address) {
            Ok(place) => place,
            Err(status) => {
                let response = status.into_http::<ResBody>().map(|body| HeldBody {
                    inner: Box::pin(body),
                    place: None,
                });
                return Box::pin(async move { Ok(response) });
            }
        };
        // The clone is not ready; keep the ready one for this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let response = inner.call(request).await?;
            Ok(response.map(|body| HeldBody {
                inner: Box::pin(body),
                place,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const TEN: RateSettings = RateSettings {
        per_second: 10.0,
        burst: 20.0,
        capacity: 4,
        ..RateSettings::DEFAULT
    };

    #[test]
    fn a_burst_then_the_rate() {
        let mut b = Buckets::new(TEN);
        let t0 = Instant::now();
        let a = ip("127.0.0.9");
        assert_eq!((0..20).filter(|_| b.take(a, t0)).count(), 20);
        assert!(!b.take(a, t0), "the burst is spent");
        // 100 ms refill one token.
        assert!(b.take(a, t0 + Duration::from_millis(100)));
        assert!(!b.take(a, t0 + Duration::from_millis(100)));
        // Refused calls take nothing: a second later, ten more.
        let t1 = t0 + Duration::from_millis(1100);
        assert_eq!((0..15).filter(|_| b.take(a, t1)).count(), 10);
        // Never more than the burst, however long the pause.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!((0..30).filter(|_| b.take(a, t2)).count(), 20);
    }

    #[test]
    fn sources_have_buckets_of_their_own() {
        let mut b = Buckets::new(TEN);
        let t0 = Instant::now();
        while b.take(ip("127.0.0.9"), t0) {}
        assert!(b.take(ip("127.0.0.10"), t0));
        // One IPv6 /64 is one source; the next /64 another.
        while b.take(ip("2001:db8:0:1::1"), t0) {}
        assert!(!b.take(ip("2001:db8:0:1::ffff"), t0));
        assert!(b.take(ip("2001:db8:0:2::1"), t0));
        // An IPv4-mapped address is the IPv4 source.
        assert!(!b.take(ip("::ffff:127.0.0.9"), t0));
    }

    #[test]
    fn the_table_stays_bounded_dropping_full_then_oldest() {
        let mut b = Buckets::new(TEN);
        let t0 = Instant::now();
        // Four sources with empty buckets, seen at increasing times.
        for i in 0..4u8 {
            let t = t0 + Duration::from_millis(u64::from(i));
            while b.take(IpAddr::from([10, 0, 0, i]), t) {}
        }
        assert_eq!(b.len(), 4);
        // A flood of new addresses never grows the table past its capacity.
        for i in 0..1000u16 {
            let [hi, lo] = i.to_be_bytes();
            b.take(
                IpAddr::from([10, 1, hi, lo]),
                t0 + Duration::from_millis(10),
            );
            assert!(b.len() <= 4);
        }
        // The limited sources were dropped, oldest first: back to full buckets.
        let mut fresh = Buckets::new(TEN);
        for i in 0..4u8 {
            let t = t0 + Duration::from_millis(u64::from(i));
            while fresh.take(IpAddr::from([10, 0, 0, i]), t) {}
        }
        assert!(!fresh.take(ip("10.0.0.3"), t0 + Duration::from_millis(4)));
        // A new source evicts 10.0.0.0 (least recently seen), not 10.0.0.3.
        assert!(fresh.take(ip("10.9.9.9"), t0 + Duration::from_millis(5)));
        assert_eq!(fresh.len(), 4);
        assert!(!fresh.take(ip("10.0.0.3"), t0 + Duration::from_millis(5)));
        assert!(fresh.take(ip("10.0.0.0"), t0 + Duration::from_millis(5)));
    }

    #[test]
    fn full_buckets_go_before_limited_ones() {
        let mut b = Buckets::new(TEN);
        let t0 = Instant::now();
        while b.take(ip("10.0.0.1"), t0) {}
        b.take(ip("10.0.0.2"), t0); // nearly full, then full after 100 ms
        b.take(ip("10.0.0.3"), t0 + Duration::from_millis(1));
        while b.take(ip("10.0.0.4"), t0 + Duration::from_millis(2)) {}
        let later = t0 + Duration::from_millis(150);
        assert!(b.take(ip("10.0.0.5"), later));
        assert_eq!(b.len(), 3, "the two full buckets went");
        // 10.0.0.1 (oldest, but limited) is still tracked: 1.5 tokens refilled, not 20.
        assert!(b.take(ip("10.0.0.1"), later));
        assert!(!b.take(ip("10.0.0.1"), later));
    }

    #[test]
    fn zero_means_no_limit() {
        let mut b = Buckets::new(RateSettings::per_second(0));
        let t0 = Instant::now();
        assert!((0..10_000).all(|_| b.take(ip("127.0.0.9"), t0)));
        assert!(b.is_empty());
    }

    #[test]
    fn only_the_unauthenticated_entry_points_are_limited() {
        let layer = RateLayer::new(RateSettings {
            per_second: 1.0,
            burst: 1.0,
            capacity: 8,
            ..RateSettings::DEFAULT
        });
        let a = Some(ip("127.0.0.9"));
        assert!(layer.admit("/polis.api.AAA/Escrow", a).is_ok());
        let refused = layer.admit("/polis.api.AAA/Escrow", a).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("127.0.0.9"), "{refused:?}");
        for method in [
            "/polis.api.Curator/RegisterNode",
            "/polis.api.Curator/CommitNode",
            "/polis.api.DataUnlock/UnlockData",
        ] {
            assert!(layer.admit(method, a).is_err(), "{method}");
        }
        assert!(layer.admit("/polis.api.Curator/Heartbeat", a).is_ok());
        // Forwarded calls (no address to count) were limited where they arrived.
        assert!(layer.admit("/polis.api.AAA/Escrow", None).is_ok());
    }

    #[test]
    fn a_source_holds_at_most_its_cap_of_register_streams() {
        let layer = RateLayer::new(RateSettings {
            streams_per_source: 2,
            ..RateSettings::DEFAULT
        });
        let register = "/polis.api.Curator/RegisterNode";
        let (a, b) = (Some(ip("127.0.0.9")), Some(ip("127.0.0.10")));
        let first = layer.admit(register, a).unwrap().expect("a stream's place");
        let _second = layer.admit(register, a).unwrap().expect("a stream's place");
        let refused = layer.admit(register, a).expect_err("a third stream");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("streams open"), "{refused:?}");
        assert!(layer.admit(register, b).unwrap().is_some(), "b has its own");
        // Unary calls hold no place; an ended stream gives its place back.
        assert!(
            layer
                .admit("/polis.api.Curator/CommitNode", a)
                .unwrap()
                .is_none()
        );
        drop(first);
        assert!(layer.admit(register, a).unwrap().is_some());
        // No limit at all: no place taken either.
        let open = RateLayer::new(RateSettings::per_second(0));
        let places: Vec<_> = (0..10).map(|_| open.admit(register, a).unwrap()).collect();
        assert!(places.iter().all(Option::is_none));
    }
}
