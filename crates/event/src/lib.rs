//! Typed watchable values with latest-value semantics.
//!
//! A [`Value`] holds the newest version of some piece of node state (the cluster state,
//! the consensus status, the node's roles). Components that produce state `set` it;
//! components that consume it `watch` it. A [`Watcher`] never sees stale data and never
//! queues: if a value changes three times while a watcher is busy, its next `get` returns
//! only the newest.
//!
//! ```text
//!  producer ── set(v1) ── set(v2) ── set(v3) ──▶ Value ──▶ Watcher::get() == v3
//! ```
//!
//! Invariants:
//! - The first `get` on a new watcher returns the current value at once, or waits until
//!   a first value is set.
//! - Every later `get` waits for a value newer than the one it last returned.
//! - When every [`Value`] handle is dropped, waiting watchers get [`Closed`].

use tokio::sync::watch;

/// The value's producer side has gone away; no further values will arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the watched value was dropped")]
pub struct Closed;

/// A watchable value. Cloning gives another handle to the same value.
#[derive(Debug)]
pub struct Value<T> {
    tx: std::sync::Arc<watch::Sender<Option<T>>>,
}

impl<T> Clone for Value<T> {
    fn clone(&self) -> Self {
        Value {
            tx: self.tx.clone(),
        }
    }
}

impl<T: Clone + Send + Sync> Default for Value<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone + Send + Sync> Value<T> {
    /// A value that has not been set yet.
    pub fn new() -> Self {
        let (tx, _) = watch::channel(None);
        Value {
            tx: std::sync::Arc::new(tx),
        }
    }

    /// Publishes a new version, waking every watcher.
    pub fn set(&self, value: T) {
        self.tx.send_replace(Some(value));
    }

    /// Replaces the value with `change(current)` when that returns `Some`, atomically
    /// (no other `set` or `update` comes in between); true when it changed. Watchers
    /// are woken only then.
    pub fn update(&self, change: impl FnOnce(Option<&T>) -> Option<T>) -> bool {
        self.tx.send_if_modified(|v| match change(v.as_ref()) {
            Some(next) => {
                *v = Some(next);
                true
            }
            None => false,
        })
    }

    /// The current value, without waiting.
    pub fn current(&self) -> Option<T> {
        self.tx.borrow().clone()
    }

    /// A new watcher; its first `get` returns the current value (or waits for one).
    pub fn watch(&self) -> Watcher<T> {
        let mut rx = self.tx.subscribe();
        rx.mark_changed();
        Watcher { rx }
    }
}

/// Follows one [`Value`]; see the crate documentation for its semantics.
#[derive(Debug)]
pub struct Watcher<T> {
    rx: watch::Receiver<Option<T>>,
}

impl<T: Clone + Send + Sync> Watcher<T> {
    /// The next value this watcher has not yet returned (the newest one).
    pub async fn get(&mut self) -> Result<T, Closed> {
        loop {
            self.rx.changed().await.map_err(|_| Closed)?;
            if let Some(v) = self.rx.borrow_and_update().clone() {
                return Ok(v);
            }
        }
    }

    /// Waits for a value matching `pred` (checking the current one first).
    pub async fn get_matching(&mut self, pred: impl Fn(&T) -> bool) -> Result<T, Closed> {
        let v = self
            .rx
            .wait_for(|v| v.as_ref().is_some_and(&pred))
            .await
            .map_err(|_| Closed)?
            .clone()
            .expect("wait_for only returns values matching the predicate");
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn update_changes_only_when_asked() {
        let v = Value::new();
        v.set(1);
        let mut w = v.watch();
        assert_eq!(w.get().await, Ok(1));
        assert!(!v.update(|_| None));
        let pending = tokio::time::timeout(Duration::from_millis(30), w.get()).await;
        assert!(
            pending.is_err(),
            "an update that changed nothing woke a watcher"
        );
        assert!(v.update(|c| c.map(|c| c + 1)));
        assert_eq!(w.get().await, Ok(2));
    }

    #[tokio::test]
    async fn first_get_returns_current_value() {
        let v = Value::new();
        v.set(1);
        let mut w = v.watch();
        assert_eq!(w.get().await, Ok(1));
    }

    #[tokio::test]
    async fn first_get_waits_for_first_value() {
        let v = Value::<u32>::new();
        let mut w = v.watch();
        let pending = tokio::time::timeout(Duration::from_millis(30), w.get()).await;
        assert!(pending.is_err(), "get returned before any value was set");
        v.set(7);
        assert_eq!(w.get().await, Ok(7));
    }

    #[tokio::test]
    async fn later_gets_return_only_the_newest() {
        let v = Value::new();
        v.set("a");
        let mut w = v.watch();
        assert_eq!(w.get().await, Ok("a"));
        v.set("b");
        v.set("c");
        assert_eq!(w.get().await, Ok("c"));
        let pending = tokio::time::timeout(Duration::from_millis(30), w.get()).await;
        assert!(pending.is_err(), "a value was returned twice");
    }

    #[tokio::test]
    async fn watchers_are_independent() {
        let v = Value::new();
        let mut a = v.watch();
        let mut b = v.watch();
        v.set(1);
        assert_eq!(a.get().await, Ok(1));
        v.set(2);
        assert_eq!(a.get().await, Ok(2));
        assert_eq!(b.get().await, Ok(2));
    }

    #[tokio::test]
    async fn dropping_the_value_closes_watchers() {
        let v = Value::<u8>::new();
        let mut w = v.watch();
        drop(v);
        assert_eq!(w.get().await, Err(Closed));
    }

    #[tokio::test]
    async fn get_matching_skips_other_values() {
        let v = Value::new();
        let mut w = v.watch();
        v.set(1);
        let waiter = tokio::spawn(async move { w.get_matching(|x| *x >= 3).await });
        v.set(2);
        v.set(3);
        assert_eq!(waiter.await.unwrap(), Ok(3));
    }
}
