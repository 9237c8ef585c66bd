//! Reading a key range that can grow without bound (node records, audit entries,
//! claims, tickets, certificates): in pages, every page at the revision of the first,
//! so the pages together are one consistent view an etcd watch can continue from.
//!
//! Why pages: etcd answers a range in one message, and etcd-client decodes at most
//! 4 MiB of it by default; a whole prefix outgrows that (~10 000 audit entries, ~250
//! node records with 128 labels), and from then on the read fails every time. A page
//! holds at most [`PAGE_KEYS`] keys and is decoded with room for
//! [`MAX_RESPONSE_BYTES`]; a page etcd still answers too large for that (values are up
//! to etcd's request limit, 1.5 MiB, each) is asked again with half as many keys, down
//! to one, so any range is readable whatever its values hold.
//!
//! A range read at one revision fails once etcd compacted that revision away (a long
//! read during heavy writing); [`read_prefix`] then starts again (bounded), a caller
//! of [`Pages`] that already used some pages gets the error and decides.
//!
//! May not know what the keys mean.

use etcd_client::{Client, GetOptions, KeyValue, KvClient};

use crate::ConsensusError;

/// Most keys asked for in one page.
pub const PAGE_KEYS: i64 = 500;

/// Largest etcd response a page (or a watch, see [`watch_client`]) decodes: room for
/// [`PAGE_KEYS`] node records with every label (~20 KiB each) many times over, and for
/// an etcd watch catching up over many revisions. A page beyond it is halved instead.
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// How often [`read_prefix`] starts again after etcd compacted its revision away.
const COMPACTED_RETRIES: usize = 3;

/// The end of the key range holding every key that starts with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: no end ("\0" means: to the end of the keyspace).
    vec![0]
}

/// The smallest key after `key`.
pub fn key_after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// A watch client that decodes responses up to [`MAX_RESPONSE_BYTES`]: an etcd watch
/// that starts behind (after a long read) gets many revisions in one response.
pub fn watch_client(client: &Client) -> etcd_client::WatchClient {
    client
        .watch_client()
        .max_decoding_message_size(MAX_RESPONSE_BYTES)
}

/// Whether `error` is the client refusing a response larger than it decodes.
fn too_large(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::OutOfRange
            && s.message().contains("decoded message length too large"))
}

/// Whether `error` is etcd saying the revision read at was compacted away.
pub fn is_compacted(error: &ConsensusError) -> bool {
    matches!(error, ConsensusError::Etcd(etcd_client::Error::GRpcStatus(s))
        if s.message().contains("required revision has been compacted"))
}

/// The pages of one key range, read one at a time ([`Pages::next_page`]).
#[derive(Clone)]
pub struct Pages {
    kv: KvClient,
    from: Vec<u8>,
    end: Vec<u8>,
    keys: i64,
    revision: i64,
    cluster_id: u64,
    serializable: bool,
    keys_only: bool,
    done: bool,
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages")
            .field("from", &String::from_utf8_lossy(&self.from))
            .field("revision", &self.revision)
            .field("done", &self.done)
            .finish()
    }
}

impl Pages {
    /// Every key starting with `prefix`.
    pub fn prefix(client: &Client, prefix: impl Into<Vec<u8>>) -> Pages {
        let from = prefix.into();
        let end = prefix_end(&from);
        Pages::range(client, from, end)
    }

    /// Every key in [`from`, `end`).
    pub fn range(client: &Client, from: Vec<u8>, end: Vec<u8>) -> Pages {
        Pages {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            from,
            end,
            keys: PAGE_KEYS,
            revision: 0,
            cluster_id: 0,
            serializable: false,
            keys_only: false,
            done: false,
        }
    }

    /// Starts after `key` (a reader resuming where it stopped), if that lies further.
    pub fn after(mut self, key: &[u8]) -> Pages {
        let next = key_after(key);
        if next > self.from {
            self.from = next;
        }
        self
    }

    /// At most `keys` keys a page (at least one).
    pub fn page_keys(mut self, keys: i64) -> Pages {
        self.keys = keys.max(1);
        self
    }

    /// Decodes at most `bytes` a response (tests make pages halve with a small one).
    pub fn max_response_bytes(mut self, bytes: usize) -> Pages {
        self.kv = self.kv.max_decoding_message_size(bytes);
        self
    }

    /// Serializable reads: the local member's view, answered without a quorum.
    pub fn serializable(mut self) -> Pages {
        self.serializable = true;
        self
    }

    /// Keys only, no values.
    pub fn keys_only(mut self) -> Pages {
        self.keys_only = true;
        self
    }

    /// Reads at `revision` (0: the current one, fixed by the first page).
    pub fn at_revision(mut self, revision: i64) -> Pages {
        self.revision = revision;
        self
    }

    /// The revision every page is read at (0 before the first page without one given).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The etcd cluster the pages came from (0 before the first page).
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// The next page (possibly empty only when the range is); `None` once every key was
    /// read.
    pub async fn next_page(&mut self) -> Result<Option<Vec<KeyValue>>, ConsensusError> {
        if self.done {
            return Ok(None);
        }
        let mut keys = self.keys;
        let mut response = loop {
            let mut options = GetOptions::new()
                .with_range(self.end.clone())
                .with_limit(keys)
                .with_revision(self.revision);
            if self.serializable {
                options = options.with_serializable();
            }
            if self.keys_only {
                options = options.with_keys_only();
            }
            match self.kv.get(self.from.clone(), Some(options)).await {
                Ok(response) => break response,
                Err(e) if too_large(&e) && keys > 1 => {
                    keys = (keys / 2).max(1);
                    tracing::debug!(keys, "an etcd page was too large; asking for fewer keys");
                }
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(header) = response.header() {
            if self.revision == 0 {
                self.revision = header.revision();
            }
            self.cluster_id = header.cluster_id();
        }
        let more = response.more();
        let kvs = response.take_kvs();
        match kvs.last() {
            Some(last) if more => self.from = key_after(last.key()),
            _ => self.done = true,
        }
        Ok(Some(kvs))
    }
}

/// A whole range, read in pages at one revision.
#[derive(Debug, Clone)]
pub struct Range {
    pub kvs: Vec<KeyValue>,
    /// The revision it was read at: a watch from `revision + 1` misses nothing.
    pub revision: i64,
    pub cluster_id: u64,
}

/// Every key under `prefix` (see [`read`]).
pub async fn read_prefix(
    client: &Client,
    prefix: impl Into<Vec<u8>>,
) -> Result<Range, ConsensusError> {
    read(Pages::prefix(client, prefix)).await
}

/// Every page of `pages`, gathered; started again (at most [`COMPACTED_RETRIES`] times)
/// when etcd compacted the revision away meanwhile.
pub async fn read(pages: Pages) -> Result<Range, ConsensusError> {
    let mut attempt = 0;
    'again: loop {
        let mut reading = pages.clone();
        let mut kvs = Vec::new();
        loop {
            match reading.next_page().await {
                Ok(Some(page)) => kvs.extend(page),
                Ok(None) => {
                    return Ok(Range {
                        kvs,
                        revision: reading.revision(),
                        cluster_id: reading.cluster_id(),
                    });
                }
                Err(e) if is_compacted(&e) && attempt < COMPACTED_RETRIES => {
                    attempt += 1;
                    continue 'again;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"audit/"), b"audit0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(key_after(b"k"), b"k\0".to_vec());
    }

    #[test]
    fn only_the_decoders_refusal_halves_a_page() {
        let refused = etcd_client::Error::GRpcStatus(tonic::Status::out_of_range(
            "Error, decoded message length too large: found 4507766 bytes, the limit is: 4194304 bytes",
        ));
        assert!(too_large(&refused));
        // etcd's own OutOfRange (a future or compacted revision) is no size problem.
        let compacted = etcd_client::Error::GRpcStatus(tonic::Status::out_of_range(
            "etcdserver: mvcc: required revision has been compacted",
        ));
        assert!(!too_large(&compacted));
        assert!(is_compacted(&ConsensusError::Etcd(compacted)));
    }
}
