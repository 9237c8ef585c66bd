//! No single member's answer keeps a member locked (issue 25): a consensus member on an
//! encrypted image restarts with two bad entries first in its `esp/data-peers`: a stale
//! address (nothing listens there now) and a hostile host (answering for this node with a
//! well-formed half that is not its). It passes over both and unlocks through a real
//! member's listener. Three members (the first bootstrapped on its image); real
//! polis-node and etcd processes on 127.x addresses; the hostile host is a DataUnlock
//! server this test runs. Root only; skipped with a printed reason where the kernel lacks
//! ext4 encryption.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, Mounts, data_image, fscrypt_usable, unique_loopback};
use prost::Message;
use proto::api;
use proto::state::Node as Record;
use tonic::{Request, Response, Status};

/// The member unlock port (`node::data::datapeers::DATA_UNLOCK_PORT`).
const DATA_UNLOCK_PORT: u16 = 7837;

/// Answers every caller with `node_id` and a cluster half of its own making.
struct Hostile {
    node_id: String,
    half: Vec<u8>,
}

#[tonic::async_trait]
impl api::data_unlock_server::DataUnlock for Hostile {
    async fn unlock_data(
        &self,
        _: Request<api::UnlockDataRequest>,
    ) -> Result<Response<api::UnlockDataResponse>, Status> {
        Ok(Response::new(api::UnlockDataResponse {
            node_id: self.node_id.clone(),
            cluster_half: self.half.clone(),
        }))
    }
}

/// A `data-peers` entry (a length-delimited record with only these fields).
fn entry(id: &str, address: IpAddr) -> Vec<u8> {
    Record {
        id: id.into(),
        address: address.to_string(),
        data_join_key: vec![7; 32],
        data_cluster_half: vec![7; 41],
        ..Default::default()
    }
    .encode_length_delimited_to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_hostile_peer_does_not_keep_a_member_locked() -> Result<()> {
    // Before: the first peer that answered was final: the hostile half was mounted with
    // (refused by the kernel's key identifier) and the member exited.
    if !fscrypt_usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let imgs: Vec<String> = ["n0", "m1", "m2"]
        .iter()
        .map(|n| data_image(&dir.path().join(format!("{n}.img"))))
        .collect::<Result<_>>()?;
    let _mounts: Vec<Mounts> = ["n0", "m1", "m2"]
        .iter()
        .map(|n| Mounts(dir.path().join(n).join("root")))
        .collect();
    let (_cluster, others) =
        tokio::task::block_in_place(|| Cluster::encrypted_members(dir.path(), &imgs))?;
    let mut members = others.into_iter();
    let (mut m1, m1_id) = members.next().context("m1")?;
    let _m2 = members.next().context("m2")?;
    tokio::task::block_in_place(|| m1.stop_cleanly())?;

    // The hostile host: answers for m1 with a well-formed half that is not m1's.
    let hostile_address = unique_loopback();
    let credentials = rpc::self_signed(&identity::NodeKey::generate()?)?;
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::new(hostile_address, DATA_UNLOCK_PORT)).await?;
    let hostile = Hostile {
        node_id: m1_id.clone(),
        half: datafs::Half::generate()?.encode(),
    };
    let server = tokio::spawn(
        rpc::server::builder()
            .add_service(api::data_unlock_server::DataUnlockServer::new(hostile))
            .serve_with_incoming(rpc::incoming(
                listener,
                rpc::tls::server_config(&credentials)?,
                rpc::Port::Unlock,
            )),
    );

    // Both bad entries first, the real members after them.
    let peers_path = m1.root.join("esp/data-peers");
    let mut planted = entry("polis-stale", unique_loopback());
    planted.extend(entry("polis-hostile", hostile_address));
    planted.extend(std::fs::read(&peers_path)?);
    std::fs::write(&peers_path, planted)?;

    m1.start(&["--data-device", &imgs[1]])?;
    let home = tokio::task::block_in_place(|| m1.wait_home());
    server.abort();
    let output = m1.proc().output();
    home.with_context(|| format!("m1 never came Home: {output}"))?;
    ensure!(
        output.contains("is not this device's cluster half"),
        "the hostile half was not offered to the device and passed over: {output}"
    );
    ensure!(
        output.contains("another member handed this node its cluster half"),
        "m1 did not unlock through a real member: {output}"
    );
    ensure!(
        datafs::mounts::is_mount_point(&m1.root.join("data"))?,
        "m1's data is not the encrypted mount"
    );
    Ok(())
}
