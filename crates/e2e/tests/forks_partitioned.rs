//! No fork, ever, across a network cut (nodes in their own network namespaces, real
//! polis-node and etcd): a member cut off while the other two keep the quorum and take
//! writes is recovered by mistake (`--force`). When the cut heals, the two hold writes
//! the recovered member lacks: they stop serving (a newer epoch exists) and keep their
//! data instead of dropping it on the recovered member's learner answer; exactly one
//! cluster acknowledges writes afterwards and `cluster status` says who holds back.
//!
//! Skips (saying so) only when network namespaces cannot be created.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{PartitionedCluster, Proc, TIMEOUT, bin, wait_until};

const NODE_ARGS: [&str; 2] = ["--heartbeat-period-ms=300", "--heartbeat-timeout-ms=1500"];

#[test]
fn a_cut_off_member_recovered_by_mistake_never_wipes_the_majoritys_writes() -> Result<()> {
    match e2e::Partition::create(&["probe"]) {
        Ok(probe) => drop(probe),
        Err(e) => {
            println!("SKIPPED: network namespaces cannot be created here: {e:#}");
            return Ok(());
        }
    }
    let dir = tempfile::tempdir()?;
    let mut pc = PartitionedCluster::create(dir.path(), false, &NODE_ARGS)?;
    let within = Duration::from_secs(5);
    assert!(
        pc.write(&[0, 1, 2], 1, "before", within),
        "a write before the cut"
    );

    // n0 cut off; m1 and m2 keep the quorum and acknowledge a write n0 never sees.
    pc.partition.cut("n0")?;
    wait_until("a write through the majority", TIMEOUT, || {
        pc.write(&[1, 2], 1, "majority", Duration::from_millis(500))
    })?;

    // n0 stopped and recovered with --force: nobody answers across the cut.
    let n0 = pc.node(0);
    n0.proc().signal(libc::SIGTERM);
    n0.proc().wait_exit(TIMEOUT)?;
    let netns = n0.netns.clone().context("n0 lives in a namespace")?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &netns])
        .arg(bin("polis-node"))
        .arg("recover")
        .arg("--root")
        .arg(&n0.root)
        .arg("--force")
        .arg("--log-format=json")
        .args(NODE_ARGS);
    n0.proc = Some(Proc::spawn(
        "polis-node recover",
        cmd,
        &n0.dir.join("recover.log"),
    )?);
    // (Serving alone, behind the cut: the test reaches it once the cut heals.)
    n0.wait_for_curator()?;

    // The cut heals: m1 and m2 see the newer epoch, stop serving and keep their data.
    let kept: Vec<Vec<u8>> = [1, 2]
        .iter()
        .map(|i| std::fs::read(pc.node(*i).root.join("data/etcd/member.pb")))
        .collect::<Result<_, _>>()?;
    pc.partition.heal("n0")?;
    for i in [1, 2] {
        pc.node(i)
            .proc()
            .wait_for_line(TIMEOUT, |l| l.contains("holding back"))
            .with_context(|| format!("member {i} holds back"))?;
    }
    for (i, member) in [1usize, 2].iter().zip(kept) {
        let root = pc.node(*i).root.clone();
        assert!(
            root.join("data/etcd/data/member").is_dir(),
            "member {i}'s data (with the majority's write) is kept"
        );
        assert_eq!(std::fs::read(root.join("data/etcd/member.pb"))?, member);
    }

    // Exactly one cluster takes writes: the recovered one.
    for attempt in 0..5 {
        assert!(
            !pc.write(
                &[1, 2],
                1,
                &format!("old-{attempt}"),
                Duration::from_secs(2)
            ),
            "a write acknowledged by a member of the old epoch after the heal"
        );
    }
    wait_until("a write through the recovered member", TIMEOUT, || {
        pc.write(&[0], 1, "after-heal", Duration::from_millis(500))
    })?;
    assert_eq!(pc.label(&[0], 1)?.as_deref(), Some("after-heal"));
    let endpoints = pc.member_endpoints();
    let (ok, status) = pc.cluster.status(&endpoints)?;
    let warnings = status["warnings"].to_string();
    assert!(ok, "the recovered member has its quorum: {status}");
    assert!(!warnings.contains("TWO CLUSTERS"), "{status}");
    assert!(warnings.contains("holding back"), "{status}");
    Ok(())
}
