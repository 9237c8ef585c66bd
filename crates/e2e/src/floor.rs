//! The floor under a curator write: a gRPC server over the curator's own transport
//! (`rpc::server::builder`, `rpc::incoming`: TLS 1.3, HTTP/2, TCP_NODELAY) that does
//! nothing for a call but one etcd transaction of the curator's write shape, on the
//! same etcd unix socket, and answers. No authorization, no snapshot, no watch, no
//! audit layer, no group commit: what any curator must pay at least for a write that
//! carries its audit entry in its own transaction, measured on this machine in the same
//! run as the curator (`scripts/bench api`).
//!
//! ```text
//!   CuratorClient (mTLS) ──▶ Floor: DataUnlock/UnlockData ──▶ etcd Txn (guard compare,
//!                                                              record put, entry put)
//! ```
//! It answers the one-method DataUnlock service so that no other handler is needed;
//! its request is empty and its answer a few bytes, a little less than a label write's.
//! The server runs on a runtime of its own (two workers, as polis-node has on this
//! machine), shut down when the [`Floor`] drops.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use proto::api;
use tonic::{Request, Response, Status};

/// The key whose revision guards the floor's transactions (as the election key guards
/// the curator's).
const GUARD_KEY: &str = "bench/floor/guard";
const RECORD_KEY: &str = "bench/floor/record";

/// A transaction of the curator's label-write shape: guarded by a key's revision (the
/// leadership) and by a comparison of the record's revision (as the curator's CAS;
/// `!= -1` always holds, etcd compares a missing key as revision 0, so the shape's cost
/// is there and every transaction writes), putting the record and an audit entry of
/// its own. The bench's raw-etcd comparison uses the same shape; a transaction whose
/// guard failed wrote nothing and is counted as failed by both.
pub fn curator_shaped_txn(
    guard: (&str, i64),
    record: (&str, &[u8]),
    entry: (String, &[u8]),
) -> Txn {
    Txn::new()
        .when([
            Compare::mod_revision(guard.0, CompareOp::Equal, guard.1),
            Compare::mod_revision(record.0, CompareOp::NotEqual, -1),
        ])
        .and_then([
            TxnOp::put(record.0, record.1, None),
            TxnOp::put(entry.0, entry.1, None),
        ])
}

/// A running floor server; stopped (its runtime shut down) on drop.
pub struct Floor {
    pub address: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Floor {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

struct Handler {
    etcd: etcd_client::KvClient,
    guard_revision: i64,
    record: Vec<u8>,
    entry: Vec<u8>,
    calls: AtomicU64,
}

#[tonic::async_trait]
impl api::data_unlock_server::DataUnlock for Handler {
    async fn unlock_data(
        &self,
        _request: Request<api::UnlockDataRequest>,
    ) -> Result<Response<api::UnlockDataResponse>, Status> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let txn = curator_shaped_txn(
            (GUARD_KEY, self.guard_revision),
            (RECORD_KEY, &self.record),
            (format!("bench/floor/audit/{call:016}"), &self.entry),
        );
        let response = self
            .etcd
            .clone()
            .txn(txn)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        if !response.succeeded() {
            return Err(Status::aborted("the floor's guard failed"));
        }
        Ok(Response::new(api::UnlockDataResponse {
            node_id: "floor".into(),
            cluster_half: Vec::new(),
        }))
    }
}

impl Floor {
    /// Starts a floor server on `address` (port chosen by the system), writing
    /// `record`-sized records and `entry`-sized entries to the etcd at `socket`.
    /// Must be called outside any tokio runtime.
    pub fn start(socket: &Path, address: IpAddr, record: Vec<u8>, entry: Vec<u8>) -> Result<Floor> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("floor")
            .enable_all()
            .build()
            .context("the floor's runtime")?;
        let socket = socket.to_path_buf();
        let address = runtime.block_on(async move {
            let mut etcd = consensus::client::connect_unix(&socket)
                .await
                .with_context(|| format!("connecting to etcd at {}", socket.display()))?;
            let guard_revision = etcd
                .put(GUARD_KEY, "leader", None)
                .await?
                .header()
                .map_or(0, |h| h.revision());
            etcd.put(RECORD_KEY, record.clone(), None).await?;
            let handler = Handler {
                etcd: etcd.kv_client(),
                guard_revision,
                record,
                entry,
                calls: AtomicU64::new(0),
            };
            let credentials = rpc::self_signed(&identity::NodeKey::generate()?)?;
            let tls = rpc::tls::server_config(&credentials)?;
            let listener = tokio::net::TcpListener::bind((address, 0))
                .await
                .with_context(|| format!("binding the floor to {address}"))?;
            let bound = listener.local_addr()?;
            // The curator's limits, but calls here pass no AuthLayer, which is what
            // tells a connection it is in use: without it every connection would be
            // closed as callless `first_call_timeout` after its handshake.
            let limits = rpc::Limits {
                first_call_timeout: std::time::Duration::from_secs(3600),
                ..rpc::Limits::for_this_process(rpc::Port::Curator)
            };
            tokio::spawn(
                rpc::server::builder()
                    .add_service(api::data_unlock_server::DataUnlockServer::new(handler))
                    .serve_with_incoming(rpc::server::incoming_with(listener, tls, limits)),
            );
            anyhow::Ok(bound)
        })?;
        Ok(Floor {
            address,
            runtime: Some(runtime),
        })
    }

    /// A client of this floor with credentials of its own (self-signed, as the floor
    /// checks none), made like the owner's curator client.
    pub fn client(&self) -> Result<rpc::CuratorClient> {
        let credentials = rpc::self_signed(&identity::NodeKey::generate()?)?;
        Ok(rpc::CuratorClient::new(
            vec![self.address],
            rpc::ServerTrust::FirstUse,
            Some(credentials),
        )?)
    }
}

/// One write through the floor.
pub async fn floor_write(client: &rpc::CuratorClient) -> Result<(), rpc::CallError> {
    client
        .call(|channel| async move {
            api::data_unlock_client::DataUnlockClient::new(channel)
                .unlock_data(api::UnlockDataRequest {})
                .await
        })
        .await
        .map(drop)
}
