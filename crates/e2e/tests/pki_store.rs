//! The PKI's etcd store against a real etcd: ensure semantics under races, revocation.

use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{BareEtcd, TIMEOUT, unique_loopback};
use pki::{CA_LIFETIME, CERTIFICATE_LIFETIME, Ca, CaStore, Template, Usage};

fn fast() -> consensus::RaftTiming {
    consensus::RaftTiming {
        heartbeat: Duration::from_millis(20),
        election_timeout: Duration::from_millis(200),
    }
}

async fn store(dir: &std::path::Path) -> Result<(BareEtcd, CaStore)> {
    let etcd = BareEtcd::spawn(dir, unique_loopback(), fast())?;
    let client = etcd.ready_client(TIMEOUT).await?;
    let store = CaStore::new(consensus::Namespaced::new(client, "test-pki"));
    Ok((etcd, store))
}

fn template() -> Template {
    Template {
        common_name: "polis-x".into(),
        dns_names: vec!["polis-x".into()],
        ip_addresses: vec![],
        usage: Usage::Server,
        lifetime: CERTIFICATE_LIFETIME,
        kind: pki::CertificateKind::Node,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_ensure_ca_creates_exactly_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, store) = store(dir.path()).await?;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .ensure_ca(|| Ca::generate(&format!("CA {i}"), CA_LIFETIME))
                    .await
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await??);
    }
    assert_eq!(results.iter().filter(|(_, created)| *created).count(), 1);
    let first = &results[0].0;
    assert!(
        results.iter().all(|(ca, _)| ca == first),
        "callers got different CAs"
    );
    assert_eq!(store.load_ca().await?.as_ref(), Some(first));
    assert!(pki::crl_serials(&store.crl().await?)?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_ensure_certificate_stores_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, store) = store(dir.path()).await?;
    let (ca, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let key = identity::NodeKey::generate()?.public_key();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, ca) = (store.clone(), ca.clone());
            tokio::spawn(async move {
                store
                    .ensure_certificate("node-x", || ca.issue(&template(), &key))
                    .await
            })
        })
        .collect();
    let mut certs = Vec::new();
    for t in tasks {
        certs.push(t.await??);
    }
    assert!(
        certs.iter().all(|c| c == &certs[0]),
        "callers got different certificates"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_revocations_are_all_kept() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, store) = store(dir.path()).await?;
    store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let serials: Vec<Vec<u8>> = (0..6).map(|_| pki::random_serial()).collect();
    let tasks: Vec<_> = serials
        .iter()
        .cloned()
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move { store.revoke(&s).await })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let mut listed = pki::crl_serials(&store.crl().await?)?;
    listed.sort();
    let mut expected = serials.clone();
    expected.sort();
    assert_eq!(listed, expected);
    // Revoking again is a no-op.
    store.revoke(&serials[0]).await?;
    assert_eq!(pki::crl_serials(&store.crl().await?)?.len(), serials.len());
    Ok(())
}

/// The next CRL from a watch, failing after `TIMEOUT`.
async fn next_crl(crls: &mut tokio::sync::mpsc::Receiver<Vec<u8>>) -> Result<Vec<u8>> {
    tokio::time::timeout(TIMEOUT, crls.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("the CRL watch closed"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crl_watch_sends_the_current_crl_then_every_revocation() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, store) = store(dir.path()).await?;
    // No CA yet: the watch fails (no CRL) and keeps retrying until there is one.
    let mut crls = store.watch_crl();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(crls.try_recv().is_err(), "a CRL before the CA existed");
    store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let first = next_crl(&mut crls).await?;
    assert_eq!(first, store.crl().await?);
    assert!(pki::crl_serials(&first)?.is_empty());

    let serials: Vec<Vec<u8>> = (0..3).map(|_| pki::random_serial()).collect();
    for (i, serial) in serials.iter().enumerate() {
        store.revoke(serial).await?;
        let crl = next_crl(&mut crls).await?;
        assert_eq!(pki::crl_serials(&crl)?, serials[..=i].to_vec());
    }
    // A second watcher starts from the current CRL, not from the beginning.
    let mut late = store.watch_crl();
    assert_eq!(pki::crl_serials(&next_crl(&mut late).await?)?, serials);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crl_sheds_expired_certificates_and_its_number_only_grows() -> Result<()> {
    // Before: CRL entries never left (the CRL only grew until etcd refused it) and its
    // number was its entry count, so a shorter CRL would have looked older.
    let dir = tempfile::tempdir()?;
    let (_etcd, store) = store(dir.path()).await?;
    let (ca, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let key = identity::NodeKey::generate()?;
    let mut recorded = Vec::new();
    for name in ["node-a", "node-b", "node-c"] {
        let der = store
            .ensure_certificate(name, || ca.issue(&template(), &key.public_key()))
            .await?;
        recorded.push((pki::certificate_serial(&der)?, pki::Validity::of(&der)?));
    }
    let number = |crl: &[u8]| pki::verified_crl_number(crl, &ca.cert_der);
    let mut last = number(&store.crl().await?)?;
    let (a, b, c) = (&recorded[0], &recorded[1], &recorded[2]);
    for (serial, _) in [a, b] {
        let crl = store.revoke(serial).await?;
        assert!(number(&crl)? > last);
        last = number(&crl)?;
    }
    // Judged once a and b have ended (and the grace for clocks has passed): they leave.
    let later = a.1.not_after.max(b.1.not_after) + pki::BACKDATE.as_secs();
    let crl = store.revoke_as_of(&c.0, later).await?;
    assert_eq!(pki::crl_serials(&crl)?, vec![c.0.clone()]);
    assert!(number(&crl)? > last, "a shorter CRL must still be newer");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reissued_crl_keeps_its_entries_and_passes_every_earlier_number() -> Result<()> {
    // What a restore does to the CRL of a store brought back from a backup: clients may
    // hold CRLs numbered past the backup's, issued before the restore.
    let dir = tempfile::tempdir()?;
    let (_etcd, store) = store(dir.path()).await?;
    let (ca, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let key = identity::NodeKey::generate()?;
    let der = store
        .ensure_certificate("node-a", || ca.issue(&template(), &key.public_key()))
        .await?;
    let serial = pki::certificate_serial(&der)?;
    let number = |crl: &[u8]| pki::verified_crl_number(crl, &ca.cert_der);
    let revoked = store.revoke(&serial).await?;
    let micros = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
    };
    let before = micros(std::time::SystemTime::now())?;
    let reissued = store.reissue_crl().await?;
    assert!(number(&reissued)? > number(&revoked)?);
    assert!(
        number(&reissued)? >= before,
        "numbered below the clock: {} < {before}",
        number(&reissued)?
    );
    assert_eq!(pki::crl_serials(&reissued)?, vec![serial]);
    assert_eq!(store.crl().await?, reissued);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_issued_certificates_are_listed() -> Result<()> {
    // Before: the records were read in one range, which etcd's answer size limit
    // refused past a few thousand certificates.
    let dir = tempfile::tempdir()?;
    let etcd = BareEtcd::spawn(dir.path(), unique_loopback(), fast())?;
    let client = etcd.ready_client(TIMEOUT).await?;
    let ns = consensus::Namespaced::new(client, "test-pki");
    let store = CaStore::new(ns.clone());
    let (ca, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let key = identity::NodeKey::generate()?;
    let der = ca.issue(&template(), &key.public_key())?.der;
    const COUNT: usize = 10_000;
    // Written directly, 100 per transaction (etcd allows 128 operations per txn).
    for chunk in (0..COUNT).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<_> = chunk
            .iter()
            .map(|i| {
                etcd_client::TxnOp::put(ns.key(&format!("issued/node-{i:05}")), der.clone(), None)
            })
            .collect();
        ns.client()
            .txn(etcd_client::Txn::new().and_then(ops))
            .await?;
    }
    let listed = store.list_issued("").await?;
    assert_eq!(listed.len(), COUNT);
    assert_eq!(listed[0].0, "node-00000");
    assert_eq!(listed[COUNT - 1].0, format!("node-{:05}", COUNT - 1));
    assert_eq!(store.list_issued("node-0999").await?.len(), 10);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_certificate_is_recorded_only_while_its_guard_holds() -> Result<()> {
    use etcd_client::{Compare, CompareOp};
    let dir = tempfile::tempdir()?;
    let (etcd, store) = store(dir.path()).await?;
    let (ca, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let key = identity::NodeKey::generate()?.public_key();
    let mut client = etcd.ready_client(TIMEOUT).await?;
    let put = client.put("record", "UP", None).await?;
    let checked = put.header().map(|h| h.revision()).unwrap_or_default();
    let guard = || Compare::mod_revision("record", CompareOp::Equal, checked);
    // The record changes (a decommission) between the check and the recording.
    client.put("record", "DECOMMISSIONING", None).await?;
    let refused = store
        .ensure_certificate_guarded("node-y", vec![guard()], || ca.issue(&template(), &key))
        .await;
    assert!(
        matches!(refused, Err(pki::PkiError::Fenced(_))),
        "recorded although the guard failed: {refused:?}"
    );
    assert!(store.list_issued("node-y").await?.is_empty());
    // Unchanged since the check: recorded.
    let current = client.get("record", None).await?;
    let revision = current.kvs()[0].mod_revision();
    let recorded = store
        .ensure_certificate_guarded(
            "node-y",
            vec![Compare::mod_revision("record", CompareOp::Equal, revision)],
            || ca.issue(&template(), &key),
        )
        .await?;
    assert_eq!(
        store.list_issued("node-y").await?,
        vec![("node-y".to_string(), recorded)]
    );
    Ok(())
}

/// A rotation's three steps against real etcd: the successor is trusted before it
/// signs, inherits every revocation, takes every revocation made meanwhile, signs once
/// promoted, and the old CA leaves the trust when retired; racing steps happen once,
/// and a watcher sees every phase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_introduces_promotes_and_retires_keeping_every_revocation() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, store) = store(dir.path()).await?;
    let (old, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let mut watched = store.watch_trusted();
    let next = async |w: &mut tokio::sync::mpsc::Receiver<pki::TrustedCas>| {
        tokio::time::timeout(TIMEOUT, w.recv())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the trust watch closed"))
    };
    assert_eq!(
        next(&mut watched).await?.phase(),
        pki::RotationPhase::Settled
    );
    let before = pki::random_serial();
    store.revoke(&before).await?;
    assert_eq!(next(&mut watched).await?.crls().len(), 1);

    let (one, other) = (
        Ca::generate("CA 2", CA_LIFETIME)?,
        Ca::generate("CA 3", CA_LIFETIME)?,
    );
    let (first, second) = tokio::join!(
        store.introduce_successor(&one),
        store.introduce_successor(&other)
    );
    assert_eq!(
        [first?, second?].iter().filter(|made| **made).count(),
        1,
        "two successors introduced"
    );
    let introduced = store.trusted().await?;
    assert_eq!(introduced.phase(), pki::RotationPhase::Introduced);
    let successor = introduced.next.clone().context("a successor")?;
    // Still signing with the old CA; the successor's CRL already lists the revocation.
    assert_eq!(store.load_ca().await?.as_ref(), Some(&old));
    assert_eq!(pki::crl_serials(&successor.crl)?, vec![before.clone()]);
    pki::verified_crl_number(&successor.crl, &successor.cert)?;
    let during = pki::random_serial();
    store.revoke(&during).await?;
    let introduced = store.trusted().await?;
    for crl in introduced.crls() {
        assert_eq!(
            pki::crl_serials(&crl)?,
            vec![before.clone(), during.clone()]
        );
    }

    let (first, second) = tokio::join!(store.promote_successor(), store.promote_successor());
    assert_eq!([first?, second?].iter().filter(|p| **p).count(), 1);
    let reissuing = store.trusted().await?;
    assert_eq!(reissuing.phase(), pki::RotationPhase::Reissuing);
    assert_eq!(
        reissuing.cas(),
        vec![successor.cert.clone(), old.cert_der.clone()]
    );
    let signing = store.load_ca().await?.context("a CA")?;
    assert_eq!(signing.cert_der, successor.cert);
    let after = pki::random_serial();
    let crl = store.revoke(&after).await?;
    pki::verified_crl_number(&crl, &successor.cert)?;
    for crl in store.trusted().await?.crls() {
        assert_eq!(pki::crl_serials(&crl)?.len(), 3);
    }
    assert!(
        !store
            .introduce_successor(&Ca::generate("CA 4", CA_LIFETIME)?)
            .await?
    );

    assert!(store.retire_previous().await?);
    assert!(!store.retire_previous().await?);
    // One handover, from the retired CA to its successor, and only that one: the
    // refused introductions left none.
    let handovers = store.handovers().await?;
    assert_eq!(handovers.len(), 1);
    assert!(pki::handed_over(
        std::slice::from_ref(&old.cert_der),
        &handovers,
        &successor.cert
    ));
    let settled = store.trusted().await?;
    assert_eq!(settled.phase(), pki::RotationPhase::Settled);
    assert_eq!(settled.cas(), vec![successor.cert.clone()]);
    // The watcher saw every phase, ending where the store is.
    let mut phases = Vec::new();
    loop {
        let state = next(&mut watched).await?;
        phases.push(state.phase());
        if state == settled {
            break;
        }
    }
    for phase in [
        pki::RotationPhase::Introduced,
        pki::RotationPhase::Reissuing,
    ] {
        assert!(phases.contains(&phase), "{phases:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_long_expired_and_superseded_are_forgotten() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_etcd, store) = store(dir.path()).await?;
    let (ca, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let key = identity::NodeKey::generate()?;
    // Three renewals of one node's certificate, a day apart, and another node's one.
    let day = time::Duration::days(1);
    let start = time::OffsetDateTime::now_utc() - day * 3;
    let mut names = Vec::new();
    for (i, cn) in ["polis-x", "polis-x", "polis-x", "polis-y"]
        .iter()
        .enumerate()
    {
        let name = format!("node-{cn}-{i}");
        let template = Template {
            common_name: cn.to_string(),
            ..template()
        };
        let issued = start + day * i as i32;
        store
            .ensure_certificate(&name, || ca.issue_at(&template, &key.public_key(), issued))
            .await?;
        names.push(name);
    }
    let validity = |der: &[u8]| pki::Validity::of(der);
    let listed = store.list_issued("node-").await?;
    // Each superseded one goes an hour after its end; each subject's newest stays.
    let (first_ends, second_ends) = (
        validity(&listed[0].1)?.not_after,
        validity(&listed[1].1)?.not_after,
    );
    let keep = Duration::from_secs(3600);
    assert_eq!(store.prune_superseded(first_ends + 3600, keep).await?, 0);
    assert_eq!(store.prune_superseded(first_ends + 3601, keep).await?, 1);
    assert_eq!(store.prune_superseded(second_ends + 3601, keep).await?, 1);
    let left: Vec<String> = store
        .list_issued("node-")
        .await?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(left, vec![names[2].clone(), names[3].clone()]);
    // Nothing more to forget, and the CA and its CRL are untouched.
    assert_eq!(store.prune_superseded(u64::MAX / 2, keep).await?, 0);
    assert_eq!(store.load_ca().await?.as_ref(), Some(&ca));
    assert!(pki::crl_serials(&store.crl().await?)?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handover_log_keeps_only_the_newest_and_they_still_chain() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (etcd, store) = store(dir.path()).await?;
    let (first, _) = store
        .ensure_ca(|| Ca::generate("CA 0", CA_LIFETIME))
        .await?;
    let rotations = pki::MAX_HANDOVERS + 4;
    let mut cas = vec![first.cert_der.clone()];
    for i in 1..=rotations {
        let successor = Ca::generate(&format!("CA {i}"), CA_LIFETIME)?;
        assert!(store.introduce_successor(&successor).await?);
        assert!(store.promote_successor().await?);
        assert!(store.retire_previous().await?);
        cas.push(successor.cert_der.clone());
    }
    // Counted in etcd itself, not through `handovers` (which also cuts to the newest).
    let client = etcd.ready_client(TIMEOUT).await?;
    let prefix = consensus::Namespaced::new(client.clone(), "test-pki").key("handover/");
    let stored = client
        .clone()
        .get(
            prefix,
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only(),
            ),
        )
        .await?
        .count();
    assert_eq!(stored, pki::MAX_HANDOVERS as i64);
    let handovers = store.handovers().await?;
    assert_eq!(handovers.len(), pki::MAX_HANDOVERS);
    // The oldest CA still handed over reaches the current one through all of them; the
    // first CA, whose handover was pruned, does not.
    let oldest_kept = &cas[rotations - pki::MAX_HANDOVERS];
    let current = cas.last().expect("rotated");
    assert!(pki::handed_over(
        std::slice::from_ref(oldest_kept),
        &handovers,
        current
    ));
    assert!(!pki::handed_over(
        std::slice::from_ref(&first.cert_der),
        &handovers,
        current
    ));
    Ok(())
}
