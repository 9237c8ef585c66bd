//! The PKI's etcd store against a real etcd: ensure semantics under races, revocation.

use std::time::Duration;

use anyhow::Result;
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
    let (ca, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let serials: Vec<Vec<u8>> = (0..6).map(|_| pki::random_serial()).collect();
    let tasks: Vec<_> = serials
        .iter()
        .cloned()
        .map(|s| {
            let (store, ca) = (store.clone(), ca.clone());
            tokio::spawn(async move { store.revoke(&ca, &s).await })
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
    store.revoke(&ca, &serials[0]).await?;
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
    let (ca, _) = store.ensure_ca(|| Ca::generate("CA", CA_LIFETIME)).await?;
    let first = next_crl(&mut crls).await?;
    assert_eq!(first, store.crl().await?);
    assert!(pki::crl_serials(&first)?.is_empty());

    let serials: Vec<Vec<u8>> = (0..3).map(|_| pki::random_serial()).collect();
    for (i, serial) in serials.iter().enumerate() {
        store.revoke(&ca, serial).await?;
        let crl = next_crl(&mut crls).await?;
        assert_eq!(pki::crl_serials(&crl)?, serials[..=i].to_vec());
    }
    // A second watcher starts from the current CRL, not from the beginning.
    let mut late = store.watch_crl();
    assert_eq!(pki::crl_serials(&next_crl(&mut late).await?)?, serials);
    Ok(())
}
