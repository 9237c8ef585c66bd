//! What each component of this node's Kubernetes roles is doing, for the node's status
//! (`node describe`, the warnings of `node list`): running or not, how often it was
//! started again, the last error it exited with. Shared between the runnables that
//! start components (writers) and the node's heartbeat (reader).
//!
//! A leaf: no I/O.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use proto::state::ServiceState;

/// The longest error text kept (a component's exit status, a missing binary's path).
pub const MAX_ERROR_LEN: usize = 256;
/// Restarts from which a component is called crash-looping (`node list` warns).
pub const CRASH_LOOP_RESTARTS: u32 = 3;

/// Milliseconds since the Unix epoch, now.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The components' states, by program name. Cloned handles share one board.
#[derive(Clone, Debug, Default)]
pub struct ComponentBoard(
    Arc<Mutex<BTreeMap<String, ServiceState>>>,
    Arc<Mutex<String>>,
);

fn bounded(text: &str) -> String {
    let mut end = text.len().min(MAX_ERROR_LEN);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

impl ComponentBoard {
    /// Changes `program`'s state (a new one when the board has none).
    fn update(&self, program: &str, change: impl FnOnce(&mut ServiceState)) {
        let mut board = self.0.lock().expect("component board lock");
        change(
            board
                .entry(program.to_string())
                .or_insert_with(|| ServiceState {
                    name: program.to_string(),
                    ..Default::default()
                }),
        );
    }

    /// `program` started (again, when it ran before: counted as a restart).
    pub fn started(&self, program: &str, now_unix_ms: u64) {
        self.update(program, |state| {
            if state.since_unix_ms != 0 {
                state.restarts = state.restarts.saturating_add(1);
            }
            state.running = true;
            state.since_unix_ms = now_unix_ms;
        });
    }

    /// `program` exited (or could not start), with `error`.
    pub fn exited(&self, program: &str, error: &str, now_unix_ms: u64) {
        self.update(program, |state| {
            state.running = false;
            state.last_error = bounded(error);
            state.since_unix_ms = now_unix_ms;
        });
    }

    /// `program` was stopped on purpose (new certificates, the role going): not an
    /// exit, and its next start is no restart.
    pub fn stopped(&self, program: &str) {
        let mut board = self.0.lock().expect("component board lock");
        if let Some(state) = board.get_mut(program) {
            state.running = false;
            state.since_unix_ms = 0;
        }
    }

    /// Every component forgotten (the role went away).
    pub fn clear(&self) {
        self.0.lock().expect("component board lock").clear();
        self.1.lock().expect("component board lock").clear();
    }

    /// A worker's Node as the apiserver shows it (bounded like an error).
    pub fn set_kubernetes_node(&self, state: &str) {
        *self.1.lock().expect("component board lock") = bounded(state);
    }

    pub fn kubernetes_node(&self) -> String {
        self.1.lock().expect("component board lock").clone()
    }

    /// The states, by name.
    pub fn snapshot(&self) -> Vec<ServiceState> {
        self.0
            .lock()
            .expect("component board lock")
            .values()
            .cloned()
            .collect()
    }
}

/// Whether `state` is a component that keeps crashing (pure).
pub fn crash_looping(state: &ServiceState) -> bool {
    state.restarts >= CRASH_LOOP_RESTARTS && !state.last_error.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_exits_and_restarts_are_counted_per_component() {
        let board = ComponentBoard::default();
        board.started("kube-apiserver", 1);
        board.started("kube-scheduler", 1);
        assert!(
            board
                .snapshot()
                .iter()
                .all(|s| s.running && s.restarts == 0)
        );
        for at in 2..6 {
            board.exited(
                "kube-scheduler",
                "kube-scheduler exited (exit status: 1)",
                at,
            );
            board.started("kube-scheduler", at);
        }
        let states = board.snapshot();
        let scheduler = states.iter().find(|s| s.name == "kube-scheduler").unwrap();
        assert_eq!(scheduler.restarts, 4);
        assert!(crash_looping(scheduler));
        assert!(!crash_looping(&states[0]));
        board.exited("kube-apiserver", &"é".repeat(400), 9);
        let apiserver = &board.snapshot()[0];
        assert!(!apiserver.running && apiserver.last_error.len() <= MAX_ERROR_LEN);
        // A stop on purpose: its next start is no restart.
        board.stopped("kube-apiserver");
        board.started("kube-apiserver", 10);
        assert_eq!(board.snapshot()[0].restarts, 0);
        board.clear();
        assert!(board.snapshot().is_empty());
    }
}
