//! `consensus::membership` against a real etcd (Debian's 3.4): how promotion reads
//! etcd's refusals. A voter counts as promoted and an unknown member as gone, both at
//! once; a learner that is not in sync is retried until the patience runs out, although
//! etcd's answer for it starts with the same words as the one for a voter.

use std::time::{Duration, Instant};

use anyhow::Result;
use consensus::membership::{self, PromoteError};
use e2e::{BareEtcd, TIMEOUT, unique_loopback};

/// What the curator gives a joining learner (its promotion holds the membership lock).
const PATIENCE: Duration = Duration::from_secs(30);

/// A refusal that is final must end the call this much before the patience would.
const PROMPT: Duration = Duration::from_secs(5);

async fn etcd(dir: &std::path::Path) -> Result<(BareEtcd, etcd_client::Client)> {
    let etcd = BareEtcd::spawn(
        dir,
        unique_loopback(),
        consensus::RaftTiming {
            heartbeat: Duration::from_millis(20),
            election_timeout: Duration::from_millis(200),
        },
    )?;
    let client = etcd.ready_client(TIMEOUT).await?;
    Ok((etcd, client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_reads_etcds_refusals() -> Result<()> {
    // Before: etcd's answer to a voter ("can only promote a learner member") was not
    // recognised, so promoting one retried for the whole patience (30 s).
    let dir = tempfile::tempdir()?;
    let (_etcd, mut client) = etcd(dir.path()).await?;
    let members = membership::members(&mut client).await?;
    let [voter] = members.as_slice() else {
        anyhow::bail!("expected one member: {members:?}");
    };
    assert!(!voter.is_learner);

    let started = Instant::now();
    membership::promote_when_in_sync(&mut client, voter.id, PATIENCE).await?;
    let took = started.elapsed();
    println!("promoting the voter answered in {took:?}");
    assert!(took < PROMPT, "promoting a voter took {took:?}");

    let unknown = voter.id ^ 0x5a5a;
    let started = Instant::now();
    let outcome = membership::promote_when_in_sync(&mut client, unknown, PATIENCE).await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(PromoteError::Gone(id)) if id == unknown),
        "{outcome:?}"
    );
    assert!(took < PROMPT, "promoting an unknown member took {took:?}");

    // A learner that never starts is never in sync: retried, not taken for a voter.
    let nowhere = consensus::config::peer_url(unique_loopback(), consensus::config::PEER_PORT);
    let (learner, _) = membership::add_learner(&mut client, &nowhere).await?;
    let patience = Duration::from_secs(1);
    let started = Instant::now();
    let outcome = membership::promote_when_in_sync(&mut client, learner.id, patience).await;
    let took = started.elapsed();
    match outcome {
        Err(PromoteError::TimedOut { id, last, .. }) => {
            assert_eq!(id, learner.id);
            assert!(last.contains("in sync with leader"), "{last}");
        }
        other => panic!("an unstarted learner was promoted: {other:?}"),
    }
    // It stops early rather than sleep past its deadline: by at most its longest pause
    // (250 ms).
    assert!(
        took >= patience / 2 && took < PROMPT,
        "gave up after {took:?}"
    );
    let members = membership::members(&mut client).await?;
    assert!(
        members.iter().any(|m| m.id == learner.id && m.is_learner),
        "{members:?}"
    );
    Ok(())
}
