//! Polis's nodes carried into Kubernetes' Nodes: one node, one name.
//!
//! ```text
//!   node records (watched, from the local etcd member) ─┐
//!   kubectl get nodes (polis-node's own credential) ────┴─▶ plan (pure) ─▶ kubectl
//!      a worker's Node: its Polis labels as polis.dev/KEY=VALUE (set, changed, removed)
//!      a Node no UP worker holds: cordoned, its pods evicted, the Node deleted
//! ```
//! Runs on every controller (`root.role.kubernetes.nodesync`): each act is idempotent,
//! so controllers acting at once agree. Labels go one way, Polis → Kubernetes: a
//! `polis.dev/` label set on a Node by hand (or by its kubelet) is put back within a
//! pass (on every change of the records, and every 30 s). A Node is removed only after
//! a fresh quorum read of its record (`still_a_worker`) says it is not a worker's: a
//! record watch a moment behind the Node's registration never removes it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Layout;
use crate::tokenreview::KubeletCheck;

/// The prefix of the labels Polis keeps on Nodes.
pub const LABEL_PREFIX: &str = "polis.dev/";
/// How often a pass runs without a change of the records (labels changed by hand are
/// put back).
pub const RESYNC: Duration = Duration::from_secs(30);

/// A node as Polis's records say (for this sync).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolisNode {
    pub id: String,
    /// UP and holding KubernetesWorker.
    pub worker: bool,
    pub labels: BTreeMap<String, String>,
}

/// A Node as the apiserver lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// One change to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `kubectl label node NAME --overwrite K=V… K-…`
    Label {
        node: String,
        set: Vec<(String, String)>,
        remove: Vec<String>,
    },
    /// Cordon, evict, delete: no UP worker of Polis holds this Node.
    Remove { node: String },
}

/// Subscribes to the node records: the first answer is every node, then one per change;
/// an `Err` or the end of the channel ends the subscription (subscribe again).
pub type PolisNodesWatch =
    Arc<dyn Fn() -> tokio::sync::mpsc::Receiver<Result<Vec<PolisNode>, String>> + Send + Sync>;

/// What to change so that the Nodes match Polis's workers (pure).
pub fn plan(polis: &[PolisNode], nodes: &[KubeNode]) -> Vec<Action> {
    let by_id: BTreeMap<&str, &PolisNode> = polis.iter().map(|n| (n.id.as_str(), n)).collect();
    let mut actions = Vec::new();
    for node in nodes {
        let Some(owner) = by_id.get(node.name.as_str()).filter(|n| n.worker) else {
            actions.push(Action::Remove {
                node: node.name.clone(),
            });
            continue;
        };
        let wanted: BTreeMap<String, &String> = owner
            .labels
            .iter()
            .map(|(k, v)| (format!("{LABEL_PREFIX}{k}"), v))
            .collect();
        let set: Vec<(String, String)> = wanted
            .iter()
            .filter(|(k, v)| node.labels.get(k.as_str()) != Some(**v))
            .map(|(k, v)| (k.clone(), (*v).clone()))
            .collect();
        let remove: Vec<String> = node
            .labels
            .keys()
            .filter(|k| k.starts_with(LABEL_PREFIX) && !wanted.contains_key(k.as_str()))
            .cloned()
            .collect();
        if !set.is_empty() || !remove.is_empty() {
            actions.push(Action::Label {
                node: node.name.clone(),
                set,
                remove,
            });
        }
    }
    actions
}

/// The Nodes of `kubectl get nodes -o json`.
pub fn read_nodes(json: &str) -> Result<Vec<KubeNode>, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("kubectl's node list: {e}"))?;
    let items = value["items"]
        .as_array()
        .ok_or("kubectl's node list has no items")?;
    Ok(items
        .iter()
        .filter_map(|item| {
            let name = item["metadata"]["name"].as_str()?.to_string();
            let labels = item["metadata"]["labels"]
                .as_object()
                .map(|l| {
                    l.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default();
            Some(KubeNode { name, labels })
        })
        .collect())
}

/// The kubectl arguments that carry out `action` (one or more invocations).
pub fn commands(action: &Action) -> Vec<Vec<String>> {
    match action {
        Action::Label { node, set, remove } => {
            let mut args = vec![
                "label".into(),
                "node".into(),
                node.clone(),
                "--overwrite".into(),
            ];
            args.extend(set.iter().map(|(k, v)| format!("{k}={v}")));
            args.extend(remove.iter().map(|k| format!("{k}-")));
            vec![args]
        }
        Action::Remove { node } => vec![
            // Evictions honour disruption budgets and make the workloads' controllers
            // start replacements at once; the kubelet, refused by now, cannot report
            // the pods gone, so the drain is not waited for: the Node's deletion lets
            // the pod garbage collector remove them.
            vec![
                "drain".into(),
                node.clone(),
                "--ignore-daemonsets".into(),
                "--delete-emptydir-data".into(),
                "--force".into(),
                "--timeout=10s".into(),
            ],
            vec![
                "delete".into(),
                "node".into(),
                node.clone(),
                "--ignore-not-found".into(),
                "--wait=false".into(),
            ],
        ],
    }
}

/// One pass: lists the Nodes, plans, acts.
async fn pass(
    binaries: &std::path::Path,
    layout: &Layout,
    polis: &[PolisNode],
    still_a_worker: &KubeletCheck,
) -> Result<(), String> {
    let listed =
        crate::kubectl::kubectl(binaries, layout, &["get", "nodes", "-o", "json"], None).await?;
    for action in plan(polis, &read_nodes(&listed)?) {
        if let Action::Remove { node } = &action {
            // An UP worker with a token: its kubelet may have registered the Node
            // after the records were read.
            match still_a_worker(node.clone()).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(e) => return Err(format!("asking whether {node} is a worker: {e}")),
            }
            tracing::info!(
                node,
                "no UP worker of Polis holds this Node: draining and deleting it"
            );
        }
        for args in commands(&action) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match crate::kubectl::kubectl(binaries, layout, &args, None).await {
                Ok(_) => {}
                // A drain that timed out has evicted what it could (see `commands`).
                Err(e) if args[0] == "drain" => tracing::debug!("{}: {e}", args.join(" ")),
                Err(e) => return Err(format!("kubectl {}: {e}", args.join(" "))),
            }
        }
        if let Action::Label { node, set, remove } = &action {
            tracing::info!(
                node,
                set = set.len(),
                removed = remove.len(),
                "Node labels synchronised"
            );
        }
    }
    Ok(())
}

/// The `nodesync` runnable: a pass on every change of the records and every
/// [`RESYNC`]. Until a first pass succeeds (the apiserver starting) a failed one is
/// logged at debug only.
pub async fn run(
    ctx: supervisor::Context,
    binaries: PathBuf,
    layout: Layout,
    watch: PolisNodesWatch,
    still_a_worker: KubeletCheck,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let mut succeeded = false;
    loop {
        let mut updates = watch();
        let mut latest: Option<Vec<PolisNode>> = None;
        loop {
            tokio::select! {
                update = updates.recv() => match update {
                    Some(Ok(nodes)) => latest = Some(nodes),
                    Some(Err(e)) => {
                        tracing::debug!("watching the node records: {e}");
                        break;
                    }
                    None => break,
                },
                _ = tokio::time::sleep(RESYNC) => {}
                () = ctx.cancelled() => return Ok(()),
            }
            if let Some(polis) = &latest {
                match pass(&binaries, &layout, polis, &still_a_worker).await {
                    Ok(()) => succeeded = true,
                    Err(e) if succeeded => {
                        tracing::warn!("synchronising the Nodes with Polis: {e}")
                    }
                    Err(e) => tracing::debug!("synchronising the Nodes with Polis: {e}"),
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            () = ctx.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polis(id: &str, worker: bool, labels: &[(&str, &str)]) -> PolisNode {
        PolisNode {
            id: id.into(),
            worker,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn kube(name: &str, labels: &[(&str, &str)]) -> KubeNode {
        KubeNode {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_workers_polis_labels_are_set_changed_and_removed_and_nothing_else_is_touched() {
        let actions = plan(
            &[polis("w1", true, &[("zone", "a"), ("rack", "7")])],
            &[kube(
                "w1",
                &[
                    ("kubernetes.io/hostname", "w1"),
                    ("polis.dev/zone", "b"),
                    ("polis.dev/gone", "x"),
                ],
            )],
        );
        assert_eq!(
            actions,
            vec![Action::Label {
                node: "w1".into(),
                set: vec![
                    ("polis.dev/rack".into(), "7".into()),
                    ("polis.dev/zone".into(), "a".into())
                ],
                remove: vec!["polis.dev/gone".into()],
            }]
        );
        assert_eq!(
            commands(&actions[0]),
            vec![
                vec![
                    "label",
                    "node",
                    "w1",
                    "--overwrite",
                    "polis.dev/rack=7",
                    "polis.dev/zone=a",
                    "polis.dev/gone-"
                ]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
            ]
        );
        // In step: nothing to do.
        assert!(
            plan(
                &[polis("w1", true, &[("zone", "a")])],
                &[kube("w1", &[("polis.dev/zone", "a"), ("other", "x")])]
            )
            .is_empty()
        );
    }

    #[test]
    fn a_node_no_worker_holds_is_removed() {
        let actions = plan(
            &[polis("w1", false, &[]), polis("w2", true, &[])],
            &[kube("w1", &[]), kube("w2", &[]), kube("stranger", &[])],
        );
        assert_eq!(
            actions,
            vec![
                Action::Remove { node: "w1".into() },
                Action::Remove {
                    node: "stranger".into()
                }
            ]
        );
        let steps = commands(&actions[0]);
        assert_eq!(steps[0][0], "drain");
        assert_eq!(steps[1][..3], ["delete", "node", "w1"]);
    }

    #[test]
    fn the_node_list_is_read_from_kubectl() {
        let nodes = read_nodes(
            r#"{"items":[{"metadata":{"name":"w1","labels":{"a":"b"}}},{"metadata":{"name":"w2"}}]}"#,
        )
        .unwrap();
        assert_eq!(nodes, vec![kube("w1", &[("a", "b")]), kube("w2", &[])]);
        assert!(read_nodes("{}").is_err());
        assert!(read_nodes("not json").is_err());
    }
}
