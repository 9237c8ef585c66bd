//! Curator leader election against a real etcd: one leader, failover within the lease
//! TTL, and no writes from a deposed leader.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use consensus::Namespaced;
use curator::election::{self, ElectionConfig, Role};
use e2e::{BareEtcd, TIMEOUT, unique_loopback};
use etcd_client::{Txn, TxnOp};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(2);

struct Campaigner {
    role: event::Value<Role>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Campaigner {
    fn start(ns: &Namespaced, name: &str) -> Campaigner {
        Campaigner::start_at(ns, name, &format!("{name}:7835"))
    }

    /// A campaigner announcing `endpoint` as its curator's.
    fn start_at(ns: &Namespaced, name: &str, endpoint: &str) -> Campaigner {
        let role = event::Value::new();
        let cancel = CancellationToken::new();
        let config = ElectionConfig {
            node_id: name.to_string(),
            endpoint: endpoint.to_string(),
            ttl: TTL,
        };
        let (ns, r, c) = (ns.clone(), role.clone(), cancel.clone());
        // Like the supervisor: campaign again after losing leadership.
        let task = tokio::spawn(async move {
            while !c.is_cancelled() {
                if election::run(&ns, &config, &r, &c, || {}).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        Campaigner { role, cancel, task }
    }

    fn leadership(&self) -> Option<election::Leadership> {
        match self.role.current() {
            Some(Role::Leader(l)) => Some(l),
            _ => None,
        }
    }
}

impl Drop for Campaigner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn etcd(dir: &std::path::Path) -> Result<(BareEtcd, Namespaced)> {
    let etcd = BareEtcd::spawn(
        dir,
        unique_loopback(),
        consensus::RaftTiming {
            heartbeat: Duration::from_millis(20),
            election_timeout: Duration::from_millis(200),
        },
    )?;
    let client = etcd.ready_client(TIMEOUT).await?;
    Ok((etcd, Namespaced::new(client, "curator")))
}

/// Waits until exactly one of `campaigners` leads; returns its index.
async fn single_leader(campaigners: &[&Campaigner], timeout: Duration) -> Result<usize> {
    let deadline = Instant::now() + timeout;
    loop {
        let leaders: Vec<usize> = (0..campaigners.len())
            .filter(|i| campaigners[*i].leadership().is_some())
            .collect();
        match leaders.as_slice() {
            [one] => return Ok(*one),
            [] => {}
            many => bail!("{} leaders at once: {many:?}", many.len()),
        }
        if Instant::now() > deadline {
            bail!("no leader within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_leader_and_handover_on_stop() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, ns) = etcd(dir.path()).await?;
    let a = Campaigner::start(&ns, "a");
    let b = Campaigner::start(&ns, "b");
    let first = single_leader(&[&a, &b], TIMEOUT).await?;
    // Stays exactly one for a while.
    for _ in 0..20 {
        assert_eq!(single_leader(&[&a, &b], TIMEOUT).await?, first);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let leader_info = election::current_leader(&ns)
        .await?
        .expect("a leader is recorded");
    assert_eq!(leader_info.node_id, ["a", "b"][first]);

    let (leader, other) = if first == 0 { (&a, &b) } else { (&b, &a) };
    let stopped = Instant::now();
    leader.cancel.cancel();
    single_leader(&[other], TIMEOUT).await?;
    let took = stopped.elapsed();
    println!("handover after a clean stop took {took:?}");
    assert!(
        took < TTL,
        "clean stop should resign, not wait out the TTL ({took:?})"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_is_replaced_within_the_ttl() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, ns) = etcd(dir.path()).await?;
    let a = Campaigner::start(&ns, "a");
    let b = Campaigner::start(&ns, "b");
    let first = single_leader(&[&a, &b], TIMEOUT).await?;
    let (leader, other) = if first == 0 { (a, b) } else { (b, a) };
    // Abort without resigning or revoking: like kill -9, the lease must expire.
    let killed = Instant::now();
    drop(leader);
    single_leader(&[&other], TIMEOUT).await?;
    let took = killed.elapsed();
    println!("failover after the leader was killed took {took:?} (TTL {TTL:?})");
    assert!(
        took <= TTL + Duration::from_millis(1500),
        "failover took {took:?}"
    );
    Ok(())
}

/// A leader whose curator endpoint refuses connections (as while its listener restarts)
/// but whose keepalives reach etcd keeps leading: followers revoke a leader's lease only
/// on etcd's evidence that it is gone (issue 16), not on refused connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_listener_refuses_keeps_leading() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, ns) = etcd(dir.path()).await?;
    let refusing = || -> Result<String> {
        let ip = unique_loopback();
        // Nothing listens on a loopback address's free port: connections are refused.
        let port = std::net::TcpListener::bind((ip, 0))?.local_addr()?.port();
        Ok(format!("{ip}:{port}"))
    };
    let a = Campaigner::start_at(&ns, "a", &refusing()?);
    let b = Campaigner::start_at(&ns, "b", &refusing()?);
    let first = single_leader(&[&a, &b], TIMEOUT).await?;
    let campaigners = [&a, &b];
    let held = campaigners[first].leadership();
    // Watch for three TTLs (a refusal-based revocation took ~450 ms).
    let until = Instant::now() + 3 * TTL;
    while Instant::now() < until {
        let now = campaigners[first].leadership();
        assert_eq!(now, held, "leadership moved away from a live leader");
        assert!(campaigners[1 - first].leadership().is_none());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposed_leader_cannot_write() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, ns) = etcd(dir.path()).await?;
    let a = Campaigner::start(&ns, "a");
    single_leader(&[&a], TIMEOUT).await?;
    let old = a.leadership().expect("a leads");
    let write = |v: &'static str| Txn::new().and_then([TxnOp::put(ns.key("probe"), v, None)]);
    election::leader_txn(&ns, &old, write("while leader")).await?;

    // Depose a without telling it: its lease disappears, b takes over.
    let b = Campaigner::start(&ns, "b");
    ns.client().lease_revoke(old.lease).await?;
    let deadline = Instant::now() + TIMEOUT;
    while b.leadership().is_none() {
        assert!(Instant::now() < deadline, "b never became leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let result = election::leader_txn(&ns, &old, write("after deposition")).await;
    assert!(
        matches!(result, Err(curator::CuratorError::NotLeader)),
        "{result:?}"
    );
    assert_eq!(
        ns.get("probe").await?.as_deref(),
        Some(&b"while leader"[..])
    );
    let new = b.leadership().expect("b leads");
    election::leader_txn(&ns, &new, write("new leader")).await?;
    assert_eq!(ns.get("probe").await?.as_deref(), Some(&b"new leader"[..]));
    Ok(())
}
