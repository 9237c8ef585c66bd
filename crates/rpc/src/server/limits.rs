//! Connection limits of a listener: the numbers, why they are what they are, and how
//! the node's listeners share the process's open-files limit.
//!
//! A leaf: may not accept connections.

use std::time::Duration;

/// Which of the node's TLS listeners a set of limits is for: they share one process's
/// descriptors, each its own part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The curator (7835): every node's heartbeat channel, operators, other curators.
    Curator,
    /// The node port (7836): logs and member status, for owners and nodes.
    Node,
    /// Members' data unlock (7837): locked members starting.
    Unlock,
}

impl Port {
    /// This listener's part of the descriptors left for listeners (in sixteenths) and
    /// its cap however many there are.
    fn share(self) -> (usize, usize) {
        match self {
            Port::Curator => (12, Limits::PRODUCTION.max_connections),
            Port::Node => (3, 512),
            Port::Unlock => (1, 128),
        }
    }
}

/// Connection limits of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections (including those in their handshake). At the cap, the oldest
    /// connection that may go makes room (see `admission`).
    pub max_connections: usize,
    /// Connections from one source (an IPv4 address, an IPv6 /64) that have not shown a
    /// cluster certificate in a call; beyond it the source's own oldest idle one goes.
    pub per_source_connections: usize,
    /// Connections from one source in their TLS handshake at once; more wait (for at
    /// most `handshake_timeout`) for their turn.
    pub per_source_handshakes: usize,
    /// Connections of one node or admin kept from eviction and from its source's count;
    /// its others count like a stranger's.
    pub per_identity_connections: usize,
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
    /// A node, an operator's command or a registering node needs one connection, a
    /// follower forwarding registrations one per registration, but those are proven
    /// (a node certificate) and not counted per source: 32 unproven connections leave a
    /// source (or a NAT of a few machines) plenty, and let a flood from one address
    /// hold at most 32. Eight handshakes at once per source: a whole cluster restarting
    /// reconnects one connection per address. A node holds one or two connections to a
    /// curator (its heartbeat channel, a reconnect racing the old one), an admin one per
    /// command running: 8 each are kept from eviction, so that one stolen node or admin
    /// key cannot hold the seats of everyone else. A TLS 1.3 handshake takes one round trip;
    /// 5 s allows slow links. Clients call right after connecting (10 s), and nodes
    /// heartbeat every 5 s, so 120 s without a call means the connection is abandoned.
    pub const PRODUCTION: Limits = Limits {
        max_connections: 4096,
        per_source_connections: 32,
        per_source_handshakes: 8,
        per_identity_connections: 8,
        handshake_timeout: Duration::from_secs(5),
        first_call_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
    };

    /// Descriptors kept free for everything else: the etcd client, log files, the
    /// metrics listener (64), files written; etcd's own are in its own process.
    const RESERVED_DESCRIPTORS: usize = 256;

    /// The limits of listener `port` when the process may open `nofile` descriptors:
    /// its share of what the reserve leaves, so that the caps, not EMFILE, decide who
    /// waits, and the three listeners together never run the process out.
    pub fn within_open_files(nofile: u64, port: Port) -> Limits {
        let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
        let fit = nofile.saturating_sub(Self::RESERVED_DESCRIPTORS).max(16);
        let (sixteenths, cap) = port.share();
        let max_connections = (fit / 16).saturating_mul(sixteenths).clamp(1, cap);
        Limits {
            max_connections,
            per_source_connections: Self::PRODUCTION.per_source_connections.min(max_connections),
            ..Self::PRODUCTION
        }
    }

    /// The limits of `port` for this process's current open-files soft limit.
    pub fn for_this_process(port: Port) -> Limits {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit with a valid pointer to a local struct.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return Self::within_open_files(1024, port);
        }
        Self::within_open_files(limit.rlim_cur, port)
    }
}
