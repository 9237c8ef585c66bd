//! A cluster under test: bootstrap the first node and take ownership, add nodes
//! (register parameters, approve), polisctl with the owner's config, an owner client,
//! one label write through it ([`write_label`]), and polls of what the cluster reports
//! (node list, consensus members).
//!
//! The top of the harness: uses nodes, the polisctl wrapper and waits.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use proto::api;

use crate::ctl::polisctl;
use crate::node::Node;
use crate::wait::TIMEOUT;

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
        let first_dir = dir.join("n0");
        std::fs::create_dir_all(&first_dir)?;
        let mut first = Node::new(&first_dir);
        first.extra_args = node_args.iter().map(|a| a.to_string()).collect();
        Cluster::bootstrap_from(dir, first, params_extra)
    }

    /// [`Cluster::bootstrap_with`] from a prepared first node in `dir/n0` (its address,
    /// namespace and flags set by the caller; every node of the cluster gets its flags).
    pub fn bootstrap_from(dir: &Path, mut first: Node, params_extra: &[&str]) -> Result<Cluster> {
        let first_dir = dir.join("n0");
        let node_args = first.extra_args.clone();
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

    /// After a recover: node `id`, asked through `endpoint`, still shows the label value
    /// `label` (what was written before the majority was lost), and a new label write
    /// (`recovered=yes`) is served.
    pub fn label_survived_recover(&self, endpoint: &str, id: &str, label: &str) -> Result<()> {
        let out = self.ctl_retry(&["--endpoints", endpoint, "node", "describe", id])?;
        anyhow::ensure!(
            out.contains(label),
            "the label is gone after recover:\n{out}"
        );
        self.ctl_retry(&[
            "--endpoints",
            endpoint,
            "node",
            "label",
            id,
            "recovered=yes",
        ])?;
        Ok(())
    }

    /// Three consensus members on encrypted images (`--data-device`, `imgs[0..3]`): the
    /// first bootstrapped on its image in `dir/n0`, then `m1` and `m2` registered on theirs
    /// and given the role; returns once the first one's own half left its ESP (another
    /// member keeps it): the cluster, and the other two members with their IDs.
    pub fn encrypted_members(
        dir: &Path,
        imgs: &[String],
    ) -> Result<(Cluster, Vec<(Node, String)>)> {
        let first_dir = dir.join("n0");
        std::fs::create_dir_all(&first_dir)?;
        let mut first = Node::new(&first_dir);
        let params = first.bootstrap_params()?;
        let params = params.to_str().context("utf-8 path")?;
        first.start(&["--params", params, "--data-device", &imgs[0]])?;
        first.wait_home()?;
        let cluster = Cluster {
            dir: dir.to_path_buf(),
            config: first_dir.join("config"),
            first,
            node_args: vec![],
        };
        let endpoint = cluster.first.address.to_string();
        cluster.ctl_retry(&["--endpoints", &endpoint, "takeownership", "--accept-ca"])?;
        let mut others = Vec::new();
        for (name, img) in [("m1", &imgs[1]), ("m2", &imgs[2])] {
            let params = cluster.register_params(name)?;
            others.push(cluster.add_worker_with(name, &params, &["--data-device", img])?);
        }
        for (_, id) in &others {
            cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
        }
        let all = [&cluster.first, &others[0].0, &others[1].0];
        cluster.wait_members(&endpoints(&all), 3, 0)?;
        let own_half = cluster.first.root.join("esp/data-cluster-half");
        crate::wait::wait_until(
            "the first node's half is kept by another member",
            TIMEOUT,
            || !own_half.exists(),
        )?;
        Ok((cluster, others))
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

/// One label write, `key=value` on node `id`, through `client` (it follows the leader).
pub async fn write_label(
    client: &rpc::CuratorClient,
    id: &str,
    key: &str,
    value: &str,
) -> Result<(), rpc::CallError> {
    write_labels(client, id, [(key.to_string(), value.to_string())].into()).await
}

/// One write of several labels (`upsert`) on node `id`, through `client`.
pub async fn write_labels(
    client: &rpc::CuratorClient,
    id: &str,
    upsert: std::collections::HashMap<String, String>,
) -> Result<(), rpc::CallError> {
    let request = api::UpdateNodeLabelsRequest {
        id: id.to_string(),
        upsert,
        delete: vec![],
    };
    client
        .call(|channel| {
            let request = request.clone();
            async move {
                api::management_client::ManagementClient::new(channel)
                    .update_node_labels(request)
                    .await
            }
        })
        .await
        .map(drop)
}

impl Cluster {
    /// A leader-following client with the owner's credentials from the config directory.
    pub fn owner_client(&self) -> Result<rpc::CuratorClient> {
        self.owner_client_to(&[self.first.address])
    }

    /// [`Cluster::owner_client`] that knows the curators at `addresses` (it goes on to
    /// the next when one does not answer).
    pub fn owner_client_to(&self, addresses: &[std::net::IpAddr]) -> Result<rpc::CuratorClient> {
        let read_pem = |name: &str| -> Result<Vec<u8>> {
            let text = std::fs::read_to_string(self.config.join(name))
                .with_context(|| format!("reading {name}"))?;
            Ok(pem::parse(text)?.into_contents())
        };
        let key = identity::NodeKey::from_pkcs8(&read_pem("owner-key.pem")?)?;
        Ok(rpc::CuratorClient::new(
            addresses
                .iter()
                .map(|a| std::net::SocketAddr::new(*a, rpc::CURATOR_PORT))
                .collect(),
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
        self.add_worker_with(name, params, &[])
    }

    /// [`Cluster::add_worker`] with `extra` polis-node flags (e.g. `--data-device IMG`).
    pub fn add_worker_with(
        &self,
        name: &str,
        params: &Path,
        extra: &[&str],
    ) -> Result<(Node, String)> {
        self.add_worker_running(name, params, None, extra)
    }

    /// [`Cluster::add_worker_with`] running `binary` instead of the workspace's
    /// polis-node (an older version, for upgrade tests), when given.
    pub fn add_worker_running(
        &self,
        name: &str,
        params: &Path,
        binary: Option<&Path>,
        extra: &[&str],
    ) -> Result<(Node, String)> {
        let mut node = self.new_node(name)?;
        node.binary = binary.map(Path::to_path_buf);
        let mut args = vec!["--params", params.to_str().context("utf-8 path")?];
        args.extend_from_slice(extra);
        node.start(&args)?;
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
