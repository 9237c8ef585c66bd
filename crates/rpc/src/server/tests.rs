//! The listener against real sockets on 127.0.0.1, with limits small enough to hit.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant as StdInstant;

use proto::api;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use tokio_stream::wrappers::ReceiverStream;

use super::calls::Calls;
use super::*;
use crate::tls::{
    Anchors, Authenticator, Credentials, ServerTrust, client_config, self_signed, server_config,
};

pub(super) const WAIT: Duration = Duration::from_secs(5);

pub(super) fn small(max_connections: usize, per_source_handshakes: usize) -> Limits {
    Limits {
        max_connections,
        per_source_connections: 32,
        per_source_handshakes,
        per_identity_connections: 8,
        handshake_timeout: Duration::from_millis(400),
        first_call_timeout: Duration::from_millis(400),
        idle_timeout: Duration::from_millis(400),
    }
}

/// A TCP connection to `address` from the loopback address `source`.
async fn tcp_from(source: &str, address: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(source.parse().unwrap(), 0))
        .unwrap();
    socket.connect(address).await.unwrap()
}

pub(super) fn server_credentials() -> Credentials {
    self_signed(&identity::NodeKey::generate().unwrap()).unwrap()
}

pub(super) async fn bind() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    (listener, address)
}

/// A TLS session to `address` that then sends nothing.
async fn tls_client(
    address: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    tls_over(TcpStream::connect(address).await?, address).await
}

/// A TLS session over `tcp` (connected to `address`) that then sends nothing.
async fn tls_over(
    tcp: TcpStream,
    address: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = client_config(&ServerTrust::FirstUse, None).unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// How long until the server closes `stream` (EOF or reset), failing after `WAIT`.
async fn closed_after<S: AsyncRead + Unpin>(stream: &mut S) -> Duration {
    let started = StdInstant::now();
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the server did not close the connection within {WAIT:?}"),
        }
    }
}

#[tokio::test]
async fn accepted_sockets_have_nodelay() {
    let (listener, address) = bind().await;
    let mut incoming = incoming_with(
        listener,
        server_config(&server_credentials()).unwrap(),
        small(8, 8),
    );
    let _client = tls_client(address).await.unwrap();
    let conn = tokio::time::timeout(WAIT, tokio_stream::StreamExt::next(&mut incoming))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(conn.tcp().nodelay().unwrap());
}

/// Waits until the server has seated `n` connections it was handed (each appears
/// on `incoming` once its handshake is done).
async fn next_conn(incoming: &mut ReceiverStream<Result<TlsConn, std::io::Error>>) -> TlsConn {
    tokio::time::timeout(WAIT, tokio_stream::StreamExt::next(incoming))
        .await
        .expect("a connection within the wait")
        .expect("the listener runs")
        .expect("a connection")
}

/// Whether the server still holds `stream` open after `within`.
async fn still_open<S: AsyncRead + Unpin>(stream: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    tokio::time::timeout(within, stream.read(&mut buf))
        .await
        .is_err()
}

#[tokio::test]
async fn beyond_the_connection_cap_the_oldest_idle_stranger_makes_room() {
    // Two seats: one TLS connection without a call, one in its handshake; a third
    // source's newcomer closes the oldest (the TLS one) and completes its handshake.
    let (listener, address) = bind().await;
    let mut incoming = incoming_with(
        listener,
        server_config(&server_credentials()).unwrap(),
        Limits {
            first_call_timeout: WAIT * 2,
            handshake_timeout: WAIT * 2,
            ..small(2, 2)
        },
    );
    let mut oldest = tls_over(tcp_from("127.0.0.2", address).await, address)
        .await
        .unwrap();
    // Read as hyper reads a connection: an eviction ends the read, the drop closes it.
    let mut held = next_conn(&mut incoming).await;
    tokio::spawn(async move {
        let mut buf = [0u8; 16];
        let _ = held.read(&mut buf).await;
    });
    let mut handshaking = tcp_from("127.0.0.3", address).await;
    let newcomer = tls_over(tcp_from("127.0.0.4", address).await, address).await;
    assert!(newcomer.is_ok(), "the newcomer got in: {newcomer:?}");
    assert!(closed_after(&mut oldest).await < Duration::from_secs(2));
    assert!(
        still_open(&mut handshaking, Duration::from_millis(300)).await,
        "only one seat was needed"
    );
}

#[tokio::test]
async fn a_source_at_its_cap_replaces_its_own_oldest_connection() {
    let (listener, address) = bind().await;
    let _incoming = incoming_with(
        listener,
        server_config(&server_credentials()).unwrap(),
        Limits {
            per_source_connections: 2,
            handshake_timeout: WAIT * 2,
            ..small(16, 8)
        },
    );
    let mut first = tcp_from("127.0.0.2", address).await;
    let mut second = tcp_from("127.0.0.2", address).await;
    let mut third = tcp_from("127.0.0.2", address).await;
    assert!(closed_after(&mut first).await < Duration::from_secs(2));
    // Another source is not touched by it.
    let mut other = tcp_from("127.0.0.3", address).await;
    assert!(still_open(&mut second, Duration::from_millis(300)).await);
    assert!(still_open(&mut third, Duration::from_millis(10)).await);
    assert!(still_open(&mut other, Duration::from_millis(10)).await);
}

#[tokio::test]
async fn beyond_its_handshake_turns_a_source_waits_and_others_do_not() {
    // One silent TCP client holds its source's only turn until its handshake times out
    // (400 ms); a TLS client from that source waits for the turn instead of being
    // refused, and one from another source does not wait at all.
    let (listener, address) = bind().await;
    let mut incoming = incoming_with(
        listener,
        server_config(&server_credentials()).unwrap(),
        small(8, 1),
    );
    let mut silent = tcp_from("127.0.0.2", address).await;
    let started = StdInstant::now();
    let (queued, other) = tokio::join!(
        async {
            let tls = tls_over(tcp_from("127.0.0.2", address).await, address).await;
            (tls, started.elapsed())
        },
        async {
            let tls = tls_over(tcp_from("127.0.0.3", address).await, address).await;
            (tls, started.elapsed())
        },
    );
    let (queued, waited) = (queued.0.expect("the queued handshake succeeds"), queued.1);
    let (other, other_took) = (other.0.expect("the other source's handshake"), other.1);
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(other_took < Duration::from_millis(200), "{other_took:?}");
    let held = closed_after(&mut silent).await;
    assert!(held < Duration::from_secs(2), "{held:?}");
    next_conn(&mut incoming).await;
    next_conn(&mut incoming).await;
    drop((queued, other));
}

#[tokio::test]
async fn waiting_for_a_handshake_turn_is_bounded() {
    let none = Arc::new(tokio::sync::Semaphore::new(0));
    let started = StdInstant::now();
    assert!(
        accept::turn(none.clone(), Duration::from_millis(100))
            .await
            .is_none()
    );
    assert!(started.elapsed() >= Duration::from_millis(100));
    let freed = none.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        freed.add_permits(1);
    });
    assert!(accept::turn(none, WAIT).await.is_some());
}

#[test]
fn limits_share_the_open_files_limit() {
    assert_eq!(
        Limits::within_open_files(1 << 20, Port::Curator),
        Limits::PRODUCTION
    );
    // 1024 - 256 left for listeners: 12, 3 and 1 sixteenths.
    let parts = [Port::Curator, Port::Node, Port::Unlock]
        .map(|p| Limits::within_open_files(1024, p).max_connections);
    assert_eq!(parts, [576, 144, 48]);
    assert!(parts.iter().sum::<usize>() <= 1024 - 256);
    assert_eq!(
        Limits::within_open_files(1 << 20, Port::Unlock).max_connections,
        128
    );
    let tiny = Limits::within_open_files(0, Port::Unlock);
    assert!(tiny.max_connections > 0);
    assert!(tiny.per_source_connections <= tiny.max_connections);
}

#[test]
fn log_budget_reports_once_per_interval_with_a_count() {
    let mut budget = LogBudget::new(Duration::from_secs(1));
    let t0 = std::time::Instant::now();
    assert_eq!(budget.record(t0), Some(1));
    for i in 1..=99 {
        assert_eq!(budget.record(t0 + Duration::from_millis(i * 5)), None);
    }
    assert_eq!(budget.record(t0 + Duration::from_secs(1)), Some(100));
    assert_eq!(budget.record(t0 + Duration::from_millis(1500)), None);
}

/// CuratorLocal whose GetCurrentLeader takes `delay`.
pub(super) struct Slow {
    pub(super) delay: Duration,
}

#[tonic::async_trait]
impl api::curator_local_server::CuratorLocal for Slow {
    async fn get_current_leader(
        &self,
        _: tonic::Request<api::GetCurrentLeaderRequest>,
    ) -> Result<tonic::Response<api::GetCurrentLeaderResponse>, tonic::Status> {
        tokio::time::sleep(self.delay).await;
        Ok(tonic::Response::new(Default::default()))
    }
    async fn get_ca_certificate(
        &self,
        _: tonic::Request<api::GetCaCertificateRequest>,
    ) -> Result<tonic::Response<api::GetCaCertificateResponse>, tonic::Status> {
        Ok(tonic::Response::new(Default::default()))
    }
    async fn get_consensus_status(
        &self,
        _: tonic::Request<api::GetConsensusStatusRequest>,
    ) -> Result<tonic::Response<api::GetConsensusStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(Default::default()))
    }
    async fn defragment_member(
        &self,
        _: tonic::Request<api::DefragmentMemberRequest>,
    ) -> Result<tonic::Response<api::DefragmentMemberResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    type SnapshotsFetchLocalStream =
        tokio_stream::Empty<Result<api::SnapshotFileChunk, tonic::Status>>;
    async fn snapshots_list_local(
        &self,
        _: tonic::Request<api::SnapshotsListLocalRequest>,
    ) -> Result<tonic::Response<api::SnapshotsListLocalResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
    async fn snapshots_fetch_local(
        &self,
        _: tonic::Request<api::SnapshotsFetchLocalRequest>,
    ) -> Result<tonic::Response<Self::SnapshotsFetchLocalStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
}

/// A curator-like server (our builder, the auth layer, our listener) on 127.0.0.1.
async fn serve(limits: Limits, delay: Duration) -> SocketAddr {
    let (listener, address) = bind().await;
    let ca = pki::Ca::generate("test CA", pki::CA_LIFETIME).unwrap();
    let crl_der = ca.crl(&[], 1).unwrap();
    let anchors = Anchors::one(ca.cert_der.clone(), Some(crl_der));
    let trust: TrustSource = Arc::new(move || {
        let anchors = anchors.clone();
        Box::pin(async move { Ok(anchors) })
    });
    let auth = AuthLayer::new(Arc::new(Authenticator::new()), trust);
    let tls = server_config(&server_credentials()).unwrap();
    tokio::spawn(
        builder()
            .layer(auth)
            .add_service(api::curator_local_server::CuratorLocalServer::new(Slow {
                delay,
            }))
            .serve_with_incoming(incoming_with(listener, tls, limits)),
    );
    address
}

#[tokio::test]
async fn connections_without_calls_are_closed_and_calls_keep_them_open() {
    let limits = small(16, 16);
    let address = serve(limits, Duration::from_millis(1000)).await;

    // TLS done, then no HTTP/2 preface.
    let mut silent = tls_client(address).await.unwrap();
    let after = closed_after(&mut silent).await;
    assert!(
        after >= Duration::from_millis(300) && after < Duration::from_secs(2),
        "{after:?}"
    );

    // A call longer than the idle timeout completes; once it is over, the connection is
    // closed for idleness. The test keeps a second descriptor of the client's socket to
    // see the server's FIN.
    let (channel, socket) = channel_with_socket(address, None).await;
    let started = StdInstant::now();
    api::curator_local_client::CuratorLocalClient::new(channel.clone())
        .get_current_leader(api::GetCurrentLeaderRequest {})
        .await
        .expect("a call longer than the idle timeout is not cut");
    assert!(started.elapsed() >= Duration::from_millis(1000));
    let idle_since = StdInstant::now();
    assert!(
        closed_within(&socket, WAIT).await,
        "the idle connection was not closed"
    );
    assert!(idle_since.elapsed() >= Duration::from_millis(200));
    drop(channel);
}

fn open_files_limit() -> libc::rlimit {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    limit
}

fn two_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn set_open_files_soft_limit(soft: u64) {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: open_files_limit().rlim_max,
    };
    // SAFETY: setrlimit with a valid pointer; callers run in a process of their own.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage with a valid pointer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Lowers the process's open-files limit: a process of its own (`ownprocess`).
#[test]
fn out_of_descriptors_the_accept_loop_pauses_and_recovers() {
    let _ = ownprocess::in_own_process(
        module_path!(),
        "out_of_descriptors_the_accept_loop_pauses_and_recovers",
        || {
            two_worker_runtime()
                .block_on(out_of_descriptors_the_accept_loop_pauses_and_recovers_body())
        },
    );
}

async fn out_of_descriptors_the_accept_loop_pauses_and_recovers_body() {
    let (listener, address) = bind().await;
    // The kernel completes the clients' TCP handshakes into the backlog; once no
    // descriptor is left, every accept(2) fails with EMFILE.
    let clients: Vec<_> = futures_connect(address, 8).await;
    let saved = open_files_limit();
    // read_dir holds one descriptor while counting.
    let in_use = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64 - 1;
    set_open_files_soft_limit(in_use);
    let mut incoming = incoming_with(
        listener,
        server_config(&server_credentials()).unwrap(),
        small(64, 64),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = cpu_time();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let burnt = cpu_time() - before;
    // A loop retrying accept at once would burn about a core for the whole second.
    assert!(burnt < Duration::from_millis(300), "{burnt:?}");

    set_open_files_soft_limit(saved.rlim_cur);
    drop(clients);
    let _client = tls_client(address).await.unwrap();
    let conn = tokio::time::timeout(WAIT, tokio_stream::StreamExt::next(&mut incoming)).await;
    assert!(
        matches!(conn, Ok(Some(Ok(_)))),
        "accepting again after EMFILE"
    );
}

/// Lowers the process's open-files limit: a process of its own (`ownprocess`).
#[test]
fn out_of_descriptors_the_oldest_idle_stranger_is_closed() {
    let _ = ownprocess::in_own_process(
        module_path!(),
        "out_of_descriptors_the_oldest_idle_stranger_is_closed",
        || {
            two_worker_runtime()
                .block_on(out_of_descriptors_the_oldest_idle_stranger_is_closed_body())
        },
    );
}

async fn out_of_descriptors_the_oldest_idle_stranger_is_closed_body() {
    let (listener, address) = bind().await;
    let long = Limits {
        handshake_timeout: WAIT * 4,
        first_call_timeout: WAIT * 4,
        ..small(64, 8)
    };
    let mut incoming = incoming_with(
        listener,
        server_config(&server_credentials()).unwrap(),
        long,
    );
    // A stranger seated (TLS done, no call), its connection read as hyper reads it.
    let mut stranger = tls_client(address).await.unwrap();
    let mut conn = next_conn(&mut incoming).await;
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 16];
        let _ = conn.read(&mut buf).await;
    });
    // One descriptor left, which the next client takes: the server's accept fails.
    let saved = open_files_limit();
    let in_use = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64 - 1;
    set_open_files_soft_limit(in_use + 1);
    let waiting = TcpStream::connect(address).await;
    let closed = tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 16];
        matches!(stranger.read(&mut buf).await, Ok(0) | Err(_))
    })
    .await;
    set_open_files_soft_limit(saved.rlim_cur);
    assert!(waiting.is_ok(), "{waiting:?}");
    assert_eq!(
        closed,
        Ok(true),
        "the stranger was closed to free a descriptor"
    );
    reader.await.unwrap();
}

async fn futures_connect(address: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(TcpStream::connect(address).await.unwrap());
    }
    clients
}

#[test]
fn a_streaming_response_counts_as_in_flight_until_its_body_is_dropped() {
    let limits = small(16, 16);
    let calls = Arc::new(Calls::new(Arc::default()));
    let accepted = Instant::now();
    let body = CountedBody {
        inner: Box::pin(tonic::body::Body::empty()),
        _call: Some(calls.start()),
    };
    assert_eq!(
        calls.idle_deadline(accepted, &limits),
        None,
        "an open response stream keeps the connection busy"
    );
    drop(body);
    let deadline = calls.idle_deadline(accepted, &limits).expect("idle again");
    assert!(deadline > Instant::now());
}

#[test]
fn a_connection_whose_latest_call_no_longer_proves_it_is_evictable_again() {
    // An admin's connection (proven by a call), then its certificate revoked: the next
    // call on it is classified anything but an admin. Its seat counts against its
    // source again and goes first, as the oldest idle one (it is not closed before).
    use super::admission::{Caps, Table};
    let mut table: Table<Arc<Calls>> = Table::new(Caps {
        max: 16,
        per_source: 2,
        handshakes_per_source: 1,
        per_identity: 8,
    });
    let source: std::net::IpAddr = "127.0.0.9".parse().unwrap();
    let demotions = table.demotions();
    let admin = Arc::new(Calls::new(demotions.clone()));
    table.admit(source, admin.clone()).unwrap();
    admin.set_proven(Some(Arc::from("user owner")));
    let stranger = || Arc::new(Calls::new(demotions.clone()));
    for _ in 0..2 {
        let seated = table.admit(source, stranger()).unwrap();
        assert!(seated.evicted.is_empty(), "the admin's seat is not counted");
    }
    admin.set_proven(None);
    let seated = table.admit(source, stranger()).unwrap();
    assert_eq!(seated.evicted.len(), 1);
    assert!(
        Arc::ptr_eq(&seated.evicted[0], &admin),
        "the removed admin's seat, the oldest, goes first"
    );
}

/// A channel to `address` with `credentials`, and a second descriptor of its socket
/// (to see the server close it).
pub(super) async fn channel_with_socket(
    address: SocketAddr,
    credentials: Option<&Credentials>,
) -> (tonic::transport::Channel, std::net::TcpStream) {
    let (socket_tx, socket_rx) = std::sync::mpsc::channel();
    let connector = tokio_rustls::TlsConnector::from(
        client_config(&ServerTrust::FirstUse, credentials).unwrap(),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let (connector, socket_tx) = (connector.clone(), socket_tx.clone());
            async move {
                let tcp = TcpStream::connect(address).await?;
                let std = tcp.into_std()?;
                socket_tx.send(std.try_clone()?).expect("test alive");
                let tcp = TcpStream::from_std(std)?;
                let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    (channel, socket_rx.try_recv().expect("one connection"))
}

/// Whether the server closed `socket` (EOF or reset) within `within`.
pub(super) async fn closed_within(socket: &std::net::TcpStream, within: Duration) -> bool {
    socket.set_nonblocking(true).unwrap();
    let started = StdInstant::now();
    while started.elapsed() < within {
        let mut buf = [0u8; 1];
        match socket.peek(&mut buf) {
            Ok(0) => return true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(_) => return true,
            Ok(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
