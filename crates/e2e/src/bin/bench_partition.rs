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
//! Goals (issue 16): failover ≤ 3 s, Unavailable ≤ lease TTL + 1 s (4 s), flapping gap
//! ≤ 2 s, back ≤ 5 s. The last line is one JSON object.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::{MEMBERS, PartitionedCluster, median};

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

fn main() -> Result<()> {
    let samples: usize = match std::env::args().nth(1) {
        Some(s) => s
            .parse()
            .with_context(|| format!("SAMPLES must be a number, got {s:?}"))?,
        None => 3,
    };
    let dir = tempfile::tempdir()?;
    let pc = PartitionedCluster::create(dir.path(), false, &[])
        .context("a cluster in network namespaces (needs root: ip netns)")?;
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
