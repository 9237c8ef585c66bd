//! The curator and the node root against hostile clients and careless operators, with a
//! real polis-node: connection floods, a second node on one root, key files other tools
//! must read, short-lived owner certificates.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Node, TIMEOUT, polisctl};
use proto::api;
use tokio::io::AsyncReadExt;

/// polisctl with the node's endpoint and `dir/config`, retried while the curator is
/// still electing itself.
fn ctl_ok(node: &Node, args: &[&str]) -> Result<String> {
    let config = node.dir.join("config");
    let endpoint = node.address.to_string();
    let mut all = vec![
        "--config",
        config.to_str().unwrap(),
        "--endpoints",
        &endpoint,
    ];
    all.extend_from_slice(args);
    let mut last = String::new();
    for _ in 0..100 {
        let (status, out, err) = polisctl(&all)?;
        if status.success() {
            return Ok(out);
        }
        last = err;
        if !last.contains("unavailable") && !last.contains("cannot reach") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("polisctl {args:?} failed: {last}")
}

fn openssl(args: &[&str]) -> Result<(bool, String)> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

fn pem_der(path: &Path) -> Result<Vec<u8>> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(pem::parse(text)?.into_contents())
}

#[test]
fn key_files_are_pkcs8_v1_that_openssl_reads_and_v2_keys_still_load() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    let owner_key = dir.path().join("config/owner-key.pem");
    let node_key = node.root.join("data/node/key.der");
    let peer_key = node.root.join("data/etcd/peer/key.pem");
    for (path, form) in [(&owner_key, "PEM"), (&node_key, "DER"), (&peer_key, "PEM")] {
        let (ok, out) = openssl(&[
            "pkey",
            "-inform",
            form,
            "-in",
            path.to_str().unwrap(),
            "-noout",
        ])?;
        assert!(ok, "openssl cannot read {}: {out}", path.display());
    }

    // A root written by an earlier version holds a v2 key (ring's form, with the public
    // key): the node still joins with it.
    node.proc().signal(libc::SIGTERM);
    node.proc().wait_exit(TIMEOUT)?;
    let v1 = std::fs::read(&node_key)?;
    let key = identity::NodeKey::from_pkcs8(&v1)?;
    let mut v2 = vec![
        0x30, 0x53, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    v2.extend_from_slice(&v1[16..48]);
    v2.extend_from_slice(&[0xa1, 0x23, 0x03, 0x21, 0x00]);
    v2.extend_from_slice(&key.public_key());
    std::fs::write(&node_key, &v2)?;
    node.start(&[])?;
    node.wait_home()?;
    Ok(())
}

#[test]
fn a_second_node_on_a_running_root_is_refused_naming_the_first() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::bootstrapped(dir.path())?;
    let first = node.proc().pid();
    let marker = node.root.join("ephemeral/left-alone");
    std::fs::write(&marker, b"x")?;
    let mut second = e2e::Proc::spawn(
        "second polis-node",
        node.command(&[]),
        &dir.path().join("second.log"),
    )?;
    let status = second.wait_exit(TIMEOUT)?;
    assert_eq!(status.code(), Some(1), "{}", second.output());
    let out = second.output();
    assert!(
        out.contains(&format!("in use by another polis-node (PID {first}")),
        "{out}"
    );
    assert!(marker.exists(), "the refused node touched the root");
    assert_eq!(
        std::fs::read_to_string(node.root.join("lock"))?.trim(),
        first.to_string()
    );
    assert!(e2e::process_alive(first));

    // Once the first is gone (even by kill -9), the root is free again.
    node.proc().signal(libc::SIGKILL);
    node.proc().wait_exit(TIMEOUT)?;
    node.start(&[])?;
    node.wait_home()?;
    Ok(())
}

#[test]
fn a_60_second_owner_certificate_is_valid_for_60_seconds_from_issue() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut node = Node::new(dir.path());
    let params = node.bootstrap_params_with(&["--owner-certificate-lifetime", "60"])?;
    node.start(&["--params", params.to_str().unwrap()])?;
    node.wait_home()?;
    let issued = Instant::now();
    ctl_ok(&node, &["takeownership", "--accept-ca"])?;
    let cert = dir.path().join("config/owner.pem");
    // Valid now and for (nearly) all of its 60 s: not back-dated into its lifetime.
    let remaining = 58u64.saturating_sub(issued.elapsed().as_secs());
    let (ok, out) = openssl(&[
        "x509",
        "-in",
        cert.to_str().unwrap(),
        "-noout",
        "-checkend",
        &remaining.to_string(),
    ])?;
    assert!(ok, "expires within {remaining} s: {out}");
    let (ok, out) = openssl(&[
        "x509",
        "-in",
        cert.to_str().unwrap(),
        "-noout",
        "-checkend",
        "61",
    ])?;
    assert!(!ok, "valid beyond its lifetime: {out}");
    ctl_ok(&node, &["node", "list"])?;

    // Outside the PKI's bounds the parameters are refused, naming the limit.
    for bad in ["4", "11y"] {
        let err = node
            .bootstrap_params_with(&["--owner-certificate-lifetime", bad])
            .unwrap_err()
            .to_string();
        assert!(err.contains("lifetime"), "{bad}: {err}");
    }
    Ok(())
}

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
    if limit.rlim_cur < need {
        bail!(
            "this test needs {need} open files, the hard limit is {}",
            limit.rlim_cur
        );
    }
    Ok(())
}

/// Hostile connections of each kind.
const HOSTILE_PER_KIND: usize = 1000;
/// The server closes a stalled handshake after 5 s and a connection without a call
/// after 10 s (`rpc::Limits::PRODUCTION`); this allows for a loaded machine.
const CLOSE_BOUND: Duration = Duration::from_secs(20);

/// When a hostile connection was opened and when the server closed it.
struct Hostile {
    opened: Instant,
    closed: Option<Instant>,
}

/// Waits (bounded) until the server closes `stream`.
async fn until_closed<S: tokio::io::AsyncRead + Unpin>(mut stream: S, opened: Instant) -> Hostile {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::from_std(opened + CLOSE_BOUND + Duration::from_secs(5));
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return Hostile {
                    opened,
                    closed: Some(Instant::now()),
                };
            }
            Ok(Ok(_)) => continue,
            Err(_) => {
                return Hostile {
                    opened,
                    closed: None,
                };
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn owner_calls_succeed_under_2000_hostile_connections_which_get_closed() -> Result<()> {
    raise_own_open_files_limit(2 * HOSTILE_PER_KIND as u64 + 512)?;
    let dir = tempfile::tempdir()?;
    let (node, endpoint) = tokio::task::block_in_place(|| -> Result<_> {
        let node = Node::bootstrapped(dir.path())?;
        ctl_ok(&node, &["takeownership", "--accept-ca"])?;
        let endpoint = SocketAddr::new(node.address, rpc::CURATOR_PORT);
        Ok((node, endpoint))
    })?;
    let mut node = node;
    let config = dir.path().join("config");
    let owner = rpc::Credentials {
        certificate: pem_der(&config.join("owner.pem"))?,
        key_pkcs8: pem_der(&config.join("owner-key.pem"))?,
    };
    let trust = rpc::ServerTrust::PinnedCa(pem_der(&config.join("ca.pem"))?);
    let owner_call = || async {
        let started = Instant::now();
        let channel = rpc::connect(endpoint, &trust, Some(&owner)).await?;
        let nodes = api::management_client::ManagementClient::new(channel)
            .list_nodes(api::ListNodesRequest::default())
            .await?
            .into_inner();
        anyhow::ensure!(nodes.nodes.len() == 1, "{nodes:?}");
        Ok::<_, anyhow::Error>(started.elapsed())
    };
    let baseline = owner_call().await?;

    // Each from one of 100 addresses: 20 per address stay within the per-source cap
    // (32), so the timeouts, not evictions, close them.
    let sources: Vec<std::net::IpAddr> = (0..100).map(|_| e2e::unique_loopback()).collect();
    let from = |i: usize| {
        let source = sources[i % sources.len()];
        async move {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(source, 0))?;
            socket.connect(endpoint).await
        }
    };
    // Half: TLS completed, then silence (no HTTP/2 preface). Opened with bounded
    // concurrency so the client side does not become the bottleneck.
    let tls = rpc::tls::client_config(&rpc::ServerTrust::FirstUse, None)?;
    let connector = tokio_rustls::TlsConnector::from(tls);
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = Vec::with_capacity(2 * HOSTILE_PER_KIND);
    let (opened_tx, mut opened_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    for i in 0..HOSTILE_PER_KIND {
        let (connector, gate, opened_tx) = (connector.clone(), gate.clone(), opened_tx.clone());
        let tcp = from(i);
        tasks.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await.expect("gate open");
            let name = rustls::pki_types::ServerName::IpAddress(endpoint.ip().into());
            let connect = async { connector.connect(name, tcp.await?).await };
            let stream = tokio::time::timeout(Duration::from_secs(10), connect)
                .await
                .context("TLS connect timed out")??;
            let opened = Instant::now();
            drop(permit);
            let _ = opened_tx.send(());
            Ok::<_, anyhow::Error>(until_closed(stream, opened).await)
        }));
    }
    for _ in 0..HOSTILE_PER_KIND {
        opened_rx.recv().await.context("a TLS connection failed")?;
    }
    // The other half: TCP only, never a ClientHello (a stalled handshake).
    for i in 0..HOSTILE_PER_KIND {
        let stream = tokio::time::timeout(Duration::from_secs(5), from(HOSTILE_PER_KIND + i))
            .await
            .context("TCP connect timed out")??;
        let opened = Instant::now();
        tasks.push(tokio::spawn(async move {
            Ok::<_, anyhow::Error>(until_closed(stream, opened).await)
        }));
    }

    let call_started = Instant::now();
    let under_load = tokio::time::timeout(Duration::from_secs(1), owner_call())
        .await
        .context("the owner call did not finish within 1 s under load")??;
    let call_done = Instant::now();

    let mut open_during_call = 0;
    let mut slowest_close = Duration::ZERO;
    for task in tasks {
        let hostile = task.await??;
        let closed = hostile
            .closed
            .context("a hostile connection was never closed by the server")?;
        slowest_close = slowest_close.max(closed - hostile.opened);
        if hostile.opened <= call_started && closed >= call_done {
            open_during_call += 1;
        }
    }
    eprintln!(
        "owner call: {baseline:?} idle, {under_load:?} under load; \
         {open_during_call} hostile connections open during it; slowest close {slowest_close:?}"
    );
    assert!(
        open_during_call >= 2 * HOSTILE_PER_KIND * 9 / 10,
        "only {open_during_call} hostile connections were open during the owner call"
    );
    assert!(slowest_close <= CLOSE_BOUND, "{slowest_close:?}");
    let log = node.proc().output();
    assert!(!log.contains("Too many open files"), "{log}");
    let refused = log.lines().any(|l| {
        l.contains("to make room") || (l.contains("refused") && l.contains("connections:"))
    });
    assert!(!refused, "the caps refused or evicted connections: {log}");
    // The node raised its own open-files limit to the hard limit.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", node.proc().pid()))?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("open files line")?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3], fields[4], "{line}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_election_holds_the_lease_ttl_etcd_granted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // With a 100 ms heartbeat and a 1 s election timeout etcd's shortest lease is 2 s
    // (1.5 election timeouts, rounded up to a second); a 1 s request is raised to it.
    let etcd = e2e::BareEtcd::spawn(
        dir.path(),
        e2e::unique_loopback(),
        consensus::RaftTiming {
            heartbeat: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
        },
    )?;
    let ns = consensus::Namespaced::new(etcd.ready_client(TIMEOUT).await?, "curator");
    let role = event::Value::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    let config = curator::election::ElectionConfig {
        node_id: "polis-test".into(),
        endpoint: "127.0.0.1:7835".into(),
        ttl: Duration::from_secs(1),
    };
    let election = {
        let (ns, role, cancel) = (ns.clone(), role.clone(), cancel.clone());
        tokio::spawn(
            async move { curator::election::run(&ns, &config, &role, &cancel, || {}).await },
        )
    };
    let deadline = Instant::now() + TIMEOUT;
    let leadership = loop {
        if let Some(curator::election::Role::Leader(l)) = role.current() {
            break l;
        }
        anyhow::ensure!(Instant::now() < deadline, "never elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(leadership.ttl, Duration::from_secs(2));
    // Kept alive on the granted TTL's schedule: still the leader well past the 1 s asked.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(matches!(
        role.current(),
        Some(curator::election::Role::Leader(_))
    ));
    cancel.cancel();
    election.await??;
    Ok(())
}
