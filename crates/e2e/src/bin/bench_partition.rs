//! `scripts/bench partition [SAMPLES]`: the control plane under network partitions, three
//! members in their own network namespaces behind a bridge (`e2e::PartitionedCluster`).
//!
//! - leader cut: the curator leader's host (made etcd leader too: the worst case) cut off both ways (SAMPLES times) and once
//!   one way (it can only receive) → first label write served through the other two;
//! - isolated curator: during each both-way cut, `polisctl node label` run inside the
//!   cut-off namespace against that curator only → how long until it fails (killed at
//!   30 s: counted as 30 s);
//! - flapping: a follower cut 5× (5 s cut / 5 s healed) while writes run through the
//!   other two → longest gap between acknowledged writes, whether leadership moved;
//! - heal: a follower cut off until it is HEARTBEAT_TIMEOUT, healed → back (3 voters
//!   answering, every node HEALTHY); also after each leader cut.
//!
//! `scripts/bench partition --heals N`: only heals, N of them, each after a cut long
//! enough for the others to list the node HEARTBEAT_TIMEOUT, alternately of the curator
//! leader's host and of a follower; per heal, when each step of the way back first held
//! (see [`Phases`]), and the median and max of each.
//!
//! Goals (issue 16): failover ≤ 3 s, Unavailable ≤ lease TTL + 1 s (4 s), flapping gap
//! ≤ 2 s, back ≤ 5 s. The last line is one JSON object.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use e2e::{MEMBERS, Node, PartitionedCluster, median};

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// Cuts the curator leader's host (one way: it cannot send), measures the first write
/// through the others and, for both-way cuts, a call to the isolated curator; heals and
/// waits until the cluster is back: (failover, isolated call, back).
fn leader_cut(
    pc: &PartitionedCluster,
    one_way: bool,
) -> Result<(Duration, Option<Duration>, Duration)> {
    let leader = pc.leader(&[0, 1, 2])?;
    let name = MEMBERS[leader];
    let rest: Vec<usize> = (0..MEMBERS.len()).filter(|i| *i != leader).collect();
    pc.make_etcd_leader(leader)?;
    // Let the move settle: writes through the others succeed.
    pc.first_write(&rest, rest[0], Instant::now())?;
    if one_way {
        pc.partition.cut_outgoing(name)?;
    } else {
        pc.partition.cut(name)?;
    }
    let cut = Instant::now();
    let failover = pc.first_write(&rest, rest[0], cut)?;
    let isolated = if one_way {
        None
    } else {
        let asked = Instant::now();
        let ok = pc.write_from_inside(leader, leader, "minority", Duration::from_secs(30))?;
        anyhow::ensure!(!ok, "the isolated curator acknowledged a write");
        Some(asked.elapsed())
    };
    pc.partition.heal(name)?;
    let [etcd, curators, healthy, back] = pc.wait_back_parts(e2e::TIMEOUT)?;
    println!(
        "  heal of {name}: etcd voters after {:.1} ms, curators after {:.1} ms, all HEALTHY after {:.1} ms",
        ms(etcd),
        ms(curators),
        ms(healthy)
    );
    Ok((failover, isolated, back))
}

/// The node in slot `i`.
fn node(pc: &PartitionedCluster, i: usize) -> &Node {
    match i {
        0 => &pc.cluster.first,
        i => &pc.others[i - 1],
    }
}

/// The node's current log (the one its latest start writes: `node-N.log`, highest N).
fn current_log(node: &Node) -> Result<PathBuf> {
    let mut logs = Vec::new();
    for entry in
        std::fs::read_dir(&node.dir).with_context(|| format!("listing {}", node.dir.display()))?
    {
        let name = entry?.file_name().to_string_lossy().to_string();
        if let Some(n) = name
            .strip_prefix("node-")
            .and_then(|r| r.strip_suffix(".log"))
            .and_then(|n| n.parse::<u32>().ok())
        {
            logs.push((n, node.dir.join(name)));
        }
    }
    logs.into_iter()
        .max()
        .map(|(_, p)| p)
        .with_context(|| format!("no node log in {}", node.dir.display()))
}

/// Seconds since the Unix epoch of a JSON log line's `timestamp` (RFC 3339, UTC).
fn line_time(line: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let ts = v["timestamp"].as_str()?;
    let (date, time) = ts.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min, sec) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    // Days since the epoch of a proleptic Gregorian date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// The time after `since` (Unix seconds) of the first line of `log`, past byte `from`,
/// containing any of `needles`.
fn first_logged(log: &Path, from: u64, since: f64, needles: &[&str]) -> Option<Duration> {
    let text = std::fs::read(log).ok()?;
    let text = String::from_utf8_lossy(text.get(from as usize..)?).to_string();
    text.lines()
        .filter(|l| needles.iter().any(|n| l.contains(n)))
        .find_map(line_time)
        .map(|t| Duration::from_secs_f64((t - since).max(0.0)))
}

/// Polls `holds` (each poll bounded by its own command timeouts) until it is true: how
/// long after `start` it first was; an error after `within`.
fn first_held(
    what: &str,
    start: Instant,
    within: Duration,
    holds: impl Fn() -> bool,
) -> Result<Duration> {
    loop {
        if holds() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            bail!("{what} did not hold within {within:?} of the heal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// When each step of a healed member's way back first held, counted from the heal.
#[derive(Debug, Clone, Copy)]
struct Phases {
    /// Its etcd logged a peer "became active" (rafthttp reconnected).
    etcd_peer: Option<Duration>,
    /// Its etcd serves a linearizable read through its own socket (it follows a leader).
    etcd_leader: Duration,
    /// The node logged a heartbeat answered again.
    heartbeat: Option<Duration>,
    /// The others list it HEALTHY.
    healthy: Duration,
    /// `cluster status` shows 3 voters, all answering.
    voters: Duration,
}

impl Phases {
    /// Back: a voter following the leader, HEALTHY, and listed so by `cluster status`.
    fn back(&self) -> Duration {
        self.etcd_leader.max(self.healthy).max(self.voters)
    }
}

/// Cuts slot `cut` off until the others list it HEARTBEAT_TIMEOUT, heals it and times
/// each step back.
fn heal_once(pc: &PartitionedCluster, cut: usize) -> Result<Phases> {
    let rest: Vec<usize> = (0..MEMBERS.len()).filter(|i| *i != cut).collect();
    let name = MEMBERS[cut];
    pc.partition.cut(name)?;
    let timed_out = e2e::wait_until("the cut-off member timed out", e2e::TIMEOUT, || {
        pc.health(&rest, cut)
            .is_ok_and(|h| h == "HEARTBEAT_TIMEOUT")
    });
    let log = current_log(node(pc, cut))?;
    let from = std::fs::metadata(&log)
        .with_context(|| format!("reading the size of {}", log.display()))?
        .len();
    pc.partition.heal(name)?;
    let healed = Instant::now();
    let healed_unix = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs_f64();
    timed_out?;
    let within = e2e::TIMEOUT;
    let socket = node(pc, cut).socket();
    let endpoints = pc.member_endpoints();
    let id = pc.ids[cut].clone();
    let (etcd_leader, healthy, voters) = std::thread::scope(|scope| {
        // Threads inherit the hub namespace of this one.
        let etcd = scope.spawn(|| {
            first_held(
                "a linearizable read through its etcd",
                healed,
                within,
                || {
                    std::process::Command::new("etcdctl")
                        .env("ETCDCTL_API", "3")
                        .arg(format!("--endpoints=unix://{}", socket.display()))
                        .args([
                            "--command-timeout=1s",
                            "get",
                            "--consistency=l",
                            "heal-probe",
                        ])
                        .output()
                        .is_ok_and(|o| o.status.success())
                },
            )
        });
        let healthy = scope.spawn(|| {
            first_held("HEALTHY in the node list", healed, within, || {
                pc.cluster
                    .ctl(&["--endpoints", &endpoints, "node", "list", "-o", "json"])
                    .ok()
                    .and_then(|(_, out, _)| serde_json::from_str::<serde_json::Value>(&out).ok())
                    .and_then(|v| v.as_array().cloned())
                    .is_some_and(|nodes| {
                        nodes
                            .iter()
                            .any(|n| n["id"] == *id && n["health"] == "HEALTHY")
                    })
            })
        });
        let voters = scope.spawn(|| {
            first_held(
                "3 voters answering in cluster status",
                healed,
                within,
                || {
                    pc.cluster.status(&endpoints).is_ok_and(|(ok, status)| {
                        let members = status["members"].as_array().cloned().unwrap_or_default();
                        ok && members.len() == 3
                            && members
                                .iter()
                                .all(|m| m["role"] == "voter" && m["answered"] == true)
                    })
                },
            )
        });
        let join = |h: std::thread::ScopedJoinHandle<'_, Result<Duration>>| {
            h.join().expect("a polling thread panicked")
        };
        anyhow::Ok((join(etcd)?, join(healthy)?, join(voters)?))
    })?;
    Ok(Phases {
        etcd_peer: first_logged(&log, from, healed_unix, &["became active"]),
        etcd_leader,
        heartbeat: first_logged(
            &log,
            from,
            healed_unix,
            &[
                "answers heartbeats again",
                "heartbeats reach the curator again",
            ],
        ),
        healthy,
        voters,
    })
}

/// `--heals N`: N heals, alternately of the curator leader's host and of a follower.
fn heals(pc: &PartitionedCluster, n: usize) -> Result<()> {
    let mut all = Vec::new();
    for i in 0..n {
        let leader = pc.leader(&[0, 1, 2])?;
        let (cut, kind) = if i % 2 == 0 {
            (leader, "leader")
        } else {
            ((leader + 1) % MEMBERS.len(), "follower")
        };
        let p = heal_once(pc, cut).with_context(|| format!("heal {i} ({kind})"))?;
        let opt = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1}", ms(d)));
        println!(
            "heal {i} ({kind} {}): etcd peer active {} ms, etcd has a leader {:.1} ms, heartbeat answered {} ms, HEALTHY {:.1} ms, 3 voters {:.1} ms → back {:.1} ms",
            MEMBERS[cut],
            opt(p.etcd_peer),
            ms(p.etcd_leader),
            opt(p.heartbeat),
            ms(p.healthy),
            ms(p.voters),
            ms(p.back())
        );
        all.push(p);
    }
    let stats = |f: &dyn Fn(&Phases) -> Option<Duration>| {
        let v: Vec<f64> = all.iter().filter_map(f).map(ms).collect();
        serde_json::json!({"median": median(v.clone()), "max": max(&v), "seen": v.len()})
    };
    println!(
        "{}",
        serde_json::json!({
            "bench": "partition-heals",
            "heals": n,
            "etcd_peer_active_ms": stats(&|p| p.etcd_peer),
            "etcd_leader_ms": stats(&|p| Some(p.etcd_leader)),
            "heartbeat_answered_ms": stats(&|p| p.heartbeat),
            "healthy_ms": stats(&|p| Some(p.healthy)),
            "voters_ms": stats(&|p| Some(p.voters)),
            "back_ms": stats(&|p| Some(p.back())),
            "target_back_ms": 5000,
        })
    );
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let heal_count = match args.as_slice() {
        [flag, n] if flag == "--heals" => Some(
            n.parse::<usize>()
                .with_context(|| format!("--heals takes a number, got {n:?}"))?,
        ),
        [flag] if flag == "--heals" => bail!("--heals takes a number (how many heals)"),
        _ => None,
    };
    let samples: usize = match (heal_count, args.first()) {
        (Some(_), _) | (None, None) => 3,
        (None, Some(s)) => s
            .parse()
            .with_context(|| format!("SAMPLES must be a number or --heals N, got {s:?}"))?,
    };
    // POLIS_KEEP_TEST_DIR=1 keeps the nodes' logs for a look afterwards.
    let dir = tempfile::tempdir()?;
    let path = match std::env::var_os("POLIS_KEEP_TEST_DIR") {
        Some(_) => dir.keep(),
        None => dir.path().to_path_buf(),
    };
    println!("nodes' directories: {}", path.display());
    // Consensus members as recommended (README): TCP retransmission backoff bounded at
    // 1 s, so that etcd's peer streams resume right after a heal.
    let pc = PartitionedCluster::create(&path, false, &["--tcp-rto-max-ms", "1000"])
        .context("a cluster in network namespaces (needs root: ip netns)")?;
    if let Some(n) = heal_count {
        return heals(&pc, n);
    }
    let (mut failovers, mut isolated, mut backs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..samples {
        let (f, iso, back) = leader_cut(&pc, false)?;
        let iso = iso.expect("both-way cut");
        println!(
            "leader cut {i}: write served by the others after {:.1} ms; isolated curator failed the call after {:.1} ms; healed → back in {:.1} ms",
            ms(f),
            ms(iso),
            ms(back)
        );
        failovers.push(ms(f));
        isolated.push(ms(iso));
        backs.push(ms(back));
    }
    let (one_way, _, back) = leader_cut(&pc, true)?;
    println!(
        "leader cut one way (cannot send): write served by the others after {:.1} ms; back in {:.1} ms",
        ms(one_way),
        ms(back)
    );

    let leader = pc.leader(&[0, 1, 2])?;
    let flapper = (0..MEMBERS.len())
        .find(|i| *i != leader)
        .expect("3 members");
    let steady = (0..MEMBERS.len())
        .find(|i| *i != leader && *i != flapper)
        .expect("3 members");
    let five = Duration::from_secs(5);
    let (acks, gap) = pc.flap_while_writing(flapper, &[leader, steady], steady, 5, (five, five))?;
    let moved = pc.leader(&[leader, steady])? != leader;
    println!(
        "follower {} flapped 5× (5 s / 5 s): {acks} writes, max gap {:.1} ms, leadership moved: {moved}",
        MEMBERS[flapper],
        ms(gap)
    );
    pc.wait_back(e2e::TIMEOUT)?;

    let rest: Vec<usize> = (0..MEMBERS.len()).filter(|i| *i != flapper).collect();
    let (timed_out, heal_back) = pc.cut_until_timed_out(flapper, &rest)?;
    println!(
        "follower {} cut: HEARTBEAT_TIMEOUT after {:.1} ms; healed → back in {:.1} ms",
        MEMBERS[flapper],
        ms(timed_out),
        ms(heal_back)
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "partition",
            "leader_cut_failover_ms": median(failovers.clone()),
            "leader_cut_failover_max_ms": max(&failovers),
            "leader_cut_one_way_failover_ms": ms(one_way),
            "isolated_curator_unavailable_ms": median(isolated.clone()),
            "isolated_curator_unavailable_max_ms": max(&isolated),
            "flapping_max_gap_ms": ms(gap),
            "flapping_leader_moved": moved,
            "heal_to_healthy_ms": ms(heal_back),
            "leader_heal_to_back_max_ms": max(&backs),
            "samples": samples,
            "targets_ms": {"failover": 3000, "unavailable": 4000, "gap": 2000, "heal": 5000},
        })
    );
    Ok(())
}
