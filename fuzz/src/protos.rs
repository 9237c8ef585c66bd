//! Protobuf messages from outside: node parameters (written by an operator's polisctl),
//! the node's other files and the curator's etcd records (a damaged disk, an old
//! version), and every API message a curator or a client decodes from the network —
//! each decoded with prost, then given the checks its reader applies before it acts.
//!
//! Every message that decodes must re-encode to one that decodes equal.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;

use prost::Message;
use proto::api;
use proto::config::{self, node_parameters};
use proto::state;

use crate::{pick, picked};

/// Decodes `M`, and checks that its encoding decodes to the same message.
fn decoded<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let again = M::decode(message.encode_to_vec().as_slice()).expect("a re-encoding decodes");
    assert_eq!(again, message, "a message changed on re-encoding");
    Some(message)
}

/// Labels as a request or a parameters file carries them: what `labels::apply` accepts
/// holds only valid keys and values, and is accepted again unchanged.
fn labels(current: &HashMap<String, String>, upsert: &HashMap<String, String>, delete: &[String]) {
    let upsert: BTreeMap<String, String> =
        upsert.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let Ok(applied) = proto::labels::apply(current, &upsert, delete) else {
        return;
    };
    assert!(applied.len() <= proto::labels::MAX_LABELS);
    for (k, v) in &applied {
        if upsert.contains_key(k) {
            proto::labels::validate_key(k).expect("an applied key is valid");
            proto::labels::validate_value(k, v).expect("an applied value is valid");
        }
    }
    let again = proto::labels::apply(&applied, &upsert, delete).expect("applying twice works");
    assert_eq!(again, applied, "label changes are idempotent");
}

fn node_id(id: &str) {
    if identity::validate_node_id(id).is_ok() {
        assert_eq!(id.len(), identity::NODE_ID_PREFIX.len() + 32);
    }
}

/// What a node checks of a certificate a peer or a file hands it.
fn certificate(der: &[u8]) {
    if pki::certificate_public_key(der).is_ok() {
        let _ = pki::Validity::of(der);
    }
}

/// What a node checks of a CRL before it keeps it: its signature (against the test CA;
/// real ones are checked against the cluster CA), then its serials.
fn crl(der: &[u8]) {
    if !der.is_empty() && pki::verified_crl_number(der, crate::fixture::CA_DER).is_ok() {
        pki::crl_serials(der).expect("a verified CRL lists its serials");
    }
}

fn endpoints(raw: &[String]) {
    if let Ok(parsed) = rpc::client::parse_endpoints(raw) {
        assert_eq!(parsed.len(), raw.len());
        let shown: Vec<String> = parsed.iter().map(ToString::to_string).collect();
        assert_eq!(rpc::client::parse_endpoints(&shown).ok(), Some(parsed));
    }
}

fn half(bytes: &[u8]) {
    if let Ok(h) = datafs::Half::decode(bytes) {
        assert_eq!(h.encode(), bytes, "a decoded half re-encodes to its bytes");
    }
}

fn epochs(chain: &[config::ClusterEpoch]) {
    let latest = proto::epoch::latest(chain);
    assert!(chain.iter().all(|e| !proto::epoch::newer(e, &latest)));
    for e in chain {
        let _ = proto::epoch::describe(e);
        let _ = proto::epoch::may_drop(e, e.parent_revision, chain);
        let _ = proto::epoch::may_drop(e, i64::MAX, chain);
        let header = rpc::epoch::encode(e);
        // The header names an epoch by four dash-separated fields: the kinds Polis
        // writes ("recover", "restore") have no dash, so they come back whole.
        if !e.kind.contains('-')
            && let Some(back) = rpc::epoch::decode(&header)
        {
            assert_eq!(
                (back.number, back.made_unix_ms, &back.kind, &back.made_by),
                (e.number, e.made_unix_ms, &e.kind, &e.made_by)
            );
        }
    }
}

/// `<root>/esp/parameters.pb` (`polisctl params`): what polis-node's preflight checks
/// before it bootstraps or registers.
pub fn node_parameters(data: &[u8]) {
    let Some(parameters) = decoded::<config::NodeParameters>(data) else {
        return;
    };
    match parameters.cluster {
        Some(node_parameters::Cluster::Bootstrap(b)) => {
            labels(&HashMap::new(), &b.labels, &[]);
            let _ = identity::public_key_from_slice(&b.owner_public_key);
            if let Some(c) = &b.initial_cluster_configuration {
                configuration(c);
            }
        }
        Some(node_parameters::Cluster::Register(r)) => {
            certificate(&r.ca_certificate);
            endpoints(&r.curator_endpoints);
            labels(&HashMap::new(), &r.labels, &[]);
            crl(&r.crl);
        }
        None => {}
    }
}

pub fn node_parameters_seeds() -> Vec<Vec<u8>> {
    let bootstrap = config::NodeParameters {
        cluster: Some(node_parameters::Cluster::Bootstrap(
            config::ClusterBootstrap {
                owner_public_key: vec![7; 32],
                initial_cluster_configuration: Some(config::ClusterConfiguration {
                    cluster_domain: "polis.internal".into(),
                    node_certificate_lifetime_seconds: 86400,
                    etcd_quota_bytes: 64 << 20,
                    snapshot_interval_seconds: 3600,
                    snapshot_keep: 3,
                    ..Default::default()
                }),
                labels: HashMap::from([("zone".into(), "a1".into())]),
            },
        )),
    };
    let register = config::NodeParameters {
        cluster: Some(node_parameters::Cluster::Register(
            config::ClusterRegister {
                register_ticket:
                    b"0123abcd.00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
                        .to_vec(),
                ca_certificate: crate::fixture::CA_DER.to_vec(),
                curator_endpoints: vec!["127.0.0.1:7835".into(), "[::1]".into()],
                labels: HashMap::from([("rack".into(), "r-1".into())]),
                crl: crate::fixture::crl().to_vec(),
            },
        )),
    };
    vec![
        bootstrap.encode_to_vec(),
        register.encode_to_vec(),
        Vec::new(),
    ]
}

fn configuration(c: &config::ClusterConfiguration) {
    let _ = curator::templates::check_configuration(c);
    let _ = proto::quota::effective_quota(c.etcd_quota_bytes);
    for bounds in [
        proto::snapshots::Bounds::NORMAL,
        proto::snapshots::Bounds::TESTING,
    ] {
        let s = proto::snapshots::effective(c.snapshot_interval_seconds, c.snapshot_keep, bounds);
        assert!(s.interval.as_secs() >= bounds.min_interval_seconds);
        assert!((1..=proto::snapshots::MAX_KEEP).contains(&s.keep));
    }
    let budget = curator::audit::bounds::Budget::of(Some(c));
    assert!(budget.entries > 0 && budget.bytes > 0, "{budget:?}");
}

/// The node's other files under its root and the curator's records in etcd; the first
/// byte picks the message.
pub fn records(data: &[u8]) {
    let Some((choice, bytes)) = pick(data, 11) else {
        return;
    };
    match choice {
        0 => {
            if let Some(s) = decoded::<config::SealedConfiguration>(bytes) {
                node_id(&s.node_id);
                certificate(&s.cluster_ca_certificate);
                let _ = s.address.parse::<std::net::IpAddr>();
            }
        }
        1 => {
            if let Some(d) = decoded::<config::ClusterDirectory>(bytes) {
                endpoints(&d.curator_endpoints);
            }
        }
        2 => {
            // A chain of epochs, each length-delimited (as etcd keeps them, one a key).
            let mut rest = bytes;
            let mut chain = Vec::new();
            while !rest.is_empty() {
                match config::ClusterEpoch::decode_length_delimited(&mut rest) {
                    Ok(e) => chain.push(e),
                    Err(_) => break,
                }
            }
            epochs(&chain);
        }
        3 => {
            decoded::<config::ConsensusMembership>(bytes);
        }
        4 => {
            decoded::<config::RecordedMembers>(bytes);
        }
        5 => {
            decoded::<config::LocalRoles>(bytes);
        }
        6 => {
            if let Some(q) = decoded::<config::EtcdQuota>(bytes)
                && let Ok(effective) = proto::quota::effective_quota(q.quota_backend_bytes)
            {
                assert!(effective >= proto::quota::MIN_QUOTA_BYTES);
                let _ = proto::quota::show(effective);
            }
        }
        7 => {
            if let Some(n) = decoded::<state::Node>(bytes) {
                node_id(&n.id);
                labels(&n.labels, &HashMap::new(), &[]);
                half(&n.data_cluster_half);
            }
        }
        8 => {
            if let Some(c) = decoded::<config::ClusterConfiguration>(bytes) {
                configuration(&c);
            }
        }
        9 => {
            if let Some(mut e) = decoded::<api::AuditEntry>(bytes) {
                let _ = curator::audit::bounds::account(&e);
                curator::audit::bounds::clip(&mut e);
                assert!(e.message.len() <= curator::audit::bounds::MAX_MESSAGE_BYTES);
                assert!(e.identity.len() <= curator::audit::bounds::MAX_TEXT_BYTES);
            }
        }
        _ => {
            decoded::<state::LeaderElectionValue>(bytes);
            decoded::<state::RegisterTicket>(bytes);
        }
    }
}

pub fn records_seeds() -> Vec<Vec<u8>> {
    let epoch = config::ClusterEpoch {
        number: 2,
        made_unix_ms: 1_795_674_017_451,
        made_by: "polis-5b4993252d1ed0f05b4993252d1ed0f0".into(),
        kind: "restore".into(),
        parent_made_unix_ms: 1_795_000_000_000,
        parent_made_by: "polis-00112233445566778899aabbccddeeff".into(),
        parent_number: 1,
        parent_revision: 1234,
        record_revision: 1240,
    };
    let mut chain = Vec::new();
    for e in [
        config::ClusterEpoch {
            number: 1,
            made_unix_ms: 1_795_000_000_000,
            made_by: "polis-00112233445566778899aabbccddeeff".into(),
            kind: "recover".into(),
            parent_revision: 99,
            ..Default::default()
        },
        epoch.clone(),
    ] {
        e.encode_length_delimited(&mut chain).expect("a Vec grows");
    }
    let node = state::Node {
        id: "polis-00112233445566778899aabbccddeeff".into(),
        public_key: vec![1; 32],
        state: state::NodeState::Up as i32,
        roles: Some(state::NodeRoles {
            consensus_member: Some(state::ConsensusMemberRole {
                member_id: 42,
                removal_pending: false,
            }),
            ..Default::default()
        }),
        address: "10.0.0.5".into(),
        labels: HashMap::from([("zone".into(), "a1".into())]),
        status: Some(state::NodeStatus {
            address: "10.0.0.5".into(),
            version: "0.1.0".into(),
            etcd_member_running: true,
            curator_running: true,
            started_at_unix_ms: 1_795_000_000_000,
            trusted_ca_fingerprints: vec!["ab".repeat(32), "cd".repeat(32)],
            certificate_ca_fingerprint: "ab".repeat(32),
            etcd_loaded_peer_ca_fingerprints: vec!["ef".repeat(32)],
            etcd_peer_certificate_ca_fingerprint: "ef".repeat(32),
            services: vec![state::ServiceState {
                name: "kube-apiserver".into(),
                running: true,
                restarts: 2,
                last_error: "kube-apiserver exited (exit status: 1)".into(),
                since_unix_ms: 1_795_000_000_000,
            }],
            kubernetes_node: "NotReady: KubeletNotReady".into(),
        }),
        health: 1,
        data_join_key: vec![2; 32],
        data_cluster_half: datafs::Half::from_bytes([3; 32]).encode(),
    };
    let seeds: Vec<(usize, Vec<u8>)> = vec![
        (
            0,
            config::SealedConfiguration {
                node_id: node.id.clone(),
                cluster_ca_certificate: crate::fixture::CA_DER.to_vec(),
                address: "10.0.0.5".into(),
                etcd_cluster_id: 7,
                etcd_member_id: 42,
            }
            .encode_to_vec(),
        ),
        (
            1,
            config::ClusterDirectory {
                curator_endpoints: vec!["10.0.0.5:7835".into(), "10.0.0.6".into()],
                applied_record_revision: 17,
                applied_record_etcd_cluster: 7,
            }
            .encode_to_vec(),
        ),
        (2, chain),
        (
            3,
            config::ConsensusMembership {
                etcd_cluster_id: 7,
                etcd_member_id: 42,
            }
            .encode_to_vec(),
        ),
        (
            4,
            config::RecordedMembers {
                members: vec![config::RecordedMember {
                    id: 42,
                    name: node.id.clone(),
                    peer_urls: vec!["https://10.0.0.5:7834".into()],
                    is_learner: false,
                }],
            }
            .encode_to_vec(),
        ),
        (
            5,
            config::LocalRoles {
                consensus_member: true,
                kubernetes_controller: true,
                kubernetes_worker: false,
            }
            .encode_to_vec(),
        ),
        (
            6,
            config::EtcdQuota {
                quota_backend_bytes: 64 << 20,
            }
            .encode_to_vec(),
        ),
        (7, node.encode_to_vec()),
        (
            8,
            config::ClusterConfiguration {
                cluster_domain: "polis.internal".into(),
                etcd_quota_bytes: 64 << 20,
                audit_max_entries: 100,
                audit_max_bytes: 1 << 20,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            9,
            api::AuditEntry {
                key: "audit/0001795000000000000-0001-polis-00112233445566778899aabbccddeeff".into(),
                time_unix_micros: 1_795_000_000_000_000,
                identity_kind: "self-signed".into(),
                identity: "polis-aa".into(),
                source_address: "[2001:db8::1]:4000".into(),
                curator: node.id.clone(),
                method: "/polis.api.Management/ApproveNode".into(),
                target: node.id.clone(),
                code: 7,
                code_name: "PermissionDenied".into(),
                message: "denied".into(),
                count: 3,
                first_time_unix_micros: 1_794_000_000_000_000,
            }
            .encode_to_vec(),
        ),
        (
            10,
            state::LeaderElectionValue {
                node_id: node.id.clone(),
                endpoint: "10.0.0.5:7835".into(),
            }
            .encode_to_vec(),
        ),
    ];
    seeds.iter().map(|(c, s)| picked(*c, s)).collect()
}

/// Every API message from the network: requests as a curator decodes and checks them
/// before it acts, answers as a node or polisctl decodes and checks them. The first
/// byte picks the message.
pub fn api_messages(data: &[u8]) {
    let Some((choice, b)) = pick(data, 20) else {
        return;
    };
    match choice {
        0 => {
            if let Some(r) = decoded::<api::UpdateNodeLabelsRequest>(b) {
                node_id(&r.id);
                labels(&HashMap::new(), &r.upsert, &r.delete);
                let current = HashMap::from([("zone".to_string(), "a1".to_string())]);
                labels(&current, &r.upsert, &r.delete);
            }
        }
        1 => {
            if let Some(r) = decoded::<api::RegisterNodeRequest>(b) {
                let _ = r.address.parse::<std::net::IpAddr>();
                labels(&HashMap::new(), &r.labels, &[]);
                let _ = identity::public_key_from_slice(&r.data_join_key);
                half(&r.data_cluster_half);
            }
        }
        2 => {
            if let Some(r) = decoded::<api::SetSnapshotScheduleRequest>(b) {
                for bounds in [
                    proto::snapshots::Bounds::NORMAL,
                    proto::snapshots::Bounds::TESTING,
                ] {
                    if let Ok(s) =
                        proto::snapshots::check_interval(r.snapshot_interval_seconds, bounds)
                    {
                        let shown = proto::snapshots::show(s);
                        assert_eq!(proto::snapshots::parse_interval(&shown), Ok(s), "{shown}");
                    }
                }
                let _ = proto::snapshots::check_keep(r.snapshot_keep);
            }
        }
        3 => {
            if let Some(r) = decoded::<api::FetchSnapshotRequest>(b) {
                node_id(&r.node_id);
                snapshot_name(&r.name);
            }
        }
        4 => {
            if let Some(r) = decoded::<api::SnapshotsFetchLocalRequest>(b) {
                snapshot_name(&r.name);
            }
        }
        5 => {
            if let Some(r) = decoded::<api::DescribeNodeRequest>(b) {
                node_id(&r.id);
            }
            if let Some(r) = decoded::<api::RevokeRegisterTicketRequest>(b) {
                let _ = proto::echo::quoted(&r.id);
            }
        }
        6 => {
            if let Some(r) = decoded::<api::UpdateNodeRolesRequest>(b) {
                node_id(&r.id);
            }
        }
        7 => {
            if let Some(r) = decoded::<api::RotateOwnerRequest>(b) {
                let _ = identity::public_key_from_slice(&r.new_public_key);
            }
            decoded::<api::EscrowRequest>(b);
        }
        8 => {
            decoded::<api::HeartbeatRequest>(b);
            decoded::<api::ListNodesRequest>(b);
        }
        9 => {
            if let Some(r) = decoded::<api::AuditLogRequest>(b)
                && !r.node_id.is_empty()
            {
                node_id(&r.node_id);
            }
            decoded::<api::NodeLogsRequest>(b);
            decoded::<api::CreateRegisterTicketRequest>(b);
        }
        10 => {
            if let Some(u) = decoded::<api::WatchNodeUpdate>(b) {
                endpoints(&u.curator_endpoints);
                crl(&u.cluster_crl);
            }
        }
        11 => {
            if let Some(r) = decoded::<api::CommitNodeResponse>(b) {
                certificate(&r.node_certificate);
                certificate(&r.ca_certificate);
                endpoints(&r.curator_endpoints);
            }
        }
        12 => {
            if let Some(r) = decoded::<api::RenewCertificatesResponse>(b) {
                certificate(&r.node_certificate);
                certificate(&r.peer_certificate);
            }
            decoded::<api::EscrowResponse>(b);
        }
        13 => {
            if let Some(r) = decoded::<api::GetCaCertificateResponse>(b) {
                certificate(&r.ca_certificate);
                crl(&r.crl);
            }
        }
        14 => {
            if let Some(r) = decoded::<api::UnlockDataResponse>(b) {
                node_id(&r.node_id);
                half(&r.cluster_half);
            }
        }
        15 => {
            if let Some(r) = decoded::<api::GetConsensusStatusResponse>(b) {
                let mut chain = r.epoch_chain.clone();
                chain.extend(r.epoch);
                epochs(&chain);
            }
        }
        16 => {
            if let Some(r) = decoded::<api::JoinConsensusResponse>(b) {
                certificate(&r.peer_certificate);
                epochs(&r.epochs);
            }
        }
        17 => {
            if let Some(api::BackupChunk {
                part: Some(api::backup_chunk::Part::Start(s)),
            }) = decoded::<api::BackupChunk>(b)
            {
                certificate(&s.ca_certificate);
            }
        }
        18 => {
            decoded::<api::ListNodesResponse>(b);
            decoded::<api::GetClusterInfoResponse>(b);
            decoded::<api::ListSnapshotsResponse>(b);
        }
        _ => {
            decoded::<api::RegistrationUpdate>(b);
            decoded::<api::GetCurrentLeaderResponse>(b);
            decoded::<api::ListRegisterTicketsResponse>(b);
            decoded::<api::NodeLogLine>(b);
        }
    }
}

/// A snapshot name a caller asks for is joined to a directory only when it parses, so
/// what parses must be a plain file name, spelled one way.
fn snapshot_name(name: &str) {
    if let Some(parsed) = curator::snapshots::SnapshotName::parse(name) {
        assert!(!name.contains('/') && !name.starts_with('.'), "{name:?}");
        assert_eq!(parsed.file_name(), name);
    }
}

pub fn api_messages_seeds() -> Vec<Vec<u8>> {
    let id = "polis-00112233445566778899aabbccddeeff".to_string();
    let name = curator::snapshots::SnapshotName {
        taken_at_unix_ms: 1_795_000_000_000,
        revision: 1234,
    }
    .file_name();
    let epoch = config::ClusterEpoch {
        number: 1,
        made_unix_ms: 1_795_000_000_000,
        made_by: id.clone(),
        kind: "recover".into(),
        parent_revision: 99,
        ..Default::default()
    };
    let seeds: Vec<(usize, Vec<u8>)> = vec![
        (
            0,
            api::UpdateNodeLabelsRequest {
                id: id.clone(),
                upsert: HashMap::from([("zone".into(), "b2".into()), ("x".into(), "".into())]),
                delete: vec!["rack".into()],
            }
            .encode_to_vec(),
        ),
        (
            1,
            api::RegisterNodeRequest {
                register_ticket: b"0123abcd.00".to_vec(),
                address: "10.0.0.7".into(),
                labels: HashMap::from([("zone".into(), "a1".into())]),
                data_join_key: vec![5; 32],
                data_cluster_half: datafs::Half::from_bytes([6; 32]).encode(),
            }
            .encode_to_vec(),
        ),
        (
            2,
            api::SetSnapshotScheduleRequest {
                snapshot_interval_seconds: 3600,
                snapshot_keep: 4,
            }
            .encode_to_vec(),
        ),
        (
            3,
            api::FetchSnapshotRequest {
                node_id: id.clone(),
                name: name.clone(),
            }
            .encode_to_vec(),
        ),
        (4, api::SnapshotsFetchLocalRequest { name }.encode_to_vec()),
        (
            5,
            api::DescribeNodeRequest { id: id.clone() }.encode_to_vec(),
        ),
        (
            6,
            api::UpdateNodeRolesRequest {
                id: id.clone(),
                add: vec![proto::ROLE_CONSENSUS_MEMBER.into()],
                remove: vec![],
            }
            .encode_to_vec(),
        ),
        (
            7,
            api::RotateOwnerRequest {
                new_public_key: vec![9; 32],
            }
            .encode_to_vec(),
        ),
        (
            8,
            api::ListNodesRequest {
                state: state::NodeState::Up as i32,
                role: proto::ROLE_CONSENSUS_MEMBER.into(),
                labels: HashMap::from([("zone".into(), "a1".into())]),
                page_size: 10,
                after_id: id.clone(),
            }
            .encode_to_vec(),
        ),
        (
            9,
            api::AuditLogRequest {
                node_id: id.clone(),
                since_unix_micros: 5,
                follow: true,
                after_key: "audit/1".into(),
            }
            .encode_to_vec(),
        ),
        (
            10,
            api::WatchNodeUpdate {
                state: state::NodeState::Up as i32,
                roles: vec![proto::ROLE_CONSENSUS_MEMBER.into()],
                curator_endpoints: vec!["127.0.0.1:7835".into()],
                cluster_crl: crate::fixture::crl().to_vec().into(),
                record_revision: 10,
                record_etcd_cluster: 7,
                cluster_cas: vec![crate::fixture::CA_DER.to_vec().into()],
                cluster_crls: vec![crate::fixture::crl().to_vec().into()],
                etcd_peer_cas: vec![crate::fixture::CA_DER.to_vec().into()],
            }
            .encode_to_vec(),
        ),
        (
            11,
            api::CommitNodeResponse {
                node_certificate: crate::fixture::node_certificate().to_vec(),
                ca_certificate: crate::fixture::CA_DER.to_vec(),
                roles: vec![],
                curator_endpoints: vec!["127.0.0.1:7835".into()],
            }
            .encode_to_vec(),
        ),
        (
            13,
            api::GetCaCertificateResponse {
                ca_certificate: crate::fixture::CA_DER.to_vec(),
                crl: crate::fixture::crl().to_vec(),
                trusted_cas: vec![crate::fixture::CA_DER.to_vec()],
                crls: vec![crate::fixture::crl().to_vec()],
                handovers: vec![crate::fixture::handover().to_vec()],
            }
            .encode_to_vec(),
        ),
        (
            14,
            api::UnlockDataResponse {
                node_id: id.clone(),
                cluster_half: datafs::Half::from_bytes([6; 32]).encode(),
            }
            .encode_to_vec(),
        ),
        (
            15,
            api::GetConsensusStatusResponse {
                node_id: id.clone(),
                member_id: 42,
                epoch: Some(epoch.clone()),
                epoch_chain: vec![epoch.clone()],
                members: vec![api::ConsensusMember {
                    id: 42,
                    name: id.clone(),
                    peer_urls: vec!["https://127.0.0.1:7834".into()],
                    is_learner: false,
                }],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            16,
            api::JoinConsensusResponse {
                peer_certificate: crate::fixture::node_certificate().to_vec(),
                epochs: vec![epoch],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            17,
            api::BackupChunk {
                part: Some(api::backup_chunk::Part::Start(api::BackupStart {
                    node_id: id.clone(),
                    revision: 5,
                    ca_certificate: crate::fixture::CA_DER.to_vec(),
                    ..Default::default()
                })),
            }
            .encode_to_vec(),
        ),
        (
            19,
            api::RegistrationUpdate {
                node_id: id,
                state: state::NodeState::New as i32,
            }
            .encode_to_vec(),
        ),
    ];
    seeds.iter().map(|(c, s)| picked(*c, s)).collect()
}
