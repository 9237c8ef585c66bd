//! Files and streams that are not protobuf: backup files (an operator hands one to
//! `polisctl cluster backup inspect` or a restore), the data key halves and the marker
//! and first bytes of a data device, node key files, and the text etcd's metrics socket
//! answers.

use std::io::Cursor;

use crate::{pick, picked};

/// The first byte's low bit: 0 — the bytes are the file; 1 — they are its header and
/// snapshot, framed with a matching trailer, so the header JSON is reached (a trailer
/// holds its SHA-256, which the fuzzer would never guess). In the framed form the next
/// two bytes give the header's length.
pub fn backup_file(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let file = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        frame(rest)
    };
    let mut reader = Cursor::new(file.as_slice());
    let Ok(opened) = backup::open(&mut reader) else {
        return;
    };
    assert_eq!(
        opened.snapshot_offset + opened.trailer.snapshot_size + backup::TRAILER_LEN,
        file.len() as u64
    );
    let mut snapshot = Vec::new();
    if backup::copy_snapshot(&mut reader, &opened, &mut snapshot).is_err() {
        return;
    }
    // What verified writes back as a backup that opens to the same header and snapshot.
    let mut writer = backup::Writer::new(Vec::new(), &opened.header).expect("the header writes");
    writer.write_snapshot(&snapshot).expect("a Vec grows");
    let (rewritten, trailer) = writer.finish().expect("a Vec grows");
    assert_eq!(trailer.snapshot_sha256, opened.trailer.snapshot_sha256);
    let again = backup::open(&mut Cursor::new(rewritten.as_slice())).expect("a rewrite opens");
    assert_eq!(again.header, opened.header);
}

fn frame(rest: &[u8]) -> Vec<u8> {
    use ring::digest::{SHA256, digest};
    let (len, body) = match rest {
        [a, b, body @ ..] => (usize::from(u16::from_be_bytes([*a, *b])), body),
        _ => (0, rest),
    };
    let (header, snapshot) = body.split_at(len.min(body.len()));
    let mut file = Vec::with_capacity(rest.len() + 96);
    file.extend_from_slice(backup::MAGIC);
    file.extend_from_slice(&backup::FORMAT_VERSION.to_be_bytes());
    file.extend_from_slice(&u32::try_from(header.len()).expect("short").to_be_bytes());
    file.extend_from_slice(header);
    file.extend_from_slice(snapshot);
    file.extend_from_slice(&(snapshot.len() as u64).to_be_bytes());
    file.extend_from_slice(digest(&SHA256, snapshot).as_ref());
    file.extend_from_slice(digest(&SHA256, header).as_ref());
    file.extend_from_slice(backup::END_MAGIC);
    file
}

pub fn backup_file_seeds() -> Vec<Vec<u8>> {
    let header = backup::Header {
        ca_fingerprint: "ab".repeat(32),
        trusted_ca_fingerprints: vec!["ab".repeat(32), "cd".repeat(32)],
        revision: 1234,
        quorum_read: true,
        taken_at_unix_ms: 1_795_000_000_000,
        node_id: "polis-00112233445566778899aabbccddeeff".into(),
        etcd_cluster_id: "cdf818194e3a8c32".into(),
        etcd_member_id: "8e9e05c52164694d".into(),
        polis_version: "0.1.0".into(),
        etcd_version: "3.4.23".into(),
    };
    let mut writer = backup::Writer::new(Vec::new(), &header).expect("the header writes");
    writer
        .write_snapshot(b"bbolt database bytes, then etcd's sha256")
        .expect("a Vec grows");
    let (whole, _) = writer.finish().expect("a Vec grows");
    let json = serde_json::to_vec(&header).expect("a header serializes");
    let mut framed = vec![1];
    framed.extend_from_slice(&u16::try_from(json.len()).expect("short").to_be_bytes());
    framed.extend_from_slice(&json);
    framed.extend_from_slice(b"snapshot");
    vec![[&[0], whole.as_slice()].concat(), framed]
}

/// A data device's pieces, picked by the first byte: 0 — an encoded key half (the
/// local half's file, a DataUnlock answer); 1 — the marker file; 2 — a device's first
/// bytes (what `probe::classify` judges before anything is formatted).
pub fn datafs(data: &[u8]) {
    let Some((choice, bytes)) = pick(data, 3) else {
        return;
    };
    match choice {
        0 => {
            if let Ok(half) = datafs::Half::decode(bytes) {
                assert_eq!(half.encode(), bytes);
            }
            if let Some(raw) = bytes.first_chunk::<{ datafs::key::HALF_LEN }>() {
                let half = datafs::Half::from_bytes(*raw);
                assert_eq!(datafs::Half::decode(&half.encode()), Ok(half));
            }
        }
        1 => {
            let text = String::from_utf8_lossy(bytes);
            if let Ok(owner) = datafs::Owner::decode(&text) {
                assert_eq!(datafs::Owner::decode(&owner.encode()), Ok(owner));
            }
        }
        _ => {
            let content = datafs::probe::classify(bytes);
            let zeroed = bytes.iter().all(|&b| b == 0);
            assert_eq!(content == datafs::probe::Content::Empty, zeroed);
        }
    }
}

pub fn datafs_seeds() -> Vec<Vec<u8>> {
    let owner = datafs::Owner {
        cluster: "cdf818194e3a8c32".into(),
        node: "polis-00112233445566778899aabbccddeeff".into(),
    };
    // An ext4 superblock at 1024 labelled polis-data with the encrypt feature.
    let mut head = vec![0u8; 4096];
    head[1024 + 0x38..1024 + 0x3a].copy_from_slice(&0xEF53u16.to_le_bytes());
    head[1024 + 0x60..1024 + 0x64].copy_from_slice(&0x10000u32.to_le_bytes());
    head[1024 + 0x78..1024 + 0x78 + 10].copy_from_slice(datafs::probe::LABEL.as_bytes());
    let mut luks = vec![0u8; 600];
    luks[..6].copy_from_slice(b"LUKS\xba\xbe");
    vec![
        picked(0, &datafs::Half::from_bytes([0x5a; 32]).encode()),
        picked(1, owner.encode().as_bytes()),
        picked(2, &head),
        picked(2, &luks),
    ]
}

/// A node key file (`<root>/.../node.key`, PKCS#8 DER): what loads loads again from the
/// form it is written in, as the same key.
pub fn node_key(data: &[u8]) {
    let Ok(key) = identity::NodeKey::from_pkcs8(data) else {
        return;
    };
    let again = identity::NodeKey::from_pkcs8(key.pkcs8_der()).expect("a written key loads");
    assert_eq!(again.public_key(), key.public_key());
    identity::validate_node_id(&key.node_id()).expect("a key's node ID is valid");
}

pub fn node_key_seeds() -> Vec<Vec<u8>> {
    let key = identity::NodeKey::generate().expect("a key");
    // ring's own form (PKCS#8 v2, with the public key) as well as the v1 Polis writes.
    let rng = ring::rand::SystemRandom::new();
    let v2 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("a key");
    vec![key.pkcs8_der().to_vec(), v2.as_ref().to_vec()]
}

/// etcd's metrics text, as read from its metrics socket (`consensus::selfreport`).
pub fn selfreport(data: &[u8]) {
    let report = consensus::selfreport::parse(&String::from_utf8_lossy(data));
    let members = [consensus::membership::Member {
        id: 0x8e9e05c52164694d,
        name: "polis-00112233445566778899aabbccddeeff".into(),
        peer_urls: vec!["https://127.0.0.1:7834".into()],
        is_learner: false,
    }];
    let view = consensus::selfreport::peer_view(&report, report.member_id, &members);
    assert!(view.iter().all(|p| p.id != 0));
    assert!(
        view.windows(2).all(|w| w[0].id < w[1].id),
        "sorted by member ID"
    );
}

pub fn selfreport_seeds() -> Vec<Vec<u8>> {
    let text = "# HELP etcd_server_has_leader Whether or not a leader exists.\n\
        # TYPE etcd_server_has_leader gauge\n\
        etcd_server_has_leader 1\n\
        etcd_server_is_leader 0\n\
        etcd_server_is_learner 0\n\
        etcd_server_id{server_id=\"8e9e05c52164694d\"} 1\n\
        etcd_server_proposals_committed_total 1234\n\
        etcd_server_proposals_applied_total 1230\n\
        etcd_server_leader_changes_seen_total 2\n\
        etcd_server_quota_backend_bytes 2.147483648e+09\n\
        etcd_mvcc_db_total_size_in_bytes 24576\n\
        etcd_mvcc_db_total_size_in_use_in_bytes 16384\n\
        etcd_debugging_mvcc_current_revision 77\n\
        etcd_network_active_peers{Local=\"8e9e05c52164694d\",Remote=\"91bc3c398fb3c146\"} 1\n\
        etcd_network_peer_sent_failures_total{To=\"fd422379fda50e48\"} 3\n";
    vec![text.as_bytes().to_vec()]
}
