//! Benchmarks of the highly available control plane (real polis-node and etcd).
//!
//! - `bench-ha promote [N]`: per sample a fresh cluster (bootstrap node + one worker);
//!   `node add-role ConsensusMember` → the worker's etcd starts as a learner → it is a
//!   voter. Prints `{"bench":"promote","catchup_ms","voter_ms",…}`: catchup = learner
//!   etcd started → voter (etcd's catch-up plus our promotion latency), voter = the
//!   add-role call → voter.
//! - `bench-ha failover [N]`: a 3-member control plane; per sample kill -9 the curator
//!   leader's node and time until a Management call succeeds through the other
//!   curators. Prints `{"bench":"failover","ms",…}`.
//! - `bench-ha recover [N]`: per sample a fresh 3-member control plane; kill -9 two
//!   members, stop the third, `polis-node recover` on it → a label write served. Prints
//!   `{"bench":"recover","ms","etcd_ready_ms",…}`: ms from starting recover to the
//!   served write, etcd_ready_ms the recovered etcd's own start (spawn → ready, from the
//!   node's log); goal ms ≤ etcd_ready_ms + 2000.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, TIMEOUT, median};
use proto::api;

fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn promote_once() -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("w")?;
    let (mut worker, id) = cluster.add_worker("w", &params)?;
    let asked = Instant::now();
    cluster.ctl_retry(&["node", "add-role", &id, "ConsensusMember"])?;
    worker
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("started etcd"))?;
    let started = Instant::now();
    worker
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("now a voting etcd member"))?;
    Ok((ms_since(started), ms_since(asked)))
}

fn promote(samples: usize) -> Result<()> {
    let (mut catchup, mut voter) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let (c, v) = promote_once()?;
        println!("promote {i}: learner started → voter {c:.1} ms, add-role → voter {v:.1} ms");
        catchup.push(c);
        voter.push(v);
    }
    println!(
        "{}",
        serde_json::json!({
            "bench": "promote",
            "catchup_ms": round(median(catchup)),
            "voter_ms": round(median(voter)),
            "samples": samples,
        })
    );
    Ok(())
}

/// The curator leader's address, asked through `at`.
async fn curator_leader(at: SocketAddr) -> Result<SocketAddr> {
    let channel = rpc::connect(at, &rpc::ServerTrust::FirstUse, None).await?;
    let answer = api::curator_local_client::CuratorLocalClient::new(channel)
        .get_current_leader(api::GetCurrentLeaderRequest {})
        .await?
        .into_inner();
    Ok(answer.leader_endpoint.parse()?)
}

fn wait_three_voters(cluster: &Cluster, nodes: &[&Node]) -> Result<()> {
    let all: Vec<String> = nodes.iter().map(|n| n.address.to_string()).collect();
    cluster.wait_members(&all.join(","), 3, 0)?;
    Ok(())
}

fn failover(samples: usize) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("w")?;
    let (mut a, id_a) = cluster.add_worker("a", &params)?;
    cluster.ctl_retry(&["node", "add-role", &id_a, "ConsensusMember"])?;
    a.wait_for_curator()?;
    let (mut b, id_b) = cluster.add_worker("b", &params)?;
    cluster.ctl_retry(&["node", "add-role", &id_b, "ConsensusMember"])?;
    b.wait_for_curator()?;
    let owner = cluster.owner_client()?;
    let mut cluster = cluster;
    let mut results = Vec::new();
    for i in 0..samples {
        wait_three_voters(&cluster, &[&cluster.first, &a, &b])?;
        let any = SocketAddr::new(a.address, rpc::CURATOR_PORT);
        let leader = runtime.block_on(curator_leader(any))?;
        let addresses = [cluster.first.address, a.address, b.address];
        let Some(victim) = addresses.iter().position(|ip| *ip == leader.ip()) else {
            bail!("the curator leader {leader} is not one of the members");
        };
        let survivors: Vec<SocketAddr> = addresses
            .iter()
            .filter(|ip| **ip != leader.ip())
            .map(|ip| SocketAddr::new(*ip, rpc::CURATOR_PORT))
            .collect();
        owner.set_endpoints(survivors);
        let node: &mut Node = match victim {
            0 => &mut cluster.first,
            1 => &mut a,
            _ => &mut b,
        };
        node.proc().signal(libc::SIGKILL);
        let killed = Instant::now();
        loop {
            let served = runtime.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(2),
                    owner.call(|channel| async move {
                        api::management_client::ManagementClient::new(channel)
                            .list_nodes(api::ListNodesRequest::default())
                            .await
                    }),
                )
                .await
            });
            if matches!(served, Ok(Ok(_))) {
                break;
            }
            if killed.elapsed() > TIMEOUT {
                bail!("Management was not served again within {TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let ms = ms_since(killed);
        println!("failover {i}: kill -9 of the leader → Management served in {ms:.1} ms");
        results.push(ms);
        let node: &mut Node = match victim {
            0 => &mut cluster.first,
            1 => &mut a,
            _ => &mut b,
        };
        node.proc().wait_exit(TIMEOUT)?;
        node.start(&[])?;
        node.wait_for_curator()?;
    }
    let (min, max) = results
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
    println!(
        "{}",
        serde_json::json!({
            "bench": "failover",
            "ms": round(median(results.clone())),
            "min_ms": round(min),
            "max_ms": round(max),
            "samples": samples,
            "target_ms": 3000,
        })
    );
    Ok(())
}

/// One recovery: (recover started → label write served, its etcd spawn → ready), ms.
fn recover_once() -> Result<(f64, f64)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("w")?;
    let mut members = Vec::new();
    for name in ["a", "b"] {
        let (mut node, id) = cluster.add_worker(name, &params)?;
        cluster.ctl_retry(&["node", "add-role", &id, "ConsensusMember"])?;
        node.wait_for_curator()?;
        members.push(node);
    }
    wait_three_voters(&cluster, &[&cluster.first, &members[0], &members[1]])?;
    let target = cluster.first.key_node_id()?;
    let owner = cluster.owner_client()?;
    for node in &mut members {
        node.proc().signal(libc::SIGKILL);
        node.proc().wait_exit(TIMEOUT)?;
    }
    let survivor = &mut cluster.first;
    survivor.proc().signal(libc::SIGTERM);
    survivor.proc().wait_exit(TIMEOUT)?;
    let mut cmd = std::process::Command::new(e2e::bin("polis-node"));
    cmd.arg("recover")
        .arg("--root")
        .arg(&survivor.root)
        .arg("--log-format=json");
    let started = Instant::now();
    survivor.proc = Some(e2e::Proc::spawn(
        "polis-node recover",
        cmd,
        &survivor.dir.join("recover.log"),
    )?);
    let mut write = 0u64;
    loop {
        write += 1;
        let value = write.to_string();
        // The timeout is made inside the runtime (it needs its timer).
        let served = runtime.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(2),
                e2e::write_label(&owner, &target, "bench-recover", &value),
            )
            .await
        });
        if matches!(served, Ok(Ok(_))) {
            break;
        }
        if started.elapsed() > TIMEOUT {
            bail!("no label write was served within {TIMEOUT:?} of recover");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ms = ms_since(started);
    let ready = survivor
        .proc()
        .wait_for_line(TIMEOUT, |l| l.contains("etcd is ready"))?;
    let json: serde_json::Value = serde_json::from_str(&ready)?;
    let etcd_ms = json["fields"]["ms"]
        .as_f64()
        .context("etcd is ready: ms field")?;
    Ok((ms, etcd_ms))
}

fn recover(samples: usize) -> Result<()> {
    let (mut served, mut etcd) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let (ms, etcd_ms) = recover_once()?;
        println!(
            "recover {i}: recover started → label write served {ms:.1} ms (its etcd: spawn → ready {etcd_ms:.1} ms)"
        );
        served.push(ms);
        etcd.push(etcd_ms);
    }
    let (ms, etcd_ms) = (median(served), median(etcd));
    println!(
        "{}",
        serde_json::json!({
            "bench": "recover",
            "ms": round(ms),
            "etcd_ready_ms": round(etcd_ms),
            "goal_ms": round(etcd_ms + 2000.0),
            "samples": samples,
        })
    );
    Ok(())
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mode = args
        .next()
        .context("usage: bench-ha promote|failover|recover [SAMPLES]")?;
    let samples: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()
        .context("SAMPLES must be a number")?
        .unwrap_or(5)
        .max(1);
    match mode.as_str() {
        "promote" => promote(samples),
        "failover" => failover(samples),
        "recover" => recover(samples),
        other => bail!("unknown mode {other:?}: promote, failover or recover"),
    }
}
