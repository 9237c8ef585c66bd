//! A backup's header, as `cluster backup` and `cluster backup inspect` show it.
//! May not read or write files: results in, text on stdout out.

use std::path::Path;

use serde_json::{Value, json};

use crate::output::{self, Format, escape};

fn header_value(file: &Path, header: &backup::Header, trailer: &backup::Trailer) -> Value {
    json!({
        "file": file.display().to_string(),
        "ca_fingerprint": header.ca_fingerprint,
        "trusted_ca_fingerprints": header.trusted_ca_fingerprints,
        "node_id": header.node_id,
        "revision": header.revision,
        "quorum_read": header.quorum_read,
        "taken_at": output::utc_time(header.taken_at_unix_ms),
        "taken_at_unix_ms": header.taken_at_unix_ms,
        "polis_version": header.polis_version,
        "etcd_version": header.etcd_version,
        "etcd_cluster_id": header.etcd_cluster_id,
        "etcd_member_id": header.etcd_member_id,
        "snapshot_size": trailer.snapshot_size,
        "snapshot_sha256": hex(&trailer.snapshot_sha256),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn print(value: &Value, format: Format, table: impl FnOnce()) {
    match format {
        Format::Quiet => {}
        Format::Json => println!("{value}"),
        Format::Yaml => print!("{}", output::yaml(value)),
        Format::Table => table(),
    }
}

fn print_header(header: &backup::Header, trailer: &backup::Trailer) {
    let quorum = if header.quorum_read {
        "read through the quorum"
    } else {
        "local state only: the member had no quorum"
    };
    println!("CA fingerprint:  SHA256:{}", escape(&header.ca_fingerprint));
    // Listed only when a rotation was running (one CA: the line above says it all).
    if header.trusted_ca_fingerprints.len() > 1 {
        for fingerprint in &header.trusted_ca_fingerprints {
            println!("Trusted CA:      SHA256:{}", escape(fingerprint));
        }
    }
    println!("Node:            {}", escape(&header.node_id));
    println!("etcd revision:   {} ({quorum})", header.revision);
    println!(
        "Taken at:        {}",
        output::utc_time(header.taken_at_unix_ms)
    );
    println!(
        "Versions:        Polis {}, etcd {}",
        escape(&header.polis_version),
        escape(&header.etcd_version)
    );
    println!(
        "etcd IDs:        cluster {}, member {}",
        header.etcd_cluster_id, header.etcd_member_id
    );
    println!("Snapshot:        {} bytes", trailer.snapshot_size);
    println!("SHA-256:         {}", hex(&trailer.snapshot_sha256));
}

/// After `cluster backup --out FILE`.
pub(crate) fn print_saved(
    file: &Path,
    header: &backup::Header,
    trailer: &backup::Trailer,
    format: Format,
) {
    print(&header_value(file, header, trailer), format, || {
        println!("Backup written to {}", file.display());
        print_header(header, trailer);
    });
}

/// `cluster backup inspect FILE` (the snapshot verified).
pub(crate) fn print_inspected(file: &Path, backup: &backup::Backup, format: Format) {
    let mut value = header_value(file, &backup.header, &backup.trailer);
    value["format_version"] = json!(backup.format_version);
    value["snapshot_offset"] = json!(backup.snapshot_offset);
    value["verified"] = json!(true);
    print(&value, format, || {
        println!("File:            {}", file.display());
        println!(
            "Format:          Polis backup, version {}",
            backup.format_version
        );
        print_header(&backup.header, &backup.trailer);
        println!("Snapshot offset: {}", backup.snapshot_offset);
        println!("Verified:        the snapshot matches its SHA-256");
    });
}
