//! Client plumbing: a tonic channel over our own rustls configuration, and the
//! leader-aware [`CuratorClient`] every node and polisctl call goes through.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

use crate::RpcError;
use crate::epoch::EpochSlot;
use crate::tls::{CredentialSlot, Credentials, ServerTrust, client_config_from};

/// Default port of the curator.
pub const CURATOR_PORT: u16 = 7835;
/// The port every node serves its own log lines on (NodeLogs, owner only).
pub const NODE_LOGS_PORT: u16 = 7836;

/// Parses `HOST` or `HOST:PORT` (IP addresses; curators are addressed by IP).
pub fn parse_endpoint(endpoint: &str) -> Result<SocketAddr, RpcError> {
    if let Ok(addr) = endpoint.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = endpoint
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        return Ok(SocketAddr::new(ip, CURATOR_PORT));
    }
    Err(RpcError::BadEndpoint {
        endpoint: endpoint.to_string(),
    })
}

/// The IP address an `https://IP:PORT` URL names (etcd peer URLs, from which a member's
/// curator is found); `None` for anything else.
pub fn url_address(url: &str) -> Option<std::net::IpAddr> {
    let (host, _port) = url.strip_prefix("https://")?.rsplit_once(':')?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Parses a list of endpoints (see [`parse_endpoint`]), ignoring surrounding spaces.
pub fn parse_endpoints(raw: &[String]) -> Result<Vec<SocketAddr>, RpcError> {
    raw.iter().map(|e| parse_endpoint(e.trim())).collect()
}

/// Connects to a curator at `endpoint` over TLS and HTTP/2.
pub async fn connect(
    endpoint: SocketAddr,
    trust: &ServerTrust,
    client: Option<&Credentials>,
) -> Result<Channel, RpcError> {
    let slot = client.map(|c| CredentialSlot::new(c.clone())).transpose()?;
    connect_with(endpoint, trust, slot.as_ref()).await
}

/// Connects to a curator at `endpoint` over TLS and HTTP/2, presenting what `client`
/// holds at the time of each (re)connection.
pub async fn connect_with(
    endpoint: SocketAddr,
    trust: &ServerTrust,
    client: Option<&CredentialSlot>,
) -> Result<Channel, RpcError> {
    connect_from(endpoint, trust, client, None).await
}

/// [`connect_with`] from the local address `source` (None: the one the system picks),
/// e.g. to call as another loopback address.
pub async fn connect_from(
    endpoint: SocketAddr,
    trust: &ServerTrust,
    client: Option<&CredentialSlot>,
    source: Option<std::net::IpAddr>,
) -> Result<Channel, RpcError> {
    let connector = tokio_rustls::TlsConnector::from(client_config_from(trust, client)?);
    let server_name = ServerName::IpAddress(endpoint.ip().into());
    let uri = format!("http://{endpoint}");
    // tonic flattens connector errors into text; keep the one that matters here.
    let untrusted: Arc<Mutex<Option<Untrusted>>> = Arc::default();
    let seen = untrusted.clone();
    Endpoint::from_shared(uri.clone())
        .map_err(|_| RpcError::BadEndpoint { endpoint: uri })?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect_with_connector(tower::service_fn(move |_| {
            let (connector, server_name, seen) =
                (connector.clone(), server_name.clone(), seen.clone());
            async move {
                let tcp = match source {
                    None => tokio::net::TcpStream::connect(endpoint).await?,
                    Some(source) => {
                        let socket = match source {
                            std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                            std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
                        };
                        socket.bind(SocketAddr::new(source, 0))?;
                        socket.connect(endpoint).await?
                    }
                };
                tcp.set_nodelay(true)?;
                let tls = connector.connect(server_name, tcp).await.inspect_err(|e| {
                    if let Some(rustls::Error::InvalidCertificate(why)) =
                        e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
                    {
                        let untrusted = if let Some(reason) = crate::tls::not_a_curator(why) {
                            Untrusted::NotACurator(reason)
                        } else if let Some(reason) = crate::tls::not_the_node(why) {
                            Untrusted::NotTheNode(reason)
                        } else {
                            Untrusted::Ca(format!("{why:?}"))
                        };
                        *seen.lock().expect("lock") = Some(untrusted);
                    }
                })?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| match untrusted.lock().expect("lock").take() {
            Some(Untrusted::Ca(reason)) => RpcError::UntrustedServer { endpoint, reason },
            Some(Untrusted::NotACurator(reason)) => RpcError::NotACurator { endpoint, reason },
            Some(Untrusted::NotTheNode(reason)) => RpcError::NotTheNode { endpoint, reason },
            None => RpcError::Connect {
                endpoint,
                reason: supervisor::error_chain(&e),
            },
        })
}

/// Why a server's certificate was refused.
enum Untrusted {
    /// Not one of the trusted CA (or revoked, expired, naming another address).
    Ca(String),
    /// A certificate of the trusted CA, but no curator's.
    NotACurator(String),
    /// A certificate of the trusted CA, but not the node's that was asked for.
    NotTheNode(String),
}

/// How long a curator that just answered Unavailable gets to name the leader (it may
/// have stopped answering altogether).
const LEADER_QUESTION_TIMEOUT: Duration = Duration::from_secs(2);

/// The curator leader's endpoint, as the curator behind `channel` knows it.
pub async fn leader_endpoint(channel: Channel) -> Option<SocketAddr> {
    let mut local = proto::api::curator_local_client::CuratorLocalClient::new(channel);
    let question = local.get_current_leader(proto::api::GetCurrentLeaderRequest {});
    let leader = tokio::time::timeout(LEADER_QUESTION_TIMEOUT, question)
        .await
        .ok()?
        .ok()?
        .into_inner();
    leader.leader_endpoint.parse().ok()
}

/// Why a call through [`CuratorClient`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No curator could be reached; one entry per endpoint tried.
    #[error("no curator reachable: {}", list(.0))]
    Unreachable(Vec<RpcError>),
    /// A curator answered with an error (the last one, when every curator answered
    /// Unavailable).
    #[error("{}", .0.message())]
    Status(tonic::Status),
}

fn list(errors: &[RpcError]) -> String {
    if errors.is_empty() {
        return "no endpoints".into();
    }
    errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

impl CallError {
    /// Some curator presented a certificate the client's CRL lists: a node removed from
    /// the cluster (or someone holding its key) answering at a curator's endpoint.
    pub fn revoked_server(&self) -> bool {
        matches!(self, CallError::Unreachable(errors)
            if errors.iter().any(|e| matches!(e, RpcError::UntrustedServer { reason, .. } if reason == "Revoked")))
    }

    /// Every curator was reached, and none presented a certificate of the trusted CA:
    /// the caller pins the wrong CA (a configuration error, not an outage).
    pub fn all_untrusted(&self) -> bool {
        matches!(self, CallError::Unreachable(errors)
            if !errors.is_empty()
                && errors.iter().all(|e| matches!(e, RpcError::UntrustedServer { .. })))
    }
}

/// Extra rounds when every curator answered Unavailable, and the pause before each
/// (growing linearly): together about 3.75 s, enough for a curator election (which may
/// first have to revoke a dead leader's lease; failover target 3 s).
const UNAVAILABLE_ROUNDS: u32 = 5;
const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(250);

/// A client of a cluster's curators that follows the leader: calls go to the curator
/// that answered last; a curator that is not the leader answers Unavailable and names
/// the leader, which is tried next; unreachable curators are skipped. Shared by
/// polisctl and every node-side caller, so that they all behave alike.
///
/// With a [`CredentialSlot`] (a node's renewable certificate) the cached connection is
/// dropped as soon as the slot's credentials were replaced: the next call connects with
/// the new certificate, so no call is made with one that is about to expire (the
/// curator checks expiry on every call).
pub struct CuratorClient {
    endpoints: Mutex<Vec<SocketAddr>>,
    trust: ServerTrust,
    credentials: Option<CredentialSlot>,
    /// The curator that answered last, its channel, and the slot generation it was
    /// made with.
    current: Mutex<Option<(SocketAddr, Channel, u64)>>,
    /// The newest cluster epoch seen: answers of curators of an older one are refused
    /// (`crate::epoch`).
    epoch: EpochSlot,
    /// The local address connections are made from (None: the one the system picks).
    source: Option<std::net::IpAddr>,
}

impl CuratorClient {
    /// A client presenting fixed `credentials` (if any). Refuses credentials whose key
    /// does not load or does not match the certificate.
    pub fn new(
        endpoints: Vec<SocketAddr>,
        trust: ServerTrust,
        credentials: Option<Credentials>,
    ) -> Result<CuratorClient, RpcError> {
        let slot = credentials.map(CredentialSlot::new).transpose()?;
        Ok(CuratorClient::with_slot(endpoints, trust, slot))
    }

    /// A client presenting whatever `credentials` holds (see the type's documentation).
    pub fn with_slot(
        endpoints: Vec<SocketAddr>,
        trust: ServerTrust,
        credentials: Option<CredentialSlot>,
    ) -> CuratorClient {
        CuratorClient {
            endpoints: Mutex::new(endpoints),
            trust,
            credentials,
            current: Mutex::new(None),
            epoch: EpochSlot::default(),
            source: None,
        }
    }

    /// The same client keeping the newest epoch seen in `slot` (shared, persisted by its
    /// owner) instead of a slot of its own.
    pub fn with_epoch(mut self, slot: EpochSlot) -> CuratorClient {
        self.epoch = slot;
        self
    }

    /// Connects from the local address `source` (None: the one the system picks). A
    /// node on a loopback address (tests, `cluster launch`) calls from it, so that the
    /// curator counts it as the source of its own, as it counts a node on a machine of
    /// its own, not as one more client of 127.0.0.1.
    pub fn with_source(mut self, source: Option<std::net::IpAddr>) -> CuratorClient {
        self.source = source;
        self
    }

    /// Replaces the endpoints tried after the current curator.
    pub fn set_endpoints(&self, endpoints: Vec<SocketAddr>) {
        *self.endpoints.lock().expect("endpoints lock") = endpoints;
    }

    pub fn endpoints(&self) -> Vec<SocketAddr> {
        self.endpoints.lock().expect("endpoints lock").clone()
    }

    pub fn trust(&self) -> &ServerTrust {
        &self.trust
    }

    /// The credentials presented now.
    pub fn credentials(&self) -> Option<Credentials> {
        self.credentials.as_ref().map(|s| s.credentials())
    }

    fn generation(&self) -> u64 {
        self.credentials.as_ref().map_or(0, |s| s.generation())
    }

    /// The curator that answered last, if any.
    pub fn current(&self) -> Option<SocketAddr> {
        self.current
            .lock()
            .expect("current lock")
            .as_ref()
            .map(|c| c.0)
    }

    /// Runs `call` against the leader (see the type's documentation). When every curator
    /// answered Unavailable (an election in progress, a leader handing over), the round
    /// is repeated a few times after a short pause.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, CallError>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut round = 0;
        loop {
            match self.call_round(&call).await {
                Err(CallError::Status(s))
                    if s.code() == tonic::Code::Unavailable && round < UNAVAILABLE_ROUNDS =>
                {
                    round += 1;
                    tokio::time::sleep(UNAVAILABLE_PAUSE * round).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// The CAs this client checks curators against (none for trust on first use): what
    /// a curator's epoch signature must verify under.
    fn trusted_cas(&self) -> Vec<Vec<u8>> {
        match &self.trust {
            ServerTrust::PinnedCa(ca) => vec![ca.clone()],
            ServerTrust::ClusterCa { trust }
            | ServerTrust::ClusterNode { trust, .. }
            | ServerTrust::ClusterMember { trust } => trust.cas(),
            ServerTrust::FirstUse => Vec::new(),
        }
    }

    /// Takes the epoch `endpoint` answered with (none: a curator of a version before
    /// epochs, taken as the bootstrap's); an older one than seen refuses its answer.
    fn epoch_of(
        &self,
        endpoint: SocketAddr,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<(), tonic::Status> {
        let answered = metadata
            .get(crate::epoch::EPOCH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::epoch::decode)
            .unwrap_or_default();
        let signature = metadata
            .get(crate::epoch::EPOCH_SIGNATURE_HEADER)
            .and_then(|v| v.to_str().ok());
        let verified = crate::epoch::verified(&answered, signature, &self.trusted_cas());
        self.epoch.offer(&answered, verified).map_err(|seen| {
            if proto::epoch::is_drill(&answered) != proto::epoch::is_drill(&seen) {
                let (drill, live) = if proto::epoch::is_drill(&answered) {
                    (
                        "it serves a DRILL restore of the cluster",
                        "the live cluster",
                    )
                } else {
                    ("it serves the live cluster", "a DRILL restore of it")
                };
                return tonic::Status::unavailable(format!(
                    "curator {endpoint} answered from {}: {drill}, and this client has seen \
                     {live} ({}): its answer is refused (keep a client configuration for each)",
                    proto::epoch::describe(&answered),
                    proto::epoch::describe(&seen)
                ));
            }
            tonic::Status::unavailable(format!(
                "curator {endpoint} answered from {}, older than {} this client has seen: \
                 its answer is refused (the curator is superseded)",
                proto::epoch::describe(&answered),
                proto::epoch::describe(&seen)
            ))
        })
    }

    async fn call_round<T, F, Fut>(&self, call: &F) -> Result<T, CallError>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let generation = self.generation();
        let current = self.current.lock().expect("current lock").clone();
        let mut candidates: VecDeque<(SocketAddr, Option<Channel>)> = VecDeque::new();
        match current {
            Some((endpoint, channel, made_with)) if made_with == generation => {
                candidates.push_back((endpoint, Some(channel)));
            }
            // Made with credentials since replaced: connect anew (same curator first).
            Some((endpoint, _, _)) => candidates.push_back((endpoint, None)),
            None => {}
        }
        candidates.extend(self.endpoints().into_iter().map(|e| (e, None)));
        // Each endpoint at most twice: once as listed, once more when another curator
        // names it leader (it may have just won). Bounded even when two curators name
        // each other during an election.
        let mut attempts: std::collections::HashMap<SocketAddr, u32> = Default::default();
        let mut unreachable = Vec::new();
        let mut last_status = None;
        while let Some((endpoint, channel)) = candidates.pop_front() {
            let n = attempts.entry(endpoint).or_default();
            if *n >= 2 {
                continue;
            }
            *n += 1;
            let channel = match channel {
                Some(c) => c,
                None => {
                    let connected = connect_from(
                        endpoint,
                        &self.trust,
                        self.credentials.as_ref(),
                        self.source,
                    )
                    .await;
                    match connected {
                        Ok(c) => c,
                        Err(e) => {
                            unreachable.push(e);
                            continue;
                        }
                    }
                }
            };
            match call(channel.clone()).await {
                Ok(response) => {
                    if let Err(status) = self.epoch_of(endpoint, response.metadata()) {
                        self.forget(endpoint);
                        last_status = Some(status);
                        continue;
                    }
                    *self.current.lock().expect("current lock") =
                        Some((endpoint, channel, generation));
                    return Ok(response.into_inner());
                }
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    self.forget(endpoint);
                    if let Some(leader) = leader_endpoint(channel).await
                        && leader != endpoint
                    {
                        candidates.push_front((leader, None));
                    }
                    last_status = Some(status);
                }
                Err(status) => {
                    *self.current.lock().expect("current lock") =
                        Some((endpoint, channel, generation));
                    return Err(CallError::Status(status));
                }
            }
        }
        Err(match last_status {
            Some(status) => CallError::Status(status),
            None => CallError::Unreachable(unreachable),
        })
    }

    fn forget(&self, endpoint: SocketAddr) {
        let mut current = self.current.lock().expect("current lock");
        if current.as_ref().is_some_and(|c| c.0 == endpoint) {
            *current = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("127.0.0.2").unwrap(),
            "127.0.0.2:7835".parse().unwrap()
        );
        assert_eq!(
            parse_endpoint("127.0.0.2:9000").unwrap(),
            "127.0.0.2:9000".parse().unwrap()
        );
        assert_eq!(
            parse_endpoint("[::1]:7835").unwrap(),
            "[::1]:7835".parse().unwrap()
        );
        assert_eq!(
            parse_endpoint("::1").unwrap(),
            "[::1]:7835".parse().unwrap()
        );
        assert!(parse_endpoint("example.com").is_err());
        assert_eq!(
            url_address("https://127.0.0.3:7834"),
            Some("127.0.0.3".parse().unwrap())
        );
        assert_eq!(
            url_address("https://[fd00::1]:7834"),
            Some("fd00::1".parse().unwrap())
        );
        assert_eq!(url_address("unix://etcd.sock:0"), None);
        assert!(parse_endpoint("").is_err());
    }
}

/// Properties over arbitrary endpoints (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        // From an IP and a port: an IPv6 socket address' flow label is never written out.
        fn addresses_parse_back(ip in any::<std::net::IpAddr>(), port in any::<u16>()) {
            let address = SocketAddr::new(ip, port);
            prop_assert_eq!(parse_endpoint(&address.to_string()).ok(), Some(address));
            prop_assert_eq!(
                parse_endpoint(&ip.to_string()).ok(),
                Some(SocketAddr::new(ip, CURATOR_PORT))
            );
        }

        #[test]
        fn any_text_parses_or_is_refused(text in any::<String>()) {
            if let Ok(address) = parse_endpoint(&text) {
                prop_assert_eq!(parse_endpoint(&address.to_string()).ok(), Some(address));
            }
            let _ = url_address(&text);
        }
    }
}
