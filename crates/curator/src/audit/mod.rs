//! The audit log's rules (pure): entry keys (sorted by time), who a caller is, what a
//! call targets, which entries a reader asked for; in `bounds` the size of an entry
//! and of the log, and whose entries go when it is over; in `tally` which calls are
//! counted in windows rather than recorded one by one.
//!
//! ```text
//!   mod (this file)   keys, who, target, Filter
//!   tally             refused calls of anyone but the owner, counted per window
//!   bounds            clip (entry size), Budget, Account, Ledger (the share rule)
//! ```
//!
//! May not do I/O (it reads the clock): `service::audit_writer` and the changes that
//! carry their own entry (`writes::carried`) write the entries, `service::audit_log`
//! reads them.

pub mod bounds;
pub mod tally;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use proto::api::AuditEntry;

/// Prefix of every audit entry's key, inside the curator namespace.
pub const PREFIX: &str = "audit/";

/// An entry's key: its time, then the writing curator's sequence number and ID, so keys
/// sort by time and never collide (each curator numbers its own entries).
pub fn entry_key(time_unix_micros: u64, sequence: u64, curator: &str) -> String {
    format!("{PREFIX}{time_unix_micros:020}-{sequence:010}-{curator}")
}

/// The next of this process's entry numbers: one sequence for every writer of entries
/// (the audit writer and the changes that carry their own entry), so that no two
/// entries of this curator share a key even when the clock steps back.
pub fn next_sequence() -> u64 {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    SEQUENCE.fetch_add(1, Ordering::Relaxed) + 1
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The entry of one call written by `curator`, ended with `code` and `message`, cut to
/// size ([`bounds::clip`]), its key still empty.
pub fn entry_of(
    curator: &str,
    call: &rpc::server::AuditCall,
    code: i32,
    message: &str,
) -> AuditEntry {
    let serial = call
        .certificate
        .as_ref()
        .and_then(|c| c.leaf())
        .and_then(serial_of);
    let (identity_kind, identity) = who(call.identity.as_ref(), serial.as_deref());
    let target = target(&call.method, &call.request, &identity_kind, &identity);
    let mut entry = AuditEntry {
        key: String::new(),
        time_unix_micros: now_micros(),
        identity_kind,
        identity,
        source_address: call.peer.map(|p| p.to_string()).unwrap_or_default(),
        curator: curator.to_string(),
        method: call.method.clone(),
        target,
        code,
        code_name: format!("{:?}", tonic::Code::from_i32(code)),
        message: message.to_string(),
        count: 0,
        first_time_unix_micros: 0,
    };
    bounds::clip(&mut entry);
    entry
}

/// The serial of the certificate `der`. The last one read is kept: nearly every audited
/// call comes from the one owner certificate, and parsing it cost as much as a tenth of
/// a label write's own work.
fn serial_of(der: &[u8]) -> Option<Vec<u8>> {
    static LAST: std::sync::Mutex<Option<(Vec<u8>, Vec<u8>)>> = std::sync::Mutex::new(None);
    if let Some((known, serial)) = LAST.lock().expect("serial cache lock").as_ref()
        && known.as_slice() == der
    {
        return Some(serial.clone());
    }
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let serial = cert.tbs_certificate.raw_serial().to_vec();
    *LAST.lock().expect("serial cache lock") = Some((der.to_vec(), serial.clone()));
    Some(serial)
}

/// Gives `entry` its key (this curator's next number at its time).
pub fn assign_key(entry: &mut AuditEntry) {
    entry.key = entry_key(entry.time_unix_micros, next_sequence(), &entry.curator);
}

/// Who called: the identity kind and its name (node ID; owner certificate serial, or
/// the owner key when the serial is unknown; an operator's name and role, then the
/// same; a self-signed key's node ID).
pub fn who(caller: Option<&rpc::Identity>, owner_serial: Option<&[u8]>) -> (String, String) {
    use rpc::Identity;
    let (kind, name) = match caller {
        None | Some(Identity::Anonymous) => ("anonymous", String::new()),
        Some(Identity::Node { id, .. }) => ("node", id.clone()),
        Some(Identity::User { public_key, .. }) => (
            "owner",
            match owner_serial {
                Some(serial) => format!("serial {}", hex::encode(serial)),
                None => format!(
                    "key {}",
                    hex::encode(&public_key[..public_key.len().min(8)])
                ),
            },
        ),
        Some(Identity::Operator {
            name,
            role,
            public_key,
        }) => (
            "operator",
            match owner_serial {
                Some(serial) => format!("{name} ({role}), serial {}", hex::encode(serial)),
                None => format!(
                    "{name} ({role}), key {}",
                    hex::encode(&public_key[..public_key.len().min(8)])
                ),
            },
        ),
        Some(Identity::SelfSigned { public_key }) => (
            "self-signed",
            match identity::public_key_from_slice(public_key) {
                Ok(key) => identity::node_id(&key),
                Err(_) => hex::encode(public_key),
            },
        ),
        Some(Identity::Invalid { reason }) => ("invalid", reason.clone()),
    };
    (kind.to_string(), name)
}

/// The field number of the `id` string field of each RPC's request message.
fn id_fields() -> &'static HashMap<String, u32> {
    static FIELDS: OnceLock<HashMap<String, u32>> = OnceLock::new();
    FIELDS.get_or_init(|| {
        use prost::Message;
        use prost_types::field_descriptor_proto::Type;
        let Ok(set) = prost_types::FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET) else {
            return HashMap::new();
        };
        let mut messages = HashMap::new();
        for file in &set.file {
            for m in &file.message_type {
                let id = m
                    .field
                    .iter()
                    .find(|f| f.name() == "id" && f.r#type() == Type::String)
                    .map(|f| f.number() as u32);
                if let Some(id) = id {
                    messages.insert(format!(".{}.{}", file.package(), m.name()), id);
                }
            }
        }
        let mut fields = HashMap::new();
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    if let Some(id) = messages.get(method.input_type()) {
                        let name =
                            format!("/{}.{}/{}", file.package(), service.name(), method.name());
                        fields.insert(name, *id);
                    }
                }
            }
        }
        fields
    })
}

fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The string in field `number` of an encoded protobuf message, if present.
pub fn string_field(message: &[u8], number: u32) -> Option<String> {
    let mut at = 0;
    while at < message.len() {
        let tag = varint(message, &mut at)?;
        let (field, wire) = ((tag >> 3) as u32, tag & 7);
        match wire {
            0 => {
                varint(message, &mut at)?;
            }
            1 => at += 8,
            5 => at += 4,
            2 => {
                let len = usize::try_from(varint(message, &mut at)?).ok()?;
                let value = message.get(at..at.checked_add(len)?)?;
                if field == number {
                    return String::from_utf8(value.to_vec()).ok();
                }
                at += len;
            }
            _ => return None,
        }
    }
    None
}

/// What a call targets: the node its request names (`id`; empty when the request was
/// not read, e.g. the call was refused before it), the operator an operator call names,
/// or for an RPC whose request names no node, the calling node itself (a node's own
/// calls, a registering key's node ID).
pub fn target(method: &str, request: &[u8], caller_kind: &str, caller: &str) -> String {
    // An operator call targets the operator it names (field 1, `name`).
    if method.ends_with("Operator") && method.starts_with("/polis.api.Management/") {
        return string_field(request, 1).unwrap_or_default();
    }
    if let Some(field) = id_fields().get(method) {
        return string_field(request, *field).unwrap_or_default();
    }
    match caller_kind {
        "node" | "self-signed" => caller.to_string(),
        _ => String::new(),
    }
}

/// What a reader asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub node_id: String,
    pub since_unix_micros: u64,
}

impl Filter {
    pub fn matches(&self, entry: &AuditEntry) -> bool {
        entry.time_unix_micros >= self.since_unix_micros
            && (self.node_id.is_empty()
                || entry.target == self.node_id
                || entry.identity == self.node_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn keys_sort_by_time_then_sequence() {
        let mut keys = vec![
            entry_key(1_000_000, 2, "polis-b"),
            entry_key(999_999, 7, "polis-a"),
            entry_key(1_000_000, 1, "polis-c"),
            entry_key(10_000_000, 0, "polis-a"),
        ];
        keys.sort();
        assert_eq!(
            keys,
            [
                entry_key(999_999, 7, "polis-a"),
                entry_key(1_000_000, 1, "polis-c"),
                entry_key(1_000_000, 2, "polis-b"),
                entry_key(10_000_000, 0, "polis-a"),
            ]
        );
        assert!(keys.iter().all(|k| k.starts_with(PREFIX)));
    }

    #[test]
    fn targets_come_from_the_request_or_the_calling_node() {
        let request = proto::api::ApproveNodeRequest {
            id: "polis-abc".into(),
        }
        .encode_to_vec();
        assert_eq!(
            target(
                "/polis.api.Management/ApproveNode",
                &request,
                "owner",
                "serial 01"
            ),
            "polis-abc"
        );
        let labels = proto::api::UpdateNodeLabelsRequest {
            id: "polis-x".into(),
            upsert: [("a".to_string(), "b".to_string())].into(),
            delete: vec!["c".into()],
        }
        .encode_to_vec();
        assert_eq!(
            target(
                "/polis.api.Management/UpdateNodeLabels",
                &labels,
                "owner",
                ""
            ),
            "polis-x"
        );
        // RotateOwner's first field is bytes, not an id: no target.
        let rotate = proto::api::RotateOwnerRequest {
            new_public_key: b"polis-not-an-id".to_vec(),
        }
        .encode_to_vec();
        assert_eq!(
            target("/polis.api.Management/RotateOwner", &rotate, "owner", "s"),
            ""
        );
        assert_eq!(
            target(
                "/polis.api.Curator/RenewCertificates",
                &[8, 1],
                "node",
                "polis-n"
            ),
            "polis-n"
        );
        // A refused call's request is not read: no target, not the caller.
        assert_eq!(
            target("/polis.api.Management/ApproveNode", &[], "node", "polis-n"),
            ""
        );
        // Garbage is no target, never a panic.
        assert_eq!(
            target(
                "/polis.api.Management/DeleteNode",
                &[0x0a, 0xff],
                "owner",
                ""
            ),
            ""
        );
    }

    #[test]
    fn callers_are_named_by_kind() {
        let owner = rpc::Identity::User {
            name: "owner".into(),
            public_key: vec![7; 32],
        };
        assert_eq!(
            who(Some(&owner), Some(&[1, 2])),
            ("owner".to_string(), "serial 0102".to_string())
        );
        assert_eq!(who(Some(&owner), None).1, "key 0707070707070707");
        let key = [9u8; 32];
        assert_eq!(
            who(
                Some(&rpc::Identity::SelfSigned {
                    public_key: key.to_vec()
                }),
                None
            ),
            ("self-signed".to_string(), identity::node_id(&key))
        );
        assert_eq!(who(None, None).0, "anonymous");
        let ada = rpc::Identity::Operator {
            name: "ada".into(),
            role: pki::OperatorRole::Operator,
            public_key: vec![8; 32],
        };
        assert_eq!(
            who(Some(&ada), Some(&[0xab])),
            (
                "operator".to_string(),
                "ada (operator), serial ab".to_string()
            )
        );
        assert_eq!(
            who(Some(&ada), None).1,
            "ada (operator), key 0808080808080808"
        );
    }

    #[test]
    fn an_operator_call_targets_the_operator() {
        let remove = proto::api::RemoveOperatorRequest { name: "ada".into() }.encode_to_vec();
        assert_eq!(
            target(
                "/polis.api.Management/RemoveOperator",
                &remove,
                "owner",
                "s"
            ),
            "ada"
        );
        let add = proto::api::AddOperatorRequest {
            name: "rita".into(),
            role: "reader".into(),
            public_key: vec![1; 32],
        }
        .encode_to_vec();
        assert_eq!(
            target("/polis.api.Management/AddOperator", &add, "owner", "s"),
            "rita"
        );
    }

    #[test]
    fn filters_select_by_node_and_time() {
        let entry = AuditEntry {
            time_unix_micros: 100,
            identity: "polis-a".into(),
            target: "polis-b".into(),
            ..Default::default()
        };
        assert!(Filter::default().matches(&entry));
        for (node, since, want) in [
            ("polis-a", 0, true),
            ("polis-b", 100, true),
            ("polis-c", 0, false),
            ("", 101, false),
        ] {
            let f = Filter {
                node_id: node.into(),
                since_unix_micros: since,
            };
            assert_eq!(f.matches(&entry), want, "{f:?}");
        }
    }
}
