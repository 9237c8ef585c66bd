//! One polis-node: its directories, bootstrap parameters, starting it, reading its
//! log for progress (Home, curator serving, cluster state), and its etcd.
//!
//! Uses processes, the polisctl wrapper and waits; may not know about a cluster of
//! nodes (that is `crate::cluster`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::ctl::polisctl;
use crate::net::unique_loopback;
use crate::process::{Proc, bin};
use crate::wait::TIMEOUT;

/// One polis-node root, started and stopped at will.
pub struct Node {
    pub dir: PathBuf,
    pub root: PathBuf,
    pub address: IpAddr,
    pub proc: Option<Proc>,
    starts: usize,
    /// Extra flags for every start (e.g. faster raft timing).
    pub extra_args: Vec<String>,
    /// The network namespace the node runs in (`ip netns exec`; see `crate::partition`),
    /// or None for the test's own.
    pub netns: Option<String>,
    /// Started under `prlimit --nofile=N:N` (soft and hard open-files limit N), or None
    /// for the test's own limits.
    pub open_files: Option<u64>,
    /// The polis-node binary to run instead of the workspace's (an older version, for
    /// upgrade tests).
    pub binary: Option<PathBuf>,
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
            netns: None,
            open_files: None,
            binary: None,
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
        // `ip netns exec` and `prlimit` exec what follows: the pid stays the node's.
        let mut launcher: Vec<std::ffi::OsString> = Vec::new();
        if let Some(netns) = &self.netns {
            launcher.extend(["ip", "netns", "exec", netns].map(Into::into));
        }
        if let Some(n) = self.open_files {
            launcher.extend(["prlimit".into(), format!("--nofile={n}:{n}").into()]);
        }
        launcher.push(
            self.binary
                .clone()
                .unwrap_or_else(|| bin("polis-node"))
                .into(),
        );
        let mut cmd = Command::new(&launcher[0]);
        cmd.args(&launcher[1..]);
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

    /// Stops the running node with SIGTERM and requires a clean exit (status 0).
    pub fn stop_cleanly(&mut self) -> Result<()> {
        let proc = self.proc();
        proc.signal(libc::SIGTERM);
        let status = proc.wait_exit(TIMEOUT)?;
        anyhow::ensure!(status.success(), "polis-node exited with {status}");
        // A runnable that ignored its cancellation: the node stopped without it, and
        // named it (polis-node's bounded shutdown); a stop that is not clean.
        let output = proc.output();
        if let Some(stuck) = output
            .lines()
            .find(|l| l.contains("after the shutdown began: stopping without them"))
        {
            anyhow::bail!(
                "polis-node stopped without a runnable that ignored its cancellation: {stuck}"
            );
        }
        Ok(())
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

    /// How many KV calls (Range, Put, DeleteRange, Txn, Compact) the node's etcd member
    /// has started since it started, from its own metrics (`grpc_server_started_total`
    /// of service `etcdserverpb.KV`, read over its metrics socket).
    pub fn etcd_kv_calls(&self) -> Result<u64> {
        etcd_kv_calls_at(&self.root)
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

    /// The etcd member ID node `id`'s record holds (0: none), read through this node's
    /// etcd.
    pub fn recorded_member_id(&self, id: &str) -> Result<u64> {
        use prost::Message as _;
        let bytes = self
            .etcd_get(&format!("namespaced:curator/nodes/{id}"))?
            .with_context(|| format!("no record of node {id}"))?;
        let record = proto::state::Node::decode(bytes.as_slice())?;
        Ok(record
            .roles
            .and_then(|r| r.consensus_member)
            .map_or(0, |c| c.member_id))
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

/// The register parameters in a node parameters file (`polisctl params register`).
pub fn read_register_params(path: &Path) -> Result<proto::config::ClusterRegister> {
    use prost::Message;
    let params = proto::config::NodeParameters::decode(std::fs::read(path)?.as_slice())?;
    match params.cluster {
        Some(proto::config::node_parameters::Cluster::Register(r)) => Ok(r),
        other => bail!("not register parameters: {other:?}"),
    }
}

impl Node {
    /// The address of the node whose curator leads, as this node's curator tells it
    /// (CuratorLocal.GetCurrentLeader, answered by any curator).
    pub fn curator_leader_address(&self) -> Result<IpAddr> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let answer = runtime.block_on(async {
            let channel = rpc::connect(
                std::net::SocketAddr::new(self.address, rpc::CURATOR_PORT),
                &rpc::ServerTrust::FirstUse,
                None,
            )
            .await?;
            anyhow::Ok(
                proto::api::curator_local_client::CuratorLocalClient::new(channel)
                    .get_current_leader(proto::api::GetCurrentLeaderRequest {})
                    .await?
                    .into_inner(),
            )
        })?;
        Ok(answer.leader_endpoint.parse::<std::net::SocketAddr>()?.ip())
    }
}

/// [`Node::etcd_kv_calls`] of the node whose root is `root`.
pub fn etcd_kv_calls_at(root: &Path) -> Result<u64> {
    use std::io::{Read, Write};
    let socket = root
        .join("ephemeral/consensus")
        .join(consensus::selfreport::METRICS_SOCKET_NAME);
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .with_context(|| format!("reading metrics from {}", socket.display()))?;
    Ok(kv_calls_in(&text))
}

/// The KV calls counted in an etcd member's Prometheus text (see `Node::etcd_kv_calls`).
pub fn kv_calls_in(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("grpc_server_started_total{")
                && l.contains("grpc_service=\"etcdserverpb.KV\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[cfg(test)]
mod kv_call_tests {
    #[test]
    fn kv_calls_are_summed_over_methods_of_the_kv_service_only() {
        let text = "# HELP x\n\
grpc_server_started_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 12\n\
grpc_server_started_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3\n\
grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 40\n\
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 12\n";
        assert_eq!(super::kv_calls_in(text), 15);
    }
}
