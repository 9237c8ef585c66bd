//! A member's etcd data after kill -9: its database lags the write-ahead log, and the
//! revision a decision to drop the data compares must count the log (issue 35, item 3).
//!
//! Real etcd 3.4, alone on a unique loopback address, with its backend batch stretched
//! (`--backend-batch-interval 1h`) so that nothing it acknowledges reaches the database
//! before the kill: the widest form of the 100 ms window every unclean stop has.

use anyhow::{Context as _, Result};
use e2e::{BareEtcd, TIMEOUT, unique_loopback};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use proto::config::ClusterEpoch;

/// `etcdctl snapshot status`'s revision of a database file: the measure a member used
/// before (`node::member::epochs::data_revision` read only this).
fn status_revision(db: &std::path::Path) -> Result<i64> {
    let output = std::process::Command::new("/usr/bin/etcdctl")
        .args(["snapshot", "status"])
        .arg(db)
        .args(["-w", "json"])
        .env("ETCDCTL_API", "3")
        .output()
        .context("running etcdctl snapshot status")?;
    anyhow::ensure!(
        output.status.success(),
        "etcdctl snapshot status: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    value["revision"]
        .as_i64()
        .context("snapshot status named no revision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_only_the_log_holds_after_kill_9_are_counted_before_any_drop() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stretched = [
        "--backend-batch-interval",
        "1h",
        "--backend-batch-limit",
        "1000000",
    ];
    let mut etcd = BareEtcd::spawn_with(
        dir.path(),
        unique_loopback(),
        consensus::RaftTiming::default(),
        &stretched,
    )?;
    let mut client = etcd.ready_client(TIMEOUT).await?;
    // A first write the database holds (a defragmentation commits the backend): the
    // member's data is not empty, as no member's is.
    client.put("base", "v", None).await?;
    client.defragment().await?;
    // Writes, and requests that leave the key space alone between them: a lease grant,
    // a read-only transaction, one whose compare fails (its other branch would write),
    // one whose branch writes.
    let mut acknowledged = 0;
    for i in 0..20 {
        acknowledged = client
            .put(format!("k{i}"), "v", None)
            .await?
            .header()
            .context("a put without header")?
            .revision();
    }
    let lease = client.lease_grant(60, None).await?.id();
    client
        .put("leased", "v", Some(PutOptions::new().with_lease(lease)))
        .await?;
    let failed = Txn::new()
        .when([Compare::value("k0", CompareOp::Equal, "other")])
        .and_then([TxnOp::put("never", "v", None)])
        .or_else([TxnOp::get("k0", None)]);
    client.txn(failed).await?;
    let read_only = Txn::new()
        .when([Compare::value("k0", CompareOp::Equal, "v")])
        .and_then([TxnOp::get("k1", None)])
        .or_else([TxnOp::get("k2", None)]);
    client.txn(read_only).await?;
    let written = Txn::new()
        .when([Compare::value("k0", CompareOp::Equal, "v")])
        .and_then([TxnOp::put("k0", "w", None)]);
    acknowledged = acknowledged.max(
        client
            .txn(written)
            .await?
            .header()
            .context("a txn without header")?
            .revision(),
    );
    assert_eq!(
        acknowledged, 24,
        "base, 20 puts, the leased put and one written txn"
    );
    drop(client);
    etcd.proc.signal(libc::SIGKILL);
    etcd.proc.wait_exit(TIMEOUT)?;

    let data_dir = etcd.config.data_dir.clone();
    let db = data_dir.join("member").join("snap").join("db");
    let applied = status_revision(&db)?;
    let unapplied = consensus::ondisk::unapplied(&data_dir)?;
    println!(
        "acknowledged {acknowledged}; database {applied} (consistent index {}); log to {}, \
         {} writes not applied",
        unapplied.consistent_index, unapplied.last_logged_index, unapplied.writes
    );
    // What was seen failing: the database alone takes this member for one that holds
    // nothing past its first write, so a chain whose recover promised revision `applied`
    // lets it drop 22 acknowledged writes.
    assert_eq!(applied, 2, "the database holds the first write only");
    assert!(
        applied < acknowledged,
        "the database was expected to lag the log (applied {applied}, acknowledged {acknowledged})"
    );
    let parent = ClusterEpoch::default();
    let child = proto::epoch::successor(&parent, 1, "recovering-node", "recover", applied);
    // The chain in etcd: the epochs after the bootstrap's.
    let chain = vec![child];
    assert!(proto::epoch::may_drop(&parent, applied, &chain).is_ok());
    // Counted with the log: never below what the member acknowledged, so the same chain
    // makes it keep its data.
    let bound = applied + unapplied.writes as i64;
    assert!(
        bound >= acknowledged,
        "bound {bound} below the acknowledged revision {acknowledged}"
    );
    assert!(proto::epoch::may_drop(&parent, bound, &chain).is_err());

    // etcd replays the log on its next start: the writes were there. A clean stop then
    // commits them, and the database's own measure agrees with the bound but for the
    // transaction whose compare failed: a reader of files cannot evaluate a compare, so a
    // transaction with a write in either branch counts (an upper bound). The lease grant
    // and the read-only transaction were not counted.
    let mut etcd = BareEtcd::start(dir.path(), etcd.config.clone(), &[])?;
    let mut client = etcd.ready_client(TIMEOUT).await?;
    let replayed = client
        .get("k0", None)
        .await?
        .header()
        .context("a get without header")?
        .revision();
    assert_eq!(replayed, acknowledged, "etcd replayed what it acknowledged");
    drop(client);
    etcd.proc.signal(libc::SIGTERM);
    etcd.proc.wait_exit(TIMEOUT)?;
    let after = status_revision(&db)?;
    assert_eq!(after, acknowledged);
    assert_eq!(
        bound,
        after + 1,
        "the bound counted the log's writes and the failed transaction ({} not applied)",
        unapplied.writes
    );
    let settled = consensus::ondisk::unapplied(&data_dir)?;
    assert_eq!(
        settled.writes, 0,
        "a clean stop leaves nothing unapplied: {settled:?}"
    );
    Ok(())
}
