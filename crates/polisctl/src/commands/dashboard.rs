//! `dashboard`: a live terminal view of the cluster until `q` (or Ctrl-C).
//! Sources: the audit log followed as a stream (`Audit.AuditLog` with follow); the node
//! list (`Management.ListNodes`, which has no watch for owners) fetched again on each new
//! audit entry (a state change), at most every 0.5 s, and otherwise every 2 s for health
//! and heartbeat ages; the consensus status (every curator's own member, no watch either)
//! every 2 s. The screen is restored on every exit: `q`, Esc, Ctrl-C, SIGTERM, SIGHUP, an
//! error or a panic.
//! May not draw itself (`render::dashboard` does, from a `DashboardState`).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use proto::api;
use ratatui::DefaultTerminal;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use tokio::sync::{Notify, mpsc};

use crate::commands::status::{consensus_status, curator_leader};
use crate::consensus_summary::MemberStatus;
use crate::render::dashboard::{DashboardState, draw};
use crate::session::{OwnerSession, call_error, owner_session};

/// What `dashboard` says when stdout or stdin is not a terminal.
pub(crate) const NO_TERMINAL: &str =
    "polisctl dashboard needs a terminal; use `polisctl node list` / `cluster status`";
/// The longest between two fetches of the node list and of the consensus status.
const REFRESH: Duration = Duration::from_secs(2);
/// The shortest between two fetches of the node list (audit entries may come in bursts).
const MIN_GAP: Duration = Duration::from_millis(500);
/// How long one owner session serves the node list before it is opened anew.
const SESSION_RENEWAL: Duration = Duration::from_secs(600);

enum Update {
    Nodes(Result<Vec<api::NodeInfo>, String>),
    Consensus(Result<(Vec<MemberStatus>, bool, Option<String>), String>),
    AuditOpen,
    Audit(api::AuditEntry),
    AuditError(String),
    Redraw,
    Quit,
    KeyboardError(String),
}

/// `dashboard`.
pub(crate) async fn dashboard(config: &Path, raw_endpoints: &[String]) -> Result<()> {
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!(NO_TERMINAL);
    }
    // Credentials first: a problem with them is an ordinary one-line error.
    drop(owner_session(config, raw_endpoints).await?);
    // Installs a panic hook that restores the terminal before the panic is printed.
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            ratatui::restore();
            return Err(e).context("setting up the terminal");
        }
    };
    let (tx, mut rx) = mpsc::channel(256);
    let changed = Arc::new(Notify::new());
    let tasks = [
        tokio::spawn(follow_audit(
            config.to_path_buf(),
            raw_endpoints.to_vec(),
            tx.clone(),
            changed.clone(),
        )),
        tokio::spawn(fetch_nodes(
            config.to_path_buf(),
            raw_endpoints.to_vec(),
            tx.clone(),
            changed,
        )),
        tokio::spawn(fetch_consensus(
            config.to_path_buf(),
            raw_endpoints.to_vec(),
            tx.clone(),
        )),
    ];
    // The keyboard blocks: its own thread, which ends with the process.
    std::thread::spawn(move || read_keys(tx));
    let shown = show(&mut terminal, &mut rx).await;
    ratatui::restore();
    for t in tasks {
        t.abort();
    }
    shown
}

/// Draws `state` after every batch of updates until `q`.
async fn show(terminal: &mut DefaultTerminal, rx: &mut mpsc::Receiver<Update>) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Terminated or hung up: leave as after `q`, so the terminal is restored.
    let mut term = signal(SignalKind::terminate()).context("watching for SIGTERM")?;
    let mut hangup = signal(SignalKind::hangup()).context("watching for SIGHUP")?;
    let mut state = DashboardState::default();
    loop {
        terminal
            .draw(|f| draw(f, &state))
            .context("drawing the dashboard")?;
        let first = tokio::select! {
            first = rx.recv() => first,
            _ = term.recv() => return Ok(()),
            _ = hangup.recv() => return Ok(()),
        };
        let Some(first) = first else {
            bail!("the dashboard's sources all stopped");
        };
        let mut next = Some(first);
        while let Some(update) = next {
            match update {
                Update::Quit => return Ok(()),
                Update::KeyboardError(e) => bail!("reading the keyboard: {e}"),
                Update::Redraw => {}
                Update::Nodes(Ok(nodes)) => {
                    state.nodes = Some(nodes);
                    state.set_error("nodes", None);
                }
                Update::Nodes(Err(e)) => state.set_error("nodes", Some(e)),
                Update::Consensus(Ok((members, quorum, leader))) => {
                    state.members = Some(members);
                    state.quorum = quorum;
                    state.curator_leader = leader;
                    state.set_error("consensus", None);
                }
                Update::Consensus(Err(e)) => state.set_error("consensus", Some(e)),
                Update::AuditOpen => {
                    state.audit_open = true;
                    state.set_error("audit", None);
                }
                Update::Audit(entry) => state.push_audit(entry),
                Update::AuditError(e) => state.set_error("audit", Some(e)),
            }
            next = rx.try_recv().ok();
        }
    }
}

/// Sends `Quit` on `q`, `Q`, Ctrl-C or Esc, `Redraw` when the terminal is resized.
fn read_keys(tx: mpsc::Sender<Update>) {
    loop {
        let update = match event::read() {
            Ok(Event::Key(key)) if key.kind == KeyEventKind::Press => {
                let ctrl_c =
                    key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
                if ctrl_c || matches!(key.code, KeyCode::Char('q' | 'Q') | KeyCode::Esc) {
                    Update::Quit
                } else {
                    continue;
                }
            }
            Ok(Event::Resize(..)) => Update::Redraw,
            Ok(_) => continue,
            Err(e) => Update::KeyboardError(e.to_string()),
        };
        let last = matches!(update, Update::Quit | Update::KeyboardError(_));
        if tx.blocking_send(update).is_err() || last {
            return;
        }
    }
}

/// Follows the audit log, reopening it (from the last entry seen) when it breaks;
/// wakes `changed` on every new entry.
async fn follow_audit(
    config: PathBuf,
    endpoints: Vec<String>,
    tx: mpsc::Sender<Update>,
    changed: Arc<Notify>,
) {
    let mut last: Option<(u64, String)> = None;
    loop {
        let request = api::AuditLogRequest {
            node_id: String::new(),
            since_unix_micros: last.as_ref().map_or(0, |(t, _)| *t),
            follow: true,
            after_key: String::new(),
        };
        let opened = async {
            owner_session(&config, &endpoints)
                .await?
                .audit_log(request)
                .await
        };
        match opened.await {
            Ok(mut stream) => {
                if tx.send(Update::AuditOpen).await.is_err() {
                    return;
                }
                loop {
                    match stream.message().await {
                        Ok(Some(entry)) => {
                            // Reopened from the last time: skip what was seen already.
                            if last.as_ref().is_some_and(|(_, key)| entry.key <= *key) {
                                continue;
                            }
                            last = Some((entry.time_unix_micros, entry.key.clone()));
                            changed.notify_one();
                            if tx.send(Update::Audit(entry)).await.is_err() {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(s) => {
                            let e = call_error("reading the audit log", s);
                            if tx.send(Update::AuditError(format!("{e:#}"))).await.is_err() {
                                return;
                            }
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                if tx.send(Update::AuditError(format!("{e:#}"))).await.is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(REFRESH).await;
    }
}

/// The node list: again on each audit entry (at most every `MIN_GAP`), else every
/// `REFRESH`. One session (one connection to the leader) serves the calls; it is opened
/// anew after a failure and every `SESSION_RENEWAL` (to pick up a renewed owner
/// certificate and CRL).
async fn fetch_nodes(
    config: PathBuf,
    endpoints: Vec<String>,
    tx: mpsc::Sender<Update>,
    changed: Arc<Notify>,
) {
    let mut session: Option<(OwnerSession, Instant)> = None;
    loop {
        if session
            .as_ref()
            .is_some_and(|(_, opened)| opened.elapsed() > SESSION_RENEWAL)
        {
            session = None;
        }
        let nodes = async {
            if session.is_none() {
                session = Some((owner_session(&config, &endpoints).await?, Instant::now()));
            }
            let (s, _) = session.as_ref().expect("opened above");
            let listed = s
                .list_nodes("listing nodes", api::ListNodesRequest::default())
                .await;
            if listed.is_err() {
                session = None;
            }
            listed
        };
        let nodes = nodes.await.map_err(|e| format!("{e:#}"));
        if tx.send(Update::Nodes(nodes)).await.is_err() {
            return;
        }
        tokio::time::sleep(MIN_GAP).await;
        tokio::select! {
            () = tokio::time::sleep(REFRESH - MIN_GAP) => {}
            () = changed.notified() => {}
        }
    }
}

/// The consensus members and the curator leader, every `REFRESH`.
async fn fetch_consensus(config: PathBuf, endpoints: Vec<String>, tx: mpsc::Sender<Update>) {
    loop {
        let answer = match consensus_status(&config, &endpoints).await {
            Ok((members, quorum, ..)) => {
                let leader = curator_leader(&config, &endpoints).await.map(|(id, _)| id);
                Ok((members, quorum, leader))
            }
            Err(e) => Err(format!("{e:#}")),
        };
        if tx.send(Update::Consensus(answer)).await.is_err() {
            return;
        }
        tokio::time::sleep(REFRESH).await;
    }
}
