//! Who keeps a scrape connection: the `/metrics` listener's seats, capped per source and
//! in all, and which connection makes room for a newcomer ([`Seats`], pure: time is
//! read from the connections, which the tests set).
//!
//! ```text
//!   accepted from S ─▶ S holds `per_source`? ─ yes ─▶ S's idlest goes (none idle: refused)
//!                      the listener is full? ─ yes ─▶ the idlest anywhere goes (none: refused)
//!                      ─▶ seated
//! ```
//! The idlest connection is one that never sent a byte (oldest first), else the one
//! whose last byte moved longest ago; a connection answering a request is never
//! chosen. A flood of idle connections, from one address or many, therefore only ever
//! replaces itself, and a scraper (which sends its request at once) always gets a
//! seat. A source is an IPv4 address or an IPv6 /64.
//!
//! A leaf: may not touch sockets or tasks.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// What the listener and a connection's task share about the connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) since: Instant,
    /// Milliseconds after `since` when a byte last moved.
    last_ms: AtomicU64,
    /// A byte was read from the client.
    spoke: AtomicBool,
    /// Requests being answered.
    busy: AtomicUsize,
    /// Notified once the connection is evicted (the permit waits for its task).
    pub(crate) evicted: Notify,
}

impl Conn {
    pub(crate) fn new(now: Instant) -> Arc<Conn> {
        Arc::new(Conn {
            since: now,
            last_ms: AtomicU64::new(0),
            spoke: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            evicted: Notify::new(),
        })
    }

    /// A byte moved at `now` (`read`: from the client).
    pub(crate) fn touch(&self, now: Instant, read: bool) {
        let ms = now.saturating_duration_since(self.since).as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
        if read {
            self.spoke.store(true, Ordering::Relaxed);
        }
    }

    /// When a byte last moved (`since` when none did).
    pub(crate) fn last(&self) -> Instant {
        self.since + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn spoke(&self) -> bool {
        self.spoke.load(Ordering::Relaxed)
    }

    /// A request is being answered until the guard drops.
    pub(crate) fn answering(self: &Arc<Conn>) -> Answering {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Answering(self.clone())
    }

    fn busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst) > 0
    }

    /// How idle it is, for eviction: smaller goes first. Silent connections before any
    /// that spoke; among each, the longest without a byte.
    fn idleness_key(&self) -> (bool, Instant) {
        (self.spoke(), self.last())
    }
}

/// One request being answered on a connection.
#[derive(Debug)]
pub(crate) struct Answering(Arc<Conn>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
        self.0.touch(Instant::now(), false);
    }
}

/// The source a connection counts under: an IPv4 address, or an IPv6 /64.
fn source_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

/// Why a newcomer was not seated: every seat it could take is answering a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AllBusy;

/// The seats of the `/metrics` listener.
#[derive(Debug)]
pub(crate) struct Seats {
    max: usize,
    per_source: usize,
    next: u64,
    seated: Vec<(u64, IpAddr, Arc<Conn>)>,
}

impl Seats {
    pub(crate) fn new(max: usize, per_source: usize) -> Seats {
        Seats {
            max: max.max(1),
            per_source: per_source.max(1),
            next: 0,
            seated: Vec::new(),
        }
    }

    /// Seats `conn` from `address`: its seat number and the connections evicted to
    /// make room (the caller tells them).
    pub(crate) fn admit(
        &mut self,
        address: IpAddr,
        conn: Arc<Conn>,
    ) -> Result<(u64, Vec<Arc<Conn>>), AllBusy> {
        let source = source_key(address);
        let mut evicted = Vec::new();
        if self.seated.iter().filter(|s| s.1 == source).count() >= self.per_source {
            evicted.push(self.evict_idlest(Some(source)).ok_or(AllBusy)?);
        }
        if self.seated.len() >= self.max {
            evicted.push(self.evict_idlest(None).ok_or(AllBusy)?);
        }
        let id = self.next;
        self.next += 1;
        self.seated.push((id, source, conn));
        Ok((id, evicted))
    }

    /// Frees seat `id` (its connection ended).
    pub(crate) fn leave(&mut self, id: u64) {
        self.seated.retain(|s| s.0 != id);
    }

    /// Removes the idlest seat (of `source`, or anywhere) not answering a request.
    pub(crate) fn evict_idlest(&mut self, source: Option<IpAddr>) -> Option<Arc<Conn>> {
        let index = self
            .seated
            .iter()
            .enumerate()
            .filter(|(_, s)| source.is_none_or(|source| s.1 == source) && !s.2.busy())
            .min_by_key(|(_, s)| s.2.idleness_key())
            .map(|(i, _)| i)?;
        Some(self.seated.swap_remove(index).2)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.seated.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_source_at_its_cap_replaces_its_silent_oldest_first() {
        let t0 = Instant::now();
        let mut seats = Seats::new(10, 2);
        let a = ip("127.0.0.9");
        let scraper = Conn::new(t0);
        scraper.touch(t0 + Duration::from_millis(5), true);
        let silent = Conn::new(t0 + Duration::from_millis(1));
        seats.admit(a, scraper.clone()).unwrap();
        seats.admit(a, silent.clone()).unwrap();
        // The silent one goes, although the scraper was seated first.
        let (_, evicted) = seats
            .admit(a, Conn::new(t0 + Duration::from_millis(9)))
            .unwrap();
        assert!(Arc::ptr_eq(&evicted[0], &silent));
        assert_eq!(seats.len(), 2);
        // Another source is not touched.
        let (_, evicted) = seats.admit(ip("127.0.0.10"), Conn::new(t0)).unwrap();
        assert!(evicted.is_empty());
    }

    #[test]
    fn a_full_listener_replaces_the_idlest_and_never_one_answering() {
        let t0 = Instant::now();
        let mut seats = Seats::new(3, 8);
        let conns: Vec<_> = (0..3u8)
            .map(|i| {
                let c = Conn::new(t0);
                // All spoke; the first moved a byte last, the second longest ago.
                c.touch(t0 + Duration::from_millis([30, 10, 20][i as usize]), true);
                seats
                    .admit(IpAddr::from([127, 0, 0, i + 1]), c.clone())
                    .unwrap();
                c
            })
            .collect();
        let _answering = conns[1].answering();
        let (_, evicted) = seats.admit(ip("127.0.1.1"), Conn::new(t0)).unwrap();
        assert!(Arc::ptr_eq(&evicted[0], &conns[2]), "conns[1] is answering");
        // Every seat answering: the newcomer is refused, nobody evicted.
        let busy: Vec<_> = seats.seated.iter().map(|s| s.2.answering()).collect();
        assert_eq!(
            seats.admit(ip("127.0.1.2"), Conn::new(t0)).err(),
            Some(AllBusy)
        );
        assert_eq!(seats.len(), 3);
        drop(busy);
        assert!(seats.evict_idlest(None).is_some());
    }

    #[test]
    fn leaving_frees_the_seat() {
        let t0 = Instant::now();
        let mut seats = Seats::new(1, 1);
        let (id, _) = seats.admit(ip("::1"), Conn::new(t0)).unwrap();
        seats.leave(id);
        assert_eq!(seats.len(), 0);
        // One IPv6 /64 is one source.
        let mut seats = Seats::new(4, 1);
        seats.admit(ip("2001:db8:0:1::1"), Conn::new(t0)).unwrap();
        let (_, evicted) = seats.admit(ip("2001:db8:0:1::2"), Conn::new(t0)).unwrap();
        assert_eq!(evicted.len(), 1);
    }
}
