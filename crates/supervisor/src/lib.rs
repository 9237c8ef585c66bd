//! A tree of named, restartable runnables: the process model of `polis-node`.
//!
//! Everything long-running in a node is a *runnable*: an async function that takes a
//! [`Context`] and returns `Ok(())` only when it has signalled [`Context::signal_done`].
//! Runnables form a tree; each has a distinguished name (DN) made of its ancestors' names,
//! e.g. `root.role.controlplane.consensus`. A parent starts its children with
//! [`Context::run`]; the children live as long as the parent's current incarnation.
//!
//! ```text
//!            root ─────────────── (restarted with backoff if it fails)
//!           /    \
//!     cluster    role
//!                  \
//!                 controlplane ── fails ──▶ its context is cancelled, so
//!                   /      \                consensus and curator stop;
//!            consensus    curator           when all have exited, it waits
//!                                           out its backoff and starts again
//! ```
//!
//! Invariants:
//! - A runnable that returns an error, panics, or returns `Ok` without having signalled
//!   Done is *dead*: its subtree is cancelled and awaited, then the runnable is restarted
//!   after an exponential backoff. The backoff resets when the runnable signals Healthy.
//! - Cancelling a runnable (because its parent died, or the tree is shut down) cancels
//!   all its descendants; a runnable that exits after cancellation is *canceled*, not
//!   dead, and is not restarted.
//! - A runnable that signalled Done keeps its children running.
//! - A parent may stop a child it started with [`Context::run_stoppable`] on purpose
//!   (a role was taken away): the child's subtree is cancelled and awaited, and the child
//!   is forgotten, not restarted; no backoff grows.
//! - Every log line emitted inside a runnable carries its DN (a `tracing` span
//!   `runnable{dn=…}`), including the supervisor's own lines about it.
//! - The state of the whole tree can be read at any time ([`Supervisor::dump`]).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// The error type runnables return; anything that is `std::error::Error` converts into it
/// (including `anyhow::Error`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a runnable returns.
pub type RunnableResult = Result<(), BoxError>;

type BoxFuture = Pin<Box<dyn Future<Output = RunnableResult> + Send + 'static>>;
type RunnableFn = Arc<dyn Fn(Context) -> BoxFuture + Send + Sync + 'static>;

/// Errors from supervisor operations (not from runnables).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SupervisorError {
    #[error("invalid runnable name {name:?}: must be 1-64 characters of [a-z0-9_-]")]
    InvalidName { name: String },
    #[error("runnable {dn} already exists")]
    DuplicateName { dn: String },
    #[error("runnable {dn} is no longer running and cannot start children")]
    ParentGone { dn: String },
}

/// The lifecycle state of one runnable, as shown by [`Supervisor::dump`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnableState {
    /// Started, not yet signalled Healthy.
    New,
    /// Signalled Healthy.
    Healthy,
    /// Signalled Done and returned.
    Done,
    /// Failed; waiting out its backoff before the next start.
    Dead { error: String },
    /// Exited after being cancelled; will not be restarted.
    Canceled,
}

impl fmt::Display for RunnableState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunnableState::New => f.write_str("NEW"),
            RunnableState::Healthy => f.write_str("HEALTHY"),
            RunnableState::Done => f.write_str("DONE"),
            RunnableState::Dead { error } => write!(f, "DEAD ({error})"),
            RunnableState::Canceled => f.write_str("CANCELED"),
        }
    }
}

/// One entry of the tree's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnableStatus {
    pub state: RunnableState,
    /// How many times this runnable has been restarted after failing.
    pub restarts: u32,
    /// The delay before the latest restart (zero before the first failure).
    pub last_backoff: Duration,
}

/// Exponential backoff between restarts of a failed runnable.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            multiplier: 1.5,
        }
    }
}

impl Backoff {
    /// The delay before restart number `attempt` (0-based) since the last Healthy signal.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.powi(attempt.min(64) as i32);
        let delay = self.initial.as_secs_f64() * factor;
        Duration::from_secs_f64(delay.min(self.max.as_secs_f64()))
    }
}

#[derive(Default)]
struct Tree {
    nodes: Mutex<BTreeMap<String, RunnableStatus>>,
}

impl Tree {
    fn update(&self, dn: &str, f: impl FnOnce(&mut RunnableStatus)) {
        let mut nodes = self.nodes.lock().expect("supervisor tree lock poisoned");
        if let Some(status) = nodes.get_mut(dn) {
            f(status);
        }
    }

    fn insert_new(&self, dn: &str) -> Result<(), SupervisorError> {
        let mut nodes = self.nodes.lock().expect("supervisor tree lock poisoned");
        match nodes.get(dn) {
            Some(s) if !matches!(s.state, RunnableState::Canceled) => {
                Err(SupervisorError::DuplicateName { dn: dn.to_string() })
            }
            _ => {
                nodes.insert(
                    dn.to_string(),
                    RunnableStatus {
                        state: RunnableState::New,
                        restarts: 0,
                        last_backoff: Duration::ZERO,
                    },
                );
                Ok(())
            }
        }
    }

    /// Forgets every descendant of `dn`: they belong to an incarnation that is over.
    fn remove_descendants(&self, dn: &str) {
        let prefix = format!("{dn}.");
        let mut nodes = self.nodes.lock().expect("supervisor tree lock poisoned");
        nodes.retain(|k, _| !k.starts_with(&prefix));
    }
}

/// Handed to every runnable: its name, its cancellation, its signals and its children.
#[derive(Clone)]
pub struct Context {
    dn: Arc<str>,
    cancel: CancellationToken,
    tree: Arc<Tree>,
    config: Arc<Config>,
    children: Arc<Mutex<Option<JoinSet<()>>>>,
}

impl Context {
    /// The runnable's distinguished name, e.g. `root.consensus.etcd`.
    pub fn dn(&self) -> &str {
        &self.dn
    }

    /// Completes when this runnable should stop (its parent died or the tree shuts down).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// A token that is cancelled together with this runnable, for handing to code that
    /// does not know about the supervisor.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Declares the runnable healthy; resets its restart backoff.
    pub fn signal_healthy(&self) {
        self.tree.update(&self.dn, |s| {
            if s.state == RunnableState::New {
                s.state = RunnableState::Healthy;
            }
        });
        tracing::debug!("signalled healthy");
    }

    /// Declares that the runnable has finished its job; it may now return `Ok(())`.
    pub fn signal_done(&self) {
        self.tree
            .update(&self.dn, |s| s.state = RunnableState::Done);
        tracing::debug!("signalled done");
    }

    fn state(&self) -> Option<RunnableState> {
        let nodes = self
            .tree
            .nodes
            .lock()
            .expect("supervisor tree lock poisoned");
        nodes.get(&*self.dn).map(|s| s.state.clone())
    }

    fn is_done(&self) -> bool {
        self.state() == Some(RunnableState::Done)
    }

    fn is_healthy_or_done(&self) -> bool {
        matches!(
            self.state(),
            Some(RunnableState::Healthy | RunnableState::Done)
        )
    }

    /// Starts a child runnable named `name` under this one. The child runs until it is
    /// Done, or until this runnable's current incarnation ends.
    pub fn run<F, Fut>(&self, name: &str, runnable: F) -> Result<(), SupervisorError>
    where
        F: Fn(Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RunnableResult> + Send + 'static,
    {
        self.spawn_child(name, runnable, self.cancel.clone())
            .map(drop)
    }

    /// Registers and spawns a child supervised under `cancel`; resolves the returned
    /// receiver once the child (and its subtree) exited.
    fn spawn_child<F, Fut>(
        &self,
        name: &str,
        runnable: F,
        cancel: CancellationToken,
    ) -> Result<(String, tokio::sync::oneshot::Receiver<()>), SupervisorError>
    where
        F: Fn(Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RunnableResult> + Send + 'static,
    {
        validate_name(name)?;
        let dn = format!("{}.{}", self.dn, name);
        let mut children = self.children.lock().expect("children lock poisoned");
        let Some(set) = children.as_mut() else {
            return Err(SupervisorError::ParentGone {
                dn: self.dn.to_string(),
            });
        };
        self.tree.insert_new(&dn)?;
        let runnable: RunnableFn = Arc::new(move |ctx| Box::pin(runnable(ctx)));
        let (exited_tx, exited) = tokio::sync::oneshot::channel();
        let supervised = supervise(
            dn.clone().into(),
            runnable,
            cancel,
            self.tree.clone(),
            self.config.clone(),
        );
        set.spawn(async move {
            supervised.await;
            let _ = exited_tx.send(());
        });
        Ok((dn, exited))
    }
}

/// A child started with [`Context::run_stoppable`]: its parent may stop it on purpose.
#[must_use = "dropping the handle leaves the child running until its parent ends"]
pub struct Stoppable {
    dn: String,
    cancel: CancellationToken,
    exited: tokio::sync::oneshot::Receiver<()>,
    tree: Arc<Tree>,
}

impl Stoppable {
    /// Cancels the child and its subtree, waits until all of them exited, and forgets
    /// them: the name can be started again. Stopping is not a failure: no backoff grows,
    /// nothing is restarted.
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.exited.await;
        self.tree.remove_descendants(&self.dn);
        self.tree
            .nodes
            .lock()
            .expect("supervisor tree lock poisoned")
            .remove(&self.dn);
        tracing::info!(runnable = self.dn, "stopped on purpose");
    }

    pub fn dn(&self) -> &str {
        &self.dn
    }
}

impl Context {
    /// Like [`Context::run`], but the returned handle can stop the child (and its
    /// subtree) while this runnable goes on: for services that come and go with the
    /// node's roles.
    pub fn run_stoppable<F, Fut>(
        &self,
        name: &str,
        runnable: F,
    ) -> Result<Stoppable, SupervisorError>
    where
        F: Fn(Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RunnableResult> + Send + 'static,
    {
        let cancel = self.cancel.child_token();
        let (dn, exited) = self.spawn_child(name, runnable, cancel.clone())?;
        Ok(Stoppable {
            dn,
            cancel,
            exited,
            tree: self.tree.clone(),
        })
    }
}

fn validate_name(name: &str) -> Result<(), SupervisorError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SupervisorError::InvalidName {
            name: name.to_string(),
        })
    }
}

/// Called with a runnable's DN each time it is restarted after failing (e.g. to count
/// restarts in metrics); must be quick and must not block.
pub type RestartHook = Arc<dyn Fn(&str) + Send + Sync + 'static>;

/// Supervisor-wide settings.
#[derive(Clone, Default)]
pub struct Config {
    pub backoff: Backoff,
    pub on_restart: Option<RestartHook>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("backoff", &self.backoff)
            .field("on_restart", &self.on_restart.is_some())
            .finish()
    }
}

/// Runs one runnable (and, through its context, its subtree) until it is Done or
/// cancelled, restarting it whenever it dies.
async fn supervise(
    dn: Arc<str>,
    runnable: RunnableFn,
    parent_cancel: CancellationToken,
    tree: Arc<Tree>,
    config: Arc<Config>,
) {
    let span = tracing::info_span!(parent: None, "runnable", dn = %dn);
    async move {
        let mut attempt: u32 = 0;
        loop {
            let ctx = Context {
                dn: dn.clone(),
                cancel: parent_cancel.child_token(),
                tree: tree.clone(),
                config: config.clone(),
                children: Arc::new(Mutex::new(Some(JoinSet::new()))),
            };
            let outcome = tokio::spawn(runnable(ctx.clone()).in_current_span()).await;
            let failure = match outcome {
                Ok(Ok(())) if ctx.is_done() => None,
                Ok(Ok(())) if ctx.is_cancelled() => None,
                Ok(Ok(())) => Some("returned without signalling done".to_string()),
                Ok(Err(e)) => Some(error_chain(&*e)),
                Err(join) if join.is_panic() => Some(format!(
                    "panicked: {}",
                    panic_message(join.into_panic().as_ref())
                )),
                Err(join) => Some(format!("task failed: {join}")),
            };
            if failure.is_some() || ctx.is_cancelled() {
                ctx.cancel.cancel();
            }
            let children = ctx
                .children
                .lock()
                .expect("children lock poisoned")
                .take()
                .expect("children are taken once per incarnation");
            children.join_all().await;

            if parent_cancel.is_cancelled() {
                tree.update(&dn, |s| {
                    if s.state != RunnableState::Done {
                        s.state = RunnableState::Canceled
                    }
                });
                return;
            }
            let Some(error) = failure else {
                // Done: the incarnation finished its job and its children have exited.
                return;
            };
            if ctx.is_healthy_or_done() {
                attempt = 0;
            }
            let delay = config.backoff.delay(attempt);
            attempt = attempt.saturating_add(1);
            tracing::error!(
                restart_in_ms = delay.as_millis() as u64,
                "runnable failed: {error}"
            );
            tree.remove_descendants(&dn);
            tree.update(&dn, |s| {
                s.state = RunnableState::Dead {
                    error: error.clone(),
                };
                s.last_backoff = delay;
            });
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = parent_cancel.cancelled() => {
                    tree.update(&dn, |s| s.state = RunnableState::Canceled);
                    return;
                }
            }
            tree.update(&dn, |s| {
                s.state = RunnableState::New;
                s.restarts += 1;
            });
            if let Some(hook) = &config.on_restart {
                hook(&dn);
            }
        }
    }
    .instrument(span)
    .await
}

/// Formats an error with its sources: "when starting etcd: spawning /usr/bin/etcd: …".
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// The running tree. Dropping it does not stop the runnables; call [`Supervisor::shutdown`].
pub struct Supervisor {
    tree: Arc<Tree>,
    cancel: CancellationToken,
    root: tokio::task::JoinHandle<()>,
}

impl Supervisor {
    /// Starts `root` as the runnable named `root`.
    pub fn start<F, Fut>(config: Config, root: F) -> Supervisor
    where
        F: Fn(Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = RunnableResult> + Send + 'static,
    {
        let tree = Arc::new(Tree::default());
        let cancel = CancellationToken::new();
        tree.insert_new("root")
            .expect("a fresh tree has no runnable named root");
        let runnable: RunnableFn = Arc::new(move |ctx| Box::pin(root(ctx)));
        let handle = tokio::spawn(supervise(
            "root".into(),
            runnable,
            cancel.clone(),
            tree.clone(),
            Arc::new(config),
        ));
        Supervisor {
            tree,
            cancel,
            root: handle,
        }
    }

    /// The state of one runnable by DN, if it exists in the current tree.
    pub fn status(&self, dn: &str) -> Option<RunnableStatus> {
        let nodes = self
            .tree
            .nodes
            .lock()
            .expect("supervisor tree lock poisoned");
        nodes.get(dn).cloned()
    }

    /// The state of every runnable, sorted by DN.
    pub fn snapshot(&self) -> Vec<(String, RunnableStatus)> {
        let nodes = self
            .tree
            .nodes
            .lock()
            .expect("supervisor tree lock poisoned");
        nodes.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// A human-readable dump of the tree: one line per runnable.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (dn, status) in self.snapshot() {
            out.push_str(&format!(
                "{dn:<48} {} restarts={}\n",
                status.state, status.restarts
            ));
        }
        out
    }

    /// [`Supervisor::shutdown`], waiting at most `bound`: then stops waiting and returns
    /// the runnables still running (by DN, a parent with its stuck descendant; empty
    /// when every one stopped). A runnable that ignores its cancellation must not keep
    /// a node from stopping, and its name is what the operator needs to know.
    pub async fn shutdown_within(mut self, bound: std::time::Duration) -> Vec<String> {
        self.cancel.cancel();
        match tokio::time::timeout(bound, &mut self.root).await {
            Ok(Ok(())) => Vec::new(),
            Ok(Err(e)) => {
                tracing::error!("supervisor root task failed: {e}");
                Vec::new()
            }
            Err(_) => {
                self.root.abort();
                self.snapshot()
                    .into_iter()
                    .filter(|(_, status)| {
                        matches!(status.state, RunnableState::New | RunnableState::Healthy)
                    })
                    .map(|(dn, _)| dn)
                    .collect()
            }
        }
    }

    /// Cancels the whole tree and waits until every runnable has exited.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        if let Err(e) = self.root.await {
            tracing::error!("supervisor root task failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
