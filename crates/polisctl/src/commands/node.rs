//! `node list`, `node describe`, `node add-role` / `remove-role`, `node approve` and
//! `node label` (`node decommission` and `node delete`: `decommission`).
//! May not format results itself (`render::node` does).

use std::path::Path;

use anyhow::{Result, bail};
use proto::api::{self, NodeState};

use crate::names::{parse_state, state_name};
use crate::output::{Format, escape, escape_text};
use crate::render::node::{print_node, print_node_list};
use crate::session::owner_session;

/// Every node, as the cluster lists it.
pub(crate) async fn list_nodes(
    config: &Path,
    raw_endpoints: &[String],
) -> Result<Vec<api::NodeInfo>> {
    owner_session(config, raw_endpoints)
        .await?
        .list_nodes("listing nodes", api::ListNodesRequest::default())
        .await
}

/// The IDs of the nodes in `state` (any state when `None`).
pub(crate) async fn list_ids(
    config: &Path,
    raw_endpoints: &[String],
    state: Option<&str>,
) -> Result<Vec<String>> {
    let state = state.map(parse_state).transpose()?;
    Ok(list_nodes(config, raw_endpoints)
        .await?
        .into_iter()
        .filter(|n| state.is_none_or(|s| n.state == s))
        .map(|n| n.id)
        .collect())
}

/// `node list`, filtered by state, role and labels.
pub(crate) async fn node_list(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
    state: Option<&str>,
    role: Option<&str>,
    labels: &[(String, String)],
) -> Result<()> {
    let request = api::ListNodesRequest {
        state: state.map(parse_state).transpose()?.unwrap_or(0),
        role: role.unwrap_or_default().to_string(),
        labels: labels.iter().cloned().collect(),
        ..Default::default()
    };
    let nodes = owner_session(config, raw_endpoints)
        .await?
        .list_nodes("listing nodes", request)
        .await?;
    print_node_list(&nodes, format);
    Ok(())
}

/// `node describe`.
pub(crate) async fn node_describe(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
    id: &str,
) -> Result<()> {
    identity::validate_node_id(id)?;
    let node = owner_session(config, raw_endpoints)
        .await?
        .management(&format!("describing node {id}"), |mut m| async move {
            m.describe_node(api::DescribeNodeRequest { id: id.to_string() })
                .await
        })
        .await?;
    print_node(&node, format);
    Ok(())
}

/// Label changes from the command line: labels to set and keys to remove.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct LabelChanges {
    pub(crate) upsert: Vec<(String, String)>,
    pub(crate) delete: Vec<String>,
}

/// Splits `KEY=VALUE` (set) and `KEY-` (remove) arguments.
pub(crate) fn parse_label_changes(changes: &[String]) -> Result<LabelChanges> {
    let LabelChanges {
        mut upsert,
        mut delete,
    } = LabelChanges::default();
    for c in changes {
        if let Some((k, v)) = c.split_once('=') {
            upsert.push((k.to_string(), v.to_string()));
        } else if let Some(k) = c.strip_suffix('-') {
            delete.push(k.to_string());
        } else {
            bail!("label change {c:?} is neither KEY=VALUE nor KEY-");
        }
    }
    Ok(LabelChanges { upsert, delete })
}

/// `node label`: sets and removes labels, then shows the node.
pub(crate) async fn node_label(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
    id: &str,
    changes: &[String],
) -> Result<()> {
    identity::validate_node_id(id)?;
    let LabelChanges { upsert, delete } = parse_label_changes(changes)?;
    for (k, v) in &upsert {
        proto::labels::validate_key(k)?;
        proto::labels::validate_value(k, v)?;
    }
    for k in &delete {
        proto::labels::validate_key(k)?;
    }
    let request = api::UpdateNodeLabelsRequest {
        id: id.to_string(),
        upsert: upsert.into_iter().collect(),
        delete,
    };
    let response = owner_session(config, raw_endpoints)
        .await?
        .management(&format!("labelling node {id}"), |mut m| {
            let request = request.clone();
            async move { m.update_node_labels(request).await }
        })
        .await?;
    if let Some(node) = response.node {
        print_node(&node, format);
    }
    Ok(())
}

/// `node approve`: approves each node (NEW → STANDBY); every ID is tried, and the
/// command fails if any approval failed.
pub(crate) async fn node_approve(
    config: &Path,
    raw_endpoints: &[String],
    ids: &[String],
    all_new: bool,
) -> Result<()> {
    let session = owner_session(config, raw_endpoints).await?;
    let mut ids = ids.to_vec();
    if all_new {
        let new = session
            .list_nodes(
                "listing new nodes",
                api::ListNodesRequest {
                    state: NodeState::New as i32,
                    ..Default::default()
                },
            )
            .await?;
        if new.is_empty() && ids.is_empty() {
            println!("No nodes wait for approval.");
            return Ok(());
        }
        ids.extend(new.into_iter().map(|n| n.id));
    }
    if ids.is_empty() {
        bail!("name the nodes to approve, or pass --all-new");
    }
    let ids = first_of_each(ids);
    let mut failed = 0;
    for id in &ids {
        if let Err(e) = identity::validate_node_id(id) {
            eprintln!("polisctl: approving {}: {e}", escape(id));
            failed += 1;
            continue;
        }
        let outcome = session
            .management(&format!("approving node {id}"), |mut m| async move {
                m.approve_node(api::ApproveNodeRequest { id: id.clone() })
                    .await
            })
            .await;
        match outcome {
            Ok(r) => {
                let state = r.node.map(|n| state_name(n.state)).unwrap_or_default();
                println!("approved {} ({state})", escape(id));
            }
            Err(e) => {
                eprintln!("polisctl: {}", escape_text(&format!("{e:#}")));
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} approvals failed", ids.len());
    }
    Ok(())
}

/// `node add-role` / `node remove-role`.
pub(crate) async fn node_roles(
    config: &Path,
    raw_endpoints: &[String],
    format: Format,
    id: &str,
    add: Vec<String>,
    remove: Vec<String>,
) -> Result<()> {
    identity::validate_node_id(id)?;
    let request = api::UpdateNodeRolesRequest {
        id: id.to_string(),
        add,
        remove,
    };
    let response = owner_session(config, raw_endpoints)
        .await?
        .management(&format!("changing the roles of node {id}"), |mut m| {
            let request = request.clone();
            async move { m.update_node_roles(request).await }
        })
        .await?;
    if let Some(node) = response.node {
        print_node(&node, format);
    }
    Ok(())
}

/// `ids` in their order, each once (`approve a b a` approves a, then b).
fn first_of_each(ids: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    ids.into_iter()
        .filter(|id| seen.insert(id.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_node_is_approved_once_in_the_order_given() {
        let ids = ["a", "b", "a", "c", "b"].map(String::from).to_vec();
        assert_eq!(super::first_of_each(ids), ["a", "b", "c"]);
    }

    use super::*;

    #[test]
    fn label_changes() {
        let LabelChanges {
            upsert: u,
            delete: d,
        } = parse_label_changes(&["a=1".into(), "b-".into(), "c=".into()]).unwrap();
        assert_eq!(u, vec![("a".into(), "1".into()), ("c".into(), "".into())]);
        assert_eq!(d, vec!["b".to_string()]);
        assert!(parse_label_changes(&["bad".into()]).is_err());
    }
}

/// Properties of the label change arguments (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_change_is_a_set_or_a_removal(changes in prop::collection::vec(any::<String>(), 0..6)) {
            if let Ok(parsed) = parse_label_changes(&changes) {
                prop_assert_eq!(parsed.upsert.len() + parsed.delete.len(), changes.len());
            } else {
                prop_assert!(changes.iter().any(|c| !c.contains('=') && !c.ends_with('-')));
            }
        }

        #[test]
        fn sets_and_removals_come_back_in_order(
            sets in prop::collection::vec(("[^=]{0,10}", any::<String>()), 0..4),
            removals in prop::collection::vec("[^=]{0,10}", 0..4),
        ) {
            let mut changes: Vec<String> = sets.iter().map(|(k, v)| format!("{k}={v}")).collect();
            changes.extend(removals.iter().map(|k| format!("{k}-")));
            let parsed = parse_label_changes(&changes).unwrap();
            prop_assert_eq!(parsed.upsert, sets);
            prop_assert_eq!(parsed.delete, removals);
        }
    }
}
