//! The control plane under network partitions (issue 16), with real nodes in their own
//! network namespaces behind a bridge (`e2e::Partition`): one 3-member cluster shared by
//! the cases, which run in order in one test.
//!
//! - leader host (curator and etcd leader) cut off both ways → a write served by the
//!   other two within 1.5× the 3 s goal; a write sent only to the isolated curator is never acknowledged, and is not in
//!   the record after the heal;
//! - a follower cut and healed 3× (5 s / 5 s) while writes run through the others → no
//!   gap over 2 s in acknowledged writes, and the curator leader does not move;
//! - after each heal the cluster is back (3 voters answering, every node HEALTHY) within
//!   2× the 5 s goal, also after a cut long enough to time the node out;
//! - a healed member is back as a voter and HEALTHY: cut (the curator leader's host, then
//!   a follower, twice each) until the others list it HEARTBEAT_TIMEOUT, healed → every
//!   member's etcd serves a linearizable read within 3.5 s (on main, without a bound on
//!   TCP retransmission backoff, up to 4.8 s: etcd's peer stream to the returning member
//!   stayed stuck on the connection of before the cut) and all back within 2× the goal.
//!
//! Skips (saying so) only when network namespaces cannot be created.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::{MEMBERS, PartitionedCluster};

/// Goals (issue 16); the test asserts twice each, the failover 1.5× (before the fix it
/// took 5.2–6.9 s, which 2× would not always catch).
const FAILOVER_GOAL: Duration = Duration::from_secs(3);
const BACK_GOAL: Duration = Duration::from_secs(5);
const MAX_GAP: Duration = Duration::from_secs(2);
/// A healed member's etcd follows a leader again within this (1.4 s measured with the
/// backoff bounded at 1 s; up to 4.8 s without).
const ETCD_BACK: Duration = Duration::from_millis(3500);

fn setup(dir: &std::path::Path) -> Result<Option<PartitionedCluster>> {
    // Probe for privileges first, so that only that lack skips the test.
    match e2e::Partition::create(&["probe"]) {
        Ok(probe) => drop(probe),
        Err(e) => {
            println!("SKIPPED: network namespaces cannot be created here: {e:#}");
            return Ok(None);
        }
    }
    // As recommended for consensus members (README): retransmission backoff bounded.
    Ok(Some(PartitionedCluster::create(
        dir,
        false,
        &["--tcp-rto-max-ms", "1000"],
    )?))
}

/// One slot other than those in `not`.
fn other(not: &[usize]) -> usize {
    (0..MEMBERS.len())
        .find(|i| !not.contains(i))
        .expect("three members")
}

fn leader_host_cut(pc: &mut PartitionedCluster) -> Result<()> {
    let leader = pc.leader(&[0, 1, 2])?;
    let name = MEMBERS[leader];
    let rest: Vec<usize> = (0..MEMBERS.len()).filter(|i| *i != leader).collect();
    // The worst case: the host of both the curator and the etcd leader goes silent.
    pc.make_etcd_leader(leader)?;
    assert!(pc.write(&rest, rest[0], "before", Duration::from_secs(10)));
    pc.partition.cut(name)?;
    let cut = Instant::now();
    let failover = pc.first_write(&rest, rest[0], cut)?;
    println!("leader host {name} cut off → write served by the others in {failover:?}");
    assert!(
        failover <= FAILOVER_GOAL * 3 / 2,
        "failover took {failover:?} (goal {FAILOVER_GOAL:?})"
    );
    // The minority never acknowledges: a write sent from inside the cut-off namespace
    // to the isolated curator only.
    let minority = pc.write_from_inside(leader, leader, "minority", Duration::from_secs(8))?;
    assert!(!minority, "the isolated curator acknowledged a write");
    pc.partition.heal(name)?;
    let back = pc.wait_back(Duration::from_secs(60))?;
    println!("leader host {name} healed → back (3 voters, HEALTHY) in {back:?}");
    assert!(
        back <= BACK_GOAL * 2,
        "back after {back:?} (goal {BACK_GOAL:?})"
    );
    let label = pc.label(&[0, 1, 2], leader)?;
    assert_ne!(
        label.as_deref(),
        Some("minority"),
        "a minority write took hold"
    );
    Ok(())
}

fn follower_flaps(pc: &mut PartitionedCluster, rounds: usize) -> Result<()> {
    let leader = pc.leader(&[0, 1, 2])?;
    let flapper = other(&[leader]);
    let steady = other(&[leader, flapper]);
    let name = MEMBERS[flapper];
    let five = Duration::from_secs(5);
    let (acks, max_gap) =
        pc.flap_while_writing(flapper, &[leader, steady], steady, rounds, (five, five))?;
    println!("follower {name} flapped {rounds}× (5 s / 5 s) → {acks} writes, max gap {max_gap:?}");
    assert!(
        max_gap <= MAX_GAP,
        "writes stalled {max_gap:?} while {name} flapped"
    );
    let after = pc.leader(&[leader, steady])?;
    assert_eq!(after, leader, "leadership moved while a follower flapped");
    let back = pc.wait_back(Duration::from_secs(60))?;
    println!("after the flapping, back in {back:?}");
    assert!(
        back <= BACK_GOAL * 2,
        "back after {back:?} (goal {BACK_GOAL:?})"
    );
    Ok(())
}

/// A follower cut off past the heartbeat timeout (HEARTBEAT_TIMEOUT in the list the
/// others serve), healed: how long until it is back.
fn long_cut_then_heal(pc: &mut PartitionedCluster) -> Result<Duration> {
    let leader = pc.leader(&[0, 1, 2])?;
    let follower = other(&[leader]);
    let rest: Vec<usize> = (0..MEMBERS.len()).filter(|i| *i != follower).collect();
    let (timed_out, back) = pc.cut_until_timed_out(follower, &rest)?;
    let name = MEMBERS[follower];
    println!("{name} cut off → HEARTBEAT_TIMEOUT after {timed_out:?}; healed → back in {back:?}");
    Ok(back)
}

/// A member cut off until the others list it HEARTBEAT_TIMEOUT, healed, `rounds` times
/// (alternately the curator leader's host and a follower): each time every member's
/// etcd serves a linearizable read within [`ETCD_BACK`] and all is back (3 voters,
/// HEALTHY) within 2× the goal.
fn healed_member_back_as_voter_and_healthy(
    pc: &mut PartitionedCluster,
    rounds: usize,
) -> Result<()> {
    let mut backs = Vec::new();
    for round in 0..rounds {
        let leader = pc.leader(&[0, 1, 2])?;
        let cut = if round % 2 == 0 {
            leader
        } else {
            other(&[leader])
        };
        let rest: Vec<usize> = (0..MEMBERS.len()).filter(|i| *i != cut).collect();
        let name = MEMBERS[cut];
        pc.partition.cut(name)?;
        let timed_out = e2e::wait_until("the cut-off member timed out", e2e::TIMEOUT, || {
            pc.health(&rest, cut)
                .is_ok_and(|h| h == "HEARTBEAT_TIMEOUT")
        });
        pc.partition.heal(name)?;
        timed_out?;
        let [etcd, curators, healthy, back] = pc.wait_back_parts(Duration::from_secs(60))?;
        println!(
            "heal {round} of {name}: etcd voters after {etcd:?}, curators {curators:?}, HEALTHY {healthy:?} → back (3 voters, HEALTHY) in {back:?}"
        );
        assert!(
            etcd <= ETCD_BACK,
            "{name}'s etcd followed a leader only {etcd:?} after the heal (bound {ETCD_BACK:?})"
        );
        assert!(
            back <= BACK_GOAL * 2,
            "back after {back:?} (goal {BACK_GOAL:?})"
        );
        backs.push(back);
    }
    println!("healed member back in {backs:?}");
    Ok(())
}

#[test]
fn leader_host_cut_fails_over_follower_flaps_without_a_gap_healed_node_returns() -> Result<()> {
    // POLIS_KEEP_TEST_DIR=1 keeps the nodes' logs for a look after the test.
    let (_dir, path) = match std::env::var_os("POLIS_KEEP_TEST_DIR") {
        Some(_) => (None, tempfile::tempdir()?.keep()),
        None => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().to_path_buf();
            (Some(dir), path)
        }
    };
    println!("nodes' directories: {}", path.display());
    let Some(mut pc) = setup(&path)? else {
        return Ok(());
    };
    leader_host_cut(&mut pc).context("leader host cut")?;
    follower_flaps(&mut pc, 3).context("follower flapping")?;
    let back = long_cut_then_heal(&mut pc).context("long cut")?;
    assert!(
        back <= BACK_GOAL * 2,
        "back after {back:?} (goal {BACK_GOAL:?})"
    );
    healed_member_back_as_voter_and_healthy(&mut pc, 4).context("healed member back")?;
    // No namespace outlives the cluster.
    let hub = pc.partition.hub.clone();
    drop(pc);
    let list = Command::new("ip").args(["netns", "list"]).output()?;
    assert!(!String::from_utf8_lossy(&list.stdout).contains(&hub));
    Ok(())
}
