//! A change and its audit entry commit together, against a real etcd: every change an
//! audited call commits writes exactly one entry, in the change's own transaction; a
//! change refused (by its rules or by a transaction guard) writes none and hands the
//! entry back to the call; writes outside a call carry none.
//!
//! The curator's write paths (`curator::writes`) run here inside
//! `rpc::server::run_in_call`, as the audit layer runs a handler.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use consensus::Namespaced;
use curator::election::{self, ElectionConfig, Leadership, Role};
use curator::writes::{self, Created};
use e2e::{BareEtcd, TIMEOUT, unique_loopback};
use etcd_client::GetOptions;
use prost::Message;
use proto::api::AuditEntry;
use proto::state::Node;
use rpc::server::{AuditCall, CallInProgress, run_in_call};
use tokio_util::sync::CancellationToken;

const AUDIT_PREFIX: &str = "namespaced:curator/audit/";

fn call(method: &str) -> Arc<CallInProgress> {
    Arc::new(CallInProgress::new(
        AuditCall {
            method: method.to_string(),
            identity: None,
            certificate: None,
            peer: None,
            request: Default::default(),
            code: 0,
            message: String::new(),
            entry_key: None,
        },
        "curator-under-test".into(),
    ))
}

async fn entries(ns: &Namespaced) -> Result<Vec<AuditEntry>> {
    let response = ns
        .client()
        .get(AUDIT_PREFIX, Some(GetOptions::new().with_prefix()))
        .await?;
    response
        .kvs()
        .iter()
        .map(|kv| AuditEntry::decode(kv.value()).context("decoding an audit entry"))
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn leader(ns: &Namespaced) -> Result<(Leadership, CancellationToken)> {
    let role = event::Value::new();
    let cancel = CancellationToken::new();
    let config = ElectionConfig {
        node_id: "curator-under-test".into(),
        endpoint: "127.0.0.1:7835".into(),
        ttl: Duration::from_secs(10),
    };
    let (ns2, r, c) = (ns.clone(), role.clone(), cancel.clone());
    tokio::spawn(async move {
        let _ = election::run(&ns2, &config, &r, &c, || {}).await;
    });
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(Role::Leader(l)) = role.current() {
            return Ok((l, cancel));
        }
        if std::time::Instant::now() > deadline {
            bail!("no leadership within {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn new_node(id: &str) -> Node {
    Node {
        id: id.to_string(),
        public_key: vec![7; 32],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_change_has_exactly_one_entry_and_a_refused_one_none() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let etcd = BareEtcd::spawn(
        dir.path(),
        unique_loopback(),
        consensus::RaftTiming {
            heartbeat: Duration::from_millis(20),
            election_timeout: Duration::from_millis(200),
        },
    )?;
    let ns = Namespaced::new(etcd.ready_client(TIMEOUT).await?, "curator");
    let (leadership, _cancel) = leader(&ns).await?;

    // A registration: the record and its entry, one transaction.
    let registering = call("/polis.api.Curator/RegisterNode");
    let created = run_in_call(
        registering.clone(),
        writes::create_node(&ns, &leadership, new_node("node-a"), vec![], vec![]),
    )
    .await?;
    ensure!(matches!(created, Created::New(_)), "{created:?}");
    ensure!(
        registering.is_recorded(),
        "the registration carried its entry"
    );
    let found = entries(&ns).await?;
    ensure!(found.len() == 1, "{found:?}");
    ensure!(found[0].method == "/polis.api.Curator/RegisterNode" && found[0].code == 0);
    ensure!(found[0].curator == "curator-under-test", "{:?}", found[0]);

    // The same registration again: nothing created, no entry, the call keeps its entry.
    let again = call("/polis.api.Curator/RegisterNode");
    let created = run_in_call(
        again.clone(),
        writes::create_node(&ns, &leadership, new_node("node-a"), vec![], vec![]),
    )
    .await?;
    ensure!(matches!(created, Created::Exists), "{created:?}");
    ensure!(
        !again.is_recorded() && again.claim(),
        "the entry is the call's again"
    );
    ensure!(entries(&ns).await?.len() == 1);

    // Sixteen label changes at once, each its own call: combined into few
    // transactions, each change with its entry.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (ns, leadership) = (ns.clone(), leadership.clone());
        let labelled = call("/polis.api.Management/UpdateNodeLabels");
        tasks.push(tokio::spawn(async move {
            let written = run_in_call(
                labelled.clone(),
                writes::update_node_labels(
                    &ns,
                    &leadership,
                    "node-a",
                    &labels(&[(&format!("k{i}"), "v")]),
                    &[],
                ),
            )
            .await;
            (written.map(|_| ()), labelled.is_recorded())
        }));
    }
    for task in tasks {
        let (written, recorded) = task.await?;
        written?;
        ensure!(recorded, "every committed label change carried its entry");
    }
    let record = curator::records::load_node(&ns, "node-a")
        .await?
        .context("node-a")?;
    ensure!(record.labels.len() == 16, "{:?}", record.labels);
    let found = entries(&ns).await?;
    ensure!(found.len() == 17, "{} entries", found.len());
    let keys: std::collections::HashSet<_> = found.iter().map(|e| e.key.clone()).collect();
    ensure!(keys.len() == 17, "every entry has a key of its own");

    // Refused by its rules (a label on a node that does not exist): no entry.
    let refused = call("/polis.api.Management/UpdateNodeLabels");
    let result = run_in_call(
        refused.clone(),
        writes::update_node_labels(&ns, &leadership, "nobody", &labels(&[("a", "b")]), &[]),
    )
    .await;
    ensure!(result.is_err(), "{result:?}");
    ensure!(!refused.is_recorded() && refused.claim());
    ensure!(entries(&ns).await?.len() == 17);

    // Refused by its transaction's guard (a leadership that is not etcd's): no change,
    // no entry.
    let deposed = Leadership {
        revision: leadership.revision + 1_000,
        ..leadership.clone()
    };
    let guarded = call("/polis.api.Management/UpdateNodeLabels");
    let result = run_in_call(
        guarded.clone(),
        writes::update_node_labels(&ns, &deposed, "node-a", &labels(&[("x", "y")]), &[]),
    )
    .await;
    ensure!(result.is_err(), "a deposed leader's write: {result:?}");
    ensure!(!guarded.is_recorded() && guarded.claim());
    let record = curator::records::load_node(&ns, "node-a")
        .await?
        .context("node-a")?;
    ensure!(!record.labels.contains_key("x"));
    ensure!(entries(&ns).await?.len() == 17);

    // A label change that changes nothing writes nothing, and no entry.
    let unchanged = call("/polis.api.Management/UpdateNodeLabels");
    run_in_call(
        unchanged.clone(),
        writes::update_node_labels(&ns, &leadership, "node-a", &labels(&[("k0", "v")]), &[]),
    )
    .await?;
    ensure!(!unchanged.is_recorded());
    ensure!(entries(&ns).await?.len() == 17);

    // A call that makes two changes: one entry, with the first.
    let twice = call("/polis.api.Management/UpdateNodeLabels");
    run_in_call(twice.clone(), async {
        writes::update_node_labels(&ns, &leadership, "node-a", &labels(&[("t", "1")]), &[]).await?;
        writes::update_node_labels(&ns, &leadership, "node-a", &labels(&[("t", "2")]), &[]).await
    })
    .await?;
    ensure!(twice.is_recorded());
    ensure!(entries(&ns).await?.len() == 18);

    // A change whose transaction committed while its handler learnt only of an error
    // (etcd away after the commit), then a second change of the same call: its entry
    // goes under the call's one key, over the first. One call, one entry.
    let uncertain = call("/polis.api.Management/UpdateNodeLabels");
    run_in_call(uncertain.clone(), async {
        let carried = writes::carried::Carried::take(&ns).context("the call's entry")?;
        let node = curator::records::load_node(&ns, "node-a")
            .await?
            .context("node-a")?;
        let mut changed = node.clone();
        changed.labels.insert("u".into(), "1".into());
        ns.client()
            .txn(etcd_client::Txn::new().and_then([
                etcd_client::TxnOp::put(
                    ns.key(&curator::layout::node_key("node-a")),
                    changed.encode_to_vec(),
                    None,
                ),
                carried.op(),
            ]))
            .await?;
        // Not marked committed: what a handler that saw an error does.
        drop(carried);
        writes::update_node_labels(&ns, &leadership, "node-a", &labels(&[("u", "2")]), &[]).await?;
        anyhow::Ok(())
    })
    .await?;
    ensure!(uncertain.is_recorded());
    let found = entries(&ns).await?;
    ensure!(
        found.len() == 19,
        "one entry for the call, not two: {}",
        found.len()
    );
    let key = uncertain.entry_key().context("a key")?;
    ensure!(found.iter().filter(|e| e.key == key).count() == 1);

    // A write outside any call (a runnable's) carries no entry.
    writes::update_node_labels(&ns, &leadership, "node-a", &labels(&[("bg", "1")]), &[]).await?;
    ensure!(entries(&ns).await?.len() == 19);

    // A deletion: the record goes, a tombstone stays, and one entry.
    let deleting = call("/polis.api.Management/DeleteNode");
    run_in_call(
        deleting.clone(),
        writes::delete_node(&ns, &leadership, "node-a"),
    )
    .await?;
    ensure!(deleting.is_recorded());
    let found = entries(&ns).await?;
    ensure!(found.len() == 20);
    ensure!(
        found
            .iter()
            .filter(|e| e.method == "/polis.api.Management/DeleteNode")
            .count()
            == 1
    );
    Ok(())
}
