use std::io::Cursor;

use super::*;

fn header() -> Header {
    Header {
        ca_fingerprint: "ab".repeat(32),
        trusted_ca_fingerprints: vec!["ab".repeat(32), "cd".repeat(32)],
        revision: 42,
        quorum_read: true,
        taken_at_unix_ms: 1_700_000_000_000,
        node_id: format!("polis-{}", "cd".repeat(16)),
        etcd_cluster_id: "1".into(),
        etcd_member_id: "2".into(),
        polis_version: "0.1.0".into(),
        etcd_version: "3.4.23".into(),
    }
}

/// A backup of `snapshot` written in pieces of `piece` bytes.
fn backup_bytes(snapshot: &[u8], piece: usize) -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), &header()).unwrap();
    for chunk in snapshot.chunks(piece.max(1)) {
        w.write_snapshot(chunk).unwrap();
    }
    assert_eq!(w.snapshot_size(), snapshot.len() as u64);
    w.finish().unwrap().0
}

fn check(bytes: Vec<u8>) -> Result<(Backup, Vec<u8>), BackupError> {
    let mut r = Cursor::new(bytes);
    let backup = open(&mut r)?;
    let mut out = Vec::new();
    copy_snapshot(&mut r, &backup, &mut out)?;
    Ok((backup, out))
}

fn snapshot() -> Vec<u8> {
    (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn round_trip() {
    for snap in [Vec::new(), b"x".to_vec(), snapshot()] {
        let bytes = backup_bytes(&snap, 4096);
        let (backup, out) = check(bytes.clone()).unwrap();
        assert_eq!(out, snap);
        assert_eq!(backup.header, header());
        assert_eq!(backup.format_version, FORMAT_VERSION);
        assert_eq!(backup.trailer.snapshot_size, snap.len() as u64);
        assert_eq!(
            backup.trailer.snapshot_sha256.as_slice(),
            ring::digest::digest(&SHA256, &snap).as_ref()
        );
        // The snapshot is contiguous at the offset the header length gives.
        let at = backup.snapshot_offset as usize;
        assert_eq!(&bytes[at..at + snap.len()], snap.as_slice());
    }
}

#[test]
fn truncated_files_are_named_truncated() {
    let bytes = backup_bytes(&snapshot(), 65536);
    for keep in [
        9,
        16,
        40,
        bytes.len() / 2,
        bytes.len() - 1,
        bytes.len() - 80,
    ] {
        let err = check(bytes[..keep].to_vec()).unwrap_err();
        assert!(matches!(err, BackupError::Truncated(_)), "{keep}: {err}");
        assert!(err.to_string().starts_with("truncated"), "{err}");
    }
}

#[test]
fn every_flipped_byte_is_caught() {
    let snap: Vec<u8> = (0..2000u32).map(|i| i as u8).collect();
    let bytes = backup_bytes(&snap, 100);
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x01;
        assert!(check(bad).is_err(), "a flip at byte {at} went unnoticed");
    }
}

#[test]
fn a_flipped_snapshot_byte_is_a_hash_mismatch() {
    let bytes = backup_bytes(&snapshot(), 65536);
    let (backup, _) = check(bytes.clone()).unwrap();
    let mut bad = bytes;
    bad[backup.snapshot_offset as usize + 1234] ^= 0x80;
    let err = check(bad).unwrap_err();
    assert!(matches!(err, BackupError::HashMismatch { .. }), "{err}");
    assert!(err.to_string().contains("hash mismatch"), "{err}");
}

#[test]
fn wrong_magic_or_version_or_tiny_files() {
    let bytes = backup_bytes(b"data", 4);
    let mut bad = bytes.clone();
    bad[..8].copy_from_slice(b"SQLite f");
    assert!(matches!(check(bad), Err(BackupError::NotABackup)));
    for tiny in [&b""[..], b"POLIS", b"hello world, not a backup at all"] {
        let err = check(tiny.to_vec()).unwrap_err();
        assert!(
            matches!(err, BackupError::NotABackup | BackupError::Truncated(_)),
            "{tiny:?}: {err}"
        );
    }
    let mut newer = bytes;
    newer[8..12].copy_from_slice(&2u32.to_be_bytes());
    assert!(matches!(
        check(newer),
        Err(BackupError::UnsupportedVersion(2))
    ));
}

#[test]
fn files_are_private_atomic_and_errors_name_them() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.polisbackup");
    let mut w = create_file(&path, &header()).unwrap();
    w.write_snapshot(b"snapshot bytes").unwrap();
    assert!(!path.exists(), "visible before it is complete");
    let (file, _) = w.finish().unwrap();
    file.commit().unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let backup = inspect_file(&path).unwrap();
    assert_eq!(backup.trailer.snapshot_size, 14);

    // Abandoned: nothing left.
    let other = dir.path().join("abandoned");
    let mut w = create_file(&other, &header()).unwrap();
    w.write_snapshot(b"half").unwrap();
    drop(w);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let missing = dir.path().join("missing");
    let err = inspect_file(&missing).unwrap_err().to_string();
    assert!(err.starts_with(&missing.display().to_string()), "{err}");
    let err = create_file(&dir.path().join("no/such/dir/b"), &header())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no/such/dir"), "{err}");

    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = inspect_file(&path).unwrap_err().to_string();
    assert!(err.starts_with(&path.display().to_string()), "{err}");
}

/// Properties over arbitrary files and headers (proptest).
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn any_header() -> impl Strategy<Value = Header> {
        (
            (any::<String>(), any::<i64>(), any::<bool>(), any::<u64>()),
            (any::<String>(), any::<String>(), any::<String>()),
            (any::<String>(), any::<String>()),
            proptest::collection::vec(any::<String>(), 0..4),
        )
            .prop_map(
                |(
                    (ca_fingerprint, revision, quorum_read, taken_at_unix_ms),
                    (node_id, etcd_cluster_id, etcd_member_id),
                    (polis_version, etcd_version),
                    trusted_ca_fingerprints,
                )| Header {
                    ca_fingerprint,
                    trusted_ca_fingerprints,
                    revision,
                    quorum_read,
                    taken_at_unix_ms,
                    node_id,
                    etcd_cluster_id,
                    etcd_member_id,
                    polis_version,
                    etcd_version,
                },
            )
    }

    fn written(header: &Header, snapshot: &[u8]) -> Vec<u8> {
        let mut w = Writer::new(Vec::new(), header).unwrap();
        w.write_snapshot(snapshot).unwrap();
        w.finish().unwrap().0
    }

    proptest! {
        #[test]
        fn any_file_opens_or_is_refused(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = check(bytes.clone());
            // The same bytes behind a valid prefix reach the header and trailer checks.
            let mut prefixed = MAGIC.to_vec();
            prefixed.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
            prefixed.extend_from_slice(&bytes);
            let _ = check(prefixed);
        }

        #[test]
        fn what_is_written_reads_back(
            header in any_header(),
            snapshot in prop::collection::vec(any::<u8>(), 0..500),
        ) {
            let (backup, out) = check(written(&header, &snapshot)).unwrap();
            prop_assert_eq!(backup.header, header);
            prop_assert_eq!(out, snapshot);
        }

        #[test]
        fn any_changed_byte_is_caught(
            snapshot in prop::collection::vec(any::<u8>(), 0..200),
            at in any::<prop::sample::Index>(),
            flip in 1u8..,
        ) {
            let mut bytes = written(&header(), &snapshot);
            let at = at.index(bytes.len());
            bytes[at] ^= flip;
            prop_assert!(check(bytes).is_err(), "byte {} changed unnoticed", at);
        }
    }
}
