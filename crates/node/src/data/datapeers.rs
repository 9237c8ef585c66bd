//! Members' cold start with encrypted data (issue 18, stage 4): each consensus member's
//! ESP holds the cluster halves of the OTHER members — never its own — and a small
//! unlock listener serves them, before etcd runs, to the holder of each member's join key.
//!
//! ```text
//!   <root>/esp/data-peers   the other members: id, address, join key, cluster half    0600
//!                           (length-delimited state.Node records, only those fields)
//!
//!   member A (locked) ── DataUnlock.UnlockData, self-signed join cert ──▶ B:7837
//!        ◀── A's half, from B's esp/data-peers ──── only to the key in B's list as A's
//!   refresh (controlplane, while etcd runs; a watch of the records): the member
//!        records with a join key and a half, but this node's own, written when they change
//! ```
//! Any majority of members can cold start: each one's half is in every other member's
//! ESP, and the listener answers before (and after) its own data is unlocked. One copied
//! disk with its ESP holds the others' halves, not its own, so it never unlocks alone.
//! The listener does not prove who it is (a self-signed join certificate, accepted by the
//! caller as is): a wrong half is refused by the kernel's key identifier, and the caller
//! sends nothing secret. So no single answer is final ([`first_accepted`]): an address
//! in `data-peers` may be stale (another host now), or its host hostile; every member is
//! asked in turn (each for [`PEER_TIMEOUT`], all for [`PEERS_TIMEOUT`]) until one's half
//! is the one the device takes. Its callers are strangers until they prove a join key,
//! so it caps connections per source (`rpc::Port::Unlock`) and UnlockData calls per
//! source (`rpc::server::RateLayer`), as the curator does.
//!
//! A leaf: files, the listener task and client calls (on `datakeys`, `storage`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use identity::NodeKey;
use prost::Message as _;
use proto::api;
use proto::state::Node;
use tonic::{Request, Response, Status};

use crate::disk::datakeys;
use crate::disk::storage::{Root, write_atomic};

/// The port of the members' data unlock listener.
pub const DATA_UNLOCK_PORT: u16 = 7837;
/// How long one peer gets to answer.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one round of asking every peer may take in all.
pub const PEERS_TIMEOUT: Duration = Duration::from_secs(15);

pub fn peers_path(root: &Root) -> PathBuf {
    root.esp().join("data-peers")
}

/// A member whose half this node keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: String,
    pub address: String,
    pub join_key: Vec<u8>,
    pub half: Vec<u8>,
}

pub fn encode(peers: &[Peer]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in peers {
        Node {
            id: p.id.clone(),
            address: p.address.clone(),
            data_join_key: p.join_key.clone(),
            data_cluster_half: p.half.clone(),
            ..Default::default()
        }
        .encode_length_delimited(&mut out)
        .expect("a Vec grows");
    }
    out
}

pub fn decode(mut bytes: &[u8]) -> Result<Vec<Peer>, prost::DecodeError> {
    let mut peers = Vec::new();
    while !bytes.is_empty() {
        let n = Node::decode_length_delimited(&mut bytes)?;
        peers.push(Peer {
            id: n.id,
            address: n.address,
            join_key: n.data_join_key,
            half: n.data_cluster_half,
        });
    }
    Ok(peers)
}

/// The peers in the ESP (none when the file is absent).
pub fn load(root: &Root) -> Result<Vec<Peer>> {
    let path = peers_path(root);
    match std::fs::read(&path) {
        Ok(bytes) => decode(&bytes)
            .with_context(|| format!("the peer halves {} are corrupted", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The peers to keep, from the cluster's records: consensus members other than `own`
/// with a join key and a half (a decommissioned record has none).
pub fn from_records<'a>(nodes: impl IntoIterator<Item = &'a Node>, own: &str) -> Vec<Peer> {
    let mut peers: Vec<Peer> = nodes
        .into_iter()
        .filter(|n| n.id != own)
        .filter(|n| {
            n.roles
                .as_ref()
                .is_some_and(|r| r.consensus_member.is_some())
        })
        .filter(|n| n.data_join_key.len() == 32 && !n.data_cluster_half.is_empty())
        .map(|n| Peer {
            id: n.id.clone(),
            address: n.address.clone(),
            join_key: n.data_join_key.clone(),
            half: n.data_cluster_half.clone(),
        })
        .collect();
    peers.sort_by(|a, b| a.id.cmp(&b.id));
    peers
}

/// Writes `peers` to the ESP when they differ from what it holds; true when written.
pub fn save_if_changed(root: &Root, peers: &[Peer]) -> Result<bool> {
    if load(root).ok().as_deref() == Some(peers) {
        return Ok(false);
    }
    write_atomic(&peers_path(root), &encode(peers)).context("saving the peer halves")?;
    Ok(true)
}

/// The half this listener hands the caller with `key`, or why not.
pub fn answer(peers: &[Peer], key: &[u8]) -> Result<(String, Vec<u8>), String> {
    peers
        .iter()
        .find(|p| p.join_key.as_slice() == key)
        .map(|p| (p.id.clone(), p.half.clone()))
        .ok_or_else(|| "this member keeps no cluster half for this join key".to_string())
}

struct Listener {
    root: Root,
}

#[tonic::async_trait]
impl api::data_unlock_server::DataUnlock for Listener {
    async fn unlock_data(
        &self,
        request: Request<api::UnlockDataRequest>,
    ) -> Result<Response<api::UnlockDataResponse>, Status> {
        let leaf = request
            .extensions()
            .get::<rpc::PeerInfo>()
            .and_then(|p| p.certificates.clone())
            .and_then(|c| c.first().map(|c| c.to_vec()))
            .ok_or_else(|| {
                Status::unauthenticated("a self-signed join key certificate is needed")
            })?;
        // The handshake proved the caller holds this key.
        let key = pki::certificate_public_key(&leaf)
            .map_err(|e| Status::invalid_argument(format!("unusable client certificate: {e}")))?;
        let peers = load(&self.root).map_err(|e| Status::internal(format!("{e:#}")))?;
        match answer(&peers, &key) {
            Ok((node_id, cluster_half)) => {
                tracing::info!(
                    node = node_id,
                    "handed a member the cluster half of its data key"
                );
                Ok(Response::new(api::UnlockDataResponse {
                    node_id,
                    cluster_half,
                }))
            }
            Err(why) => {
                tracing::warn!("member data unlock refused: {why}");
                Err(Status::permission_denied(why))
            }
        }
    }
}

/// Starts the unlock listener on `address:7837` (for the life of the process), answering
/// from `esp/data-peers` as it is at each call.
pub async fn listen(root: &Root, address: IpAddr, join: &NodeKey) -> Result<()> {
    let credentials = rpc::self_signed(join).context("creating the listener's certificate")?;
    let tls = rpc::tls::server_config(&credentials).context("the listener's TLS")?;
    let listen = SocketAddr::new(address, DATA_UNLOCK_PORT);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen} for members' data unlock"))?;
    let service = Listener { root: root.clone() };
    tracing::info!(%listen, "serving members' data unlock");
    tokio::spawn(async move {
        // Anyone may call with a self-signed certificate: per-source limits, as on the
        // curator (connections per source: `rpc::Port::Unlock`).
        let served = rpc::server::builder()
            .layer(rpc::server::RateLayer::new(
                rpc::server::RateSettings::DEFAULT,
            ))
            .add_service(api::data_unlock_server::DataUnlockServer::new(service))
            .serve_with_incoming(rpc::incoming(listener, tls, rpc::Port::Unlock))
            .await;
        if let Err(e) = served {
            tracing::error!("members' data unlock listener ended: {e}");
        }
    });
    Ok(())
}

/// Asks `peer`'s listener for this node's half (None: no answer or refused).
pub async fn ask(peer: &Peer, join: &rpc::Credentials) -> Result<api::UnlockDataResponse, String> {
    let ip: IpAddr = peer
        .address
        .parse()
        .map_err(|e| format!("member {} has no usable address: {e}", peer.id))?;
    let endpoint = SocketAddr::new(ip, DATA_UNLOCK_PORT);
    let call = async {
        let channel = rpc::connect(endpoint, &rpc::ServerTrust::FirstUse, Some(join))
            .await
            .map_err(|e| format!("member {} at {endpoint}: {e}", peer.id))?;
        api::data_unlock_client::DataUnlockClient::new(channel)
            .unlock_data(api::UnlockDataRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|e| format!("member {} at {endpoint}: {}", peer.id, e.message()))
    };
    tokio::time::timeout(PEER_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| Err(format!("member {} at {endpoint}: no answer", peer.id)))
}

/// The cluster half in a member's answer, if the answer is one for node `node_id` (pure):
/// another node's ID or a half that does not decode is a stale or hostile host's.
pub fn usable(answer: &api::UnlockDataResponse, node_id: &str) -> Result<datafs::Half, String> {
    if answer.node_id != node_id {
        return Err(format!(
            "answered with the data key of node {}, not of this node {node_id}",
            answer.node_id
        ));
    }
    datafs::Half::decode(&answer.cluster_half)
        .map_err(|e| format!("answered with an unusable cluster half: {e}"))
}

/// The first answer among `peers` that `accept` takes: each peer is asked (`ask`) in
/// turn, its answer checked ([`usable`]) and, unless it is a half in `refused` (the
/// device did not take it before), handed to `accept`, which verifies it (`Some`: taken;
/// `None`: not this device's half, remembered in `refused`; an error ends the search).
/// A peer that does not answer, refuses, or answers with anything else is passed over:
/// one stale address or hostile host cannot keep a member locked. Asking stops after
/// `within` in all (each ask bounded by what is left of it). None when no answer is taken.
pub async fn first_accepted<T>(
    peers: &[Peer],
    node_id: &str,
    within: Duration,
    refused: &mut Vec<Vec<u8>>,
    mut ask: impl AsyncFnMut(&Peer) -> Result<api::UnlockDataResponse, String>,
    mut accept: impl AsyncFnMut(datafs::Half) -> Result<Option<T>>,
) -> Result<Option<T>> {
    let deadline = tokio::time::Instant::now() + within;
    for peer in peers {
        let answer = match tokio::time::timeout_at(deadline, ask(peer)).await {
            Ok(answer) => answer,
            Err(_) => {
                tracing::info!(
                    member = peer.id,
                    "no time left to ask the other members for the cluster half"
                );
                break;
            }
        };
        let half = match answer.and_then(|a| usable(&a, node_id)) {
            Ok(half) => half,
            Err(why) => {
                tracing::info!(
                    member = peer.id,
                    address = peer.address,
                    "passed over: {why}"
                );
                continue;
            }
        };
        let encoded = half.encode();
        if refused.contains(&encoded) {
            continue;
        }
        match accept(half).await? {
            Some(taken) => {
                tracing::info!(
                    member = peer.id,
                    "another member handed this node its cluster half"
                );
                return Ok(Some(taken));
            }
            None => {
                tracing::warn!(
                    member = peer.id,
                    address = peer.address,
                    "a member's answer is not this device's cluster half; asking the next"
                );
                refused.push(encoded);
            }
        }
    }
    Ok(None)
}

/// A bootstrap node keeps its own half in the ESP until another member's listener
/// answers with it: forgets it then. Called by the refresh after saving the peers.
pub async fn confirm_held_elsewhere(root: &Root, peers: &[Peer]) -> Result<()> {
    let Some(own) = datakeys::read_pending(root)? else {
        return Ok(());
    };
    let join = datakeys::read_join_key(root)?;
    let credentials = rpc::self_signed(&join).context("creating the join key's certificate")?;
    for peer in peers {
        if let Ok(a) = ask(peer, &credentials).await
            && a.cluster_half == own.encode()
        {
            tracing::info!(
                member = peer.id,
                "another member keeps this node's cluster half"
            );
            return datakeys::forget_pending(root);
        }
    }
    Ok(())
}

/// The refresh runnable's loop: `esp/data-peers` kept current from a watch of the node
/// records in etcd (written only when the members' halves change); a first node also
/// asks, until one does, whether another member holds its own half yet (their
/// listeners may come up after the records).
pub async fn refresh(
    ctx: supervisor::Context,
    root: Root,
    own: String,
    curator: consensus::Namespaced,
) -> supervisor::RunnableResult {
    ctx.signal_healthy();
    let mut peers: Option<Vec<Peer>> = None;
    loop {
        let view_own = own.clone();
        let mut watched = curator::records::watch_nodes(&curator, move |nodes, _, _| {
            from_records(nodes.values(), &view_own)
        });
        loop {
            let waiting_for_a_keeper = peers.is_some() && datakeys::is_bootstrap(&root);
            tokio::select! {
                update = watched.recv() => match update {
                    Some(Ok(new)) => {
                        if save_if_changed(&root, &new)? {
                            tracing::info!(
                                members = new.len(),
                                "kept the other members' cluster halves"
                            );
                        }
                        peers = Some(new);
                    }
                    Some(Err(e)) => {
                        tracing::debug!("watching the member records for their halves: {e}");
                        break;
                    }
                    None => break,
                },
                _ = tokio::time::sleep(RETRY), if waiting_for_a_keeper => {}
                _ = ctx.cancelled() => return Ok(()),
            }
            if let Some(peers) = &peers
                && datakeys::is_bootstrap(&root)
            {
                confirm_held_elsewhere(&root, peers).await?;
            }
        }
        // The watch ended (e.g. no etcd leader): watch again after a pause.
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = ctx.cancelled() => return Ok(()),
        }
    }
}

/// Pause before watching again, and between a first node's questions to its peers.
const RETRY: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use proto::state::{ConsensusMemberRole, NodeRoles};

    fn node(id: &str, member: bool, key: u8, half: &[u8]) -> Node {
        Node {
            id: id.into(),
            address: "127.0.0.9".into(),
            roles: Some(NodeRoles {
                consensus_member: member.then_some(ConsensusMemberRole {
                    member_id: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            data_join_key: if key == 0 { vec![] } else { vec![key; 32] },
            data_cluster_half: half.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn only_other_members_with_a_half_are_kept_never_our_own() {
        let nodes = [
            node("own", true, 1, &[1; 41]),
            node("b", true, 2, &[2; 41]),
            node("worker", false, 3, &[3; 41]),
            node("plain", true, 0, &[]),
            node("erased", true, 4, &[]),
        ];
        let peers = from_records(&nodes, "own");
        assert_eq!(
            peers.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(decode(&encode(&peers)).unwrap(), peers);
    }

    fn peer(id: &str) -> Peer {
        Peer {
            id: id.into(),
            address: "127.0.0.9".into(),
            join_key: vec![1; 32],
            half: vec![],
        }
    }

    fn answered(node_id: &str, half: Vec<u8>) -> Result<api::UnlockDataResponse, String> {
        Ok(api::UnlockDataResponse {
            node_id: node_id.into(),
            cluster_half: half,
        })
    }

    /// What each peer answers, by ID: a stale address (another cluster's node, refusing),
    /// another node's half, garbage, a well-formed wrong half, the right one.
    fn answers(id: &str) -> Result<api::UnlockDataResponse, String> {
        let half = |b| datafs::Half::from_bytes([b; datafs::key::HALF_LEN]).encode();
        match id {
            "stale" => Err("permission denied".into()),
            "other" => answered("polis-other", half(2)),
            "garbage" => answered("polis-me", vec![9; 7]),
            "wrong" => answered("polis-me", half(3)),
            "good" => answered("polis-me", half(4)),
            _ => Err("no answer".into()),
        }
    }

    #[tokio::test]
    async fn no_single_member_answer_is_final_only_the_devices_verdict() {
        let peers: Vec<Peer> = ["stale", "other", "garbage", "wrong", "good", "never"]
            .into_iter()
            .map(peer)
            .collect();
        let right = datafs::Half::from_bytes([4; datafs::key::HALF_LEN]).encode();
        let mut refused = Vec::new();
        let mut asked = Vec::new();
        let mut offered = 0;
        let taken = first_accepted(
            &peers,
            "polis-me",
            Duration::from_secs(60),
            &mut refused,
            async |p| {
                asked.push(p.id.clone());
                answers(&p.id)
            },
            async |half: datafs::Half| {
                offered += 1;
                Ok((half.encode() == right).then_some("mounted"))
            },
        )
        .await
        .unwrap();
        assert_eq!(taken, Some("mounted"));
        // Every member up to the good one asked, none after it; only the two usable
        // halves offered to the device; the one it refused remembered.
        assert_eq!(asked, ["stale", "other", "garbage", "wrong", "good"]);
        assert_eq!(offered, 2);
        assert_eq!(
            refused,
            [datafs::Half::from_bytes([3; datafs::key::HALF_LEN]).encode()]
        );

        // The next round offers a refused half no more; without the good member nothing
        // is taken.
        let mut offered = 0;
        let taken: Option<()> = first_accepted(
            &peers[..4],
            "polis-me",
            Duration::from_secs(60),
            &mut refused,
            async |p| answers(&p.id),
            async |_| {
                offered += 1;
                Ok(None)
            },
        )
        .await
        .unwrap();
        assert_eq!((taken, offered), (None, 0));
    }

    #[tokio::test]
    async fn asking_the_members_is_bounded_in_all() {
        let peers: Vec<Peer> = ["a", "b", "c"].into_iter().map(peer).collect();
        let mut asked = 0;
        let started = std::time::Instant::now();
        let taken: Option<()> = first_accepted(
            &peers,
            "polis-me",
            Duration::from_millis(200),
            &mut Vec::new(),
            async |_| {
                asked += 1;
                // A member that accepts the connection and never answers.
                std::future::pending().await
            },
            async |_| Ok(Some(())),
        )
        .await
        .unwrap();
        assert_eq!((taken, asked), (None, 1));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_failure_to_open_the_device_ends_the_search() {
        let peers: Vec<Peer> = ["wrong", "good"].into_iter().map(peer).collect();
        let failed: Result<Option<()>> = first_accepted(
            &peers,
            "polis-me",
            Duration::from_secs(60),
            &mut Vec::new(),
            async |p| answers(&p.id),
            async |_| Err(anyhow::anyhow!("mount: no such device")),
        )
        .await;
        assert!(failed.is_err());
    }

    #[test]
    fn a_half_goes_only_to_its_join_key() {
        let peers = from_records(&[node("b", true, 2, &[2; 41])], "own");
        assert_eq!(answer(&peers, &[2; 32]).unwrap(), ("b".into(), vec![2; 41]));
        assert!(answer(&peers, &[1; 32]).is_err());
        assert!(answer(&[], &[2; 32]).is_err());
    }
}

/// Properties over arbitrary files (proptest): the peers file round-trips, and damaged
/// bytes are refused, never a panic.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn peer() -> impl Strategy<Value = Peer> {
        (
            any::<String>(),
            any::<String>(),
            prop::collection::vec(any::<u8>(), 0..40),
            prop::collection::vec(any::<u8>(), 0..50),
        )
            .prop_map(|(id, address, join_key, half)| Peer {
                id,
                address,
                join_key,
                half,
            })
    }

    proptest! {
        #[test]
        fn peers_round_trip(peers in prop::collection::vec(peer(), 0..5)) {
            prop_assert_eq!(decode(&encode(&peers)).unwrap(), peers);
        }

        #[test]
        fn any_file_decodes_or_is_refused(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(peers) = decode(&bytes) {
                prop_assert_eq!(decode(&encode(&peers)).unwrap(), peers);
            }
        }
    }
}
