//! `consensus::pages` against a real etcd: a prefix larger than one answer may carry is
//! read whole, pages too large for the decoder are halved, every page is read at the
//! revision of the first (a write between pages is not seen), and a reader resumes
//! after a key.

use std::time::Duration;

use anyhow::Result;
use consensus::pages::{Pages, read, read_prefix};
use e2e::{BareEtcd, TIMEOUT, unique_loopback};
use etcd_client::{Txn, TxnOp};

fn fast() -> consensus::RaftTiming {
    consensus::RaftTiming {
        heartbeat: Duration::from_millis(20),
        election_timeout: Duration::from_millis(200),
    }
}

/// Keys under `p/`, each value this large.
const KEYS: usize = 400;
const VALUE: usize = 20 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_beyond_one_answer_is_read_in_pages_at_one_revision() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let etcd = BareEtcd::spawn(dir.path(), unique_loopback(), fast())?;
    let mut client = etcd.ready_client(TIMEOUT).await?;
    // 400 × 20 KiB = 8 MiB: twice what etcd-client decodes by default in one answer.
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(50) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|i| TxnOp::put(format!("p/{i:04}"), vec![b'v'; VALUE], None))
            .collect();
        client.txn(Txn::new().and_then(ops)).await?;
    }
    client.put("q/outside", "x", None).await?;

    let whole = read_prefix(&client, "p/").await?;
    assert_eq!(whole.kvs.len(), KEYS);
    assert!(whole.revision > 0);
    assert_eq!(whole.kvs[KEYS - 1].key(), b"p/0399");

    // Pages of 500 keys would be 10 MiB: with a 1 MiB decoder they are halved until a
    // page fits (32 keys, 640 KiB), and nothing is lost or read twice.
    let mut pages = Pages::prefix(&client, "p/").max_response_bytes(1 << 20);
    let (mut seen, mut count) = (Vec::new(), 0);
    while let Some(page) = pages.next_page().await? {
        count += 1;
        seen.extend(page.into_iter().map(|kv| kv.key().to_vec()));
        if count == 1 {
            // Written after the first page: the later pages do not see it.
            client.put("p/0100", "changed", None).await?;
            client.put("p/9999", "new", None).await?;
        }
    }
    assert_eq!(seen.len(), KEYS, "every key once");
    assert!(count > KEYS / 32, "{count} pages");
    let first = pages.revision();
    assert_eq!(first, whole.revision);
    let again = read(Pages::prefix(&client, "p/").at_revision(first)).await?;
    assert!(again.kvs.iter().all(|kv| kv.value().len() == VALUE));

    // Resuming after a key; a key past the prefix reads nothing.
    let rest = read(Pages::prefix(&client, "p/").after(b"p/0397")).await?;
    let keys: Vec<&[u8]> = rest.kvs.iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, [&b"p/0398"[..], b"p/0399", b"p/9999"]);
    assert!(
        read(Pages::prefix(&client, "p/").after(b"q/"))
            .await?
            .kvs
            .is_empty()
    );
    Ok(())
}
