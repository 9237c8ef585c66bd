//! Reads answered by a curator leader that was paused (SIGSTOP of its polis-node; its etcd
//! keeps running) are never older than writes acknowledged before they were sent, with
//! real polis-node and etcd processes on 127.x addresses: a 3-member control plane.
//!
//! Each round: the curator leader's polis-node is frozen for [`PAUSE`] (longer than the
//! other curators take to revoke its lease, shorter than the lease TTL), while
//! - a writer adds one new label per write to a node's record through the OTHER two
//!   curators (each attempt bounded, so attempts forwarded to the frozen leader are given
//!   up; distinct keys, so a write applied late cannot pass for an older value), and
//! - a reader sends DescribeNode of that record every [`READ_EVERY`] straight to the
//!   frozen leader (one connection opened before the pause; the requests wait in its
//!   socket), noting which writes were acknowledged before each one was sent;
//!
//! then SIGCONT. Every read answered must hold every write acknowledged before it was
//! sent; a refused read (Unavailable) is fine. Reads sent after the first write a new
//! leader acknowledged are the ones at risk: the test fails if no round produced any, so
//! it cannot pass by not testing.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{Cluster, Node, TIMEOUT, endpoints, wait_until};
use proto::api;

/// Rounds of pause, writes and reads.
const ROUNDS: usize = 4;
/// How long the leader's polis-node is frozen: the other curators revoke its lease after
/// about 2 s (`curator::election`, evidence for 500 ms of no renewal for over a second);
/// its lease TTL is 3 s.
const PAUSE: Duration = Duration::from_millis(2700);
/// How often a read is sent to the frozen leader, and at most how many per round (fewer
/// than the curator's 32 concurrent streams per connection).
const READ_EVERY: Duration = Duration::from_millis(100);
const MAX_READS: usize = 30;
/// Bound on one write attempt: one forwarded to the frozen leader is given up.
const WRITE_ATTEMPT: Duration = Duration::from_millis(300);
/// Pause between write attempts, and at most this many per round (labels are cleared
/// between rounds: a record holds at most 128).
const WRITE_EVERY: Duration = Duration::from_millis(50);
const MAX_WRITES: usize = 60;
/// How long a read may wait for its answer after SIGCONT.
const READ_ANSWER: Duration = Duration::from_secs(30);

/// Freezes a process (SIGSTOP) and lets it continue (SIGCONT) when dropped, also when the
/// test fails: declared after the nodes, it is dropped before them.
struct Frozen(i32);

impl Frozen {
    fn freeze(pid: i32) -> Frozen {
        // SAFETY: kill(2) on a process this test started.
        unsafe {
            libc::kill(pid, libc::SIGSTOP);
        }
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe {
            libc::kill(self.0, libc::SIGCONT);
        }
    }
}

/// A bootstrapped cluster with two more consensus members (3 voters).
fn three_members(dir: &std::path::Path) -> Result<(Cluster, Node, Node)> {
    let cluster = Cluster::bootstrap(dir)?;
    let params = cluster.register_params("nodes")?;
    let (mut m1, id_m1) = cluster.add_worker("m1", &params)?;
    let (mut m2, id_m2) = cluster.add_worker("m2", &params)?;
    for id in [&id_m1, &id_m2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    cluster.wait_members(&endpoints(&[&cluster.first, &m1, &m2]), 3, 0)?;
    m1.wait_for_curator()?;
    m2.wait_for_curator()?;
    Ok((cluster, m1, m2))
}

/// Writes acknowledged so far: label key → when its acknowledgement arrived.
type Acked = Arc<Mutex<Vec<(String, Instant)>>>;

/// One read sent to the frozen leader: when, what had been acknowledged by then, and
/// what it answered.
struct Read {
    sent: Instant,
    acked_before: BTreeSet<String>,
    answer: Result<BTreeSet<String>, tonic::Status>,
    answered: Instant,
}

/// What one round saw.
#[derive(Default)]
struct Round {
    writes_acked: usize,
    answered: usize,
    refused: usize,
    /// Reads sent after a write acknowledged during the pause (by the new leader).
    at_risk: usize,
    stale: Vec<String>,
}

/// The node whose curator leads, by address, once every member names the same one and
/// it serves DescribeNode.
fn settled_leader(cluster: &Cluster, members: &[&Node]) -> Result<std::net::IpAddr> {
    let mut leader = None;
    wait_until(
        "the members to agree on a serving curator leader",
        TIMEOUT,
        || {
            let named: Vec<_> = members
                .iter()
                .map(|m| m.curator_leader_address().ok())
                .collect();
            let Some(Some(first)) = named.first().copied() else {
                return false;
            };
            if !named.iter().all(|n| *n == Some(first)) {
                return false;
            }
            leader = Some(first);
            true
        },
    )?;
    let leader = leader.context("a leader was named")?;
    let (ok, _, _) = cluster.ctl(&[
        "--endpoints",
        &leader.to_string(),
        "node",
        "list",
        "-o",
        "json",
    ])?;
    if !ok {
        bail!("the named leader {leader} does not serve node list");
    }
    Ok(leader)
}

async fn describe_on(
    channel: tonic::transport::Channel,
    id: String,
) -> Result<BTreeSet<String>, tonic::Status> {
    let node = api::management_client::ManagementClient::new(channel)
        .describe_node(api::DescribeNodeRequest { id })
        .await?
        .into_inner();
    Ok(node.labels.into_keys().collect())
}

/// Removes every label of node `id` (earlier rounds'), through the leader.
async fn clear_labels(client: &rpc::CuratorClient, id: &str) -> Result<()> {
    let request = api::DescribeNodeRequest { id: id.to_string() };
    let node = client
        .call(|channel| {
            let request = request.clone();
            async move {
                api::management_client::ManagementClient::new(channel)
                    .describe_node(request)
                    .await
            }
        })
        .await?;
    let request = api::UpdateNodeLabelsRequest {
        id: id.to_string(),
        upsert: Default::default(),
        delete: node.labels.into_keys().collect(),
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
        .await?;
    Ok(())
}

/// One round: freeze the leader `pid` (serving at `leader`), write through `others`,
/// read at the leader, continue it, judge every read.
fn round(
    runtime: &tokio::runtime::Runtime,
    cluster: &Cluster,
    number: usize,
    leader: SocketAddr,
    pid: i32,
    others: Vec<SocketAddr>,
    target: &str,
) -> Result<Round> {
    let owner = cluster.owner_client()?;
    let writer = rpc::CuratorClient::new(others, owner.trust().clone(), owner.credentials())?;
    let prefix = format!("r{number}-w");
    runtime.block_on(async {
        clear_labels(&owner, target)
            .await
            .context("clearing the labels")?;
        // The connection to the leader, opened and used before the pause.
        let channel = rpc::connect(leader, owner.trust(), owner.credentials().as_ref())
            .await
            .context("connecting to the leader's curator")?;
        describe_on(channel.clone(), target.to_string())
            .await
            .context("DescribeNode at the leader before the pause")?;
        // The writer's first write goes through a follower before the pause.
        e2e::write_label(&writer, target, &format!("{prefix}0"), "1")
            .await
            .context("a write through the other curators before the pause")?;
        let acked: Acked = Arc::new(Mutex::new(vec![(format!("{prefix}0"), Instant::now())]));

        let frozen = Frozen::freeze(pid);
        let paused_at = Instant::now();
        let until = paused_at + PAUSE;

        let writes = {
            let (acked, target, prefix) = (acked.clone(), target.to_string(), prefix.clone());
            async move {
                for i in 1..=MAX_WRITES {
                    if Instant::now() >= until {
                        break;
                    }
                    let key = format!("{prefix}{i}");
                    let write = e2e::write_label(&writer, &target, &key, "1");
                    if let Ok(Ok(())) = tokio::time::timeout(WRITE_ATTEMPT, write).await {
                        acked
                            .lock()
                            .expect("acked lock")
                            .push((key, Instant::now()));
                    }
                    tokio::time::sleep(WRITE_EVERY).await;
                }
            }
        };
        let reads = {
            let (acked, target) = (acked.clone(), target.to_string());
            async move {
                let mut sent = Vec::new();
                while Instant::now() < until && sent.len() < MAX_READS {
                    let acked_before: BTreeSet<String> = acked
                        .lock()
                        .expect("acked lock")
                        .iter()
                        .map(|(k, _)| k.clone())
                        .collect();
                    let (channel, id) = (channel.clone(), target.clone());
                    let at = Instant::now();
                    let answer = tokio::spawn(async move {
                        let answer =
                            tokio::time::timeout(READ_ANSWER + PAUSE, describe_on(channel, id))
                                .await
                                .unwrap_or_else(|_| {
                                    Err(tonic::Status::deadline_exceeded("no answer"))
                                });
                        (answer, Instant::now())
                    });
                    sent.push((at, acked_before, answer));
                    tokio::time::sleep(READ_EVERY).await;
                }
                sent
            }
        };
        let ((), sent) = tokio::join!(writes, reads);
        drop(frozen);
        let continued = paused_at.elapsed();

        let first_new_ack = acked
            .lock()
            .expect("acked lock")
            .iter()
            .map(|(_, at)| *at)
            .filter(|at| *at > paused_at)
            .min();
        let mut outcome = Round {
            writes_acked: acked.lock().expect("acked lock").len() - 1,
            ..Round::default()
        };
        for (sent_at, acked_before, answer) in sent {
            let (answer, answered) = answer.await.context("a read task")?;
            let read = Read {
                sent: sent_at,
                acked_before,
                answer,
                answered,
            };
            if first_new_ack.is_some_and(|first| read.sent > first) {
                outcome.at_risk += 1;
            }
            match &read.answer {
                Err(status) => {
                    outcome.refused += 1;
                    if status.code() != tonic::Code::Unavailable {
                        println!(
                            "round {number}: read sent at +{:?} refused: {status:?}",
                            read.sent - paused_at
                        );
                    }
                }
                Ok(labels) => {
                    outcome.answered += 1;
                    let missing: Vec<_> = read.acked_before.difference(labels).collect();
                    if !missing.is_empty() {
                        outcome.stale.push(format!(
                            "read sent at +{:?}, answered at +{:?}, lacks {missing:?} \
                             acknowledged before it was sent",
                            read.sent - paused_at,
                            read.answered - paused_at
                        ));
                    }
                }
            }
        }
        println!(
            "round {number}: paused {continued:?}; writes acknowledged during the pause {}, \
             first at {:?}; reads answered {}, refused {}, at risk {}, stale {}",
            outcome.writes_acked,
            first_new_ack.map(|f| f - paused_at),
            outcome.answered,
            outcome.refused,
            outcome.at_risk,
            outcome.stale.len()
        );
        for stale in &outcome.stale {
            println!("round {number}: STALE {stale}");
        }
        anyhow::Ok(outcome)
    })
}

#[test]
fn a_paused_leader_answers_no_stale_reads() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut cluster, mut m1, mut m2) = three_members(dir.path())?;
    let target = cluster.first.key_node_id()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let all = endpoints(&[&cluster.first, &m1, &m2]);
    let mut rounds = Vec::new();
    for number in 1..=ROUNDS {
        let leader = settled_leader(&cluster, &[&cluster.first, &m1, &m2])?;
        let (pid, others) = {
            let mut members = [&mut cluster.first, &mut m1, &mut m2];
            let others: Vec<SocketAddr> = members
                .iter()
                .filter(|m| m.address != leader)
                .map(|m| SocketAddr::new(m.address, rpc::CURATOR_PORT))
                .collect();
            let paused = members
                .iter_mut()
                .find(|m| m.address == leader)
                .context("the leader is a member")?;
            // polis-node itself, not its etcd child: etcd keeps the quorum going.
            (paused.proc().pid(), others)
        };
        let outcome = round(
            &runtime,
            &cluster,
            number,
            SocketAddr::new(leader, rpc::CURATOR_PORT),
            pid,
            others,
            &target,
        )?;
        rounds.push(outcome);
        // Back to three answering members before the next round.
        cluster.wait_members(&all, 3, 0)?;
    }
    let stale: Vec<&String> = rounds.iter().flat_map(|r| &r.stale).collect();
    let at_risk: usize = rounds.iter().map(|r| r.at_risk).sum();
    let rounds_with_stale = rounds.iter().filter(|r| !r.stale.is_empty()).count();
    println!(
        "{{\"rounds\": {ROUNDS}, \"rounds_with_stale_reads\": {rounds_with_stale}, \
         \"stale_reads\": {}, \"reads_at_risk\": {at_risk}, \"reads_answered\": {}, \
         \"reads_refused\": {}}}",
        stale.len(),
        rounds.iter().map(|r| r.answered).sum::<usize>(),
        rounds.iter().map(|r| r.refused).sum::<usize>(),
    );
    assert!(
        stale.is_empty(),
        "a paused leader answered reads older than acknowledged writes: {stale:#?}"
    );
    assert!(
        at_risk > 0,
        "no read was sent after a new leader acknowledged a write: nothing was tested"
    );
    Ok(())
}
