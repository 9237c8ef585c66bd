//! The etcd command line, derived from plain data (no I/O, unit-tested).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where Debian's `etcd-server` installs etcd.
pub const DEFAULT_ETCD_BINARY: &str = "/usr/bin/etcd";

/// Port etcd members use to talk to each other.
pub const PEER_PORT: u16 = 7834;

/// etcd 3.4 only accepts `unix://NAME:PORT` client URLs, relative to its working
/// directory; the socket file is literally named `NAME:PORT`.
pub const CLIENT_SOCKET_NAME: &str = "etcd.sock:0";

/// Linux limits a unix socket path (`sun_path`) to 108 bytes including the NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// Whether etcd creates a new cluster or joins/continues an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialClusterState {
    New,
    Existing,
}

/// Peer TLS material on disk. The CRL file must always exist: etcd rejects every peer
/// when it is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub crl: PathBuf,
}

/// Raft timing. Defaults are etcd's own (100 ms / 1000 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftTiming {
    pub heartbeat: Duration,
    pub election_timeout: Duration,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
        }
    }
}

/// Everything needed to start one etcd member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    pub binary: PathBuf,
    /// Member name: the node ID.
    pub name: String,
    /// Absolute path of etcd's data directory.
    pub data_dir: PathBuf,
    /// Absolute path of the 0700 directory holding the client socket; etcd's cwd.
    pub run_dir: PathBuf,
    pub peer_address: IpAddr,
    pub peer_port: u16,
    pub peer_tls: PeerTlsFiles,
    /// (member name, peer URL) of every member etcd should know at first start,
    /// including itself.
    pub initial_cluster: Vec<(String, String)>,
    pub initial_cluster_state: InitialClusterState,
    pub cluster_token: String,
    pub timing: RaftTiming,
    /// What "ready" means for this member.
    pub readiness: Readiness,
    /// The backend quota (`--quota-backend-bytes`): past it etcd raises the NOSPACE alarm
    /// and refuses writes until the alarm is disarmed.
    pub quota_backend_bytes: u64,
    /// `--force-new-cluster`: make this member, on its existing data, a one-member
    /// cluster (quorum-loss recovery). Only ever for one start: left on, a later
    /// restart would remove every member that joined since.
    pub force_new_cluster: bool,
}

/// When a started etcd counts as ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// A linearizable read succeeds: the member has a leader and a quorum. For members
    /// that are voters (a bootstrapped cluster, a member that joined before).
    Linearizable,
    /// A serializable (local) read succeeds. A learner refuses linearizable reads until
    /// it is promoted, which needs it to run and catch up first: waiting for one would
    /// restart it before it ever could.
    Serializable,
}

/// `https://ADDR:PORT`, with IPv6 addresses bracketed.
pub fn peer_url(address: IpAddr, port: u16) -> String {
    match address {
        IpAddr::V4(a) => format!("https://{a}:{port}"),
        IpAddr::V6(a) => format!("https://[{a}]:{port}"),
    }
}

impl EtcdConfig {
    pub fn peer_url(&self) -> String {
        peer_url(self.peer_address, self.peer_port)
    }

    /// Absolute path of the client socket.
    pub fn socket_path(&self) -> PathBuf {
        self.run_dir.join(CLIENT_SOCKET_NAME)
    }

    /// The arguments etcd is started with (its cwd must be `run_dir`).
    pub fn args(&self) -> Vec<String> {
        let client_url = format!("unix://{CLIENT_SOCKET_NAME}");
        let initial_cluster = self
            .initial_cluster
            .iter()
            .map(|(name, url)| format!("{name}={url}"))
            .collect::<Vec<_>>()
            .join(",");
        let state = match self.initial_cluster_state {
            InitialClusterState::New => "new",
            InitialClusterState::Existing => "existing",
        };
        let path = |p: &Path| p.display().to_string();
        let mut args = vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", path(&self.data_dir)),
            format!("--listen-peer-urls={}", self.peer_url()),
            format!("--initial-advertise-peer-urls={}", self.peer_url()),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-cluster-state={state}"),
            format!("--initial-cluster-token={}", self.cluster_token),
            format!("--peer-cert-file={}", path(&self.peer_tls.cert)),
            format!("--peer-key-file={}", path(&self.peer_tls.key)),
            format!("--peer-trusted-ca-file={}", path(&self.peer_tls.ca)),
            format!("--peer-crl-file={}", path(&self.peer_tls.crl)),
            "--peer-client-cert-auth".to_string(),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            // Answers before the client socket does (see `selfreport`).
            format!(
                "--listen-metrics-urls=unix://{}",
                crate::selfreport::METRICS_SOCKET_NAME
            ),
            format!("--heartbeat-interval={}", self.timing.heartbeat.as_millis()),
            format!(
                "--election-timeout={}",
                self.timing.election_timeout.as_millis()
            ),
            // A member that was cut off and comes back must not depose a working leader
            // with its higher term (etcd 3.4 leaves pre-vote off; 3.5 turns it on):
            // without it, every heal of a flapping follower forces an election.
            "--pre-vote=true".to_string(),
            // Keep history bounded without operator action.
            "--auto-compaction-mode=revision".to_string(),
            "--auto-compaction-retention=10000".to_string(),
            format!("--quota-backend-bytes={}", self.quota_backend_bytes),
            "--logger=zap".to_string(),
            "--log-outputs=stderr".to_string(),
        ];
        if self.force_new_cluster {
            args.push("--force-new-cluster".to_string());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EtcdConfig {
        EtcdConfig {
            binary: DEFAULT_ETCD_BINARY.into(),
            name: "polis-00".into(),
            data_dir: "/r/data/etcd/data".into(),
            run_dir: "/r/ephemeral/consensus".into(),
            peer_address: "127.0.0.2".parse().unwrap(),
            peer_port: PEER_PORT,
            peer_tls: PeerTlsFiles {
                cert: "/p/cert.pem".into(),
                key: "/p/key.pem".into(),
                ca: "/p/ca.pem".into(),
                crl: "/p/crl.pem".into(),
            },
            initial_cluster: vec![("polis-00".into(), "https://127.0.0.2:7834".into())],
            initial_cluster_state: InitialClusterState::New,
            cluster_token: "tok".into(),
            timing: RaftTiming::default(),
            readiness: Readiness::Linearizable,
            quota_backend_bytes: 2 << 30,
            force_new_cluster: false,
        }
    }

    fn check(config: &EtcdConfig, expected: &[&str]) {
        let args = config.args();
        for e in expected {
            assert!(args.iter().any(|a| a == e), "missing {e} in {args:?}");
        }
    }

    #[test]
    fn new_single_member_cluster() {
        check(
            &sample(),
            &[
                "--name=polis-00",
                "--data-dir=/r/data/etcd/data",
                "--listen-peer-urls=https://127.0.0.2:7834",
                "--initial-advertise-peer-urls=https://127.0.0.2:7834",
                "--initial-cluster=polis-00=https://127.0.0.2:7834",
                "--initial-cluster-state=new",
                "--peer-client-cert-auth",
                "--peer-crl-file=/p/crl.pem",
                "--listen-client-urls=unix://etcd.sock:0",
                "--advertise-client-urls=unix://etcd.sock:0",
                "--heartbeat-interval=100",
                "--election-timeout=1000",
                "--pre-vote=true",
                "--logger=zap",
            ],
        );
    }

    #[test]
    fn joining_member_lists_all_peers() {
        let mut c = sample();
        c.initial_cluster
            .push(("polis-01".into(), "https://127.0.0.3:7834".into()));
        c.initial_cluster_state = InitialClusterState::Existing;
        check(
            &c,
            &[
                "--initial-cluster=polis-00=https://127.0.0.2:7834,polis-01=https://127.0.0.3:7834",
                "--initial-cluster-state=existing",
            ],
        );
    }

    #[test]
    fn force_new_cluster_only_when_asked() {
        assert!(!sample().args().iter().any(|a| a == "--force-new-cluster"));
        let mut c = sample();
        c.force_new_cluster = true;
        check(&c, &["--force-new-cluster"]);
    }

    #[test]
    fn no_client_listener_on_the_network() {
        let args = sample().args();
        let client: Vec<_> = args
            .iter()
            .filter(|a| {
                a.starts_with("--listen-client-urls") || a.starts_with("--advertise-client")
            })
            .collect();
        assert_eq!(client.len(), 2);
        assert!(client.iter().all(|a| a.ends_with("=unix://etcd.sock:0")));
    }

    #[test]
    fn backend_quota_is_passed() {
        check(&sample(), &["--quota-backend-bytes=2147483648"]);
        let mut c = sample();
        c.quota_backend_bytes = 4 << 20;
        check(&c, &["--quota-backend-bytes=4194304"]);
        let quotas = c
            .args()
            .iter()
            .filter(|a| a.starts_with("--quota-backend-bytes"))
            .count();
        assert_eq!(quotas, 1);
    }

    #[test]
    fn ipv6_peer_urls_are_bracketed() {
        assert_eq!(
            peer_url("fd00::1".parse().unwrap(), 7834),
            "https://[fd00::1]:7834"
        );
    }

    #[test]
    fn socket_lives_in_run_dir() {
        assert_eq!(
            sample().socket_path(),
            PathBuf::from("/r/ephemeral/consensus/etcd.sock:0")
        );
    }
}
