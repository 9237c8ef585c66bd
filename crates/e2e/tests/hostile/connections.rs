//! One stranger cannot hurt the cluster (issue 25): with real polis-node processes, a
//! flood from one address (or from many, each at its own cap) never keeps the owner
//! out, never blinds monitoring, cannot make the unauthenticated calls without limit,
//! and a worker's heartbeats cannot drive etcd writes.
//!
//! One cluster (a member and a worker, heartbeats every second) serves the four cases
//! of `one_cluster_against_floods`, one after the other; a second one-member cluster
//! runs under `prlimit --nofile=1024:1024`. Every flood is bounded in connections,
//! opens and time, and closes all of its sockets before its case ends. Hostile clients
//! bind their own 127.x addresses; the owner and the scraper connect from the address
//! the system picks (127.0.0.1), never one of theirs.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::{Cluster, METRICS_PORT, Node, unique_loopback};
use proto::api;
use tokio::io::AsyncReadExt;

/// Heartbeat timing of the shared cluster: a short period keeps the heartbeat case short.
const NODE_ARGS: [&str; 4] = [
    "--heartbeat-period-ms",
    "1000",
    "--heartbeat-timeout-ms",
    "6000",
];
const HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);

/// How long one owner call (a fresh connection, TLS, ListNodes) may take under a flood.
const OWNER_CALL_BOUND: Duration = Duration::from_secs(5);
/// Owner calls made during each flood.
const OWNER_CALLS: usize = 8;
/// The curator's cap on connections without a cluster identity per source (Limits).
const CURATOR_PER_SOURCE: usize = 32;
/// The metrics listener's cap per source.
const METRICS_PER_SOURCE: usize = 8;

/// Raises this test process's open-files soft limit to the hard limit; fails if that
/// cannot hold `need` descriptors.
fn raise_own_open_files_limit(need: u64) -> Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with valid pointers to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            bail!("getrlimit: {}", std::io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            bail!("setrlimit: {}", std::io::Error::last_os_error());
        }
    }
    ensure!(
        limit.rlim_cur >= need,
        "this test needs {need} open files, the hard limit is {}",
        limit.rlim_cur
    );
    Ok(())
}

fn pem_file(dir: &std::path::Path, name: &str) -> Result<Vec<u8>> {
    let text = std::fs::read(dir.join(name)).with_context(|| format!("reading {name}"))?;
    Ok(pem::parse(text)?.into_contents())
}

/// The owner's credentials and the CA pin, from a cluster's config directory.
struct Owner {
    credentials: rpc::Credentials,
    trust: rpc::ServerTrust,
}

impl Owner {
    fn of(config: &std::path::Path) -> Result<Owner> {
        Ok(Owner {
            credentials: rpc::Credentials {
                certificate: pem_file(config, "owner.pem")?,
                key_pkcs8: pem_file(config, "owner-key.pem")?,
            },
            trust: rpc::ServerTrust::PinnedCa(pem_file(config, "ca.pem")?),
        })
    }

    /// One owner call on a fresh connection: ListNodes, bounded.
    async fn list_nodes(&self, endpoint: SocketAddr) -> Result<Duration> {
        let started = Instant::now();
        let call = async {
            let channel = rpc::connect(endpoint, &self.trust, Some(&self.credentials)).await?;
            api::management_client::ManagementClient::new(channel)
                .list_nodes(api::ListNodesRequest::default())
                .await?;
            anyhow::Ok(())
        };
        tokio::time::timeout(OWNER_CALL_BOUND, call)
            .await
            .with_context(|| format!("no answer within {OWNER_CALL_BOUND:?}"))??;
        Ok(started.elapsed())
    }

    /// `OWNER_CALLS` calls one after the other; fails naming how many failed and why.
    async fn calls(&self, endpoint: SocketAddr, during: &str) -> Result<Duration> {
        let mut slowest = Duration::ZERO;
        let mut failures = Vec::new();
        for _ in 0..OWNER_CALLS {
            match self.list_nodes(endpoint).await {
                Ok(took) => slowest = slowest.max(took),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        ensure!(
            failures.is_empty(),
            "{} of {OWNER_CALLS} owner calls failed during {during}: {failures:?}",
            failures.len()
        );
        eprintln!("{during}: {OWNER_CALLS} owner calls served, slowest {slowest:?}");
        Ok(slowest)
    }
}

/// Idle TCP connections (no byte sent) from `sources`, `per_source` from each, to one
/// target: a connection the server closes is opened again (at most once every
/// `REOPEN_PAUSE` per slot, at most `max_opens` opens in all) until the flood stops.
struct Flood {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    opened: Arc<AtomicUsize>,
    closed_by_server: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    slots: usize,
}

/// How long a slot waits before opening again a connection the server closed: bounds
/// the flood's rate (slots / pause) so that the machine's cores are not all the test's.
const REOPEN_PAUSE: Duration = Duration::from_secs(2);

impl Flood {
    fn start(target: SocketAddr, sources: &[IpAddr], per_source: usize, max_opens: usize) -> Flood {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let opened = Arc::new(AtomicUsize::new(0));
        let closed_by_server = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        // Connects in flight at once, so that the client side is not the bottleneck.
        let gate = Arc::new(tokio::sync::Semaphore::new(128));
        let mut tasks = Vec::new();
        for &source in sources {
            for _ in 0..per_source {
                let mut stopped = stopped.clone();
                let (opened, closed, failed, gate) = (
                    opened.clone(),
                    closed_by_server.clone(),
                    failed.clone(),
                    gate.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    while !*stopped.borrow() && opened.load(Ordering::SeqCst) < max_opens {
                        let connected = {
                            let _permit = gate.acquire().await.expect("gate open");
                            tokio::time::timeout(Duration::from_secs(5), async {
                                let socket = tokio::net::TcpSocket::new_v4()?;
                                socket.bind(SocketAddr::new(source, 0))?;
                                socket.connect(target).await
                            })
                            .await
                        };
                        let mut stream = match connected {
                            Ok(Ok(stream)) => stream,
                            _ => {
                                failed.fetch_add(1, Ordering::SeqCst);
                                tokio::select! {
                                    _ = tokio::time::sleep(REOPEN_PAUSE) => continue,
                                    _ = stopped.changed() => return,
                                }
                            }
                        };
                        opened.fetch_add(1, Ordering::SeqCst);
                        let mut buf = [0u8; 64];
                        tokio::select! {
                            _ = stream.read(&mut buf) => {
                                closed.fetch_add(1, Ordering::SeqCst);
                            }
                            _ = stopped.changed() => return,
                        }
                        drop(stream);
                        tokio::select! {
                            _ = tokio::time::sleep(REOPEN_PAUSE) => {}
                            _ = stopped.changed() => return,
                        }
                    }
                }));
            }
        }
        Flood {
            stop,
            tasks,
            opened,
            closed_by_server,
            failed,
            slots: sources.len() * per_source,
        }
    }

    /// Waits (bounded) until every slot has connected at least once.
    async fn until_all_opened(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.opened.load(Ordering::SeqCst) < self.slots {
            ensure!(
                Instant::now() < deadline,
                "the flood opened only {} of {} connections in 60 s ({} connects failed)",
                self.opened.load(Ordering::SeqCst),
                self.slots,
                self.failed.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Stops every slot and closes every socket; returns (opened, closed by the server).
    async fn stop(self) -> Result<(usize, usize)> {
        let _ = self.stop.send(true);
        for task in self.tasks {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .context("a flood task did not stop")??;
        }
        Ok((
            self.opened.load(Ordering::SeqCst),
            self.closed_by_server.load(Ordering::SeqCst),
        ))
    }
}

/// `n` distinct loopback addresses (none of them 127.0.0.1, the owner's).
fn sources(n: usize) -> Vec<IpAddr> {
    let mut all: Vec<IpAddr> = Vec::with_capacity(n);
    while all.len() < n {
        let a = unique_loopback();
        if !all.contains(&a) {
            all.push(a);
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cluster_against_floods() -> Result<()> {
    raise_own_open_files_limit(8192)?;
    let dir = tempfile::tempdir()?;
    let (cluster, worker, worker_id) = tokio::task::block_in_place(|| -> Result<_> {
        let cluster = Cluster::bootstrap_with(dir.path(), &[], &NODE_ARGS)?;
        let params = cluster.register_params("w")?;
        let (worker, id) = cluster.add_worker("w", &params)?;
        Ok((cluster, worker, id))
    })?;
    let owner = Owner::of(&cluster.config)?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    owner
        .list_nodes(endpoint)
        .await
        .context("before any flood")?;

    // Each case runs whatever the one before it did, so that one run shows every failure.
    let mut failures = Vec::new();
    let mut case = |name: &str, result: Result<()>| {
        if let Err(e) = result {
            eprintln!("{name} FAILED: {e:#}");
            failures.push(format!("{name}: {e:#}"));
        }
    };
    case(
        "(d) heartbeat flood",
        heartbeat_flood_writes_once_per_period(&cluster, &worker, &worker_id).await,
    );
    case(
        "(c) self-signed floods",
        self_signed_floods_are_limited_per_source(&cluster, &owner).await,
    );
    case(
        "(c) RegisterNode streams",
        register_streams_are_capped_per_source(&cluster, &owner, &worker).await,
    );
    case(
        "(b) metrics under an idle flood",
        scrapes_succeed_under_an_idle_flood(&cluster).await,
    );
    case(
        "(a) connection floods",
        owner_gets_in_under_connection_floods(&owner, endpoint).await,
    );
    ensure!(failures.is_empty(), "{failures:#?}");

    // The worker's heartbeats got through all along: still HEALTHY.
    tokio::task::block_in_place(|| cluster.wait_node(&worker_id, "UP", Some("HEALTHY")))?;
    drop(worker);
    Ok(())
}

/// (a) One address holding thousands of idle connections, then many addresses each
/// holding its per-source cap (more than the global cap in all): the owner's calls, each
/// on a fresh connection, are all served.
async fn owner_gets_in_under_connection_floods(owner: &Owner, endpoint: SocketAddr) -> Result<()> {
    let one = Flood::start(endpoint, &sources(1), 4200, 60_000);
    one.until_all_opened().await?;
    owner
        .calls(endpoint, "4200 idle connections from one address")
        .await?;
    let (opened, closed) = one.stop().await?;
    eprintln!("one address: {opened} connections opened, {closed} closed by the curator");

    // 4096 is the global cap: 140 addresses × 32 = 4480 go past it.
    let many = Flood::start(endpoint, &sources(140), CURATOR_PER_SOURCE, 60_000);
    many.until_all_opened().await?;
    owner
        .calls(endpoint, "140 addresses × 32 idle connections")
        .await?;
    let (opened, closed) = many.stop().await?;
    eprintln!("140 addresses: {opened} connections opened, {closed} closed by the curator");
    Ok(())
}

/// (b) Idle connections to /metrics from one address (far more than the listener
/// serves) and from many at their cap: every scrape is answered.
async fn scrapes_succeed_under_an_idle_flood(cluster: &Cluster) -> Result<()> {
    let metrics = SocketAddr::new(cluster.first.address, METRICS_PORT);
    let one = Flood::start(metrics, &sources(1), 300, 20_000);
    let many = Flood::start(metrics, &sources(20), METRICS_PER_SOURCE, 20_000);
    one.until_all_opened().await?;
    many.until_all_opened().await?;
    let address = cluster.first.address;
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        match tokio::task::spawn_blocking(move || e2e::scrape(address)).await? {
            Ok(text) if text.contains("polis_") => slowest = slowest.max(started.elapsed()),
            Ok(text) => failures.push(format!("no polis_ metric in {} bytes", text.len())),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    let (opened_one, _) = one.stop().await?;
    let (opened_many, _) = many.stop().await?;
    eprintln!(
        "metrics: {} of 10 scrapes served (slowest {slowest:?}) while {opened_one} + \
         {opened_many} idle connections were opened",
        10 - failures.len()
    );
    ensure!(failures.is_empty(), "scrapes failed: {failures:?}");
    Ok(())
}

/// A client with a fresh self-signed certificate, calling from `source`.
async fn self_signed_from(
    endpoint: SocketAddr,
    trust: &rpc::ServerTrust,
    key: &identity::NodeKey,
    source: IpAddr,
) -> Result<tonic::transport::Channel> {
    let slot = rpc::CredentialSlot::new(rpc::self_signed(key)?)?;
    Ok(rpc::connect_from(endpoint, trust, Some(&slot), Some(source)).await?)
}

/// Calls `call` up to `max` times until it answers ResourceExhausted: the number of
/// calls answered otherwise before, or an error when none was limited.
async fn calls_until_limited<F, Fut, T>(max: usize, mut call: F) -> Result<usize>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    for answered in 0..max {
        if let Err(s) = call().await
            && s.code() == tonic::Code::ResourceExhausted
        {
            return Ok(answered);
        }
    }
    bail!("{max} calls from one address, none answered ResourceExhausted")
}

/// (c) CommitNode and UnlockData with self-signed certificates from one address are
/// limited (ResourceExhausted) after a burst, per address; the owner is served
/// throughout.
async fn self_signed_floods_are_limited_per_source(cluster: &Cluster, owner: &Owner) -> Result<()> {
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let trust = &owner.trust;

    // CommitNode from one address, a stranger's key: limited after the burst (20).
    let noisy = unique_loopback();
    let stranger = identity::NodeKey::generate()?;
    let channel = self_signed_from(endpoint, trust, &stranger, noisy).await?;
    let curator = api::curator_client::CuratorClient::new(channel.clone());
    let answered = calls_until_limited(200, || {
        let mut curator = curator.clone();
        async move { curator.commit_node(api::CommitNodeRequest::default()).await }
    })
    .await
    .context("CommitNode")?;
    eprintln!("CommitNode from one address: {answered} answered, then ResourceExhausted");
    ensure!(
        (20..=40).contains(&answered),
        "{answered} CommitNode calls answered before the limit"
    );
    // The same address's UnlockData waits too (one bucket per address).
    let mut unlock = api::data_unlock_client::DataUnlockClient::new(channel);
    let limited = unlock
        .unlock_data(api::UnlockDataRequest {})
        .await
        .expect_err("UnlockData from the limited address");
    ensure!(
        limited.code() == tonic::Code::ResourceExhausted,
        "{limited:?}"
    );
    owner
        .list_nodes(endpoint)
        .await
        .context("owner after CommitNode flood")?;

    // UnlockData from another address: limited after its own burst.
    let other = unique_loopback();
    let channel = self_signed_from(endpoint, trust, &stranger, other).await?;
    let unlock = api::data_unlock_client::DataUnlockClient::new(channel);
    let answered = calls_until_limited(200, || {
        let mut unlock = unlock.clone();
        async move { unlock.unlock_data(api::UnlockDataRequest {}).await }
    })
    .await
    .context("UnlockData")?;
    eprintln!("UnlockData from another address: {answered} answered, then ResourceExhausted");
    ensure!(
        (20..=40).contains(&answered),
        "{answered} UnlockData calls answered before the limit"
    );
    owner
        .list_nodes(endpoint)
        .await
        .context("owner after UnlockData flood")?;
    Ok(())
}

/// (c) RegisterNode streams held open from one address are capped: a worker
/// registering its own key again (each stream stays open with its state) gets only a
/// few at once; a closed stream frees its place; the owner is served throughout.
async fn register_streams_are_capped_per_source(
    cluster: &Cluster,
    owner: &Owner,
    worker: &Node,
) -> Result<()> {
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let trust = &owner.trust;
    // RegisterNode with the worker's own key (registered: each stream stays open with its
    // state) from one address: only a few streams at once.
    let streamer = unique_loopback();
    let worker_key =
        identity::NodeKey::from_pkcs8(&std::fs::read(worker.root.join("data/node/key.der"))?)?;
    let channel = self_signed_from(endpoint, trust, &worker_key, streamer).await?;
    let request = api::RegisterNodeRequest {
        register_ticket: vec![],
        address: worker.address.to_string(),
        ..Default::default()
    };
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..10 {
        let mut curator = api::curator_client::CuratorClient::new(channel.clone());
        match curator.register_node(request.clone()).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
                    .await
                    .context("a registration update")??;
                ensure!(first.is_some(), "the stream ended at once");
                open.push(stream);
            }
            Err(s) if s.code() == tonic::Code::ResourceExhausted => refused += 1,
            Err(s) => bail!("RegisterNode: {s:?}"),
        }
    }
    eprintln!(
        "RegisterNode from one address: {} streams open at once, {refused} refused",
        open.len()
    );
    ensure!(
        open.len() <= 4 && refused == 10 - open.len() && !open.is_empty(),
        "{} streams open, {refused} refused",
        open.len()
    );
    // A closed stream frees its place.
    open.pop();
    let reopened = wait_for_a_stream(&channel, &request).await?;
    drop(reopened);
    drop(open);
    owner
        .list_nodes(endpoint)
        .await
        .context("owner after RegisterNode streams")?;
    Ok(())
}

/// Opens a RegisterNode stream, retrying (bounded) while the server still counts a
/// stream the client just dropped.
async fn wait_for_a_stream(
    channel: &tonic::transport::Channel,
    request: &api::RegisterNodeRequest,
) -> Result<tonic::Streaming<api::RegistrationUpdate>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut curator = api::curator_client::CuratorClient::new(channel.clone());
        match curator.register_node(request.clone()).await {
            Ok(stream) => return Ok(stream.into_inner()),
            Err(s) if s.code() == tonic::Code::ResourceExhausted && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => bail!("RegisterNode after a stream closed: {s:?}"),
        }
    }
}

/// etcd's revision and the worker record's version, read through the member's socket.
fn revision_and_version(member: &Node, worker_id: &str) -> Result<(i64, i64)> {
    let status: serde_json::Value =
        serde_json::from_str(&member.etcdctl(&["endpoint", "status", "-w", "json"])?)?;
    let revision = status[0]["Status"]["header"]["revision"]
        .as_i64()
        .context("revision")?;
    let record: serde_json::Value = serde_json::from_str(&member.etcdctl(&[
        "get",
        &format!("namespaced:curator/nodes/{worker_id}"),
        "-w",
        "json",
    ])?)?;
    let version = record["kvs"][0]["version"].as_i64().context("version")?;
    Ok((revision, version))
}

/// (d) A worker sending heartbeats as fast as it can, each with a different status:
/// at most one etcd write of its record per heartbeat period.
async fn heartbeat_flood_writes_once_per_period(
    cluster: &Cluster,
    worker: &Node,
    worker_id: &str,
) -> Result<()> {
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    let credentials = rpc::Credentials {
        certificate: std::fs::read(worker.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(worker.root.join("data/node/key.der"))?,
    };
    let trust = rpc::ServerTrust::PinnedCa(pem_file(&cluster.config, "ca.pem")?);
    let channel = rpc::connect(endpoint, &trust, Some(&credentials)).await?;
    let mut curator = api::curator_client::CuratorClient::new(channel);
    let member = &cluster.first;
    // Every write between the two reads counts: the window is from the first read's
    // start to the second's end.
    let measured_from = Instant::now();
    let before = tokio::task::block_in_place(|| revision_and_version(member, worker_id))?;
    let flood = 4 * HEARTBEAT_PERIOD;
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < flood && sent < 20_000 {
        sent += 1;
        let status = proto::state::NodeStatus {
            address: worker.address.to_string(),
            version: format!("flood-{sent}"),
            etcd_member_running: false,
            curator_running: sent.is_multiple_of(2),
            started_at_unix_ms: sent,
            ..Default::default()
        };
        curator
            .heartbeat(api::HeartbeatRequest {
                status: Some(status),
            })
            .await
            .context("a flooding heartbeat")?;
    }
    let elapsed = started.elapsed();
    let after = tokio::task::block_in_place(|| revision_and_version(member, worker_id))?;
    let window = measured_from.elapsed();
    let (revisions, versions) = (after.0 - before.0, after.1 - before.1);
    let periods = window.as_secs_f64() / HEARTBEAT_PERIOD.as_secs_f64();
    eprintln!(
        "heartbeat flood: {sent} heartbeats in {elapsed:?}; {versions} writes of the record \
         and etcd revision +{revisions} in {window:?} ({periods:.2} periods)"
    );
    // Writes a period apart: at most one per whole period in the window and one more
    // (its start); one more for an etcd commit that took longer than the next one. Other
    // writes (health verdicts) may move the revision a little.
    let bound = periods.floor() as i64 + 2;
    ensure!(
        versions <= bound,
        "{versions} writes of the record in {periods:.2} periods (at most {bound})"
    );
    ensure!(
        revisions <= bound + 4,
        "etcd revision moved {revisions} in {periods:.2} periods"
    );
    Ok(())
}

/// (a) under a low open-files limit: a one-member cluster started with
/// `prlimit --nofile=1024:1024`; 1500 idle connections from one address, then many
/// addresses at their cap: the owner's calls are served, the node logs no EMFILE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_gets_in_under_a_low_open_files_limit() -> Result<()> {
    raise_own_open_files_limit(4096)?;
    let dir = tempfile::tempdir()?;
    let first_dir = dir.path().join("n0");
    std::fs::create_dir_all(&first_dir)?;
    let mut first = Node::new(&first_dir);
    first.open_files = Some(1024);
    let mut cluster =
        tokio::task::block_in_place(|| Cluster::bootstrap_from(dir.path(), first, &[]))?;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", cluster.first.proc().pid()))?;
    ensure!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains(" 1024 ")),
        "{limits}"
    );
    let owner = Owner::of(&cluster.config)?;
    let endpoint = SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT);
    owner
        .list_nodes(endpoint)
        .await
        .context("before any flood")?;

    let one = Flood::start(endpoint, &sources(1), 1500, 30_000);
    one.until_all_opened().await?;
    owner
        .calls(
            endpoint,
            "1500 idle connections from one address, nofile 1024",
        )
        .await?;
    one.stop().await?;

    let many = Flood::start(endpoint, &sources(40), CURATOR_PER_SOURCE, 30_000);
    many.until_all_opened().await?;
    owner
        .calls(endpoint, "40 addresses × 32 idle connections, nofile 1024")
        .await?;
    many.stop().await?;

    a_stolen_node_key_holds_only_its_share(&cluster.first, &owner, endpoint).await?;

    let log = cluster.first.proc().output();
    ensure!(
        !log.contains("Too many open files"),
        "the node ran out of descriptors"
    );
    Ok(())
}

/// Connections of one node key kept from eviction (`rpc` Limits::per_identity_connections).
const PER_IDENTITY: usize = 8;
/// WatchNode streams one node keeps open on a curator (curator `watchers::PER_NODE`).
const WATCHES_PER_NODE: usize = 4;

/// (e) A node key in an attacker's hands (here the member's own): more connections than
/// the listener has seats (576 under nofile 1024), each proven by a call with it. Only
/// its share stays out of eviction: the owner's calls are still served. And WatchNode
/// streams of that node past its share end, oldest first.
async fn a_stolen_node_key_holds_only_its_share(
    node: &Node,
    owner: &Owner,
    endpoint: SocketAddr,
) -> Result<()> {
    let stolen = rpc::Credentials {
        certificate: std::fs::read(node.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(node.root.join("data/node/key.der"))?,
    };
    let mut held = Vec::new();
    let mut proven = 0;
    for _ in 0..600 {
        let Ok(channel) = rpc::connect(endpoint, &owner.trust, Some(&stolen)).await else {
            continue;
        };
        let mut local = api::curator_local_client::CuratorLocalClient::new(channel.clone());
        let call = local.get_current_leader(api::GetCurrentLeaderRequest {});
        if tokio::time::timeout(OWNER_CALL_BOUND, call)
            .await
            .is_ok_and(|r| r.is_ok())
        {
            proven += 1;
        }
        held.push(channel);
    }
    ensure!(proven > 576, "only {proven} connections made their call");
    owner
        .calls(endpoint, "600 connections proven by one stolen node key")
        .await?;
    drop(held);

    let channel = rpc::connect(endpoint, &owner.trust, Some(&stolen)).await?;
    let mut streams = Vec::new();
    for _ in 0..(WATCHES_PER_NODE + 3) {
        let mut stream = api::curator_client::CuratorClient::new(channel.clone())
            .watch_node(api::WatchNodeRequest {})
            .await?
            .into_inner();
        stream.message().await?.context("a first update")?;
        streams.push(stream);
    }
    for (i, stream) in streams.iter_mut().take(3).enumerate() {
        let ended = tokio::time::timeout(OWNER_CALL_BOUND, stream.message())
            .await
            .with_context(|| format!("stream {i}, superseded, did not end"))?;
        match ended {
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {}
            other => bail!("stream {i}: {other:?}, not ended as superseded"),
        }
    }
    eprintln!(
        "a stolen node key: {proven} proven connections ({PER_IDENTITY} kept from eviction), \
         the owner served; {} WatchNode streams, the 3 oldest ended",
        WATCHES_PER_NODE + 3
    );
    Ok(())
}
