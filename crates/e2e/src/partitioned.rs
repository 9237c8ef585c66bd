//! A cluster whose nodes run in the namespaces of a [`Partition`]: three consensus
//! members (n0, m1, m2) and optionally one worker, the owner talking from the hub; the
//! curator leader, label writes through chosen members, and "back" (voter answering and
//! HEALTHY) after a heal — what `tests/partitions.rs` and `bench-partition` measure.
//!
//! The top of the harness, beside `cluster`: uses the cluster, nodes and the partition.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use proto::api;

use crate::cluster::Cluster;
use crate::node::Node;
use crate::partition::{HubGuard, Partition};
use crate::wait::TIMEOUT;

/// The member names, in slot order; `w` is the worker when there is one.
pub const MEMBERS: [&str; 3] = ["n0", "m1", "m2"];

/// Nodes in namespaces; the creating thread talks from the hub while this lives.
pub struct PartitionedCluster {
    pub cluster: Cluster,
    /// m1, m2, then the worker if any (n0 is `cluster.first`).
    pub others: Vec<Node>,
    /// Node IDs in slot order (n0, m1, m2, worker).
    pub ids: Vec<String>,
    /// The owner's clients, one per set of members it may call (see `write`).
    owners:
        std::sync::Mutex<std::collections::HashMap<Vec<usize>, std::sync::Arc<rpc::CuratorClient>>>,
    pub runtime: tokio::runtime::Runtime,
    // Dropped after the nodes above are killed: the thread leaves the hub, then the
    // namespaces go.
    hub: HubGuard,
    pub partition: Partition,
}

impl PartitionedCluster {
    /// Creates the namespaces (an error when they cannot be: no privileges), bootstraps
    /// n0, adds m1 and m2 as consensus members and, with `worker`, a worker `w`. Every
    /// node gets `node_args`.
    pub fn create(dir: &Path, worker: bool, node_args: &[&str]) -> Result<PartitionedCluster> {
        let mut names = MEMBERS.to_vec();
        if worker {
            names.push("w");
        }
        let partition = Partition::create(&names).context("creating network namespaces")?;
        let hub = partition.enter_hub()?;
        let place = |node: &mut Node, name: &str| -> Result<()> {
            let slot = partition.slot(name)?;
            node.address = slot.address;
            node.netns = Some(slot.netns.clone());
            Ok(())
        };
        std::fs::create_dir_all(dir.join("n0"))?;
        let mut first = Node::new(&dir.join("n0"));
        first.extra_args = node_args.iter().map(|a| a.to_string()).collect();
        place(&mut first, "n0")?;
        let cluster = Cluster::bootstrap_from(dir, first, &[])?;
        let params = cluster.register_params("join")?;
        let params = params.to_str().context("utf-8 path")?.to_string();
        let mut ids = vec![cluster.first.key_node_id()?];
        let mut others = Vec::new();
        for name in &names[1..] {
            let mut node = cluster.new_node(name)?;
            place(&mut node, name)?;
            node.start(&["--params", &params])?;
            node.wait_state("Foreign")?;
            let id = node.key_node_id()?;
            cluster.ctl_retry(&["node", "approve", &id])?;
            node.wait_home()?;
            cluster.wait_node(&id, "UP", None)?;
            if *name != "w" {
                cluster.ctl_retry(&["node", "add-role", &id, "ConsensusMember"])?;
                node.wait_for_curator()?;
            }
            ids.push(id);
            others.push(node);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let pc = PartitionedCluster {
            cluster,
            others,
            ids,
            owners: Default::default(),
            runtime,
            hub,
            partition,
        };
        pc.wait_back(TIMEOUT)?;
        Ok(pc)
    }

    /// The node in slot `i` (0: n0).
    pub fn node(&mut self, i: usize) -> &mut Node {
        match i {
            0 => &mut self.cluster.first,
            i => &mut self.others[i - 1],
        }
    }

    /// Address of the node in slot `i`.
    pub fn address(&self, i: usize) -> IpAddr {
        self.partition.slots[i].address
    }

    /// The members' addresses, comma-separated (polisctl's `--endpoints`).
    pub fn member_endpoints(&self) -> String {
        (0..MEMBERS.len())
            .map(|i| self.address(i).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The slot of the curator leader, as the first member in `ask` that answers says.
    pub fn leader(&self, ask: &[usize]) -> Result<usize> {
        let mut last = None;
        for &i in ask {
            let answer = self.runtime.block_on(async {
                let at = SocketAddr::new(self.address(i), rpc::CURATOR_PORT);
                let channel = tokio::time::timeout(
                    Duration::from_secs(1),
                    rpc::connect(at, &rpc::ServerTrust::FirstUse, None),
                )
                .await??;
                let mut client = api::curator_local_client::CuratorLocalClient::new(channel);
                let call = client.get_current_leader(api::GetCurrentLeaderRequest {});
                let answer = tokio::time::timeout(Duration::from_secs(1), call).await??;
                anyhow::Ok(answer.into_inner().leader_endpoint)
            });
            match answer {
                Ok(endpoint) if !endpoint.is_empty() => {
                    let ip = endpoint.parse::<SocketAddr>()?.ip();
                    return (0..self.partition.slots.len())
                        .find(|j| self.address(*j) == ip)
                        .with_context(|| format!("the leader {endpoint} is no node here"));
                }
                other => last = Some(other),
            }
        }
        bail!("no curator named a leader: {last:?}")
    }

    /// The owner's client that calls only the members in `via` (a client keeps
    /// calling the curator it reached last, so each set has its own).
    fn owner(&self, via: &[usize]) -> Result<std::sync::Arc<rpc::CuratorClient>> {
        let mut owners = self.owners.lock().expect("owners lock");
        if let Some(owner) = owners.get(via) {
            return Ok(owner.clone());
        }
        let owner = std::sync::Arc::new(self.cluster.owner_client()?);
        owner.set_endpoints(
            via.iter()
                .map(|i| SocketAddr::new(self.address(*i), rpc::CURATOR_PORT))
                .collect(),
        );
        owners.insert(via.to_vec(), owner.clone());
        Ok(owner)
    }

    /// A label write on node `target` by polisctl run inside slot `from`'s namespace,
    /// sent only to that node's curator and killed after `within`: whether polisctl
    /// reported success.
    pub fn write_from_inside(
        &self,
        from: usize,
        target: usize,
        value: &str,
        within: Duration,
    ) -> Result<bool> {
        let config = self.cluster.config.to_str().context("utf-8 path")?;
        let status = std::process::Command::new("timeout")
            .args(["-s", "KILL", &format!("{}", within.as_secs_f64())])
            .args(["ip", "netns", "exec", &self.partition.slots[from].netns])
            .arg(crate::process::bin("polisctl"))
            .args([
                "--config",
                config,
                "--endpoints",
                &self.address(from).to_string(),
            ])
            .args([
                "node",
                "label",
                &self.ids[target],
                &format!("partition={value}"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .context("running polisctl inside a namespace")?;
        Ok(status.success())
    }

    /// Makes slot `i`'s etcd member the etcd leader (`etcdctl move-leader` through the
    /// members' sockets), so that cutting its host cuts both leaders — the worst case.
    pub fn make_etcd_leader(&self, i: usize) -> Result<()> {
        let member = match i {
            0 => self.cluster.first.etcd_ids()?.1,
            i => self.others[i - 1].etcd_ids()?.1,
        };
        let sockets = (0..MEMBERS.len())
            .map(|j| format!("unix://{}", self.member_socket(j).display()))
            .collect::<Vec<_>>()
            .join(",");
        let out = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={sockets}"))
            .args([
                "--command-timeout=10s",
                "move-leader",
                &format!("{member:x}"),
            ])
            .output()
            .context("running etcdctl move-leader")?;
        // etcd refuses to move leadership to the member that already has it.
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && !err.contains("already") {
            bail!("etcdctl move-leader {member:x}: {err}");
        }
        Ok(())
    }

    /// One label write on node `target` through the members in `via`, bounded by
    /// `within`: whether it was acknowledged.
    pub fn write(&self, via: &[usize], target: usize, value: &str, within: Duration) -> bool {
        let Ok(owner) = self.owner(via) else {
            return false;
        };
        let request = api::UpdateNodeLabelsRequest {
            id: self.ids[target].clone(),
            upsert: [("partition".to_string(), value.to_string())].into(),
            delete: vec![],
        };
        let served = self.runtime.block_on(async {
            tokio::time::timeout(
                within,
                owner.call(|channel| {
                    let request = request.clone();
                    async move {
                        api::management_client::ManagementClient::new(channel)
                            .update_node_labels(request)
                            .await
                    }
                }),
            )
            .await
        });
        matches!(served, Ok(Ok(_)))
    }

    /// Writes through `via` until one is acknowledged; the time from `since` to then.
    pub fn first_write(&self, via: &[usize], target: usize, since: Instant) -> Result<Duration> {
        let mut n = 0u64;
        while since.elapsed() < TIMEOUT {
            n += 1;
            // Short attempts: one stuck on the old leader must not hide a new one.
            if self.write(
                via,
                target,
                &format!("probe-{n}"),
                Duration::from_millis(500),
            ) {
                return Ok(since.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!("no write through {via:?} was acknowledged within {TIMEOUT:?}")
    }

    /// The health of node `target` (e.g. "HEALTHY"), as the members in `via` list it.
    pub fn health(&self, via: &[usize], target: usize) -> Result<String> {
        let info = self.info(via, target)?;
        let health = api::NodeHealth::try_from(info.health).context("unknown health")?;
        Ok(health
            .as_str_name()
            .trim_start_matches("NODE_HEALTH_")
            .to_string())
    }

    /// The `partition` label of node `target`, read through the members in `via`.
    pub fn label(&self, via: &[usize], target: usize) -> Result<Option<String>> {
        Ok(self.info(via, target)?.labels.get("partition").cloned())
    }

    /// Node `target` as the members in `via` list it.
    fn info(&self, via: &[usize], target: usize) -> Result<api::NodeInfo> {
        let owner = self.owner(via)?;
        let id = self.ids[target].clone();
        let nodes = self.runtime.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(5),
                owner.call(|channel| async move {
                    api::management_client::ManagementClient::new(channel)
                        .list_nodes(api::ListNodesRequest::default())
                        .await
                }),
            )
            .await
        })??;
        nodes
            .nodes
            .into_iter()
            .find(|n| n.id == id)
            .with_context(|| format!("node {id} is not listed"))
    }

    /// Whether every member is back: its etcd serves a linearizable read through its own
    /// socket (a voter connected to a leader), its curator names a leader within 1 s,
    /// and every node is UP and HEALTHY in the list the curators serve.
    pub fn is_back(&self) -> bool {
        self.back_parts() == [true; 3]
    }

    /// The parts of [`PartitionedCluster::is_back`]: [every member's etcd serves a
    /// linearizable read, every curator names a leader, every node UP and HEALTHY].
    pub fn back_parts(&self) -> [bool; 3] {
        let members = 0..MEMBERS.len();
        let voters = members.clone().all(|i| {
            let socket = self.member_socket(i);
            std::process::Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints=unix://{}", socket.display()))
                .args([
                    "--command-timeout=1s",
                    "get",
                    "--consistency=l",
                    "partition-probe",
                ])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        let curators = members.clone().all(|i| self.leader(&[i]).is_ok());
        let endpoints = self.member_endpoints();
        let healthy = self
            .cluster
            .ctl(&["--endpoints", &endpoints, "node", "list", "-o", "json"])
            .ok()
            .filter(|(ok, _, _)| *ok)
            .and_then(|(_, out, _)| serde_json::from_str::<serde_json::Value>(&out).ok())
            .and_then(|v| v.as_array().cloned())
            .is_some_and(|nodes| {
                self.ids.iter().all(|id| {
                    nodes
                        .iter()
                        .any(|n| n["id"] == *id && n["state"] == "UP" && n["health"] == "HEALTHY")
                })
            });
        [voters, curators, healthy]
    }

    fn member_socket(&self, i: usize) -> std::path::PathBuf {
        match i {
            0 => self.cluster.first.socket(),
            i => self.others[i - 1].socket(),
        }
    }

    /// Cuts slot `flapper` off `rounds` times (`cut` long, then healed for `healed`)
    /// while one thread writes labels on node `target` through the members in `via`,
    /// one write after another (each bounded at 3 s): (acknowledged writes, longest time
    /// between two acknowledgements, counting from the start and to the end).
    pub fn flap_while_writing(
        &self,
        flapper: usize,
        via: &[usize],
        target: usize,
        rounds: usize,
        (cut, healed): (Duration, Duration),
    ) -> Result<(usize, Duration)> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let name = &self.partition.slots[flapper].name;
        let stop = AtomicBool::new(false);
        let acks = std::thread::scope(|scope| -> Result<Vec<Instant>> {
            // Inherits the hub namespace from this thread.
            let writer = scope.spawn(|| {
                let mut acks = vec![Instant::now()];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let value = format!("flap-{n}");
                    if self.write(via, target, &value, Duration::from_secs(3)) {
                        acks.push(Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                acks.push(Instant::now());
                acks
            });
            let flapping = (|| -> Result<()> {
                for _ in 0..rounds {
                    self.partition.cut(name)?;
                    std::thread::sleep(cut);
                    self.partition.heal(name)?;
                    std::thread::sleep(healed);
                }
                Ok(())
            })();
            stop.store(true, Ordering::Relaxed);
            let acks = writer.join().expect("the writer thread panicked");
            flapping?;
            Ok(acks)
        })?;
        let max_gap = acks
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        Ok((acks.len() - 2, max_gap))
    }

    /// Cuts slot `node` off (both ways) until the members in `rest` list it as
    /// HEARTBEAT_TIMEOUT, then heals it: (cut → timed out, heal → back).
    pub fn cut_until_timed_out(&self, node: usize, rest: &[usize]) -> Result<(Duration, Duration)> {
        let name = &self.partition.slots[node].name;
        self.partition.cut(name)?;
        let cut = Instant::now();
        let timed_out = crate::wait::wait_until("the cut-off node timed out", TIMEOUT, || {
            self.health(rest, node)
                .is_ok_and(|h| h == "HEARTBEAT_TIMEOUT")
        });
        let timeout = cut.elapsed();
        self.partition.heal(name)?;
        timed_out?;
        Ok((timeout, self.wait_back(TIMEOUT)?))
    }

    /// Waits until [`PartitionedCluster::is_back`]; how long that took.
    pub fn wait_back(&self, within: Duration) -> Result<Duration> {
        Ok(self.wait_back_parts(within)?[3])
    }

    /// [`PartitionedCluster::wait_back`], also telling when each part of
    /// [`PartitionedCluster::back_parts`] first held: [etcd voters, curators, HEALTHY,
    /// all at once].
    pub fn wait_back_parts(&self, within: Duration) -> Result<[Duration; 4]> {
        let start = Instant::now();
        let mut first: [Option<Duration>; 3] = [None; 3];
        loop {
            let parts = self.back_parts();
            for (seen, holds) in first.iter_mut().zip(parts) {
                if holds && seen.is_none() {
                    *seen = Some(start.elapsed());
                }
            }
            if parts == [true; 3] {
                let at = start.elapsed();
                return Ok([0, 1, 2].map(|i| first[i].unwrap_or(at)).map(|d| d.min(at)))
                    .map(|[a, b, c]| [a, b, c, at]);
            }
            if start.elapsed() > within {
                bail!(
                    "the cluster was not back (3 voters, all HEALTHY) within {within:?}: \
                     [etcd voters, curators, HEALTHY] first held after {first:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PartitionedCluster {
    fn drop(&mut self) {
        // Kill the nodes while their namespaces still exist (fields drop afterwards).
        for node in std::iter::once(&mut self.cluster.first).chain(self.others.iter_mut()) {
            node.proc = None;
        }
        let _ = &self.hub;
    }
}
