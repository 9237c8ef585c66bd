//! Clients to the local etcd: the unix-socket connection and per-user namespaces.
//!
//! A stalled etcd (stopped, wedged disk) answers nothing; without a bound every caller
//! would hang silently. The channel therefore bounds each request to
//! [`REQUEST_TIMEOUT`], except the [`LONG_CALLS`] that wait by design.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use etcd_client::Client;
use tower::ServiceExt as _;

use crate::ConsensusError;

/// Longest an ordinary etcd request may take. etcd itself gives up on a linearizable
/// request after 5 s plus two election timeouts (7 s with Polis' defaults), so a live
/// etcd answers — possibly with its own timeout error — before this fires.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// etcd RPCs that legitimately outlast any request bound: a campaign or lock waits for
/// the current holder, and streams stay open (their response headers may also come
/// late). Their callers bound them by what they wait for.
pub const LONG_CALLS: &[&str] = &[
    "/v3electionpb.Election/Campaign",
    "/v3electionpb.Election/Observe",
    "/v3lockpb.Lock/Lock",
    "/etcdserverpb.Watch/Watch",
    "/etcdserverpb.Lease/LeaseKeepAlive",
    // Rewrites the whole database file; `maintenance::defragment` bounds it.
    "/etcdserverpb.Maintenance/Defragment",
];

/// etcd RPCs sent with etcd's require-leader metadata (`hasleader: true`): a member that
/// has lost its leader refuses to open them and cancels open ones ("etcdserver: no
/// leader") within a few election timeouts, so a watcher cut off from the quorum learns
/// that its view stopped being current instead of waiting on a silent stream. Unary
/// requests go without it: serializable reads must still answer without a leader.
pub const REQUIRE_LEADER_CALLS: &[&str] = &["/etcdserverpb.Watch/Watch"];

/// etcd's require-leader metadata key (etcd's `rpctypes.MetadataRequireLeaderKey`).
const REQUIRE_LEADER_KEY: &str = "hasleader";

/// Connects to etcd over its unix socket. `etcd_client::Client::connect` cannot do this
/// (it prefixes `http://` and resolves through DNS), so we hand it a channel of our own.
pub async fn connect_unix(socket: &Path) -> Result<Client, ConsensusError> {
    connect_unix_with(socket, REQUEST_TIMEOUT).await
}

/// [`connect_unix`] with a given bound on ordinary requests.
pub async fn connect_unix_with(
    socket: &Path,
    request_timeout: Duration,
) -> Result<Client, ConsensusError> {
    let uri = format!("unix://{}", socket.display());
    let channel = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|_| ConsensusError::SocketPathTooLong {
            path: socket.to_path_buf(),
        })?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| ConsensusError::Connect {
            path: socket.to_path_buf(),
            reason: supervisor::error_chain(&e),
        })?;
    let channel = tower::service_fn(move |request: http::Request<tonic::body::Body>| {
        let channel = channel.clone();
        let mut request = request;
        async move {
            if REQUIRE_LEADER_CALLS.contains(&request.uri().path()) {
                request
                    .headers_mut()
                    .insert(REQUIRE_LEADER_KEY, http::HeaderValue::from_static("true"));
            }
            let long = LONG_CALLS.contains(&request.uri().path());
            let call = channel.oneshot(request);
            if long {
                return call.await.map_err(tower::BoxError::from);
            }
            match tokio::time::timeout(request_timeout, call).await {
                Ok(response) => response.map_err(tower::BoxError::from),
                Err(_) => Err(Box::new(ConsensusError::Timeout {
                    what: "a request",
                    after: request_timeout,
                }) as tower::BoxError),
            }
        }
    });
    let channel = etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(channel));
    Ok(Client::from_channel(channel, None).await?)
}

/// Runs one etcd call with a bound, for calls outside request handlers (which have
/// their own) and for the [`LONG_CALLS`] whose wait has a known limit.
pub async fn bounded<T, E>(
    what: &'static str,
    after: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, ConsensusError>
where
    ConsensusError: From<E>,
{
    match tokio::time::timeout(after, call).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(ConsensusError::Timeout { what, after }),
    }
}

/// A view of etcd restricted to one consensus user's key prefix, `namespaced:<user>/`.
/// Users (curator, etcd-pki, …) never see each other's keys by accident.
#[derive(Clone)]
pub struct Namespaced {
    client: Client,
    prefix: String,
}

impl std::fmt::Debug for Namespaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespaced")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// The key prefix of a consensus user.
pub fn namespace_prefix(user: &str) -> String {
    format!("namespaced:{user}/")
}

impl Namespaced {
    pub fn new(client: Client, user: &str) -> Namespaced {
        Namespaced {
            client,
            prefix: namespace_prefix(user),
        }
    }

    /// A narrower namespace inside this one: `namespaced:curator/` + `cluster-pki/`.
    pub fn sub(&self, part: &str) -> Namespaced {
        Namespaced {
            client: self.client.clone(),
            prefix: format!("{}{part}/", self.prefix),
        }
    }

    /// The full etcd key for `key` in this namespace.
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The raw client, for transactions over keys built with [`Namespaced::key`].
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A client of the KV service alone, for gets, puts and transactions: cloning the
    /// whole [`Client`] clones a channel for each of etcd's eight services (and drops
    /// them after the call), which was about a twentieth of the curator's CPU per
    /// label write.
    pub fn kv(&self) -> etcd_client::KvClient {
        self.client.kv_client()
    }

    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ConsensusError> {
        let response = self.kv().get(self.key(key), None).await?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    pub async fn put(&self, key: &str, value: Vec<u8>) -> Result<(), ConsensusError> {
        self.kv().put(self.key(key), value, None).await?;
        Ok(())
    }
}

/// The value of the first key a `get` inside a transaction returned, if any.
pub fn txn_get_value(response: Option<&etcd_client::TxnOpResponse>) -> Option<Vec<u8>> {
    match response {
        Some(etcd_client::TxnOpResponse::Get(get)) => {
            get.kvs().first().map(|kv| kv.value().to_vec())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(namespace_prefix("curator"), "namespaced:curator/");
    }

    /// A stalled etcd: accepts connections on a unix socket and never answers.
    fn silent_etcd(dir: &Path) -> (std::path::PathBuf, tokio::task::JoinHandle<()>) {
        let socket = dir.join("etcd.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        (socket, task)
    }

    #[tokio::test]
    async fn ordinary_requests_are_bounded_and_long_calls_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, server) = silent_etcd(dir.path());
        let bound = Duration::from_millis(300);
        let mut client = connect_unix_with(&socket, bound).await.unwrap();

        let started = std::time::Instant::now();
        let err = client.get("k", None).await.unwrap_err();
        let took = started.elapsed();
        assert!(took >= bound && took < Duration::from_secs(3), "{took:?}");
        assert!(
            supervisor::error_chain(&err).contains("did not answer"),
            "{err}"
        );

        // A campaign waits for the current leader: the request bound must not cut it.
        let campaign = client.campaign("election", "me", 1);
        let outcome = tokio::time::timeout(4 * bound, campaign).await;
        assert!(outcome.is_err(), "campaign ended early: {outcome:?}");
        server.abort();
    }

    #[tokio::test]
    async fn bounded_names_what_timed_out() {
        let never = std::future::pending::<Result<(), ConsensusError>>();
        let err = bounded("lease grant", Duration::from_millis(10), never)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "etcd did not answer lease grant within 10ms"
        );
    }
}
