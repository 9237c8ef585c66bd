//! The scheduled snapshots' settings in the cluster configuration: read (from the local
//! member, so a member without a quorum keeps its schedule) and changed by the leader.
//!
//! May import only `error`, `layout` and `election` (its write is a leader write);
//! touches no node record and checks no bounds (the caller does, `proto::snapshots`).

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use prost::Message;
use proto::config::ClusterConfiguration;

use crate::election::{self, Leadership};
use crate::error::CuratorError;
use crate::layout::CLUSTER_CONFIGURATION_KEY;

/// The cluster configuration as this member holds it (serializable read: no quorum).
pub async fn local_configuration(
    curator: &Namespaced,
) -> Result<Option<ClusterConfiguration>, CuratorError> {
    let response = curator
        .kv()
        .get(
            curator.key(CLUSTER_CONFIGURATION_KEY),
            Some(GetOptions::new().with_serializable()),
        )
        .await?;
    match response.kvs().first() {
        None => Ok(None),
        Some(kv) => ClusterConfiguration::decode(kv.value())
            .map(Some)
            .map_err(|source| CuratorError::Corrupt {
                what: "cluster configuration".into(),
                source,
            }),
    }
}

/// Sets the snapshot interval and count kept (0: left as it is) in the cluster
/// configuration, compare-and-swap on its revision; returns the new configuration.
pub async fn set_snapshot_schedule(
    curator: &Namespaced,
    leadership: &Leadership,
    interval_seconds: u64,
    keep: u32,
) -> Result<ClusterConfiguration, CuratorError> {
    let key = curator.key(CLUSTER_CONFIGURATION_KEY);
    // A concurrent change of the configuration makes the comparison fail: read again.
    for _ in 0..5 {
        let response = curator.kv().get(key.clone(), None).await?;
        let kv = response.kvs().first().ok_or(CuratorError::Protocol(
            "the cluster configuration is missing",
        ))?;
        let mut config =
            ClusterConfiguration::decode(kv.value()).map_err(|source| CuratorError::Corrupt {
                what: "cluster configuration".into(),
                source,
            })?;
        if interval_seconds != 0 {
            config.snapshot_interval_seconds = interval_seconds;
        }
        if keep != 0 {
            config.snapshot_keep = keep;
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::put(key.clone(), config.encode_to_vec(), None)]);
        if election::leader_txn(curator, leadership, txn)
            .await?
            .succeeded()
        {
            return Ok(config);
        }
    }
    Err(CuratorError::Protocol(
        "the cluster configuration kept changing; retry",
    ))
}
