//! The cluster's epochs in etcd (`cluster/epochs/…`, see `proto::epoch`): the chain read
//! whole, and one epoch recorded (create-if-absent: recording the same epoch twice
//! keeps the first record and its revision).
//!
//! Written by a recovered or restored node's own control plane before its curator
//! serves, never by the leader on a caller's behalf; read by JoinConsensus (the chain a
//! former member checks before it drops its data) and by every member's status answer.
//! Imports only `layout` and `error`.

use consensus::Namespaced;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use prost::Message as _;
use proto::config::ClusterEpoch;

use crate::error::CuratorError;
use crate::layout;

/// Every recorded epoch, oldest first (empty: none since the bootstrap). Serializable
/// when `local` (a member without a quorum still answers with its own chain).
pub async fn chain(curator: &Namespaced, local: bool) -> Result<Vec<ClusterEpoch>, CuratorError> {
    let mut pages =
        consensus::pages::Pages::prefix(&curator.client(), curator.key(layout::EPOCHS_PREFIX));
    if local {
        pages = pages.serializable();
    }
    let mut chain = consensus::pages::read(pages)
        .await?
        .kvs
        .iter()
        .map(|kv| {
            let epoch =
                ClusterEpoch::decode(kv.value()).map_err(|source| CuratorError::Corrupt {
                    what: format!("cluster epoch {}", String::from_utf8_lossy(kv.key())),
                    source,
                })?;
            Ok::<_, CuratorError>(ClusterEpoch {
                record_revision: kv.create_revision(),
                ..epoch
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    chain.sort_by(|a, b| proto::epoch::order(a).cmp(&proto::epoch::order(b)));
    Ok(chain)
}

/// Records `epoch` unless it is recorded already; returns it as recorded, with the
/// revision of its record.
pub async fn record(
    curator: &Namespaced,
    epoch: &ClusterEpoch,
) -> Result<ClusterEpoch, CuratorError> {
    let key = curator.key(&layout::epoch_key(epoch.made_unix_ms, &epoch.made_by));
    let recorded = ClusterEpoch {
        record_revision: 0,
        ..epoch.clone()
    };
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), recorded.encode_to_vec(), None)])
        .or_else([TxnOp::get(key.clone(), None)]);
    let response = curator.kv().txn(txn).await?;
    if response.succeeded() {
        let revision = response
            .header()
            .map(|h| h.revision())
            .ok_or(CuratorError::Protocol(
                "a transaction answered without a header",
            ))?;
        return Ok(ClusterEpoch {
            record_revision: revision,
            ..recorded
        });
    }
    let kv = match response.op_responses().first() {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().cloned(),
        _ => None,
    }
    .ok_or(CuratorError::Protocol(
        "an epoch present a moment ago is gone",
    ))?;
    let stored = ClusterEpoch::decode(kv.value()).map_err(|source| CuratorError::Corrupt {
        what: format!("cluster epoch {key}"),
        source,
    })?;
    Ok(ClusterEpoch {
        record_revision: kv.create_revision(),
        ..stored
    })
}
