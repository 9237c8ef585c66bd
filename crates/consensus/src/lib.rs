//! Consensus: the node's etcd member, run as a supervised child process.
//!
//! Polis does not embed etcd; it runs Debian's `etcd` binary (3.4) and owns its whole
//! life: configuration, start, readiness, logs, restart and stop. Other parts of the node
//! reach etcd only through the [`Status`] this crate publishes, which carries a client
//! connected over etcd's unix socket.
//!
//! ```text
//!   node (controlplane) ──EtcdConfig──▶ consensus::run ──spawn──▶ /usr/bin/etcd
//!                                           │   ▲                  (cwd: ephemeral/consensus,
//!                                           │   └── zap JSON logs   socket etcd.sock:0)
//!                                           ▼
//!                           event::Value<Status> ──▶ curator, pki, cluster state
//! ```
//!
//! Invariants:
//! - etcd's client endpoint is only the unix socket in a 0700 directory, never TCP.
//! - Peers authenticate with mutual TLS against the etcd peer CA, and the peer CRL file
//!   always exists (etcd rejects every peer when it is missing).
//! - A stale socket is removed before start; etcd dies with polis-node
//!   (`PR_SET_PDEATHSIG`); stopping sends SIGTERM and, after a timeout, SIGKILL.
//! - etcd 3.4 reads its peer certificate, key and CRL on every handshake but its
//!   trusted peer CAs only at start: [`run_restartable`] restarts it on request (the
//!   node's `peertrust`, one member at a time), and [`Running::peer_trust_loaded`] says
//!   what the running etcd trusts. `--force-new-cluster` applies to the first start only.
//! - "Ready" means a linearizable read through the socket succeeded, each attempt with
//!   its own timeout.
//! - Maintenance (`maintenance`): the local member's sizes, alarms, compaction,
//!   defragmentation (bounded on its own, it may outlast the request bound); the
//!   curator decides when.
//! - Self-report (`selfreport`): etcd's metrics on a second unix socket next to the
//!   client one (`metrics.sock:0`), answered before etcd serves clients (which takes a
//!   quorum after a restart): leader or not, committed index, database size, which
//!   peers it has a stream to (`peer_view`, pure); never the raft term (not exposed).
//! - On disk (`ondisk`): a stopped member's database lags its write-ahead log after an
//!   unclean stop; what the log holds beyond it is read from the files (read-only).
//! - Consensus users see etcd through [`Namespaced`] clients: `namespaced:<user>/`.
//! - Every etcd request from the client this crate hands out is bounded
//!   ([`client::REQUEST_TIMEOUT`]), except the calls that wait by design (campaign, lock,
//!   watch, lease keepalive, observe): their callers bound them (see
//!   [`client::LONG_CALLS`]).
//! - Every etcd watch requires a leader ([`client::REQUIRE_LEADER_CALLS`]): a member cut
//!   off from its quorum ends its watchers' streams instead of serving old news.
//! - A key range that can grow is read in pages at one revision ([`pages`]), never in
//!   one response: etcd-client refuses responses over 4 MiB by default.

pub mod client;
pub mod config;
pub mod maintenance;
pub mod membership;
pub mod ondisk;
pub mod pages;
pub mod process;
pub mod selfreport;

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

pub use client::{Namespaced, bounded, connect_unix};
pub use config::{EtcdConfig, InitialClusterState, PeerTlsFiles, RaftTiming, Readiness};
pub use process::{run, run_restartable};

/// The published state of the local etcd member.
#[derive(Clone, Debug)]
pub enum Status {
    /// etcd answered a linearizable read.
    Running(Box<Running>),
    /// etcd is not running (stopped, or exited and about to be restarted).
    Stopped,
}

/// A running, ready etcd member.
#[derive(Clone)]
pub struct Running {
    pub cluster_id: u64,
    pub member_id: u64,
    pub client: etcd_client::Client,
    /// The peer trust file (`--peer-trusted-ca-file`, PEM) as it was when this etcd
    /// started: etcd 3.4 trusts exactly these CAs until it restarts.
    pub peer_trust_loaded: Vec<u8>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("cluster_id", &format_args!("{:x}", self.cluster_id))
            .field("member_id", &format_args!("{:x}", self.member_id))
            .finish()
    }
}

impl Running {
    pub fn namespaced(&self, user: &str) -> Namespaced {
        Namespaced::new(self.client.clone(), user)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    #[error(
        "etcd binary not found or not executable at {path}; install it with `apt-get install -y etcd-server`"
    )]
    BinaryMissing { path: PathBuf },
    #[error(
        "etcd client socket path {path} is longer than the 107 bytes Linux allows; use a shorter node root"
    )]
    SocketPathTooLong { path: PathBuf },
    #[error("etcd paths must be absolute (etcd runs in its socket directory): {path}")]
    RelativePath { path: PathBuf },
    #[error("{what} file {path} is missing")]
    MissingFile { what: &'static str, path: PathBuf },
    #[error("starting {path}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd exited ({})", process::describe_exit(status))]
    Exited { status: ExitStatus },
    #[error("etcd did not become ready within {after:?}; last error: {last_error}")]
    NotReady { after: Duration, last_error: String },
    #[error("connecting to etcd at {path}: {reason}")]
    Connect { path: PathBuf, reason: String },
    #[error("etcd request failed")]
    Etcd(#[from] etcd_client::Error),
    #[error("unexpected etcd response: {0}")]
    Protocol(&'static str),
    #[error("etcd did not answer {what} within {after:?}")]
    Timeout { what: &'static str, after: Duration },
}
