//! Who gets a connection (pure): the seat table of one listener, its caps per source
//! and in all, and which connection makes room for a newcomer.
//!
//! ```text
//!   accepted from S ─▶ S holds `per_source` unproven seats? ─ yes ─▶ S's oldest
//!                      │                                            evictable goes
//!                      │                                            (none: refused)
//!                      ▼
//!                      the listener is full? ─ yes ─▶ the oldest evictable anywhere
//!                      │                              goes (none: refused)
//!                      ▼
//!                      seated (unproven), behind S's handshake gate
//! ```
//! A seat is *proven* while the latest call on it was made with a node's or an admin's
//! (the owner's too) certificate (`server::auth` decides): those are never evicted and
//! do not count against their source, so nodes and owners always keep what they hold —
//! up to [`Caps::per_identity`] seats of one identity (a node needs one or two): the
//! seats an identity holds beyond that count as unproven, so that one stolen worker key
//! cannot take the listener's seats from the other nodes.
//! A seat whose certificate stopped proving (revoked: a removed admin, a deleted node)
//! is unproven again from its next call on, evictable and counted like any other. An
//! unproven seat (TCP only, in its handshake, handshaken but silent, calling with a
//! self-signed certificate, or a reader's or operator's: one such certificate must not
//! hold every seat) is *evictable*
//! while no call is in flight on it. Evicting the oldest rather than refusing the
//! newcomer means that a flood, however long it holds its connections, cannot keep
//! anyone out: a newcomer always finds an older idle stranger to replace, and honest
//! clients call right after their handshake, so they are never the oldest for long.
//! A source is an IPv4 address or an IPv6 /64 ([`source_key`]; the per-source rate
//! limits count the same sources).
//!
//! The table learns that a seat is proven or busy from the seat itself ([`Occupant`]),
//! lazily: a proven seat leaves its source's count the next time that count is looked
//! at. A seat that loses its proof raises the table's [`Demotions`]; the table then
//! looks again at the seats it knew as proven, and those no longer proven count again
//! (in their place by age). Time does not enter: age is the order of seating.
//!
//! A leaf: may not touch sockets or tasks.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

/// The source a connection or call is counted under: an IPv4 address, or an IPv6 /64.
pub fn source_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(bits.into())
            }
        },
    }
}

/// A prover whose seats are all kept from eviction, beyond any share: a curator the
/// listener trusts to forward calls (`AuthLayer::with_forwarders`), on a connection
/// whose latest call it forwarded, holds one connection per forwarded call, e.g. per
/// registration waiting for approval. Curators are the consensus members: their keys
/// reach etcd already.
pub(crate) const UNCAPPED: &str = "forwarder ";

/// What the table asks of a seat's connection.
pub(crate) trait Occupant {
    /// Who proved it: the identity of the node's or admin's certificate its latest
    /// call was made with (none: not proven).
    fn prover(&self) -> Option<Arc<str>>;
    /// A call is in flight on it.
    fn busy(&self) -> bool;
}

/// Raised by a seat of the table whose [`Occupant::proven`] went from true to false
/// (after storing false): the table looks again at the seats it knew as proven before
/// it next picks a seat to evict or counts a source.
#[derive(Debug, Default)]
pub(crate) struct Demotions(AtomicBool);

impl Demotions {
    pub(crate) fn raise(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

/// The caps of one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Seats in all.
    pub(crate) max: usize,
    /// Unproven seats per source.
    pub(crate) per_source: usize,
    /// Handshakes in progress per source (more wait at the gate).
    pub(crate) handshakes_per_source: usize,
    /// Proven seats one identity keeps out of eviction; its others count as unproven.
    pub(crate) per_identity: usize,
}

/// Why a newcomer was not seated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its source holds its cap of unproven seats, each with a call in flight.
    SourceFull,
    /// Every seat is proven or busy.
    ListenerFull,
}

/// A newcomer's seat: its number, the gate its handshake passes, and the connections
/// evicted to make room (the caller closes them).
pub(crate) struct Seated<T> {
    pub(crate) id: u64,
    pub(crate) handshake_gate: Arc<Semaphore>,
    pub(crate) evicted: Vec<T>,
}

struct Seat<T> {
    source: IpAddr,
    occupant: T,
}

struct Source {
    /// Seats of this source, proven or not.
    seats: usize,
    /// Its seats not known to be proven, oldest first.
    unproven: BTreeSet<u64>,
    handshakes: Arc<Semaphore>,
}

/// The seats of one listener.
pub(crate) struct Table<T> {
    caps: Caps,
    next: u64,
    seats: HashMap<u64, Seat<T>>,
    /// Seats not known to be proven, oldest first.
    unproven: BTreeSet<u64>,
    /// Seats known to be proven (forgotten by `unproven`), with who proved each: looked
    /// at again when a seat lost its proof.
    proven: BTreeSet<u64>,
    proven_by: HashMap<u64, Arc<str>>,
    /// Seats in `proven` per identity (at most `caps.per_identity` each).
    exempt: HashMap<Arc<str>, usize>,
    demotions: Arc<Demotions>,
    sources: HashMap<IpAddr, Source>,
}

impl<T: Occupant + Clone> Table<T> {
    pub(crate) fn new(caps: Caps) -> Table<T> {
        Table {
            caps: Caps {
                max: caps.max.max(1),
                per_source: caps.per_source.max(1),
                handshakes_per_source: caps.handshakes_per_source.max(1),
                per_identity: caps.per_identity.max(1),
            },
            next: 0,
            seats: HashMap::new(),
            unproven: BTreeSet::new(),
            proven: BTreeSet::new(),
            proven_by: HashMap::new(),
            exempt: HashMap::new(),
            demotions: Arc::default(),
            sources: HashMap::new(),
        }
    }

    /// What this table's seats raise when they lose their proof.
    pub(crate) fn demotions(&self) -> Arc<Demotions> {
        self.demotions.clone()
    }

    /// Seats in use.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.seats.len()
    }

    /// Seats a connection from `address`, making room when a cap is reached.
    pub(crate) fn admit(&mut self, address: IpAddr, occupant: T) -> Result<Seated<T>, Refusal> {
        let source = source_key(address);
        self.count_demoted();
        let mut evicted = Vec::new();
        if self.unproven_of(source) >= self.caps.per_source {
            let oldest = self.sources.get(&source).and_then(|s| {
                s.unproven
                    .iter()
                    .copied()
                    .find(|id| !self.seats[id].occupant.busy())
            });
            match oldest {
                Some(id) => evicted.extend(self.leave(id)),
                None => return Err(Refusal::SourceFull),
            }
        }
        if self.seats.len() >= self.caps.max {
            match self.oldest_evictable() {
                Some(id) => evicted.extend(self.leave(id)),
                None => return Err(Refusal::ListenerFull),
            }
        }
        let id = self.next;
        self.next += 1;
        self.seats.insert(id, Seat { source, occupant });
        self.unproven.insert(id);
        let per_source = self.caps.handshakes_per_source;
        let entry = self.sources.entry(source).or_insert_with(|| Source {
            seats: 0,
            unproven: BTreeSet::new(),
            handshakes: Arc::new(Semaphore::new(per_source)),
        });
        entry.seats += 1;
        entry.unproven.insert(id);
        Ok(Seated {
            id,
            handshake_gate: entry.handshakes.clone(),
            evicted,
        })
    }

    /// Frees seat `id` (a connection closed, or evicted); its occupant, if it was seated.
    pub(crate) fn leave(&mut self, id: u64) -> Option<T> {
        let seat = self.seats.remove(&id)?;
        self.unproven.remove(&id);
        self.unexempt(id);
        if let Some(source) = self.sources.get_mut(&seat.source) {
            source.seats -= 1;
            source.unproven.remove(&id);
            if source.seats == 0 {
                self.sources.remove(&seat.source);
            }
        }
        Some(seat.occupant)
    }

    /// Evicts the oldest evictable seat anywhere (descriptors ran out): its occupant.
    pub(crate) fn evict_oldest(&mut self) -> Option<T> {
        self.count_demoted();
        let id = self.oldest_evictable()?;
        self.leave(id)
    }

    /// Takes seat `id` out of eviction if it is proven and its identity holds fewer
    /// than its share of such seats; whether it did.
    fn try_exempt(&mut self, id: u64) -> bool {
        let Some(prover) = self.seats[&id].occupant.prover() else {
            return false;
        };
        let held = self.exempt.get(&prover).copied().unwrap_or(0);
        if held >= self.caps.per_identity && !prover.starts_with(UNCAPPED) {
            return false;
        }
        self.exempt.insert(prover.clone(), held + 1);
        self.proven_by.insert(id, prover);
        self.proven.insert(id);
        self.unproven.remove(&id);
        let source = self.seats[&id].source;
        if let Some(s) = self.sources.get_mut(&source) {
            s.unproven.remove(&id);
        }
        true
    }

    /// Seat `id` is no longer kept out of eviction (it left, or lost its proof).
    fn unexempt(&mut self, id: u64) {
        self.proven.remove(&id);
        if let Some(prover) = self.proven_by.remove(&id)
            && let Some(held) = self.exempt.get_mut(&prover)
        {
            *held -= 1;
            if *held == 0 {
                self.exempt.remove(&prover);
            }
        }
    }

    /// The unproven seats of `source`, forgetting those proven since last asked.
    fn unproven_of(&mut self, source: IpAddr) -> usize {
        let Some(entry) = self.sources.get(&source) else {
            return 0;
        };
        let candidates: Vec<u64> = entry.unproven.iter().copied().collect();
        for id in candidates {
            self.try_exempt(id);
        }
        self.sources.get(&source).map_or(0, |s| s.unproven.len())
    }

    /// After a seat lost its proof: the seats known as proven that no longer are count
    /// again (evictable, against their source).
    fn count_demoted(&mut self) {
        if !self.demotions.take() {
            return;
        }
        let demoted: Vec<u64> = self
            .proven
            .iter()
            .copied()
            .filter(|id| self.seats[id].occupant.prover() != self.proven_by.get(id).cloned())
            .collect();
        for id in demoted {
            self.unexempt(id);
            self.unproven.insert(id);
            let source = self.seats[&id].source;
            if let Some(s) = self.sources.get_mut(&source) {
                s.unproven.insert(id);
            }
        }
    }

    /// The oldest seat that may go, forgetting the proven seats it passes (those of an
    /// identity past its share stay evictable).
    fn oldest_evictable(&mut self) -> Option<u64> {
        let mut after = 0;
        loop {
            let id = self.unproven.range(after..).next().copied()?;
            after = id + 1;
            if self.try_exempt(id) {
                continue;
            }
            if !self.seats[&id].occupant.busy() {
                return Some(id);
            }
        }
    }
}

/// A seat held by a connection: freed when dropped.
pub(crate) struct SeatGuard<T: Occupant + Clone> {
    id: u64,
    table: Arc<Mutex<Table<T>>>,
}

impl<T: Occupant + Clone> SeatGuard<T> {
    pub(crate) fn new(id: u64, table: Arc<Mutex<Table<T>>>) -> SeatGuard<T> {
        SeatGuard { id, table }
    }
}

impl<T: Occupant + Clone> Drop for SeatGuard<T> {
    fn drop(&mut self) {
        // The occupant is dropped after the lock is released.
        let occupant = self
            .table
            .lock()
            .expect("seat table poisoned")
            .leave(self.id);
        drop(occupant);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A connection whose state the test sets.
    #[derive(Clone, Default)]
    struct Conn {
        name: &'static str,
        proven: Rc<Cell<bool>>,
        busy: Rc<Cell<bool>>,
        /// Who proves it when `proven` (default: one identity per connection name).
        by: Option<&'static str>,
    }

    impl Occupant for Conn {
        fn prover(&self) -> Option<Arc<str>> {
            self.proven
                .get()
                .then(|| Arc::from(self.by.unwrap_or(self.name)))
        }
        fn busy(&self) -> bool {
            self.busy.get()
        }
    }

    fn conn(name: &'static str) -> Conn {
        Conn {
            name,
            ..Conn::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const CAPS: Caps = Caps {
        max: 6,
        per_source: 3,
        handshakes_per_source: 2,
        per_identity: 2,
    };

    fn names(evicted: &[Conn]) -> Vec<&'static str> {
        evicted.iter().map(|c| c.name).collect()
    }

    #[test]
    fn a_source_at_its_cap_replaces_its_own_oldest_idle_seat() {
        let mut t = Table::new(CAPS);
        let a = ip("127.0.0.9");
        for name in ["a1", "a2", "a3"] {
            assert!(t.admit(a, conn(name)).unwrap().evicted.is_empty());
        }
        let seated = t.admit(a, conn("a4")).unwrap();
        assert_eq!(names(&seated.evicted), ["a1"]);
        assert_eq!(t.len(), 3);
        // Another source is not touched by a's churn.
        let b = t.admit(ip("127.0.0.10"), conn("b1")).unwrap();
        assert!(b.evicted.is_empty());
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn busy_seats_stay_and_a_source_of_only_busy_seats_is_refused() {
        let mut t = Table::new(CAPS);
        let a = ip("127.0.0.9");
        let held: Vec<Conn> = ["a1", "a2", "a3"].map(conn).to_vec();
        for c in &held {
            t.admit(a, c.clone()).unwrap();
        }
        held[0].busy.set(true);
        assert_eq!(
            names(&t.admit(a, conn("a4")).unwrap().evicted),
            ["a2"],
            "a1 has a call in flight"
        );
        held[2].busy.set(true);
        let a5 = conn("a5");
        assert_eq!(names(&t.admit(a, a5.clone()).unwrap().evicted), ["a4"]);
        a5.busy.set(true);
        assert_eq!(t.admit(a, conn("a6")).err(), Some(Refusal::SourceFull));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn proven_seats_do_not_count_against_their_source_and_never_go() {
        let mut t = Table::new(CAPS);
        let a = ip("127.0.0.9");
        let owner = conn("owner");
        t.admit(a, owner.clone()).unwrap();
        owner.proven.set(true);
        for name in ["a1", "a2", "a3"] {
            assert!(t.admit(a, conn(name)).unwrap().evicted.is_empty());
        }
        assert_eq!(names(&t.admit(a, conn("a4")).unwrap().evicted), ["a1"]);
        // The listener fills (6): evictions pass over the proven seat.
        t.admit(ip("127.0.0.10"), conn("b1")).unwrap();
        t.admit(ip("127.0.0.10"), conn("b2")).unwrap();
        assert_eq!(t.len(), 6);
        let seated = t.admit(ip("127.0.0.11"), conn("c1")).unwrap();
        assert_eq!(names(&seated.evicted), ["a2"]);
        assert!(t.seats.values().any(|s| s.occupant.name == "owner"));
    }

    #[test]
    fn a_seat_that_lost_its_proof_counts_and_goes_again_in_its_place_by_age() {
        let mut t = Table::new(CAPS);
        let a = ip("127.0.0.9");
        let admin = conn("admin");
        t.admit(a, admin.clone()).unwrap();
        admin.proven.set(true);
        for name in ["a1", "a2", "a3"] {
            assert!(t.admit(a, conn(name)).unwrap().evicted.is_empty());
        }
        // Its certificate revoked: the latest call no longer proves it. The table
        // counts it again once told, and it is a's oldest.
        admin.proven.set(false);
        t.demotions().raise();
        assert_eq!(names(&t.admit(a, conn("a4")).unwrap().evicted), ["admin"]);
        assert!(t.proven.is_empty() && t.len() == 4);

        // Listener-wide: `again` is proven, then loses its proof while a call is in
        // flight on it (its refusal still being answered).
        let b = ip("127.0.0.10");
        let again = conn("again");
        t.admit(b, again.clone()).unwrap();
        again.proven.set(true);
        let b1 = conn("b1");
        t.admit(b, b1.clone()).unwrap();
        assert_eq!(t.len(), 6);
        again.proven.set(false);
        again.busy.set(true);
        // Not told yet: nothing known as proven is looked at again.
        let c = ip("127.0.0.11");
        assert_eq!(names(&t.admit(c, conn("c1")).unwrap().evicted), ["a1"]);
        t.demotions().raise();
        assert_eq!(
            names(&t.admit(c, conn("c2")).unwrap().evicted),
            ["a2"],
            "busy: it stays like any other"
        );
        // Idle now; everyone older busy: it goes before b1, seated after it.
        again.busy.set(false);
        for s in t.seats.values() {
            if ["a3", "a4"].contains(&s.occupant.name) {
                s.occupant.busy.set(true);
            }
        }
        assert_eq!(names(&t.admit(c, conn("c3")).unwrap().evicted), ["again"]);
        assert!(t.seats.values().any(|s| s.occupant.name == "b1"));
    }

    #[test]
    fn a_full_listener_evicts_the_oldest_idle_seat_anywhere() {
        let mut t = Table::new(CAPS);
        // Six sources, one seat each: full.
        let conns: Vec<Conn> = ["s0", "s1", "s2", "s3", "s4", "s5"].map(conn).to_vec();
        for (i, c) in conns.iter().enumerate() {
            t.admit(IpAddr::from([127, 1, 0, i as u8]), c.clone())
                .unwrap();
        }
        conns[0].busy.set(true);
        let seated = t.admit(ip("127.2.0.1"), conn("new")).unwrap();
        assert_eq!(names(&seated.evicted), ["s1"]);
        assert_eq!(t.len(), 6);
        // Nobody idle and unproven: refused, nothing evicted.
        for s in t.seats.values() {
            s.occupant.busy.set(true);
        }
        assert_eq!(
            t.admit(ip("127.2.0.2"), conn("late")).err(),
            Some(Refusal::ListenerFull)
        );
        assert_eq!(t.len(), 6);
    }

    #[test]
    fn a_source_at_its_cap_and_a_full_listener_evict_two() {
        let mut t = Table::new(Caps {
            max: 4,
            per_source: 2,
            handshakes_per_source: 1,
            per_identity: 2,
        });
        t.admit(ip("127.0.0.1"), conn("x")).unwrap();
        t.admit(ip("127.0.0.2"), conn("y")).unwrap();
        t.admit(ip("127.0.0.9"), conn("a1")).unwrap();
        t.admit(ip("127.0.0.9"), conn("a2")).unwrap();
        // a's own oldest makes room for a3 within its cap; the listener then has room.
        let seated = t.admit(ip("127.0.0.9"), conn("a3")).unwrap();
        assert_eq!(names(&seated.evicted), ["a1"]);
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn sources_are_forgotten_when_their_last_seat_leaves() {
        let mut t = Table::new(CAPS);
        let s = t.admit(ip("2001:db8:0:1::1"), conn("v6")).unwrap();
        // Same /64: same source, same gate.
        let s2 = t.admit(ip("2001:db8:0:1::2"), conn("v6b")).unwrap();
        assert!(Arc::ptr_eq(&s.handshake_gate, &s2.handshake_gate));
        assert_eq!(s.handshake_gate.available_permits(), 2);
        assert_eq!(t.leave(s.id).map(|c| c.name), Some("v6"));
        assert_eq!(
            t.leave(s.id).map(|c| c.name),
            None,
            "leaving twice is a no-op"
        );
        t.leave(s2.id);
        assert!(
            t.sources.is_empty() && t.unproven.is_empty() && t.proven.is_empty() && t.len() == 0
        );
    }

    #[test]
    fn out_of_descriptors_the_oldest_idle_unproven_seat_goes() {
        let mut t = Table::new(CAPS);
        let owner = conn("owner");
        t.admit(ip("127.0.0.1"), owner.clone()).unwrap();
        owner.proven.set(true);
        t.admit(ip("127.0.0.9"), conn("a1")).unwrap();
        t.admit(ip("127.0.0.9"), conn("a2")).unwrap();
        assert_eq!(t.evict_oldest().map(|c| c.name), Some("a1"));
        assert_eq!(t.evict_oldest().map(|c| c.name), Some("a2"));
        assert!(t.evict_oldest().is_none(), "the owner stays");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn one_identity_keeps_only_its_share_of_seats_out_of_eviction() {
        let mut t = Table::new(CAPS);
        // A stolen worker key opens a seat after another, each proven by the same node.
        let stolen: Vec<Conn> = ["w1", "w2", "w3", "w4"]
            .map(|name| Conn {
                by: Some("node polis-w"),
                ..conn(name)
            })
            .to_vec();
        for (i, c) in stolen.iter().enumerate() {
            t.admit(ip(&format!("127.0.1.{i}")), c.clone()).unwrap();
            c.proven.set(true);
        }
        let other = conn("node polis-other");
        t.admit(ip("127.0.2.1"), other.clone()).unwrap();
        other.proven.set(true);
        t.admit(ip("127.0.3.1"), conn("s1")).unwrap();
        assert_eq!(t.len(), 6, "full");
        // Newcomers take the stolen key's seats past its share (2), oldest first, and
        // the stranger's; never the other node's.
        let mut evicted = Vec::new();
        for i in 0..3 {
            let seated = t.admit(ip(&format!("127.0.4.{i}")), conn("new")).unwrap();
            evicted.extend(names(&seated.evicted));
        }
        assert_eq!(evicted, ["w3", "w4", "s1"]);
        // Then only newcomers are left to evict; the two shares stay.
        let seated = t.admit(ip("127.0.5.1"), conn("newer")).unwrap();
        assert_eq!(names(&seated.evicted), ["new"]);
        assert_eq!(t.exempt.values().sum::<usize>(), 3);
        // A proven seat that leaves gives its share back.
        t.leave(0);
        assert_eq!(t.exempt.get("node polis-w").copied(), Some(1));
    }

    #[test]
    fn a_forwarding_curator_keeps_every_seat() {
        let mut t = Table::new(CAPS);
        let forwarded: Vec<Conn> = ["f1", "f2", "f3", "f4", "f5", "f6"]
            .map(|name| Conn {
                by: Some("forwarder node polis-c"),
                ..conn(name)
            })
            .to_vec();
        for c in &forwarded {
            t.admit(ip("127.0.0.7"), c.clone()).unwrap();
            c.proven.set(true);
        }
        assert_eq!(
            t.admit(ip("127.0.0.8"), conn("new")).err(),
            Some(Refusal::ListenerFull),
            "none of the forwarder's seats is taken"
        );
    }
}
