//! Streams held open per source: how many answers of a streamed call anyone may make
//! (RegisterNode, which stays open until the owner approves) one source holds open at
//! once, and how many all sources do; and the response body that keeps a stream's
//! place until the stream ends.
//!
//! A rate limit alone bounds how fast a source opens streams, not how many it keeps:
//! at 10 a second, a minute is 600 open streams, each a task, a snapshot watch and
//! (on a follower) a forwarded connection of its own to the leader. [`OpenStreams`]
//! is pure; [`Place`] gives its place back when dropped.
//!
//! A leaf: may not look at calls or connections.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// Streams open per source and in all (pure).
#[derive(Debug)]
pub struct OpenStreams {
    per_source: usize,
    total: usize,
    open: HashMap<IpAddr, usize>,
    all: usize,
}

impl OpenStreams {
    pub fn new(per_source: usize, total: usize) -> OpenStreams {
        OpenStreams {
            per_source,
            total,
            open: HashMap::new(),
            all: 0,
        }
    }

    /// Takes a place for a stream of `source`; false: its own or the total cap is
    /// reached.
    pub fn open(&mut self, source: IpAddr) -> bool {
        let mine = self.open.get(&source).copied().unwrap_or(0);
        if mine >= self.per_source || self.all >= self.total {
            return false;
        }
        self.open.insert(source, mine + 1);
        self.all += 1;
        true
    }

    /// Gives back a place `source` took.
    pub fn close(&mut self, source: IpAddr) {
        if let Some(mine) = self.open.get_mut(&source) {
            *mine -= 1;
            self.all -= 1;
            if *mine == 0 {
                self.open.remove(&source);
            }
        }
    }

    /// Streams open in all.
    pub fn len(&self) -> usize {
        self.all
    }

    pub fn is_empty(&self) -> bool {
        self.all == 0
    }
}

/// A stream's place, given back when dropped.
#[derive(Debug)]
pub struct Place {
    table: Arc<Mutex<OpenStreams>>,
    source: IpAddr,
}

impl Place {
    /// A place for `source` in `table`, if one is free.
    pub fn take(table: &Arc<Mutex<OpenStreams>>, source: IpAddr) -> Option<Place> {
        let taken = table.lock().expect("open streams poisoned").open(source);
        taken.then(|| Place {
            table: table.clone(),
            source,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.table
            .lock()
            .expect("open streams poisoned")
            .close(self.source);
    }
}

/// A response body holding a stream's place until it ends (or is dropped: the client
/// went away).
pub struct HeldBody<B> {
    pub(super) inner: Pin<Box<B>>,
    pub(super) place: Option<Place>,
}

impl<B: Default> Default for HeldBody<B> {
    fn default() -> Self {
        HeldBody {
            inner: Box::pin(B::default()),
            place: None,
        }
    }
}

impl<B: http_body::Body> http_body::Body for HeldBody<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = this.inner.as_mut().poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            // Ended: the place is free before hyper drops the body.
            this.place = None;
        }
        polled
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_source_holds_at_most_its_cap_and_all_at_most_the_total() {
        let mut s = OpenStreams::new(2, 3);
        let (a, b) = (ip("127.0.0.9"), ip("127.0.0.10"));
        assert!(s.open(a) && s.open(a));
        assert!(!s.open(a), "a holds its two");
        assert!(s.open(b));
        assert!(!s.open(b), "three in all");
        s.close(a);
        assert!(s.open(b), "a closed one: room for b");
        assert_eq!(s.len(), 3);
        s.close(a);
        s.close(b);
        s.close(b);
        assert!(s.is_empty() && s.open.is_empty());
        // Closing what was never opened changes nothing.
        s.close(a);
        assert!(s.is_empty());
    }

    #[test]
    fn a_place_is_given_back_when_dropped() {
        let table = Arc::new(Mutex::new(OpenStreams::new(1, 10)));
        let a = ip("127.0.0.9");
        let place = Place::take(&table, a).expect("a free place");
        assert!(Place::take(&table, a).is_none());
        drop(place);
        assert!(Place::take(&table, a).is_some());
    }
}
