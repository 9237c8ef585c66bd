//! One stranger cannot hurt the cluster through its audit log (issue 25), with real
//! polis-node processes and real etcd on 127.x addresses:
//!
//! - a flood of RegisterNode calls, each with a throwaway self-signed key and one
//!   60 000-byte label key of control characters, grows etcd's database by at most
//!   [`DB_GROWTH_BOUND`] (before: ~350 KB per call), and `cluster audit` still works;
//! - the owner's entry written before a flood of refused calls (UnlockData and
//!   CommitNode with self-signed keys, from one address and from many; Management
//!   calls with a worker's certificate) is still there after it, with a log bound
//!   the flood would have overrun many times;
//! - `cluster audit` and `node list` answer with 10 000 audit entries and 1 000 nodes of
//!   128 labels each (~6 MB and ~17 MB: both beyond what one etcd or gRPC answer may
//!   carry), also right after a restart (the node watch's first read, the writer's
//!   measure of the log). Those are written straight into etcd through the node's
//!   socket: the point is the read path, and the API would take minutes to write them.
//!
//! Every flood is bounded in calls and each wait in time.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::{Cluster, TIMEOUT, unique_loopback, wait_until};
use etcd_client::{Txn, TxnOp};
use prost::Message;
use proto::api;
use serde_json::Value;

/// Most etcd's database (in use) may grow through the label-key flood.
const DB_GROWTH_BOUND: i64 = 256 << 10;
/// The label-key flood: sources, and calls from each (under the per-source burst of 20).
const FLOOD_SOURCES: usize = 4;
const CALLS_PER_SOURCE: usize = 15;
/// The refused-call flood: calls of each kind, and sources making one call each.
const REFUSED_CALLS: usize = 300;
const MANY_SOURCES: usize = 250;
/// The audit log bound of the refused-call flood's cluster (the flood makes 1 150
/// refused calls).
const SMALL_BOUND: usize = 200;
/// The read path at size.
const AUDIT_ENTRIES: usize = 10_000;
const NODES: usize = 1_000;
const LABELS: usize = 128;

fn block<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    tokio::task::block_in_place(f)
}

/// `cluster audit -o json`: one entry per line, oldest first.
fn audit(cluster: &Cluster) -> Result<Vec<Value>> {
    let out = cluster.ctl_retry(&["cluster", "audit", "-o", "json"])?;
    out.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l:.200}")))
        .collect()
}

fn method(entry: &Value) -> &str {
    entry["method"]
        .as_str()
        .and_then(|m| m.rsplit('/').next())
        .unwrap_or("")
}

/// The calls an entry stands for (entries of polisctl before counting say nothing).
fn calls(entry: &Value) -> u64 {
    entry["count"].as_u64().unwrap_or(1).max(1)
}

/// The curator's endpoint and the trust a client pins (the cluster CA).
fn curator(cluster: &Cluster) -> Result<(SocketAddr, rpc::ServerTrust)> {
    let ca = std::fs::read(cluster.first.root.join("data/node/ca.der"))?;
    Ok((
        SocketAddr::new(cluster.first.address, rpc::CURATOR_PORT),
        rpc::ServerTrust::PinnedCa(ca),
    ))
}

/// A channel with a fresh self-signed key, from `source`.
async fn throwaway(cluster: &Cluster, source: IpAddr) -> Result<tonic::transport::Channel> {
    let (endpoint, trust) = curator(cluster)?;
    let key = identity::NodeKey::generate()?;
    let slot = rpc::CredentialSlot::new(rpc::self_signed(&key)?)?;
    Ok(rpc::connect_from(endpoint, &trust, Some(&slot), Some(source)).await?)
}

/// etcd's database size in use, as its member reports it.
async fn db_in_use(cluster: &Cluster) -> Result<i64> {
    let mut client = consensus::connect_unix(&cluster.first.socket()).await?;
    Ok(consensus::maintenance::status(&mut client)
        .await?
        .db_size_in_use)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_key_flood_through_register_node_stays_small() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = block(|| Cluster::bootstrap(dir.path()))?;
    let before = db_in_use(&cluster).await?;
    let label = "\u{1}".repeat(60_000);
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..FLOOD_SOURCES {
        let source = unique_loopback();
        for _ in 0..CALLS_PER_SOURCE {
            let channel = throwaway(&cluster, source).await?;
            let answer = api::curator_client::CuratorClient::new(channel)
                .register_node(api::RegisterNodeRequest {
                    register_ticket: b"not-a-ticket".to_vec(),
                    address: source.to_string(),
                    labels: [(label.clone(), "v".to_string())].into(),
                    ..Default::default()
                })
                .await;
            answers.push(answer.map(drop));
        }
    }
    let flood = started.elapsed();

    // Every call accounted for (counted per source: the entries come when their windows
    // close), or etcd already grew past the bound.
    let total = FLOOD_SOURCES * CALLS_PER_SOURCE;
    let runtime = tokio::runtime::Handle::current();
    let (mut entries, mut grown) = (Vec::new(), 0);
    block(|| {
        wait_until(
            "the refused registrations in the audit log",
            TIMEOUT,
            || {
                grown = runtime.block_on(db_in_use(&cluster)).unwrap_or(0) - before;
                if grown > DB_GROWTH_BOUND {
                    return true;
                }
                entries = audit(&cluster).unwrap_or_default();
                let counted: u64 = entries
                    .iter()
                    .filter(|e| method(e) == "RegisterNode" && e["code_name"] == "InvalidArgument")
                    .map(calls)
                    .sum();
                counted >= total as u64
            },
        )
    })?;
    let refused: Vec<&Value> = entries
        .iter()
        .filter(|e| method(e) == "RegisterNode" && e["code_name"] == "InvalidArgument")
        .collect();
    eprintln!(
        "{total} calls in {flood:?}; etcd in use {before} -> {} bytes ({grown:+}); {} entries",
        before + grown,
        refused.len()
    );
    assert!(grown <= DB_GROWTH_BOUND, "etcd grew by {grown} bytes");
    for answer in answers {
        let refusal = answer.expect_err("a bad label key registered");
        assert_eq!(refusal.code(), tonic::Code::InvalidArgument, "{refusal:?}");
        // The key is named cut, with its length, never echoed whole.
        let message = refusal.message();
        assert!(message.len() < 1024, "{}", message.len());
        assert!(message.contains("(60000 bytes)"), "{message:.300}");
    }
    assert!(
        refused.len() <= FLOOD_SOURCES,
        "one entry per source: {}",
        refused.len()
    );
    for e in &refused {
        assert!(
            e["message"].as_str().unwrap_or("").len() <= 1024,
            "{e:.300}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owners_entry_survives_a_flood_of_refused_calls() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = block(|| {
        Cluster::bootstrap_with(
            dir.path(),
            &["--audit-max-entries", &SMALL_BOUND.to_string()],
            &[],
        )
    })?;
    let first_id = block(|| cluster.first.key_node_id())?;
    let (worker_node, worker) = block(|| {
        let params = cluster.register_params("w1")?;
        cluster.add_worker("w1", &params)
    })?;
    block(|| cluster.ctl_retry(&["node", "label", &first_id, "owner=before-the-flood"]))?;
    let owners = block(|| audit(&cluster))?
        .into_iter()
        .rev()
        .find(|e| method(e) == "UpdateNodeLabels" && e["identity_kind"] == "owner")
        .context("no entry of the owner's label")?;
    let started = Instant::now();

    // Self-signed, one address, one connection: UnlockData and CommitNode, all refused
    // (past the per-source burst as ResourceExhausted, before the audit layer).
    let channel = throwaway(&cluster, unique_loopback()).await?;
    let mut unlock = api::data_unlock_client::DataUnlockClient::new(channel.clone());
    let mut commit = api::curator_client::CuratorClient::new(channel);
    for _ in 0..REFUSED_CALLS {
        unlock
            .unlock_data(api::UnlockDataRequest {})
            .await
            .expect_err("a stranger unlocked data");
        commit
            .commit_node(api::CommitNodeRequest {})
            .await
            .expect_err("a stranger committed");
    }
    // Self-signed from many addresses, one call each.
    for _ in 0..MANY_SOURCES {
        api::data_unlock_client::DataUnlockClient::new(
            throwaway(&cluster, unique_loopback()).await?,
        )
        .unlock_data(api::UnlockDataRequest {})
        .await
        .expect_err("a stranger unlocked data");
    }
    // A worker's certificate: Management calls, refused by the permission table.
    let worker_creds = rpc::Credentials {
        certificate: std::fs::read(worker_node.root.join("data/node/cert.der"))?,
        key_pkcs8: std::fs::read(worker_node.root.join("data/node/key.der"))?,
    };
    let (endpoint, trust) = curator(&cluster)?;
    let mut management = api::management_client::ManagementClient::new(
        rpc::connect(endpoint, &trust, Some(&worker_creds)).await?,
    );
    for _ in 0..REFUSED_CALLS {
        let denied = management
            .approve_node(api::ApproveNodeRequest {
                id: first_id.clone(),
            })
            .await
            .expect_err("a worker approved a node");
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    }
    let flood = started.elapsed();

    // Once the worker's calls are accounted for (or the owner's entry is gone) and the
    // log is back within its bound, the owner's entry is still there.
    let mut entries = Vec::new();
    block(|| {
        wait_until("the flood accounted for, within the bound", TIMEOUT, || {
            entries = audit(&cluster).unwrap_or_default();
            let workers: u64 = entries
                .iter()
                .filter(|e| method(e) == "ApproveNode" && e["identity"] == worker.as_str())
                .map(calls)
                .sum();
            let owners_kept = entries.iter().any(|e| e["key"] == owners["key"]);
            !entries.is_empty()
                && entries.len() <= SMALL_BOUND
                && (workers >= REFUSED_CALLS as u64 || !owners_kept)
        })
    })?;
    eprintln!(
        "{} refused calls in {flood:?}; {} entries kept",
        3 * REFUSED_CALLS + MANY_SOURCES,
        entries.len()
    );
    assert!(
        entries.iter().any(|e| e["key"] == owners["key"]),
        "the owner's entry was pushed out: {owners}"
    );
    let strangers = entries
        .iter()
        .filter(|e| e["identity_kind"] == "self-signed")
        .count();
    assert!(strangers < SMALL_BOUND, "{strangers}");
    Ok(())
}

/// `n` node records of `LABELS` labels (keys and values of the longest length), as
/// `(key, value)` for etcd: state NEW, so no curator runnable acts on them.
fn synthetic_nodes(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let id = format!("polis-{i:032x}");
            let labels = (0..LABELS)
                .map(|j| (format!("k{j:03}{}", "k".repeat(59)), "v".repeat(63)))
                .collect();
            let node = proto::state::Node {
                id: id.clone(),
                public_key: vec![7; 32],
                state: proto::state::NodeState::New as i32,
                address: format!("127.254.{}.{}", i / 250, 1 + i % 250),
                labels,
                ..Default::default()
            };
            (
                consensus::client::namespace_prefix("curator") + &curator::layout::node_key(&id),
                node.encode_to_vec(),
            )
        })
        .collect()
}

/// `n` audit entries of about 560 bytes each, an hour old (they sort before the live
/// ones), as `(key, value)` for etcd.
fn synthetic_entries(n: usize) -> Vec<(String, Vec<u8>)> {
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
        - 3_600_000_000;
    (0..n)
        .map(|i| {
            let key = curator::audit::entry_key(start + i as u64, i as u64, "polis-synthetic");
            let entry = api::AuditEntry {
                key: key.clone(),
                time_unix_micros: start + i as u64,
                identity_kind: "node".into(),
                identity: format!("polis-{:032x}", i % 100),
                source_address: "127.254.0.1:40000".into(),
                curator: "polis-synthetic".into(),
                method: "/polis.api.Curator/RenewCertificates".into(),
                target: format!("polis-{:032x}", i % 100),
                code: 9,
                code_name: "FailedPrecondition".into(),
                message: "x".repeat(350),
                ..Default::default()
            };
            (
                consensus::client::namespace_prefix("curator") + &key,
                entry.encode_to_vec(),
            )
        })
        .collect()
}

/// Puts every `(key, value)` through the node's etcd socket, `per_txn` at a time.
async fn put_all(cluster: &Cluster, kvs: Vec<(String, Vec<u8>)>, per_txn: usize) -> Result<()> {
    let mut client = consensus::connect_unix(&cluster.first.socket()).await?;
    for chunk in kvs.chunks(per_txn) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|(k, v)| TxnOp::put(k.as_str(), v.clone(), None))
            .collect();
        client.txn(Txn::new().and_then(ops)).await?;
    }
    Ok(())
}

/// `node list` and `cluster audit` at size: (nodes listed, entries read, each's time).
fn read_at_size(cluster: &Cluster) -> Result<(Vec<Value>, Vec<Value>, Duration, Duration)> {
    let started = Instant::now();
    let out = cluster.ctl_retry(&["node", "list", "-o", "json"])?;
    let listed = started.elapsed();
    let nodes: Vec<Value> = serde_json::from_str(&out).context("node list JSON")?;
    let started = Instant::now();
    let entries = audit(cluster)?;
    Ok((nodes, entries, listed, started.elapsed()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_and_node_list_read_at_full_size() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Room for every entry: this test is about reading them.
    let mut cluster =
        block(|| Cluster::bootstrap_with(dir.path(), &["--audit-max-entries", "20000"], &[]))?;
    let started = Instant::now();
    // ~17 KiB a record: 50 a transaction stay under etcd's 1.5 MiB request limit.
    put_all(&cluster, synthetic_nodes(NODES), 50).await?;
    put_all(&cluster, synthetic_entries(AUDIT_ENTRIES), 100).await?;
    eprintln!(
        "wrote {NODES} nodes and {AUDIT_ENTRIES} entries in {:?}",
        started.elapsed()
    );

    let check = |nodes: &[Value], entries: &[Value]| -> Result<()> {
        assert_eq!(nodes.len(), NODES + 1, "nodes listed");
        let synthetic = nodes
            .iter()
            .filter(|n| {
                n["id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("polis-0000"))
            })
            .collect::<Vec<_>>();
        assert_eq!(synthetic.len(), NODES);
        for n in synthetic {
            let labels: BTreeMap<String, Value> =
                serde_json::from_value(n["labels"].clone()).context("labels")?;
            assert_eq!(labels.len(), LABELS, "{:.200}", n.to_string());
        }
        assert!(entries.len() > AUDIT_ENTRIES, "{} entries", entries.len());
        let keys: Vec<&str> = entries.iter().filter_map(|e| e["key"].as_str()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "entries out of order");
        Ok(())
    };
    let (nodes, entries, listed, read) = block(|| read_at_size(&cluster))?;
    eprintln!("node list {listed:?}, cluster audit {read:?}");
    check(&nodes, &entries)?;

    // After a restart: the curator's node snapshot starts with a read of every record,
    // the audit writer with a read of every entry.
    block(|| {
        cluster.first.stop_cleanly()?;
        cluster.first.start(&[])?;
        cluster.first.wait_home()
    })?;
    let (nodes, entries, listed, read) = block(|| read_at_size(&cluster))?;
    eprintln!("after a restart: node list {listed:?}, cluster audit {read:?}");
    check(&nodes, &entries)?;
    Ok(())
}
