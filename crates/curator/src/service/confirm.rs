//! Reads the leader answers leave only while this curator can show it still leads after
//! the answer was made: a leader that was paused (a stalled process, a frozen VM) and
//! deposed meanwhile cannot answer from its memory with state older than writes its
//! successor acknowledged.
//!
//! ```text
//!   ForwardLayer: served here ─▶ ConfirmLayer (a CONFIRMED read): tenure at arrival
//!     handler (node snapshot, health book, …) ─▶ an answer (an error passes unchanged)
//!     ─▶ now, same tenure as at arrival:
//!        inside the read lease (a round sent < READ_LEASE ago confirmed it) ─▶ leaves
//!          (less than half of it left: a round started in the background)
//!        else: waits for a round that STARTED after now ─▶ leaves if it confirms the
//!          tenure, else Unavailable (rpc::CuratorClient asks who leads and goes there)
//!   round: linearizable get of the election key of the tenure current at its start
//! ```
//! Why that suffices: an election key, once gone, never comes back (a new campaign has a
//! new lease, so a new key), so the tenure current at arrival and again when the answer
//! leaves was current throughout, and the handler answered with it. etcd holding its key
//! after the answer was made (a round started then), or less than READ_LEASE before a
//! round that found it (the lease), means no other curator acted as leader yet: a winner
//! acts only `election::TAKEOVER` after its win, once its predecessor's read lease has
//! run out on any clock (the arithmetic is at `election::TAKEOVER`). So no write the
//! answer lacks was acknowledged before the call was sent, and no read answered before
//! it showed newer state: the node snapshot a leader reads holds every earlier leader's
//! writes and its own (`Shared::fresh_nodes`).
//!
//! Why the lease is not the election's own (from the moment a keepalive was sent whose
//! answer confirmed the lease, shorter than the other curators take to revoke it): that
//! bound does not hold with this cluster's etcd and election. etcd 3.4 before 3.4.25
//! (Debian ships 3.4.23) lets a deposed etcd leader that has not noticed yet renew a lease
//! and answer the keepalive (etcd issue 15247), while the new etcd leader extends every
//! lease and the other curators take that extension as evidence of a silent leader
//! (`election`): they may revoke the lease 500 ms after a new etcd leader appears,
//! however recently a keepalive was answered. A linearizable read is confirmed by a
//! majority of etcd members; a deposed etcd leader cannot answer it.
//!
//! What the lease assumes: every member's monotonic clock (`Instant`, CLOCK_MONOTONIC)
//! runs at 0.9–1.1 of real time whenever its host runs. A stopped process, a GC pause or
//! a swap storm keep it counting, so a resumed leader finds its lease over. A host whose
//! clock stands still while it is frozen (a VM paused by a hypervisor that holds the
//! guest's clock, a suspended machine) breaks that: for up to READ_LEASE of its own time
//! after it resumes, it may answer from memory what it answered before the freeze. A
//! confirmation per read (no lease) would need no clock at all; it costs an etcd read on
//! every answer (measured: 1-client ListNodes 2 413/s instead of 13 000/s, p99 2.5 ms
//! instead of 0.2 ms; ARCHITECTURE.md).
//!
//! Cost: a read inside the lease costs nothing; one etcd read per round, rounds shared:
//! a read that must wait joins the next round to start, so at most one round runs and
//! one waits, whatever the number of reads ([`Ledger`]). A busy leader refreshes its
//! lease about every READ_LEASE / 2; an idle one reads nothing.
//!
//! A layer: imports only `shared` of the service layer.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use tonic::codegen::http;

use super::shared::{Shared, Tenure};
use crate::election::{READ_LEASE, Role};

/// Reads a leader answers that need a confirmation: every call that changes nothing
/// (`rpc::authz::NOT_AUDITED`) and is served by the leader only. The others of those are
/// listed with the reason in this module's tests (`UNCONFIRMED`), which fail on a read
/// that is in neither list.
const CONFIRMED: &[&str] = &[
    "/polis.api.Management/ListNodes",
    "/polis.api.Management/DescribeNode",
    "/polis.api.Management/GetClusterInfo",
    "/polis.api.Management/ListCertificates",
    "/polis.api.Management/ListRegisterTickets",
    "/polis.api.Management/ListOperators",
    "/polis.api.Management/GetCaRotation",
];

/// Bound on one round's etcd read. Longer than a member takes to notice it lost its etcd
/// leader (`quorum`), so that a curator cut off refuses with that reason first.
const ROUND_BOUND: Duration = Duration::from_secs(5);

/// Why a read left as Unavailable.
const NO_LONGER_LEADS: &str = "this curator no longer leads; ask the leader";
const UNCONFIRMED_LEAD: &str = "could not confirm with etcd that this curator still leads";

/// What one round found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// etcd holds this tenure's election key (a linearizable read).
    Leads(Tenure),
    /// This curator did not lead when the round started, or its key is gone.
    NotLeading,
    /// etcd did not answer (within [`ROUND_BOUND`]).
    Unknown(String),
}

/// Which confirmation rounds run, and the read lease they give (pure). Rounds are
/// numbered from 1 in the order they start, one at a time. A read that must wait may be
/// answered only by a round that starts after it asked — the next one: started at once
/// when none runs, else as soon as the running one ends (every read asking meanwhile
/// shares it).
#[derive(Debug, Default)]
struct Ledger {
    started: u64,
    running: bool,
    wanted: bool,
    /// The tenure the latest round confirmed, and until when reads of it may leave
    /// without waiting: READ_LEASE after that round's read was sent.
    lease: Option<(Tenure, Instant)>,
}

/// What a read about to leave does.
#[derive(Debug, PartialEq, Eq)]
enum Ask {
    /// Leave now (inside the lease); start round `refresh` in the background, if given.
    Leave { refresh: Option<u64> },
    /// Wait for round `needed` (or a later one); start round `start` now, if given.
    Wait { needed: u64, start: Option<u64> },
}

impl Ledger {
    /// A read whose call arrived in tenure `arrived` is answered and about to leave at
    /// `now`.
    fn ask(&mut self, arrived: Option<&Tenure>, now: Instant) -> Ask {
        let covered = match (&self.lease, arrived) {
            (Some((confirmed, until)), Some(arrived)) if confirmed == arrived && now < *until => {
                Some(*until)
            }
            _ => None,
        };
        match covered {
            Some(until) => {
                let refresh = (until.duration_since(now) < READ_LEASE / 2 && !self.running)
                    .then(|| self.start());
                Ask::Leave { refresh }
            }
            None => {
                let needed = self.started + 1;
                if self.running {
                    self.wanted = true;
                    Ask::Wait {
                        needed,
                        start: None,
                    }
                } else {
                    Ask::Wait {
                        needed,
                        start: Some(self.start()),
                    }
                }
            }
        }
    }

    fn start(&mut self) -> u64 {
        self.started += 1;
        self.running = true;
        self.started
    }

    /// The running round, whose read was sent at `sent`, found `found`: the next round's
    /// number, to start now, if a read asked while it ran.
    fn finished(&mut self, sent: Instant, found: &Outcome) -> Option<u64> {
        match found {
            Outcome::Leads(tenure) => {
                let until = sent + READ_LEASE;
                let newer = match &self.lease {
                    Some((held, held_until)) => held != tenure || until > *held_until,
                    None => true,
                };
                if newer {
                    self.lease = Some((tenure.clone(), until));
                }
            }
            // Its key is gone: nothing of the tenure is served any more.
            Outcome::NotLeading => self.lease = None,
            // Time ends the lease on its own.
            Outcome::Unknown(_) => {}
        }
        if self.wanted {
            self.wanted = false;
            Some(self.start())
        } else {
            self.running = false;
            None
        }
    }
}

/// Whether a read whose call arrived while `arrived` was this curator's tenure may leave,
/// given what a round that started after its answer found.
fn verdict(arrived: Option<&Tenure>, found: &Outcome) -> Result<(), tonic::Status> {
    match (arrived, found) {
        (Some(arrived), Outcome::Leads(confirmed)) if arrived == confirmed => Ok(()),
        (_, Outcome::Unknown(why)) => Err(tonic::Status::unavailable(format!(
            "{UNCONFIRMED_LEAD} ({why}); retry"
        ))),
        _ => Err(tonic::Status::unavailable(NO_LONGER_LEADS)),
    }
}

fn tenure(role: Option<Role>) -> Option<Tenure> {
    match role {
        Some(Role::Leader(l)) => Some((l.key, l.revision)),
        _ => None,
    }
}

/// Runs the rounds and hands their outcomes to the reads waiting for them.
struct Confirmer {
    shared: Arc<Shared>,
    ledger: Mutex<Ledger>,
    /// The latest round that ended, and what it found.
    done: tokio::sync::watch::Sender<(u64, Outcome)>,
}

impl Confirmer {
    /// Whether a read whose call arrived in tenure `arrived`, answered, may leave now:
    /// inside the lease at once, else by a round that starts after this call.
    async fn confirm(self: &Arc<Self>, arrived: Option<Tenure>) -> Result<(), tonic::Status> {
        let mut done = self.done.subscribe();
        let ask = self
            .ledger
            .lock()
            .expect("ledger lock")
            .ask(arrived.as_ref(), Instant::now());
        let (needed, start) = match ask {
            Ask::Leave { refresh } => {
                if let Some(number) = refresh {
                    tokio::spawn(self.clone().run(number));
                }
                return Ok(());
            }
            Ask::Wait { needed, start } => (needed, start),
        };
        if let Some(number) = start {
            // A task of its own: a caller that goes away must not end a round others wait on.
            tokio::spawn(self.clone().run(number));
        }
        // At most the running round and ours; the bound only guards against a runtime
        // shutting down under a waiting read.
        let wait = done.wait_for(|(number, _)| *number >= needed);
        let found = match tokio::time::timeout(ROUND_BOUND * 3, wait).await {
            Ok(Ok(latest)) => latest.1.clone(),
            _ => Outcome::Unknown("no confirmation round ended".into()),
        };
        verdict(arrived.as_ref(), &found)
    }

    /// Runs round `number`, and the next ones as long as reads ask for them.
    async fn run(self: Arc<Self>, mut number: u64) {
        loop {
            // Before the read is sent: the lease counts from here (see `election::TAKEOVER`).
            let sent = Instant::now();
            let found = self.round().await;
            let next = self
                .ledger
                .lock()
                .expect("ledger lock")
                .finished(sent, &found);
            self.done.send_replace((number, found));
            match next {
                Some(next) => number = next,
                None => return,
            }
        }
    }

    /// One round: the election key of the tenure current now, read from etcd
    /// (linearizable: etcd confirms it with a majority of its members).
    async fn round(&self) -> Outcome {
        let Some((key, revision)) = tenure(self.shared.role.current()) else {
            return Outcome::NotLeading;
        };
        let mut client = self.shared.curator.kv();
        let read = client.get(key.clone(), Some(GetOptions::new().with_keys_only()));
        match consensus::bounded("confirming leadership", ROUND_BOUND, read).await {
            Ok(r)
                if r.kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == revision) =>
            {
                Outcome::Leads((key, revision))
            }
            Ok(_) => {
                tracing::info!("a read found this curator's election key gone: it no longer leads");
                Outcome::NotLeading
            }
            Err(e) => Outcome::Unknown(e.to_string()),
        }
    }
}

/// Tower layer (inside the ForwardLayer: sees only calls served here): see the module.
#[derive(Clone)]
pub(super) struct ConfirmLayer {
    confirmer: Arc<Confirmer>,
}

impl ConfirmLayer {
    pub(super) fn new(shared: Arc<Shared>) -> ConfirmLayer {
        ConfirmLayer {
            confirmer: Arc::new(Confirmer {
                shared,
                ledger: Mutex::default(),
                done: tokio::sync::watch::Sender::new((0, Outcome::NotLeading)),
            }),
        }
    }
}

impl<S> tower::Layer<S> for ConfirmLayer {
    type Service = ConfirmService<S>;
    fn layer(&self, inner: S) -> ConfirmService<S> {
        ConfirmService {
            inner,
            confirmer: self.confirmer.clone(),
        }
    }
}

#[derive(Clone)]
pub(super) struct ConfirmService<S> {
    inner: S,
    confirmer: Arc<Confirmer>,
}

impl<S, ReqBody> tower::Service<http::Request<ReqBody>> for ConfirmService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send,
    ReqBody: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let confirmed = CONFIRMED.contains(&request.uri().path());
        // Taken before the handler runs: see the module on why it must match later.
        let arrived = confirmed
            .then(|| tenure(self.confirmer.shared.role.current()))
            .flatten();
        let confirmer = self.confirmer.clone();
        Box::pin(async move {
            let answer = inner.call(request).await?;
            // A unary answer is complete once its head is here: tonic ran the handler to
            // its end. A refusal (trailers only) passes as it is: it reveals no state.
            if !confirmed || tonic::Status::from_header_map(answer.headers()).is_some() {
                return Ok(answer);
            }
            match confirmer.confirm(arrived).await {
                Ok(()) => Ok(answer),
                Err(refusal) => Ok(refusal.into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads (`rpc::authz::NOT_AUDITED`) that leave without a confirmation, and why.
    const UNCONFIRMED: &[(&str, &str)] = &[
        (
            "/polis.api.Curator/Heartbeat",
            "answers nothing; the status it carries is a guarded write",
        ),
        (
            "/polis.api.Curator/WatchNode",
            "any curator's own snapshot, by design; nodes order updates by record revision",
        ),
        (
            "/polis.api.Audit/AuditLog",
            "a stream read from etcd (linearizable) and its watch",
        ),
        (
            "/polis.api.NodeLogs/NodeLogsTail",
            "served by nodes, not curators",
        ),
        ("/polis.api.Backup/ListSnapshots", "any curator, by design"),
        (
            "/polis.api.CuratorLocal/GetCurrentLeader",
            "any curator, by design",
        ),
        (
            "/polis.api.CuratorLocal/GetCACertificate",
            "any curator, by design",
        ),
        (
            "/polis.api.CuratorLocal/GetConsensusStatus",
            "any curator, by design",
        ),
        (
            "/polis.api.CuratorLocal/SnapshotsListLocal",
            "any curator, by design",
        ),
        (
            "/polis.api.CuratorLocal/SnapshotsFetchLocal",
            "any curator, by design",
        ),
    ];

    fn tenure_a() -> Tenure {
        (b"leader/a".to_vec(), 7)
    }

    fn wait(needed: u64, start: Option<u64>) -> Ask {
        Ask::Wait { needed, start }
    }

    #[test]
    fn a_waiting_read_is_answered_only_by_a_round_that_starts_after_it_asks() {
        let (a, t0) = (tenure_a(), Instant::now());
        let mut ledger = Ledger::default();
        // Nothing runs: the first read starts round 1 itself.
        assert_eq!(ledger.ask(Some(&a), t0), wait(1, Some(1)));
        // Asked while round 1 runs: round 1 began before them, so round 2, shared.
        assert_eq!(ledger.ask(Some(&a), t0), wait(2, None));
        assert_eq!(ledger.ask(None, t0), wait(2, None));
        // Round 1 ends (it found no leader): round 2 starts at once for them.
        assert_eq!(ledger.finished(t0, &Outcome::NotLeading), Some(2));
        // Asked while round 2 runs: round 3.
        assert_eq!(ledger.ask(Some(&a), t0), wait(3, None));
        assert_eq!(
            ledger.finished(t0, &Outcome::Unknown("timed out".into())),
            Some(3)
        );
        // Nobody asked during round 3: nothing more runs.
        assert_eq!(ledger.finished(t0, &Outcome::NotLeading), None);
        // The next read starts round 4.
        assert_eq!(ledger.ask(Some(&a), t0), wait(4, Some(4)));
        assert_eq!(ledger.finished(t0, &Outcome::NotLeading), None);
    }

    #[test]
    fn the_lease_runs_from_the_rounds_read_for_its_tenure_only() {
        let (a, b) = (tenure_a(), (b"leader/b".to_vec(), 9));
        let sent = Instant::now();
        let mut ledger = Ledger::default();
        assert_eq!(ledger.ask(Some(&a), sent), wait(1, Some(1)));
        // The read took a while; the lease still counts from when it was sent.
        assert_eq!(ledger.finished(sent, &Outcome::Leads(a.clone())), None);
        let at = |ms: u64| sent + Duration::from_millis(ms);
        let leave = |refresh| Ask::Leave { refresh };
        // Early in the lease: leaves, no refresh yet.
        assert_eq!(ledger.ask(Some(&a), at(10)), leave(None));
        // Less than half left: leaves, and a round refreshes it in the background...
        let half = READ_LEASE.as_millis() as u64 / 2;
        assert_eq!(ledger.ask(Some(&a), at(half + 1)), leave(Some(2)));
        // ...only one.
        assert_eq!(ledger.ask(Some(&a), at(half + 2)), leave(None));
        // Another tenure (this curator elected again), or none: not covered.
        assert_eq!(ledger.ask(Some(&b), at(half + 3)), wait(3, None));
        assert_eq!(ledger.ask(None, at(half + 3)), wait(3, None));
        // The lease's end is not in it.
        let end = READ_LEASE.as_millis() as u64;
        assert_eq!(ledger.ask(Some(&a), at(end)), wait(3, None));
        // The refresh confirms from later on; round 3 starts for the waiting reads.
        assert_eq!(
            ledger.finished(at(half + 1), &Outcome::Leads(a.clone())),
            Some(3)
        );
        assert_eq!(ledger.ask(Some(&a), at(end)), leave(None));
        // An older confirmation does not shorten it.
        assert_eq!(ledger.finished(at(1), &Outcome::Leads(a.clone())), None);
        assert_eq!(ledger.ask(Some(&a), at(end + 1)), leave(None));
        // The key found gone ends it at once.
        assert_eq!(ledger.ask(Some(&a), at(end + half)), leave(Some(4)));
        assert_eq!(ledger.finished(at(end + half), &Outcome::NotLeading), None);
        assert_eq!(ledger.ask(Some(&a), at(end + half + 1)), wait(5, Some(5)));
        assert_eq!(
            ledger.finished(at(end + half + 1), &Outcome::Leads(a.clone())),
            None
        );
        assert_eq!(ledger.ask(Some(&a), at(end + half + 2)), leave(None));
        // A failed read neither ends nor extends it; time does.
        assert_eq!(ledger.ask(Some(&a), at(2 * end + half)), leave(Some(6)));
        assert_eq!(
            ledger.finished(at(2 * end + half), &Outcome::Unknown("timed out".into())),
            None
        );
        assert_eq!(
            ledger.ask(Some(&a), at(2 * end + half + 2)),
            wait(7, Some(7))
        );
    }

    #[test]
    fn only_the_tenure_of_the_arrival_confirmed_lets_a_read_leave() {
        let a = tenure_a();
        let b: Tenure = (b"leader/b".to_vec(), 9);
        assert!(verdict(Some(&a), &Outcome::Leads(a.clone())).is_ok());
        // Re-elected meanwhile: the handler may have answered with the lost tenure.
        let moved = verdict(Some(&a), &Outcome::Leads(b.clone())).unwrap_err();
        assert_eq!(moved.code(), tonic::Code::Unavailable);
        assert_eq!(moved.message(), NO_LONGER_LEADS);
        // Elected after the call arrived: refused too (the client retries).
        assert!(verdict(None, &Outcome::Leads(b)).is_err());
        let gone = verdict(Some(&a), &Outcome::NotLeading).unwrap_err();
        assert_eq!(gone.message(), NO_LONGER_LEADS);
        let unknown = verdict(Some(&a), &Outcome::Unknown("timed out".into())).unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::Unavailable);
        assert!(unknown.message().contains("timed out"), "{unknown:?}");
    }

    #[test]
    fn every_read_is_either_confirmed_or_says_why_not() {
        for method in rpc::authz::NOT_AUDITED {
            let confirmed = CONFIRMED.contains(method);
            let excused = UNCONFIRMED.iter().any(|(m, _)| m == method);
            assert!(
                confirmed != excused,
                "{method}: confirmed {confirmed}, excused {excused}"
            );
        }
        for method in CONFIRMED.iter().chain(UNCONFIRMED.iter().map(|(m, _)| m)) {
            assert!(
                rpc::authz::NOT_AUDITED.contains(method),
                "{method} is no read (rpc::authz::NOT_AUDITED)"
            );
        }
    }
}
