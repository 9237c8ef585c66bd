//! Launching real Polis processes for tests and benchmarks.
//!
//! Nothing here is a stand-in: [`Node`] runs the `polis-node` binary (which runs Debian's
//! etcd), [`BareEtcd`] runs etcd itself with the flags polis-node would use, and
//! [`polisctl`] runs the CLI. Binaries are found next to the test executable's target
//! directory, so `cargo build --workspace` must have built them.
//!
//! Invariants:
//! - Every process started here is killed when its guard is dropped, also when a test
//!   panics; polis-node's etcd dies with it (`PR_SET_PDEATHSIG`).
//! - Nodes listen only on unique 127.0.0.0/8 addresses ([`unique_loopback`]), so tests
//!   can run in parallel.
//! - Waiting is polling with a deadline; nothing sleeps and hopes.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Generous default for anything a test waits for.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Directory holding the workspace's binaries (target/debug or target/release).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe works on Linux");
    let mut dir = exe
        .parent()
        .expect("executables live in a directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of a workspace binary, with a hint when it has not been built.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing; run `cargo build --workspace` first",
        path.display()
    );
    path
}

/// A fresh 127.x.y.z address whose etcd peer and curator ports are free.
pub fn unique_loopback() -> IpAddr {
    loop {
        let mut bytes = [0u8; 3];
        getrandom(&mut bytes);
        let addr = Ipv4Addr::new(127, bytes[0].max(1), bytes[1], bytes[2].clamp(2, 254));
        let ip = IpAddr::V4(addr);
        // The ports polis-node listens on: etcd peers and the curator.
        let free = |port: u16| std::net::TcpListener::bind((ip, port)).is_ok();
        if free(consensus::config::PEER_PORT) && free(7835) {
            return ip;
        }
    }
}

fn getrandom(buf: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .expect("reading /dev/urandom");
}

/// Lines a process wrote to stderr/stdout, shared with a reader thread.
#[derive(Default)]
struct Output {
    lines: Mutex<Vec<String>>,
    changed: Condvar,
}

/// A child process that is killed (SIGKILL) when dropped.
pub struct Proc {
    pub child: Child,
    output: Arc<Output>,
    pub started: Instant,
    name: String,
}

impl Proc {
    /// Spawns `cmd`, capturing stderr and stdout line by line (also into `log`).
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("spawning {name}"))?;
        let output = Arc::new(Output::default());
        let log_file = Arc::new(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .with_context(|| format!("opening {}", log.display()))?,
        ));
        let pipes: Vec<Box<dyn std::io::Read + Send>> = vec![
            Box::new(child.stderr.take().expect("piped")),
            Box::new(child.stdout.take().expect("piped")),
        ];
        for pipe in pipes {
            let output = output.clone();
            let log_file = log_file.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    use std::io::Write;
                    let _ = writeln!(log_file.lock().expect("log lock"), "{line}");
                    output.lines.lock().expect("output lock").push(line);
                    output.changed.notify_all();
                }
            });
        }
        Ok(Proc {
            child,
            output,
            started,
            name: name.to_string(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// All output so far.
    pub fn output(&self) -> String {
        self.output.lines.lock().expect("output lock").join("\n")
    }

    /// Waits for an output line matching `pred`; fails if the process exits first.
    pub fn wait_for_line(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            {
                let lines = self.output.lines.lock().expect("output lock");
                if let Some(l) = lines[seen..].iter().find(|l| pred(l)) {
                    return Ok(l.clone());
                }
                seen = lines.len();
                let _ = self
                    .output
                    .changed
                    .wait_timeout(lines, Duration::from_millis(20))
                    .expect("output lock");
            }
            if let Some(status) = self.child.try_wait()? {
                // Give the reader threads a moment to drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                let lines = self.output.lines.lock().expect("output lock");
                if let Some(l) = lines.iter().find(|l| pred(l)) {
                    return Ok(l.clone());
                }
                bail!(
                    "{} exited ({status}) before the awaited line; output:\n{}",
                    self.name,
                    lines.join("\n")
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {timeout:?} waiting for a line from {}; output:\n{}",
                    self.name,
                    self.output()
                );
            }
        }
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                // Let the reader threads see the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("{} did not exit within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Polls `cond` until it holds or `timeout` passes.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Runs `polisctl` with `args`, returning (status, stdout, stderr).
pub fn polisctl(args: &[&str]) -> Result<(ExitStatus, String, String)> {
    let out = Command::new(bin("polisctl"))
        .args(args)
        .output()
        .context("running polisctl")?;
    Ok((
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// One polis-node root, started and stopped at will.
pub struct Node {
    pub dir: PathBuf,
    pub root: PathBuf,
    pub address: IpAddr,
    pub proc: Option<Proc>,
    starts: usize,
    /// Extra flags for every start (e.g. faster raft timing).
    pub extra_args: Vec<String>,
}

impl Node {
    /// A node in `dir` (holding root/, config/ and logs) on a fresh loopback address.
    pub fn new(dir: &Path) -> Node {
        Node {
            dir: dir.to_path_buf(),
            root: dir.join("root"),
            address: unique_loopback(),
            proc: None,
            starts: 0,
            extra_args: Vec::new(),
        }
    }

    /// A node in `dir` that has bootstrapped a new cluster and reached Home.
    pub fn bootstrapped(dir: &Path) -> Result<Node> {
        let mut node = Node::new(dir);
        let params = node.bootstrap_params()?;
        node.start(&["--params", params.to_str().context("utf-8 path")?])?;
        node.wait_home()?;
        Ok(node)
    }

    /// Writes bootstrap parameters with a fresh owner key; returns the parameters path.
    pub fn bootstrap_params(&self) -> Result<PathBuf> {
        self.bootstrap_params_with(&[])
    }

    /// [`Node::bootstrap_params`] with extra `polisctl params bootstrap` flags (e.g.
    /// certificate lifetimes).
    pub fn bootstrap_params_with(&self, extra: &[&str]) -> Result<PathBuf> {
        let params = self.dir.join("params.pb");
        let config = self.dir.join("config");
        let mut args = vec![
            "--config",
            config.to_str().context("utf-8 path")?,
            "params",
            "bootstrap",
            "--out",
            params.to_str().context("utf-8 path")?,
        ];
        args.extend_from_slice(extra);
        let (status, _, stderr) = polisctl(&args)?;
        if !status.success() {
            bail!("polisctl params bootstrap failed: {stderr}");
        }
        Ok(params)
    }

    /// The command line that starts this node.
    pub fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = Command::new(bin("polis-node"));
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--address")
            .arg(self.address.to_string())
            .arg("--log-format=json")
            .args(&self.extra_args)
            .args(extra);
        cmd
    }

    /// Starts polis-node (logging to `dir/node-N.log`).
    pub fn start(&mut self, extra: &[&str]) -> Result<&mut Proc> {
        self.start_with_env(extra, &[])
    }

    /// Starts polis-node with extra environment variables.
    pub fn start_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) -> Result<&mut Proc> {
        self.starts += 1;
        let log = self.dir.join(format!("node-{}.log", self.starts));
        let mut command = self.command(extra);
        command.envs(env.iter().copied());
        let proc = self.proc.insert(Proc::spawn("polis-node", command, &log)?);
        if env.iter().any(|(k, _)| *k == "POLIS_CRASH_AFTER") {
            // A binary without crash points refuses the variable; say why here rather
            // than let a test wait for a crash that never comes.
            proc.wait_for_line(TIMEOUT, |l| l.contains("crash point armed"))
                .context(
                    "polis-node did not arm its crash point: build the workspace with \
                     `--features node/crash-points` (scripts/test does)",
                )?;
        }
        Ok(proc)
    }

    pub fn proc(&mut self) -> &mut Proc {
        self.proc.as_mut().expect("node is started")
    }

    /// Waits until the node logs that its cluster state is Home.
    pub fn wait_home(&mut self) -> Result<()> {
        self.proc()
            .wait_for_line(TIMEOUT, is_home_line)
            .map(drop)
            .context("waiting for cluster state Home")
    }

    /// Path of the etcd client socket.
    pub fn socket(&self) -> PathBuf {
        self.root
            .join("ephemeral/consensus")
            .join(consensus::config::CLIENT_SOCKET_NAME)
    }

    /// Runs etcdctl against the node's socket.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=unix://{}", self.socket().display()))
            .arg("--command-timeout=10s")
            .args(args)
            .output()
            .context("running etcdctl")?;
        if !out.status.success() {
            bail!(
                "etcdctl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The raw value of `key`, read through the node's socket (binary-safe).
    pub fn etcd_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        use base64::Engine as _;
        let json: serde_json::Value =
            serde_json::from_str(&self.etcdctl(&["get", key, "-w", "json"])?)?;
        match json["kvs"].get(0) {
            None => Ok(None),
            Some(kv) => {
                let value = kv["value"].as_str().unwrap_or_default();
                Ok(Some(
                    base64::engine::general_purpose::STANDARD.decode(value)?,
                ))
            }
        }
    }

    /// (cluster ID, member ID) as etcd reports them.
    pub fn etcd_ids(&self) -> Result<(u64, u64)> {
        let json: serde_json::Value =
            serde_json::from_str(&self.etcdctl(&["endpoint", "status", "-w", "json"])?)?;
        let header = &json[0]["Status"]["header"];
        Ok((
            header["cluster_id"].as_u64().context("cluster_id")?,
            header["member_id"].as_u64().context("member_id")?,
        ))
    }

    /// The pid of the newest etcd child, from polis-node's log.
    pub fn etcd_pid(&mut self) -> Result<i32> {
        self.proc()
            .wait_for_line(TIMEOUT, |l| l.contains("started etcd"))?;
        let output = self.proc().output();
        let line = output
            .lines()
            .rev()
            .find(|l| l.contains("started etcd"))
            .context("a started etcd line")?;
        let json: serde_json::Value = serde_json::from_str(line)?;
        Ok(json["fields"]["pid"].as_i64().context("pid field")? as i32)
    }
}

/// A JSON log line announcing cluster state Home.
pub fn is_home_line(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .is_ok_and(|v| v["fields"]["cluster_state"] == "Home")
}

/// etcd started directly, with the flags polis-node gives it (for baselines and for
/// testing etcd-backed libraries).
pub struct BareEtcd {
    pub proc: Proc,
    pub config: consensus::EtcdConfig,
}

impl BareEtcd {
    /// Writes peer TLS files into `dir` and spawns etcd (does not wait for readiness).
    pub fn spawn(dir: &Path, address: IpAddr, timing: consensus::RaftTiming) -> Result<BareEtcd> {
        let key = identity::NodeKey::generate()?;
        let name = key.node_id();
        let ca = pki::Ca::generate("bare etcd CA", pki::CA_LIFETIME)?;
        let cert = ca.issue(
            &pki::Template {
                common_name: name.clone(),
                dns_names: vec![name.clone()],
                ip_addresses: vec![address, IpAddr::V4(Ipv4Addr::LOCALHOST)],
                usage: pki::Usage::ServerAndClient,
                lifetime: pki::CERTIFICATE_LIFETIME,
                kind: pki::CertificateKind::EtcdPeer,
            },
            &key.public_key(),
        )?;
        let peer = dir.join("peer");
        std::fs::create_dir_all(&peer)?;
        let pem = |tag: &str, der: &[u8]| pem::encode(&pem::Pem::new(tag, der));
        std::fs::write(peer.join("key.pem"), pem("PRIVATE KEY", key.pkcs8_der()))?;
        std::fs::write(peer.join("cert.pem"), pem("CERTIFICATE", &cert.der))?;
        std::fs::write(peer.join("ca.pem"), pem("CERTIFICATE", &ca.cert_der))?;
        std::fs::write(peer.join("crl.pem"), pem("X509 CRL", &ca.crl(&[], 1)?))?;
        let run_dir = dir.join("run");
        std::fs::create_dir_all(&run_dir)?;
        let config = consensus::EtcdConfig {
            binary: consensus::config::DEFAULT_ETCD_BINARY.into(),
            name: name.clone(),
            data_dir: dir.join("data"),
            run_dir: run_dir.clone(),
            peer_address: address,
            peer_port: consensus::config::PEER_PORT,
            peer_tls: consensus::PeerTlsFiles {
                cert: peer.join("cert.pem"),
                key: peer.join("key.pem"),
                ca: peer.join("ca.pem"),
                crl: peer.join("crl.pem"),
            },
            initial_cluster: vec![(
                name,
                consensus::config::peer_url(address, consensus::config::PEER_PORT),
            )],
            initial_cluster_state: consensus::InitialClusterState::New,
            cluster_token: "bare".into(),
            timing,
            readiness: consensus::Readiness::Linearizable,
        };
        let mut cmd = Command::new(&config.binary);
        cmd.args(config.args()).current_dir(&run_dir);
        let proc = Proc::spawn("etcd", cmd, &dir.join("etcd.log"))?;
        Ok(BareEtcd { proc, config })
    }

    /// Connects to the socket once it exists (retrying until `timeout`).
    pub async fn client(&self, timeout: Duration) -> Result<etcd_client::Client> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.config.socket_path().exists()
                && let Ok(c) = consensus::connect_unix(&self.config.socket_path()).await
            {
                return Ok(c);
            }
            if Instant::now() > deadline {
                bail!("etcd socket did not come up within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A client once etcd serves linearizable requests.
    pub async fn ready_client(&self, timeout: Duration) -> Result<etcd_client::Client> {
        let deadline = Instant::now() + timeout;
        let mut client = self.client(timeout).await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(2), client.get("probe", None)).await {
                Ok(Ok(_)) => return Ok(client),
                _ if Instant::now() > deadline => bail!("etcd not ready within {timeout:?}"),
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

/// A network namespace created for one test, deleted on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// Creates a namespace holding a veth pair, one end with `address`/32.
    pub fn with_address(address: &str) -> Result<NetNs> {
        let mut suffix = [0u8; 4];
        getrandom(&mut suffix);
        let ns = NetNs {
            name: format!("polis-e2e-{}", u32::from_le_bytes(suffix)),
        };
        let run = |args: &[&str]| -> Result<()> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .context("running ip (iproute2)")?;
            if !out.status.success() {
                bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        run(&["netns", "add", &ns.name])?;
        run(&[
            "-n", &ns.name, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
        ])?;
        run(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{address}/32"),
            "dev",
            "v0",
        ])?;
        run(&["-n", &ns.name, "link", "set", "v0", "up"])?;
        Ok(ns)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The median of benchmark samples.
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

/// A cluster under test: a bootstrapped first node, an owner config directory that took
/// ownership (and remembers the endpoints), and further nodes that register into it.
pub struct Cluster {
    pub dir: PathBuf,
    pub config: PathBuf,
    pub first: Node,
    /// Extra polis-node flags of every node of this cluster (e.g. heartbeat timing).
    pub node_args: Vec<String>,
}

impl Cluster {
    /// Bootstraps a first node in `dir/n0` and takes ownership with `dir/config`.
    pub fn bootstrap(dir: &Path) -> Result<Cluster> {
        Cluster::bootstrap_with(dir, &[], &[])
    }

    /// [`Cluster::bootstrap`] with extra `polisctl params bootstrap` flags
    /// (`params_extra`), every node (this one and those from [`Cluster::new_node`])
    /// started with the extra flags `node_args`.
    pub fn bootstrap_with(
        dir: &Path,
        params_extra: &[&str],
        node_args: &[&str],
    ) -> Result<Cluster> {
        let node_args: Vec<String> = node_args.iter().map(|a| a.to_string()).collect();
        let first_dir = dir.join("n0");
        std::fs::create_dir_all(&first_dir)?;
        let mut first = Node::new(&first_dir);
        first.extra_args = node_args.clone();
        let params = first.bootstrap_params_with(params_extra)?;
        first.start(&["--params", params.to_str().context("utf-8 path")?])?;
        first.wait_home()?;
        let cluster = Cluster {
            dir: dir.to_path_buf(),
            // bootstrap_params created the owner key here.
            config: first_dir.join("config"),
            first,
            node_args,
        };
        let endpoint = cluster.first.address.to_string();
        cluster.ctl_retry(&["--endpoints", &endpoint, "takeownership", "--accept-ca"])?;
        Ok(cluster)
    }

    /// Runs polisctl with this cluster's config: (success, stdout, stderr).
    pub fn ctl(&self, args: &[&str]) -> Result<(bool, String, String)> {
        let mut all = vec!["--config", self.config.to_str().context("utf-8 path")?];
        all.extend_from_slice(args);
        let (status, out, err) = polisctl(&all)?;
        Ok((status.success(), out, err))
    }

    /// polisctl until it succeeds, while the failure is one a retry can fix (a curator
    /// still electing itself or restarting).
    pub fn ctl_retry(&self, args: &[&str]) -> Result<String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let (ok, out, err) = self.ctl(args)?;
            if ok {
                return Ok(out);
            }
            let transient = err.contains("unavailable") || err.contains("reach");
            if !transient || Instant::now() > deadline {
                bail!("polisctl {args:?} failed: {err}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes register parameters to `dir/NAME.params` and returns the path.
    pub fn register_params(&self, name: &str) -> Result<PathBuf> {
        let path = self.dir.join(format!("{name}.params"));
        self.ctl_retry(&[
            "params",
            "register",
            "--out",
            path.to_str().context("utf-8 path")?,
        ])?;
        Ok(path)
    }

    /// A node in `dir/NAME` (not started).
    pub fn new_node(&self, name: &str) -> Result<Node> {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let mut node = Node::new(&dir);
        node.extra_args = self.node_args.clone();
        Ok(node)
    }

    /// `node list -o json`.
    pub fn nodes(&self) -> Result<Vec<serde_json::Value>> {
        let out = self.ctl_retry(&["node", "list", "-o", "json"])?;
        let value: serde_json::Value = serde_json::from_str(&out)?;
        Ok(value.as_array().cloned().unwrap_or_default())
    }

    /// The listed node `id`, if any.
    pub fn node(&self, id: &str) -> Result<Option<serde_json::Value>> {
        Ok(self.nodes()?.into_iter().find(|n| n["id"] == id))
    }

    /// Waits until node `id` is listed with `state` (and `health`, when given).
    pub fn wait_node(&self, id: &str, state: &str, health: Option<&str>) -> Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let node = self.node(id)?;
            if let Some(n) = &node
                && n["state"] == state
                && health.is_none_or(|h| n["health"] == h)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("node {id} never became {state} {health:?}; last seen: {node:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Node {
    /// The node ID of the key in this node's root.
    pub fn key_node_id(&self) -> Result<String> {
        let der =
            std::fs::read(self.root.join("data/node/key.der")).context("reading the node key")?;
        Ok(identity::NodeKey::from_pkcs8(&der)?.node_id())
    }

    /// Waits until this node's curator serves (a consensus member's control plane is up).
    pub fn wait_for_curator(&mut self) -> Result<()> {
        self.proc()
            .wait_for_line(TIMEOUT, |l| l.contains("curator serving"))
            .map(drop)
            .context("waiting for the curator to serve")
    }

    /// Waits until the node logs cluster state `state`.
    pub fn wait_state(&mut self, state: &str) -> Result<()> {
        self.proc()
            .wait_for_line(TIMEOUT, |l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .is_ok_and(|v| v["fields"]["cluster_state"] == state)
            })
            .map(drop)
            .with_context(|| format!("waiting for cluster state {state}"))
    }
}

impl Cluster {
    /// A leader-following client with the owner's credentials from the config directory.
    pub fn owner_client(&self) -> Result<rpc::CuratorClient> {
        let read_pem = |name: &str| -> Result<Vec<u8>> {
            let text = std::fs::read_to_string(self.config.join(name))
                .with_context(|| format!("reading {name}"))?;
            Ok(pem::parse(text)?.into_contents())
        };
        let key = identity::NodeKey::from_pkcs8(&read_pem("owner-key.pem")?)?;
        Ok(rpc::CuratorClient::new(
            vec![std::net::SocketAddr::new(
                self.first.address,
                rpc::CURATOR_PORT,
            )],
            rpc::ServerTrust::PinnedCa(read_pem("ca.pem")?),
            Some(rpc::Credentials {
                certificate: read_pem("owner.pem")?,
                key_pkcs8: key.pkcs8_der().to_vec(),
            }),
        )?)
    }
}

impl Cluster {
    /// Registers a worker in `dir/NAME` with `params`, approves it and waits until it is
    /// UP; returns the running node and its ID.
    pub fn add_worker(&self, name: &str, params: &Path) -> Result<(Node, String)> {
        let mut node = self.new_node(name)?;
        node.start(&["--params", params.to_str().context("utf-8 path")?])?;
        node.wait_state("Foreign")?;
        let id = node.key_node_id()?;
        self.ctl_retry(&["node", "approve", &id])?;
        node.wait_home()?;
        self.wait_node(&id, "UP", None)?;
        Ok((node, id))
    }

    /// `cluster status -o json` (also when it exits 1 for lack of quorum).
    pub fn status(&self, endpoints: &str) -> Result<(bool, serde_json::Value)> {
        let (ok, out, err) =
            self.ctl(&["--endpoints", endpoints, "cluster", "status", "-o", "json"])?;
        let value = serde_json::from_str(&out)
            .with_context(|| format!("cluster status printed no JSON: {out} {err}"))?;
        Ok((ok, value))
    }

    /// Waits until `cluster status` shows a quorum and exactly `voters` voters and
    /// `learners` learners, all answering.
    pub fn wait_members(
        &self,
        endpoints: &str,
        voters: usize,
        learners: usize,
    ) -> Result<serde_json::Value> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let (ok, status) = self.status(endpoints)?;
            let members = status["members"].as_array().cloned().unwrap_or_default();
            let count = |role: &str| members.iter().filter(|m| m["role"] == role).count();
            let answering = members.iter().all(|m| m["answered"] == true);
            if ok && count("voter") == voters && count("learner") == learners && answering {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("never saw {voters} voters and {learners} learners; last: {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The nodes' addresses as polisctl's `--endpoints` takes them (comma-separated).
pub fn endpoints(nodes: &[&Node]) -> String {
    nodes
        .iter()
        .map(|n| n.address.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The DER inside a PEM file.
pub fn pem_der(path: &Path) -> Result<Vec<u8>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    Ok(pem::parse(text)?.into_contents())
}

/// An HTTP request to an etcd peer port with the given peer certificate: true when etcd
/// answers, false when it drops the connection (refused certificate).
pub async fn peer_accepts(
    peer: SocketAddr,
    ca_pem: &Path,
    cert_pem: &Path,
    key_pem: &Path,
) -> Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from(pem_der(ca_pem)?))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(
        vec![rustls::pki_types::CertificateDer::from(pem_der(cert_pem)?)],
        rustls::pki_types::PrivateKeyDer::Pkcs8(pem_der(key_pem)?.into()),
    )?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(peer).await?;
    let name = rustls::pki_types::ServerName::IpAddress(peer.ip().into());
    let exchange = async {
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(b"GET /version HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Ok(Ok(answer)) => Ok(answer.starts_with(b"HTTP/1.1 200")),
        Ok(Err(_)) => Ok(false),
        Err(_) => bail!("the etcd peer at {peer} neither answered nor closed"),
    }
}
