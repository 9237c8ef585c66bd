//! How many WatchNode streams one node holds open on this curator: at most
//! [`PER_NODE`]; a newer stream ends the node's oldest instead of being refused.
//!
//! Why: each stream holds a task and four watches of this curator's shared values, and
//! its connection is proven by the node's certificate. Unbounded, one stolen worker key
//! could open streams until the curator's memory or tasks run out. A node needs one
//! stream (its role and record watch), two while a reconnect races its old one; a
//! restarted node whose old streams are not yet noticed dead must win over them, so
//! the oldest goes, not the newcomer.
//!
//! A leaf: imports nothing of the service layer.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio_stream::Stream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::Status;

/// WatchNode streams one node holds open on one curator.
pub const PER_NODE: usize = 4;

/// The open streams, by node, oldest first.
#[derive(Debug, Default)]
pub struct Watchers {
    open: Mutex<HashMap<String, VecDeque<(u64, CancellationToken)>>>,
    next: AtomicU64,
}

impl Watchers {
    /// Registers a stream of `node`, ending its oldest when it holds [`PER_NODE`].
    pub fn open(self: &Arc<Self>, node: &str) -> WatchSeat {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        let mut open = self.open.lock().expect("watchers lock");
        let streams = open.entry(node.to_string()).or_default();
        while streams.len() >= PER_NODE {
            if let Some((_, oldest)) = streams.pop_front() {
                oldest.cancel();
            }
        }
        streams.push_back((id, token.clone()));
        WatchSeat {
            watchers: self.clone(),
            node: node.to_string(),
            id,
            token,
        }
    }

    /// Streams `node` holds open.
    #[cfg(test)]
    pub fn held(&self, node: &str) -> usize {
        self.open
            .lock()
            .expect("watchers lock")
            .get(node)
            .map_or(0, VecDeque::len)
    }
}

/// One stream's place; given back when dropped.
#[derive(Debug)]
pub struct WatchSeat {
    watchers: Arc<Watchers>,
    node: String,
    id: u64,
    token: CancellationToken,
}

impl Drop for WatchSeat {
    fn drop(&mut self) {
        let mut open = self.watchers.open.lock().expect("watchers lock");
        if let Some(streams) = open.get_mut(&self.node) {
            streams.retain(|(id, _)| *id != self.id);
            if streams.is_empty() {
                open.remove(&self.node);
            }
        }
    }
}

/// `inner`, ended with a ResourceExhausted status once a newer stream of the same node
/// took `seat`'s place.
pub fn seated<S, T>(inner: S, seat: WatchSeat) -> Seated<S>
where
    S: Stream<Item = Result<T, Status>> + Unpin,
{
    let superseded = Box::pin(seat.token.clone().cancelled_owned());
    Seated {
        inner,
        superseded,
        seat: Some(seat),
    }
}

/// See [`seated`].
pub struct Seated<S> {
    inner: S,
    superseded: Pin<Box<WaitForCancellationFutureOwned>>,
    /// None once the stream ended.
    seat: Option<WatchSeat>,
}

impl<S, T> Stream for Seated<S>
where
    S: Stream<Item = Result<T, Status>> + Unpin,
{
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(seat) = &self.seat else {
            return Poll::Ready(None);
        };
        let node = seat.node.clone();
        if self.superseded.as_mut().poll(cx).is_ready() {
            self.seat = None;
            return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                "node {node} opened a newer WatchNode stream on this curator (at most \
                 {PER_NODE} per node): this, its oldest, ends"
            )))));
        }
        let next = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(None) = next {
            self.seat = None;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn a_nodes_newer_stream_ends_its_oldest_and_others_are_untouched() {
        let watchers = Arc::new(Watchers::default());
        let endless = || tokio_stream::pending::<Result<u32, Status>>();
        let mut streams: Vec<_> = (0..PER_NODE)
            .map(|_| seated(endless(), watchers.open("polis-w")))
            .collect();
        let mut other = seated(endless(), watchers.open("polis-other"));
        assert_eq!(watchers.held("polis-w"), PER_NODE);
        let mut newest = seated(endless(), watchers.open("polis-w"));
        assert_eq!(watchers.held("polis-w"), PER_NODE);
        let ended = streams[0].next().await.expect("an answer").unwrap_err();
        assert_eq!(ended.code(), tonic::Code::ResourceExhausted);
        assert!(ended.message().contains("node polis-w"), "{ended}");
        assert!(streams[0].next().await.is_none());
        let pending = |s: &mut Seated<_>| {
            let waker = futures_noop_waker();
            let mut cx = Context::from_waker(&waker);
            Pin::new(s).poll_next(&mut cx).is_pending()
        };
        assert!(pending(&mut streams[1]));
        assert!(pending(&mut other));
        assert!(pending(&mut newest));
        drop(streams);
        drop(newest);
        assert_eq!(watchers.held("polis-w"), 0);
        assert_eq!(watchers.held("polis-other"), 1);
    }

    fn futures_noop_waker() -> std::task::Waker {
        std::task::Waker::noop().clone()
    }
}
