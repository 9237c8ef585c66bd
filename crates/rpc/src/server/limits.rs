//! Connection limits of a listener: the numbers, why they are what they are, and how
//! they shrink to fit the process's open-files limit.
//!
//! A leaf: may not accept connections.

use std::time::Duration;

/// Connection limits of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections (including those in their handshake).
    pub max_connections: usize,
    /// Connections in their TLS handshake at once; more wait (for at most
    /// `handshake_timeout`) for a slot.
    pub max_handshakes: usize,
    /// How long a client gets to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long after the handshake the first call must start (covers clients that
    /// never send the HTTP/2 preface).
    pub first_call_timeout: Duration,
    /// How long a connection may go without a call in flight.
    pub idle_timeout: Duration,
}

impl Limits {
    /// For a curator serving ~1000 nodes: each node keeps about one connection (its
    /// heartbeat channel), plus operators and other curators; 4096 is four times that.
    /// A restart of the whole cluster reconnects every node at once, so 1024 handshakes
    /// may run together (more wait their turn). A TLS 1.3 handshake takes one round trip; 5 s allows slow
    /// links. Clients call right after connecting (10 s), and nodes heartbeat every 5 s,
    /// so 120 s without a call means the connection is abandoned.
    pub const PRODUCTION: Limits = Limits {
        max_connections: 4096,
        max_handshakes: 1024,
        handshake_timeout: Duration::from_secs(5),
        first_call_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
    };

    /// Descriptors kept free for everything else (etcd client, logs, files, etcd's
    /// peer connections are etcd's own).
    const RESERVED_DESCRIPTORS: usize = 256;

    /// [`Limits::PRODUCTION`], scaled down to fit the open-files limit `nofile` so that
    /// the caps, not EMFILE, decide who is refused.
    pub fn within_open_files(nofile: u64) -> Limits {
        let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
        let fit = nofile.saturating_sub(Self::RESERVED_DESCRIPTORS).max(16);
        let max_connections = Self::PRODUCTION.max_connections.min(fit);
        Limits {
            max_connections,
            max_handshakes: Self::PRODUCTION
                .max_handshakes
                .min(max_connections / 4)
                .max(1),
            ..Self::PRODUCTION
        }
    }

    /// The limits for this process's current open-files soft limit.
    pub fn for_this_process() -> Limits {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid pointer to a local struct.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return Self::within_open_files(1024);
        }
        Self::within_open_files(limit.rlim_cur)
    }
}
