//! The audit log's size (pure): every entry cut to a fixed size, the whole log held to
//! a count and a byte budget, and whose entries go when it is over.
//!
//! ```text
//!   entry ─▶ clip: message ≤ 1 KiB, every other text ≤ 256 B  ─▶  ≤ MAX_ENTRY_BYTES
//!   log   ─▶ Budget { entries (audit_max_entries, 10 000),
//!                     bytes (audit_max_bytes, 8 MiB or quota/16) }
//!   over? ─▶ Ledger::evict_next: the oldest entry of the account with the largest
//!            share; among strangers, of the source with the largest share
//! ```
//!
//! Who pays when the log is over its budget (the share rule): every entry counts
//! against one **account** — the owner (every owner certificate, and every admin's),
//! each node (its node ID), each operator below admin (its name), and one account
//! for every caller without a cluster certificate
//! (**strangers**: self-signed keys cost nothing to make, so they are one account,
//! divided by source address inside). An account's share is the larger of its part
//! of the count bound and of the byte bound. Over budget, the oldest entry of the
//! account with the largest share goes; the owner's share is counted minus one half,
//! so the owner always keeps up to half of the log. Hence a flood only pushes out the
//! entries of accounts that hold more than the flooder: strangers together never push
//! the owner below half of the log, nor a node below the strangers' own share; one
//! source never pushes out another source's entries below its own share; and the
//! owner's own writes, once it holds more than half, push out its own oldest first.
//!
//! No I/O: `service::audit_writer` keeps the ledger current from etcd.

use std::collections::{BTreeSet, HashMap};

use proto::api::AuditEntry;
use proto::config::ClusterConfiguration;

/// Most bytes of an entry's message (a refusal's text).
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Most bytes of each of an entry's other texts (caller, target, source, …).
pub const MAX_TEXT_BYTES: usize = 256;
/// Most bytes of an entry as stored, key and value: the texts at their bounds, the
/// numbers, the tags (a test checks it against the largest entry clipping leaves).
pub const MAX_ENTRY_BYTES: usize = 4096;

/// How many entries are kept when the cluster configuration says 0.
pub const DEFAULT_MAX_ENTRIES: u64 = 10_000;
/// How many bytes the entries may take when the cluster configuration says 0 (or a
/// sixteenth of the etcd quota, when that is less: etcd keeps each entry's history
/// until its compaction, and the log is not the only thing in it).
pub const DEFAULT_MAX_BYTES: u64 = 8 << 20;

/// Cuts every text of `entry` to its bound; counts and numbers are kept.
pub fn clip(entry: &mut AuditEntry) {
    use proto::echo::clip;
    entry.message = clip(&entry.message, MAX_MESSAGE_BYTES);
    for text in [
        &mut entry.key,
        &mut entry.identity_kind,
        &mut entry.identity,
        &mut entry.source_address,
        &mut entry.curator,
        &mut entry.method,
        &mut entry.target,
        &mut entry.code_name,
    ] {
        *text = clip(text, MAX_TEXT_BYTES);
    }
}

/// The log's bounds: both hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub entries: u64,
    pub bytes: u64,
}

impl Budget {
    /// The bounds the cluster configuration sets (its defaults for 0).
    pub fn of(configuration: Option<&ClusterConfiguration>) -> Budget {
        let entries = match configuration.map(|c| c.audit_max_entries) {
            None | Some(0) => DEFAULT_MAX_ENTRIES,
            Some(n) => n,
        };
        let bytes = match configuration.map(|c| c.audit_max_bytes) {
            None | Some(0) => {
                let quota =
                    proto::quota::effective_quota(configuration.map_or(0, |c| c.etcd_quota_bytes))
                        .unwrap_or(proto::quota::DEFAULT_QUOTA_BYTES);
                DEFAULT_MAX_BYTES.min(quota / 16)
            }
            Some(n) => n,
        };
        Budget {
            entries: entries.max(1),
            bytes: bytes.max(MAX_ENTRY_BYTES as u64),
        }
    }
}

/// Whom an entry counts against (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Account {
    /// The owner and every admin: the users' half of the log.
    Owner,
    Node(String),
    /// An operator below admin (a reader or an operator), by name.
    Operator(String),
    /// Every caller without a cluster certificate.
    Strangers,
}

/// The account of `entry`, and for strangers the source inside it (its address
/// without the port; an IPv6 /64 as one source).
pub fn account(entry: &AuditEntry) -> (Account, String) {
    match entry.identity_kind.as_str() {
        "owner" => (Account::Owner, String::new()),
        // "<name> (<role>), …" (`audit::who`): admins count with the owner.
        "operator" => match entry.identity.split_once(" (") {
            Some((_, rest)) if rest.starts_with("admin)") => (Account::Owner, String::new()),
            Some((name, _)) => (Account::Operator(name.to_string()), String::new()),
            None => (Account::Operator(entry.identity.clone()), String::new()),
        },
        "node" => (Account::Node(entry.identity.clone()), String::new()),
        _ => (Account::Strangers, source(&entry.source_address)),
    }
}

/// A source address as one stranger source: the IP (an IPv6 /64), without the port.
pub fn source(address: &str) -> String {
    match address.parse::<std::net::SocketAddr>() {
        Ok(a) => rpc::server::source_key(a.ip()).to_string(),
        Err(_) => match address.parse::<std::net::IpAddr>() {
            Ok(ip) => rpc::server::source_key(ip).to_string(),
            Err(_) => address.to_string(),
        },
    }
}

#[derive(Debug, Default, Clone)]
struct Usage {
    count: u64,
    bytes: u64,
    /// Oldest first (keys sort by time).
    keys: BTreeSet<String>,
}

/// The entries of one account: its own keys, or (strangers) its sources' keys.
#[derive(Debug, Default, Clone)]
struct Held {
    usage: Usage,
    sources: HashMap<String, Usage>,
    /// Sources by share, largest last.
    by_share: BTreeSet<(u128, String)>,
}

#[derive(Debug, Clone)]
struct Slot {
    account: Account,
    source: String,
    bytes: u64,
}

/// Every stored entry by key, with what the share rule needs: the accounts' usage,
/// ordered by share. Inserting, removing and choosing the next entry to drop each
/// cost O(log n).
#[derive(Debug, Clone)]
pub struct Ledger {
    budget: Budget,
    slots: HashMap<String, Slot>,
    accounts: HashMap<Account, Held>,
    /// Accounts by score, largest last.
    by_score: BTreeSet<(i128, Account)>,
    count: u64,
    bytes: u64,
}

impl Ledger {
    pub fn new(budget: Budget) -> Ledger {
        Ledger {
            budget,
            slots: HashMap::new(),
            accounts: HashMap::new(),
            by_score: BTreeSet::new(),
            count: 0,
            bytes: 0,
        }
    }

    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Entries held.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes held (keys and values).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the entries exceed a bound.
    pub fn over(&self) -> bool {
        self.count > self.budget.entries || self.bytes > self.budget.bytes
    }

    /// A usage's share of the budget, scaled by entries × bytes so it stays an integer.
    fn share(&self, usage: &Usage) -> u128 {
        let (e, b) = (
            u128::from(self.budget.entries),
            u128::from(self.budget.bytes),
        );
        (u128::from(usage.count) * b).max(u128::from(usage.bytes) * e)
    }

    /// An account's score: its share, the owner's less half of the budget.
    fn score(&self, account: &Account, usage: &Usage) -> i128 {
        let share = self.share(usage) as i128;
        match account {
            Account::Owner => {
                share
                    - (u128::from(self.budget.entries) * u128::from(self.budget.bytes) / 2) as i128
            }
            _ => share,
        }
    }

    /// Records an entry (replacing one of the same key).
    pub fn insert(&mut self, key: String, account: Account, source: String, bytes: u64) {
        self.remove(&key);
        let mut held = self.take(&account);
        add(&mut held.usage, &key, bytes);
        if account == Account::Strangers {
            let mut usage = held.sources.remove(&source).unwrap_or_default();
            held.by_share.remove(&(self.share(&usage), source.clone()));
            add(&mut usage, &key, bytes);
            held.by_share.insert((self.share(&usage), source.clone()));
            held.sources.insert(source.clone(), usage);
        }
        self.put(account.clone(), held);
        self.slots.insert(
            key,
            Slot {
                account,
                source,
                bytes,
            },
        );
        self.count += 1;
        self.bytes += bytes;
    }

    /// Forgets an entry (nothing if it is not held).
    pub fn remove(&mut self, key: &str) {
        let Some(slot) = self.slots.remove(key) else {
            return;
        };
        self.count -= 1;
        self.bytes -= slot.bytes;
        let mut held = self.take(&slot.account);
        subtract(&mut held.usage, key, slot.bytes);
        if let Some(mut usage) = held.sources.remove(&slot.source) {
            held.by_share
                .remove(&(self.share(&usage), slot.source.clone()));
            subtract(&mut usage, key, slot.bytes);
            if usage.count > 0 {
                held.by_share
                    .insert((self.share(&usage), slot.source.clone()));
                held.sources.insert(slot.source, usage);
            }
        }
        if held.usage.count > 0 {
            self.put(slot.account, held);
        }
    }

    /// The next entry to drop while the log is over its budget (it is forgotten
    /// here): the oldest of the account with the largest score, for strangers of the
    /// source with the largest share. `None` once within the budget.
    pub fn evict_next(&mut self) -> Option<String> {
        if !self.over() {
            return None;
        }
        let (_, account) = self.by_score.last()?.clone();
        let held = self.accounts.get(&account)?;
        let key = match account {
            Account::Strangers => {
                let (_, source) = held.by_share.last()?;
                held.sources.get(source)?.keys.first()?.clone()
            }
            _ => held.usage.keys.first()?.clone(),
        };
        self.remove(&key);
        Some(key)
    }

    /// Takes an account out of the order (to change it).
    fn take(&mut self, account: &Account) -> Held {
        match self.accounts.remove(account) {
            Some(held) => {
                let score = self.score(account, &held.usage);
                self.by_score.remove(&(score, account.clone()));
                held
            }
            None => Held::default(),
        }
    }

    /// Puts a changed account back in the order.
    fn put(&mut self, account: Account, held: Held) {
        let score = self.score(&account, &held.usage);
        self.by_score.insert((score, account.clone()));
        self.accounts.insert(account, held);
    }
}

fn add(usage: &mut Usage, key: &str, bytes: u64) {
    usage.count += 1;
    usage.bytes += bytes;
    usage.keys.insert(key.to_string());
}

fn subtract(usage: &mut Usage, key: &str, bytes: u64) {
    usage.count -= 1;
    usage.bytes -= bytes;
    usage.keys.remove(key);
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn budget(entries: u64) -> Budget {
        Budget {
            entries,
            bytes: 1 << 40,
        }
    }

    /// `n` entries of `account` (from `source`), keys `prefix-000` … in time order.
    fn fill(ledger: &mut Ledger, prefix: &str, account: Account, source: &str, n: usize) {
        for i in 0..n {
            ledger.insert(
                format!("{prefix}-{i:03}"),
                account.clone(),
                source.to_string(),
                100,
            );
        }
    }

    fn drain(ledger: &mut Ledger) -> Vec<String> {
        std::iter::from_fn(|| ledger.evict_next()).collect()
    }

    #[test]
    fn clipping_bounds_every_entry() {
        let huge = "\u{1}".repeat(64 * 1024);
        let mut entry = AuditEntry {
            key: crate::audit::entry_key(u64::MAX, u64::MAX, &huge),
            time_unix_micros: u64::MAX,
            identity_kind: huge.clone(),
            identity: huge.clone(),
            source_address: huge.clone(),
            curator: huge.clone(),
            method: huge.clone(),
            target: huge.clone(),
            code: i32::MIN,
            code_name: huge.clone(),
            message: format!("{huge:?}"),
            count: u64::MAX,
            first_time_unix_micros: u64::MAX,
        };
        clip(&mut entry);
        let stored = entry.key.len() + entry.encoded_len();
        assert!(stored <= MAX_ENTRY_BYTES, "{stored}");
        assert!(entry.message.len() <= MAX_MESSAGE_BYTES);
        assert!(entry.message.ends_with("bytes)"), "{}", entry.message);
        // A short entry is left as it is.
        let mut short = AuditEntry {
            message: "no such node".into(),
            target: "polis-a".into(),
            ..Default::default()
        };
        let before = short.clone();
        clip(&mut short);
        assert_eq!(short, before);
    }

    #[test]
    fn budgets_come_from_the_configuration() {
        assert_eq!(
            Budget::of(None),
            Budget {
                entries: DEFAULT_MAX_ENTRIES,
                bytes: DEFAULT_MAX_BYTES
            }
        );
        let mut c = ClusterConfiguration {
            audit_max_entries: 5,
            etcd_quota_bytes: 2 << 20,
            ..Default::default()
        };
        assert_eq!(Budget::of(Some(&c)).entries, 5);
        // A small quota: a sixteenth of it.
        assert_eq!(Budget::of(Some(&c)).bytes, 128 << 10);
        c.audit_max_bytes = 1 << 20;
        assert_eq!(Budget::of(Some(&c)).bytes, 1 << 20);
        // Never below one entry.
        c.audit_max_bytes = 1;
        assert_eq!(Budget::of(Some(&c)).bytes, MAX_ENTRY_BYTES as u64);
    }

    #[test]
    fn accounts_and_sources() {
        let entry = |kind: &str, identity: &str, source: &str| AuditEntry {
            identity_kind: kind.into(),
            identity: identity.into(),
            source_address: source.into(),
            ..Default::default()
        };
        assert_eq!(
            account(&entry("owner", "serial 01", "127.0.0.9:1")).0,
            Account::Owner
        );
        assert_eq!(
            account(&entry("node", "polis-a", "127.0.0.9:1")).0,
            Account::Node("polis-a".into())
        );
        // Admins count with the owner; every other operator is its own account.
        assert_eq!(
            account(&entry("operator", "ada (admin), serial 01", "127.0.0.9:1")).0,
            Account::Owner
        );
        assert_eq!(
            account(&entry(
                "operator",
                "rita (reader), serial 02",
                "127.0.0.9:1"
            ))
            .0,
            Account::Operator("rita".into())
        );
        // Self-signed keys are free: strangers, told apart by source only.
        assert_eq!(
            account(&entry("self-signed", "polis-b", "127.0.0.9:41000")),
            (Account::Strangers, "127.0.0.9".to_string())
        );
        assert_eq!(
            account(&entry("self-signed", "polis-c", "[2001:db8::1:2]:5")).1,
            account(&entry("self-signed", "polis-d", "[2001:db8::ffff:2]:6")).1
        );
    }

    #[test]
    fn within_budget_nothing_goes() {
        let mut ledger = Ledger::new(budget(10));
        fill(&mut ledger, "a", Account::Owner, "", 10);
        assert!(!ledger.over());
        assert_eq!(ledger.evict_next(), None);
        assert_eq!(ledger.len(), 10);
    }

    #[test]
    fn the_owners_own_writes_push_out_its_oldest() {
        let mut ledger = Ledger::new(budget(10));
        fill(&mut ledger, "a", Account::Owner, "", 12);
        assert_eq!(drain(&mut ledger), ["a-000", "a-001"]);
        assert_eq!(ledger.len(), 10);
    }

    #[test]
    fn a_flood_of_strangers_never_pushes_out_the_owner() {
        let mut ledger = Ledger::new(budget(100));
        fill(&mut ledger, "0-owner", Account::Owner, "", 40);
        fill(
            &mut ledger,
            "1-node",
            Account::Node("polis-n".into()),
            "",
            5,
        );
        // Many sources, many keys: one account.
        for s in 0..200 {
            for i in 0..5 {
                ledger.insert(
                    format!("2-stranger-{s:03}-{i}"),
                    Account::Strangers,
                    format!("127.0.{s}.1"),
                    100,
                );
                drain(&mut ledger);
            }
        }
        assert_eq!(ledger.len(), 100);
        let held = |a: &Account| ledger.accounts.get(a).map_or(0, |h| h.usage.count);
        assert_eq!(held(&Account::Owner), 40, "the owner's entries survive");
        // Every stranger source is levelled down alike; the node keeps what it had
        // (less than the strangers hold together).
        assert_eq!(held(&Account::Node("polis-n".into())), 5);
        assert_eq!(held(&Account::Strangers), 55);
        let strangers = &ledger.accounts[&Account::Strangers];
        let most = strangers.sources.values().map(|u| u.count).max().unwrap();
        assert!(most <= 1, "{most}");
    }

    #[test]
    fn a_flooding_source_pushes_out_its_own_entries() {
        let mut ledger = Ledger::new(budget(50));
        fill(&mut ledger, "0-quiet", Account::Strangers, "127.0.0.2", 10);
        fill(&mut ledger, "1-owner", Account::Owner, "", 10);
        for i in 0..1000 {
            ledger.insert(
                format!("2-noisy-{i:04}"),
                Account::Strangers,
                "127.0.0.3".into(),
                100,
            );
            drain(&mut ledger);
        }
        let strangers = &ledger.accounts[&Account::Strangers];
        assert_eq!(strangers.sources["127.0.0.2"].count, 10);
        assert_eq!(ledger.accounts[&Account::Owner].usage.count, 10);
        // The noisy source keeps its newest.
        let noisy = &strangers.sources["127.0.0.3"].keys;
        assert_eq!(noisy.len(), 30);
        assert_eq!(noisy.last().unwrap(), "2-noisy-0999");
    }

    #[test]
    fn many_nodes_flooding_leave_the_owner_half_of_the_log() {
        let mut ledger = Ledger::new(budget(100));
        fill(&mut ledger, "0-owner", Account::Owner, "", 50);
        for round in 0..20 {
            for n in 0..100 {
                ledger.insert(
                    format!("1-{round:02}-{n:03}"),
                    Account::Node(format!("polis-{n:03}")),
                    String::new(),
                    100,
                );
                drain(&mut ledger);
            }
        }
        assert_eq!(ledger.accounts[&Account::Owner].usage.count, 50);
        assert_eq!(ledger.len(), 100);
    }

    #[test]
    fn bytes_count_like_entries() {
        // Room for 1000 entries or 10 000 bytes: ten entries of 1000 bytes fill it.
        let mut ledger = Ledger::new(Budget {
            entries: 1000,
            bytes: 10_000,
        });
        fill(&mut ledger, "0-owner", Account::Owner, "", 5);
        for i in 0..10 {
            ledger.insert(
                format!("1-big-{i}"),
                Account::Strangers,
                "127.0.0.5".into(),
                1000,
            );
        }
        let dropped = drain(&mut ledger);
        assert!(ledger.bytes() <= 10_000);
        assert!(
            dropped.iter().all(|k| k.starts_with("1-big")),
            "{dropped:?}"
        );
        assert_eq!(dropped.first().map(String::as_str), Some("1-big-0"));
        // Replacing and removing keep the sums exact.
        ledger.insert("1-big-9".into(), Account::Strangers, "127.0.0.5".into(), 10);
        ledger.remove("0-owner-000");
        ledger.remove("no-such-key");
        let sum: u64 = ledger.slots.values().map(|s| s.bytes).sum();
        assert_eq!(ledger.bytes(), sum);
        assert_eq!(ledger.len(), ledger.slots.len() as u64);
    }
}
