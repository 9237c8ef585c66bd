//! Text from outside: the headers curators answer and forward with, and the fields
//! operators type (labels, sizes, intervals) or callers send (node IDs, snapshot names,
//! endpoints, peer addresses), plus the /proc text the metrics read.

use crate::{pick, picked};

/// `x-polis-epoch` (every curator answer): what decodes re-encodes to the same value,
/// except that numbers are written without a sign or leading zeros.
pub fn epoch_header(data: &[u8]) {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let Some(epoch) = rpc::epoch::decode(value) else {
        return;
    };
    let header = rpc::epoch::encode(&epoch);
    assert_eq!(
        rpc::epoch::decode(&header),
        Some(epoch.clone()),
        "{header:?}"
    );
    assert!(
        http_header_value(&header),
        "the header of a decoded epoch is a valid header value: {header:?}"
    );
    let _ = proto::epoch::describe(&epoch);
}

fn http_header_value(s: &str) -> bool {
    s.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
}

pub fn epoch_header_seeds() -> Vec<Vec<u8>> {
    [
        "0-0--",
        "2-1795674017451-restore-polis-5b4993252d1ed0f05b4993252d1ed0f0",
        "1-1795000000000-recover-polis-00112233445566778899aabbccddeeff",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

/// `x-polis-forwarded-identity` (a follower forwarding a call to the leader): what
/// decodes re-encodes to the same text.
pub fn forwarded_identity(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(identity) = rpc::forward::decode_identity(text) else {
        return;
    };
    let encoded = rpc::forward::encode_identity(&identity).expect("a decoded identity encodes");
    let again = rpc::forward::decode_identity(&encoded).expect("an encoded identity decodes");
    assert_eq!(format!("{again:?}"), format!("{identity:?}"));
}

pub fn forwarded_identity_seeds() -> Vec<Vec<u8>> {
    let key = [7u8; 32];
    [
        rpc::Identity::Anonymous,
        rpc::Identity::SelfSigned {
            public_key: key.to_vec(),
        },
        rpc::Identity::Node {
            id: identity::node_id(&key),
            public_key: key.to_vec(),
        },
        rpc::Identity::User {
            name: "owner".into(),
            public_key: key.to_vec(),
        },
    ]
    .iter()
    .filter_map(rpc::forward::encode_identity)
    .map(String::into_bytes)
    .collect()
}

/// Short text fields, the first byte picking the parser.
pub fn text_fields(data: &[u8]) {
    let Some((choice, bytes)) = pick(data, 9) else {
        return;
    };
    let text = String::from_utf8_lossy(bytes);
    let text = text.as_ref();
    match choice {
        // A label `key=value` (polisctl's argument, a request's map entry).
        0 => {
            let (key, value) = text.split_once('=').unwrap_or((text, ""));
            if proto::labels::validate_key(key).is_ok() {
                assert!(key.len() <= proto::labels::MAX_LENGTH && key.is_ascii());
            }
            if proto::labels::validate_value(key, value).is_ok() {
                assert!(value.len() <= proto::labels::MAX_LENGTH && value.is_ascii());
            }
            // Errors quote what they refuse, bounded whatever its size.
            assert!(proto::echo::quoted(text).len() < 1000);
        }
        1 => {
            if identity::validate_node_id(text).is_ok() {
                let hex = &text[identity::NODE_ID_PREFIX.len()..];
                let bytes = (0..16)
                    .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                    .collect::<Vec<u8>>();
                let mut key = [0u8; 32];
                key[..16].copy_from_slice(&bytes);
                assert_eq!(identity::node_id(&key), text);
            }
        }
        // `--etcd-quota 2GiB`: a size that parses is shown as one that parses the same.
        2 => {
            if let Ok(size) = proto::quota::parse_size(text)
                && let Ok(quota) = proto::quota::effective_quota(size)
            {
                let _ = proto::quota::show(quota);
            }
        }
        3 => {
            if let Ok(seconds) = proto::snapshots::parse_interval(text) {
                let shown = proto::snapshots::show(seconds);
                assert_eq!(
                    proto::snapshots::parse_interval(&shown),
                    Ok(seconds),
                    "{shown}"
                );
            }
        }
        4 => {
            if let Some(name) = curator::snapshots::SnapshotName::parse(text) {
                assert_eq!(name.file_name(), text);
                assert!(!text.contains('/'));
            }
        }
        5 => {
            if let Ok(address) = rpc::client::parse_endpoint(text) {
                let shown = address.to_string();
                assert_eq!(rpc::client::parse_endpoint(&shown).ok(), Some(address));
            }
            let _ = rpc::client::url_address(text);
        }
        // A caller's source address, as the audit log's stranger accounts key it.
        6 => {
            let _ = curator::audit::bounds::source(text);
        }
        7 => {
            let _ = metrics::process::parse_stat(text, 100.0, 4096, 1_700_000_000);
            let _ = metrics::process::parse_boot_time(text);
        }
        _ => {
            let max = bytes.first().map_or(0, |&b| usize::from(b));
            let clipped = proto::echo::clip(text, max);
            if text.len() <= max {
                assert_eq!(clipped, text);
            } else {
                assert!(clipped.len() <= max, "{} > {max}", clipped.len());
            }
        }
    }
}

pub fn text_fields_seeds() -> Vec<Vec<u8>> {
    let snapshot = curator::snapshots::SnapshotName {
        taken_at_unix_ms: 1_795_000_000_000,
        revision: 77,
    }
    .file_name();
    let seeds: Vec<(usize, &str)> = vec![
        (0, "zone=a1"),
        (0, "rack.row-3_x=v.1"),
        (1, "polis-00112233445566778899aabbccddeeff"),
        (2, "2GiB"),
        (2, "512 mib"),
        (3, "6h"),
        (3, "90"),
        (4, &snapshot),
        (5, "127.0.0.1:7835"),
        (5, "[::1]"),
        (5, "https://[fd00::1]:7834"),
        (6, "[2001:db8::1]:4000"),
        (
            7,
            "1234 (polis node) S 1 1234 1234 0 -1 4194560 2046 0 0 0 12 7 0 0 20 0 9 0 \
             5123 1002430464 3127 18446744073709551615 1 1 0 0 0 0 0 4096 17475 0 0 0 \
             17 1 0 0 0 0 0\nbtime 1700000000\n",
        ),
        (8, "\u{1}a long text to clip é"),
    ];
    seeds
        .iter()
        .map(|(c, s)| picked(*c, s.as_bytes()))
        .collect()
}
