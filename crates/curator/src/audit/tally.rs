//! Refused calls counted instead of recorded one by one (pure): a refused call of any
//! caller but the owner opens (or joins) a window for its (caller, RPC, code); the
//! window closes [`WINDOW`] after it opened and becomes one entry carrying the count.
//!
//! ```text
//!   refused call (not the owner) ─▶ Tally::add ─▶ window (subject, method, code)
//!                                                   count, first and last time
//!   every second: Tally::due(now) ─▶ closed windows ─▶ one entry each, count = calls
//! ```
//! The subject is the node ID for a node, the operator's name for an operator, the
//! source address (an IPv6 /64) for a caller without a cluster certificate: a
//! self-signed key costs nothing, an address does. Strangers and insiders (nodes and
//! operators, whose certificates the cluster issued) draw on two pools of windows, so
//! that a flood of strangers never makes an insider anonymous:
//! - strangers: at most [`MAX_WINDOWS`] open at once; a call that would open another
//!   joins its RPC and code's overflow window (subject `*`, caller unnamed);
//! - insiders: at most [`MAX_INSIDER_WINDOWS`], and [`PER_INSIDER`] per subject; a
//!   subject past its share joins its own overflow window (its name kept, RPC `*`), and
//!   only a full insider pool sends a call to the unnamed overflow window.
//!
//! Neither memory nor the entries written grow with the number of callers: at most
//! `MAX_WINDOWS` + `MAX_INSIDER_WINDOWS` + 2 × (RPCs × codes) entries per window length.
//!
//! Why: such calls change nothing, anyone (or any node) can make them as fast as the
//! network allows, and one entry per call let them fill etcd and push real entries
//! out. The owner's refusals stay one entry per call, as do successful calls.
//!
//! No I/O, no clock: times are arguments.

use std::collections::HashMap;

use proto::api::AuditEntry;

/// How long a window stays open (its entry is written when it closes).
pub const WINDOW_MICROS: u64 = 10_000_000;
/// [`WINDOW_MICROS`] as a duration.
pub const WINDOW: std::time::Duration = std::time::Duration::from_micros(WINDOW_MICROS);
/// Strangers' windows open at once, overflow windows aside.
pub const MAX_WINDOWS: usize = 1024;
/// Insiders' windows open at once (nodes and up to 256 operators), overflow windows
/// aside.
pub const MAX_INSIDER_WINDOWS: usize = 4096;
/// Windows one insider holds at once, its own overflow window included.
pub const PER_INSIDER: usize = 8;
/// The RPC of an insider's own overflow window: the calls of several RPCs.
pub const SEVERAL: &str = "*";
/// The subject of an overflow window.
pub const MANY: &str = "*";

/// Whether `entry` is counted in a window rather than written on its own: a refused
/// call (any code but OK) of a caller that is not the owner.
pub fn counted(entry: &AuditEntry) -> bool {
    entry.code != 0 && entry.identity_kind != "owner"
}

/// Whose window a call joins: the node, the operator (by name: operators calling
/// through one follower curator, or from one host, share a source, and the entry
/// must name each), or the source.
fn subject(entry: &AuditEntry) -> String {
    match entry.identity_kind.as_str() {
        "node" => format!("node {}", entry.identity),
        // "<name> (<role>), …" (`audit::who`).
        "operator" => {
            let name = entry
                .identity
                .split_once(" (")
                .map_or(entry.identity.as_str(), |(name, _)| name);
            format!("operator {name}")
        }
        _ => super::bounds::source(&entry.source_address),
    }
}

/// Whether `entry`'s caller holds a certificate the cluster issued (a node, an
/// operator): its windows come from the insiders' pool.
fn insider(entry: &AuditEntry) -> bool {
    matches!(entry.identity_kind.as_str(), "node" | "operator")
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WindowKey {
    subject: String,
    method: String,
    code: i32,
    insider: bool,
}

impl WindowKey {
    fn overflow(&self) -> bool {
        self.subject == MANY
    }
}

#[derive(Debug, Clone)]
struct Window {
    /// The first call's entry: its caller, target and message stand for the window.
    first: AuditEntry,
    count: u64,
    last_micros: u64,
}

/// The open windows.
#[derive(Debug, Default)]
pub struct Tally {
    open: HashMap<WindowKey, Window>,
    /// Open strangers' windows that are not overflow windows.
    strangers: usize,
    /// Open insiders' windows that are not overflow windows, in all and per subject.
    insiders: usize,
    per_insider: HashMap<String, usize>,
}

impl Tally {
    /// Windows open (overflow ones included).
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Counts one refused call (see [`counted`]); its time is `entry.time_unix_micros`.
    pub fn add(&mut self, entry: AuditEntry) {
        let key = self.window_for(&entry);
        let overflow = key.overflow();
        let time = entry.time_unix_micros;
        let window = self.open.entry(key).or_insert_with(|| Window {
            first: AuditEntry {
                // The callers of an overflow window are many: none is named.
                identity: if overflow {
                    String::new()
                } else {
                    entry.identity.clone()
                },
                source_address: if overflow {
                    MANY.to_string()
                } else {
                    entry.source_address.clone()
                },
                ..entry.clone()
            },
            count: 0,
            last_micros: time,
        });
        window.count += 1;
        window.last_micros = window.last_micros.max(time);
    }

    /// The window `entry` joins, counted as open if it is new.
    fn window_for(&mut self, entry: &AuditEntry) -> WindowKey {
        let insider = insider(entry);
        let mut key = WindowKey {
            subject: subject(entry),
            method: entry.method.clone(),
            code: entry.code,
            insider,
        };
        if self.open.contains_key(&key) {
            return key;
        }
        if !insider {
            if self.strangers >= MAX_WINDOWS {
                key.subject = MANY.to_string();
            } else {
                self.strangers += 1;
            }
            return key;
        }
        let held = self.per_insider.get(&key.subject).copied().unwrap_or(0);
        if held + 1 >= PER_INSIDER {
            // The subject's last window takes the calls of every RPC past its share.
            key.method = SEVERAL.to_string();
            key.code = 0;
            if self.open.contains_key(&key) {
                return key;
            }
        }
        if self.insiders >= MAX_INSIDER_WINDOWS {
            key.subject = MANY.to_string();
            key.method = entry.method.clone();
            key.code = entry.code;
            return key;
        }
        self.insiders += 1;
        *self.per_insider.entry(key.subject.clone()).or_default() += 1;
        key
    }

    /// A window closed: its place in its pool is free again.
    fn closed(&mut self, key: &WindowKey) {
        if key.overflow() {
            return;
        }
        if !key.insider {
            self.strangers -= 1;
            return;
        }
        self.insiders -= 1;
        if let Some(held) = self.per_insider.get_mut(&key.subject) {
            *held -= 1;
            if *held == 0 {
                self.per_insider.remove(&key.subject);
            }
        }
    }

    /// The entries of the windows open for [`WINDOW_MICROS`] at `now_micros` (or
    /// opened in the future: the clock went back), closed.
    pub fn due(&mut self, now_micros: u64) -> Vec<AuditEntry> {
        let closing = |w: &Window| {
            let opened = w.first.time_unix_micros;
            now_micros >= opened.saturating_add(WINDOW_MICROS) || now_micros < opened
        };
        let keys: Vec<WindowKey> = self
            .open
            .iter()
            .filter(|(_, w)| closing(w))
            .map(|(k, _)| k.clone())
            .collect();
        let mut closed = Vec::with_capacity(keys.len());
        for key in keys {
            self.closed(&key);
            closed.extend(self.open.remove(&key).map(|w| entry_of(&key, w)));
        }
        closed.sort_by_key(|e| e.first_time_unix_micros);
        closed
    }

    /// Every window's entry, closed now (the curator stops).
    pub fn drain(&mut self) -> Vec<AuditEntry> {
        self.strangers = 0;
        self.insiders = 0;
        self.per_insider.clear();
        self.open.drain().map(|(k, w)| entry_of(&k, w)).collect()
    }
}

fn entry_of(key: &WindowKey, window: Window) -> AuditEntry {
    let several = key.method == SEVERAL && !key.overflow();
    AuditEntry {
        first_time_unix_micros: window.first.time_unix_micros,
        time_unix_micros: window.last_micros,
        count: window.count,
        // An insider's own overflow window: the calls of several RPCs and codes, the
        // first one's standing for them.
        method: if several {
            SEVERAL.to_string()
        } else {
            window.first.method.clone()
        },
        message: if several {
            format!(
                "refused calls of several RPCs (past {PER_INSIDER} at once); the first: {} {}",
                window.first.method, window.first.message
            )
        } else {
            window.first.message.clone()
        },
        ..window.first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(kind: &str, identity: &str, source: &str, method: &str, at: u64) -> AuditEntry {
        AuditEntry {
            time_unix_micros: at,
            identity_kind: kind.into(),
            identity: identity.into(),
            source_address: source.into(),
            method: method.into(),
            code: 7,
            code_name: "PermissionDenied".into(),
            message: "no".into(),
            ..Default::default()
        }
    }

    const UNLOCK: &str = "/polis.api.DataUnlock/UnlockData";
    const COMMIT: &str = "/polis.api.Curator/CommitNode";

    #[test]
    fn what_is_counted() {
        let mut e = refused("self-signed", "polis-a", "127.0.0.2:1", UNLOCK, 0);
        assert!(counted(&e));
        e.identity_kind = "node".into();
        assert!(counted(&e));
        e.identity_kind = "owner".into();
        assert!(!counted(&e), "the owner's refusals are recorded one by one");
        e.identity_kind = "self-signed".into();
        e.code = 0;
        assert!(!counted(&e), "successful calls are recorded one by one");
    }

    #[test]
    fn one_entry_per_caller_rpc_and_code_per_window() {
        let mut tally = Tally::default();
        // 10 500 refused calls from one source with fresh keys each time, and a node's.
        for i in 0..10_500u64 {
            let key = format!("polis-{i}");
            tally.add(refused(
                "self-signed",
                &key,
                &format!("127.0.0.2:{}", 1000 + i % 50_000),
                UNLOCK,
                1_000 + i,
            ));
        }
        for i in 0..100 {
            tally.add(refused("node", "polis-w", "127.0.0.3:9", COMMIT, 2_000 + i));
        }
        assert_eq!(tally.len(), 2);
        assert!(tally.due(1_000 + WINDOW_MICROS - 1).is_empty());
        let entries = tally.due(2_000 + WINDOW_MICROS);
        assert_eq!(entries.len(), 2);
        let unlock = &entries[0];
        assert_eq!(unlock.count, 10_500);
        assert_eq!(unlock.first_time_unix_micros, 1_000);
        assert_eq!(unlock.time_unix_micros, 1_000 + 10_499);
        assert_eq!(unlock.identity, "polis-0", "the first caller stands for it");
        assert_eq!(unlock.source_address, "127.0.0.2:1000");
        assert_eq!(entries[1].count, 100);
        assert!(tally.is_empty());
    }

    #[test]
    fn operators_refused_through_one_source_are_counted_apart() {
        let mut tally = Tally::default();
        for (who, n) in [
            ("ada (operator), serial 1", 3),
            ("bob (reader), serial 2", 2),
        ] {
            for i in 0..n {
                tally.add(refused("operator", who, "127.0.0.9:7835", UNLOCK, 10 + i));
            }
        }
        // ada's certificate renewed: still ada's window.
        tally.add(refused(
            "operator",
            "ada (operator), serial 3",
            "127.0.0.9:7835",
            UNLOCK,
            20,
        ));
        let mut entries = tally.drain();
        entries.sort_by(|a, b| a.identity.cmp(&b.identity));
        let counts: Vec<(&str, u64)> = entries
            .iter()
            .map(|e| (e.identity.as_str(), e.count))
            .collect();
        assert_eq!(
            counts,
            [
                ("ada (operator), serial 1", 4),
                ("bob (reader), serial 2", 2)
            ]
        );
    }

    #[test]
    fn windows_close_one_by_one() {
        let mut tally = Tally::default();
        tally.add(refused("self-signed", "a", "127.0.0.2:1", UNLOCK, 0));
        tally.add(refused(
            "self-signed",
            "a",
            "127.0.0.2:1",
            COMMIT,
            5_000_000,
        ));
        assert_eq!(tally.due(WINDOW_MICROS).len(), 1);
        assert_eq!(tally.len(), 1);
        // A call after its window closed opens a new one.
        tally.add(refused(
            "self-signed",
            "a",
            "127.0.0.2:1",
            UNLOCK,
            WINDOW_MICROS,
        ));
        assert_eq!(tally.len(), 2);
        // A clock that went back closes what it cannot judge.
        assert_eq!(tally.due(1).len(), 2);
        assert_eq!(tally.drain().len(), 0);
    }

    #[test]
    fn a_stranger_flood_never_makes_an_insider_anonymous() {
        let mut tally = Tally::default();
        // Every stranger window taken, and more.
        for i in 0..(MAX_WINDOWS + 100) {
            let source = format!("127.{}.{}.{}:7", i / 65536, (i / 256) % 256, i % 256);
            tally.add(refused("self-signed", "k", &source, UNLOCK, 10));
        }
        // A node and an operator refused meanwhile: named, each in its own window.
        tally.add(refused("node", "polis-w", "127.0.0.3:9", COMMIT, 20));
        tally.add(refused(
            "operator",
            "ada (reader), serial 1",
            "127.0.0.4:9",
            UNLOCK,
            20,
        ));
        let entries = tally.drain();
        let named: Vec<_> = entries
            .iter()
            .filter(|e| e.identity_kind != "self-signed")
            .map(|e| (e.identity.as_str(), e.count))
            .collect();
        assert_eq!(named.len(), 2, "{named:?}");
        assert!(named.contains(&("polis-w", 1)));
        assert!(named.contains(&("ada (reader), serial 1", 1)));
    }

    #[test]
    fn an_insider_past_its_share_keeps_its_name_in_its_own_overflow_window() {
        let mut tally = Tally::default();
        // One node refused on 20 RPCs: PER_INSIDER - 1 windows of their own, the rest in
        // the node's overflow window, still named.
        for i in 0..20 {
            for _ in 0..3 {
                tally.add(refused(
                    "node",
                    "polis-w",
                    "127.0.0.3:9",
                    &format!("/x/M{i}"),
                    30 + i,
                ));
            }
        }
        assert_eq!(tally.len(), PER_INSIDER);
        let entries = tally.drain();
        assert!(entries.iter().all(|e| e.identity == "polis-w"));
        let several: Vec<_> = entries.iter().filter(|e| e.method == SEVERAL).collect();
        assert_eq!(several.len(), 1);
        assert_eq!(several[0].count, 3 * (20 - (PER_INSIDER as u64 - 1)));
        assert!(
            several[0].message.contains("several RPCs"),
            "{}",
            several[0].message
        );
        let total: u64 = entries.iter().map(|e| e.count).sum();
        assert_eq!(total, 60);
        // The pool fills only with many insiders; then the unnamed overflow takes calls.
        let mut tally = Tally::default();
        for i in 0..(MAX_INSIDER_WINDOWS + 10) {
            tally.add(refused(
                "node",
                &format!("polis-{i}"),
                "127.0.0.3:9",
                COMMIT,
                40,
            ));
        }
        assert_eq!(tally.len(), MAX_INSIDER_WINDOWS + 1);
        tally.due(40 + WINDOW_MICROS);
        assert!(tally.is_empty());
        tally.add(refused("node", "polis-again", "127.0.0.3:9", COMMIT, 50));
        assert_eq!(
            tally.drain()[0].identity,
            "polis-again",
            "the pool is free again"
        );
    }

    #[test]
    fn many_sources_share_overflow_windows() {
        let mut tally = Tally::default();
        for i in 0..(MAX_WINDOWS + 5000) {
            let source = format!("127.{}.{}.{}:7", i / 65536, (i / 256) % 256, i % 256);
            tally.add(refused("self-signed", "k", &source, UNLOCK, 10));
            tally.add(refused("self-signed", "k", &source, COMMIT, 10));
        }
        // MAX_WINDOWS regular windows, one overflow window per RPC.
        assert_eq!(tally.len(), MAX_WINDOWS + 2);
        let entries = tally.drain();
        let many: Vec<_> = entries
            .iter()
            .filter(|e| e.source_address == MANY)
            .collect();
        assert_eq!(many.len(), 2);
        let total: u64 = entries.iter().map(|e| e.count).sum();
        assert_eq!(total, 2 * (MAX_WINDOWS as u64 + 5000));
        assert!(many.iter().all(|e| e.identity.is_empty()));
    }
}
