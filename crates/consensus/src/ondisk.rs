//! What a stopped member's etcd data holds, read from its files: how far its database
//! has applied the log, and which logged writes it has not applied yet.
//!
//! etcd 3.4 fsyncs every raft entry to the write-ahead log before it acknowledges
//! anything, but applies entries to its bbolt database in batches committed every
//! 100 ms (`--backend-batch-interval`). After an unclean stop (kill -9, power loss: the
//! usual state before a recover or a step-down) the database lags the log: `etcdctl
//! snapshot status` then names a revision below the writes the member acknowledged,
//! and the member would take itself for further behind than it is. etcd replays the
//! log on its next start; a decision taken before that start (may this member drop its
//! data?) must count what the log holds too.
//!
//! ```text
//!   member/snap/db  ──bbolt──▶ meta/consistent_index  (the last entry the db applied)
//!   member/wal/*.wal ─frames─▶ entries after that index ─classify─▶ writes not applied
//!   revision bound = db revision + writes not applied     (never below the truth)
//! ```
//!
//! Invariants:
//! - Read-only: nothing here writes to the files, and etcd must not run on them.
//! - Bounded by the files: no bbolt page is read past the database's length, no WAL
//!   record beyond 64 MiB; of the log, only each entry's index, term and verdict are
//!   kept in memory.
//! - An upper bound, never an estimate: an entry is counted as a write (one revision)
//!   unless it is known not to change etcd's key space (lease grants, compactions,
//!   alarms, v2 store requests, transactions without a write). Entries past the member's
//!   commit index count too: the cluster may have committed and acknowledged them.
//! - A torn tail of the log (a crash while writing) ends the reading, as it ends etcd's.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Why the files could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OnDiskError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an etcd database: {why}")]
    Database { path: PathBuf, why: String },
}

/// What the log holds beyond the database of one member's data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unapplied {
    /// The index of the last raft entry the database applied.
    pub consistent_index: u64,
    /// The last index the log holds.
    pub last_logged_index: u64,
    /// Entries after `consistent_index` that may each add one revision.
    pub writes: u64,
}

/// The writes `data_dir` (etcd's `--data-dir`) logged but its database did not apply.
/// A data directory without a database or a log has nothing unapplied.
pub fn unapplied(data_dir: &Path) -> Result<Unapplied, OnDiskError> {
    let db = data_dir.join("member").join("snap").join("db");
    let consistent_index = if db.exists() {
        consistent_index(&db)?
    } else {
        0
    };
    let entries = read_wal(&data_dir.join("member").join("wal"))?;
    let last_logged_index = entries.last().map_or(0, |e| e.index);
    let writes = entries
        .iter()
        .filter(|e| e.index > consistent_index)
        .map(|e| u64::from(e.writes))
        .sum();
    Ok(Unapplied {
        consistent_index,
        last_logged_index,
        writes,
    })
}

// --- bbolt ---------------------------------------------------------------------------

const PAGE_HEADER: usize = 16;
const BRANCH_PAGE: u16 = 0x01;
const LEAF_PAGE: u16 = 0x02;
const BUCKET_LEAF: u32 = 0x01;
const META_MAGIC: u32 = 0xED0C_DAED;
/// Pages larger than this are not bbolt's (it uses the OS page size).
const MAX_PAGE_SIZE: u32 = 1 << 16;
/// A lookup deeper than this is a loop in a corrupt file.
const MAX_DEPTH: usize = 64;

/// etcd's `meta/consistent_index` in the bbolt database `db`.
pub fn consistent_index(db: &Path) -> Result<u64, OnDiskError> {
    let file = File::open(db).map_err(|source| OnDiskError::Io {
        path: db.to_owned(),
        source,
    })?;
    let bolt = Bolt::open(file, db)?;
    let Some(meta) = bolt.get(bolt.root, b"meta", true)? else {
        return Ok(0);
    };
    let meta = bolt.bucket(&meta)?;
    match bolt.get(meta, b"consistent_index", false)? {
        Some(value) => {
            let bytes: [u8; 8] = value.as_slice().try_into().map_err(|_| {
                bolt.corrupt(format!(
                    "meta/consistent_index is {} bytes, not 8",
                    value.len()
                ))
            })?;
            Ok(u64::from_be_bytes(bytes))
        }
        None => Ok(0),
    }
}

/// A bucket's tree: a page of the file, or a leaf page held inline in its parent.
#[derive(Clone, Copy)]
enum Tree<'a> {
    Page(u64),
    Inline(&'a [u8]),
}

struct Bolt<'p> {
    file: File,
    /// The file's length: no page is read past it.
    len: u64,
    path: &'p Path,
    page_size: usize,
    root: Tree<'static>,
}

impl<'p> Bolt<'p> {
    fn open(file: File, path: &'p Path) -> Result<Self, OnDiskError> {
        let len = file
            .metadata()
            .map_err(|source| OnDiskError::Io {
                path: path.to_owned(),
                source,
            })?
            .len();
        let mut bolt = Bolt {
            file,
            len,
            path,
            page_size: 4096,
            root: Tree::Page(0),
        };
        // Page 0's meta names the page size; page 1's meta sits one page further.
        let first = bolt.read_at(0, 4096)?;
        let size = meta(&first).map(|m| m.page_size).unwrap_or(4096);
        if !(512..=MAX_PAGE_SIZE).contains(&size) {
            return Err(bolt.corrupt(format!("page size {size}")));
        }
        bolt.page_size = size as usize;
        let second = bolt.read_at(bolt.page_size as u64, bolt.page_size)?;
        let newest = [meta(&first), meta(&second)]
            .into_iter()
            .flatten()
            .max_by_key(|m| m.txid)
            .ok_or_else(|| bolt.corrupt("neither meta page is valid".into()))?;
        bolt.root = Tree::Page(newest.root);
        Ok(bolt)
    }

    fn corrupt(&self, why: String) -> OnDiskError {
        OnDiskError::Database {
            path: self.path.to_owned(),
            why,
        }
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, OnDiskError> {
        let mut buf = vec![0; len];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|source| OnDiskError::Io {
                path: self.path.to_owned(),
                source,
            })?;
        Ok(buf)
    }

    fn page(&self, id: u64) -> Result<Vec<u8>, OnDiskError> {
        let offset = id
            .checked_mul(self.page_size as u64)
            .ok_or_else(|| self.corrupt(format!("page {id} out of range")))?;
        let within = |pages: u64| {
            pages
                .checked_mul(self.page_size as u64)
                .and_then(|bytes| bytes.checked_add(offset))
                .is_some_and(|end| end <= self.len)
        };
        if !within(1) {
            return Err(self.corrupt(format!("page {id} lies past the end of the file")));
        }
        let head = self.read_at(offset, self.page_size)?;
        let overflow = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
        if overflow == 0 {
            return Ok(head);
        }
        // A corrupt overflow count never makes this read more than the file holds.
        let pages = u64::from(overflow) + 1;
        if !within(pages) {
            return Err(self.corrupt(format!(
                "page {id} overflows {overflow} pages, past the end of the file"
            )));
        }
        self.read_at(offset, pages as usize * self.page_size)
    }

    /// The tree of the bucket whose header (and inline page) is `value`.
    fn bucket<'v>(&self, value: &'v [u8]) -> Result<Tree<'v>, OnDiskError> {
        if value.len() < 16 {
            return Err(self.corrupt("a bucket header is shorter than 16 bytes".into()));
        }
        let root = u64::from_le_bytes(value[0..8].try_into().expect("8 bytes"));
        Ok(if root == 0 {
            Tree::Inline(&value[16..])
        } else {
            Tree::Page(root)
        })
    }

    /// The value of `key` in `tree`: a bucket's header when `bucket`, else a plain value.
    fn get(
        &self,
        tree: Tree<'_>,
        key: &[u8],
        bucket: bool,
    ) -> Result<Option<Vec<u8>>, OnDiskError> {
        let mut page = match tree {
            Tree::Inline(bytes) => bytes.to_vec(),
            Tree::Page(id) => self.page(id)?,
        };
        for _ in 0..MAX_DEPTH {
            let parsed = parse_page(&page).map_err(|why| self.corrupt(why))?;
            match parsed {
                Page::Branch(children) => {
                    let Some(child) = branch_child(&children, key) else {
                        return Ok(None);
                    };
                    page = self.page(child)?;
                }
                Page::Leaf(items) => {
                    return Ok(items
                        .into_iter()
                        .find(|i| i.key == key && (i.flags & BUCKET_LEAF != 0) == bucket)
                        .map(|i| i.value.to_vec()));
                }
            }
        }
        Err(self.corrupt(format!("the tree is deeper than {MAX_DEPTH} pages")))
    }
}

struct Meta {
    page_size: u32,
    root: u64,
    txid: u64,
}

/// The meta of a meta page, when its magic and checksum hold.
fn meta(page: &[u8]) -> Option<Meta> {
    let m = page.get(PAGE_HEADER..PAGE_HEADER + 64)?;
    let u32_at = |o: usize| u32::from_le_bytes(m[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(m[o..o + 8].try_into().expect("8 bytes"));
    if u32_at(0) != META_MAGIC || u32_at(4) != 2 || fnv1a64(&m[..56]) != u64_at(56) {
        return None;
    }
    Some(Meta {
        page_size: u32_at(8),
        root: u64_at(16),
        txid: u64_at(48),
    })
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

struct LeafItem<'a> {
    flags: u32,
    key: &'a [u8],
    value: &'a [u8],
}

enum Page<'a> {
    /// (first key, child page) of each child.
    Branch(Vec<(&'a [u8], u64)>),
    Leaf(Vec<LeafItem<'a>>),
}

fn parse_page(page: &[u8]) -> Result<Page<'_>, String> {
    if page.len() < PAGE_HEADER {
        return Err("a page shorter than its header".into());
    }
    let flags = u16::from_le_bytes([page[8], page[9]]);
    let count = u16::from_le_bytes([page[10], page[11]]) as usize;
    let element = |i: usize| -> Result<(usize, &[u8]), String> {
        let at = PAGE_HEADER + i * 16;
        page.get(at..at + 16)
            .map(|e| (at, e))
            .ok_or_else(|| format!("element {i} of {count} lies outside its page"))
    };
    let u32_of =
        |e: &[u8], o: usize| u32::from_le_bytes(e[o..o + 4].try_into().expect("4 bytes")) as usize;
    let slice = |from: usize, len: usize| {
        from.checked_add(len)
            .and_then(|end| page.get(from..end))
            .ok_or_else(|| "a key or value lies outside its page".to_string())
    };
    match flags {
        BRANCH_PAGE => (0..count)
            .map(|i| {
                let (at, e) = element(i)?;
                let key = slice(at + u32_of(e, 0), u32_of(e, 4))?;
                let child = u64::from_le_bytes(e[8..16].try_into().expect("8 bytes"));
                Ok((key, child))
            })
            .collect::<Result<_, String>>()
            .map(Page::Branch),
        LEAF_PAGE => (0..count)
            .map(|i| {
                let (at, e) = element(i)?;
                let (pos, ksize, vsize) = (u32_of(e, 4), u32_of(e, 8), u32_of(e, 12));
                Ok(LeafItem {
                    flags: u32_of(e, 0) as u32,
                    key: slice(at + pos, ksize)?,
                    value: slice(at + pos + ksize, vsize)?,
                })
            })
            .collect::<Result<_, String>>()
            .map(Page::Leaf),
        other => Err(format!(
            "a page of kind {other:#x} where a tree page belongs"
        )),
    }
}

/// The child of a branch that may hold `key`: the last whose first key is not above it
/// (the first child when every key is above it), as bbolt's own cursor chooses.
fn branch_child(children: &[(&[u8], u64)], key: &[u8]) -> Option<u64> {
    let at = children.partition_point(|(first, _)| *first <= key);
    children.get(at.saturating_sub(1)).map(|(_, child)| *child)
}

// --- the write-ahead log -------------------------------------------------------------

const ENTRY_RECORD: i64 = 2;
const NORMAL_ENTRY: u64 = 0;
/// A record longer than this is a torn or corrupt frame (etcd's own bound is 10 MB + 1 KB).
const MAX_RECORD: u64 = 64 << 20;

/// One raft entry of the log, as far as a revision count needs it (its data is judged
/// while read and not kept: a log holds up to a few hundred megabytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub index: u64,
    pub term: u64,
    /// Whether applying it may add a revision to etcd's key space ([`may_write`]).
    pub writes: bool,
}

/// The entries of the log in `wal_dir`, in order, later entries replacing the ones they
/// overwrite (a new leader truncating a follower's log), as etcd reads them.
pub fn read_wal(wal_dir: &Path) -> Result<Vec<Entry>, OnDiskError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| OnDiskError::Io { path, source }
    };
    let mut files: Vec<PathBuf> = match std::fs::read_dir(wal_dir) {
        Ok(dir) => dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wal"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(wal_dir)(e)),
    };
    // Named <sequence>-<index>.wal in hex of fixed width: by name is by sequence.
    files.sort();
    let mut entries: Vec<Entry> = Vec::new();
    for path in files {
        let mut reader = BufReader::new(File::open(&path).map_err(io(&path))?);
        while let Some(record) = next_frame(&mut reader).map_err(io(&path))? {
            let Some((kind, data)) = record_fields(&record) else {
                break;
            };
            if kind != ENTRY_RECORD {
                continue;
            }
            let Some(entry) = entry_fields(data) else {
                break;
            };
            let keep = entries.partition_point(|e| e.index < entry.index);
            entries.truncate(keep);
            entries.push(entry);
        }
    }
    Ok(entries)
}

/// The next record's bytes, or None at the end of the log (zeroed preallocated space, a
/// frame cut short by a crash).
fn next_frame(reader: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut length = [0u8; 8];
    if !read_full(reader, &mut length)? {
        return Ok(None);
    }
    let Some((record, padding)) = frame_size(u64::from_le_bytes(length)) else {
        return Ok(None);
    };
    let mut frame = vec![0; (record + padding) as usize];
    if !read_full(reader, &mut frame)? {
        return Ok(None);
    }
    frame.truncate(record as usize);
    Ok(Some(frame))
}

/// Fills `buf`; false when the input ends first.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => return Ok(false),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// A frame's (record bytes, padding bytes) from its length field: the low 56 bits are
/// the record's length, the top bit says the next three hold the padding. None for the
/// zeroed end of a preallocated file and for lengths no record has.
fn frame_size(field: u64) -> Option<(u64, u64)> {
    let record = field & !(0xff << 56);
    let padding = if field >> 63 == 1 {
        (field >> 56) & 0x7
    } else {
        0
    };
    (record != 0 && record <= MAX_RECORD).then_some((record, padding))
}

/// walpb.Record: (type = 1, data = 3).
fn record_fields(record: &[u8]) -> Option<(i64, &[u8])> {
    let mut kind = 0;
    let mut data: &[u8] = &[];
    for field in Fields(record) {
        match field? {
            (1, Value::Varint(v)) => kind = v as i64,
            (3, Value::Bytes(b)) => data = b,
            _ => {}
        }
    }
    Some((kind, data))
}

/// raftpb.Entry: (type = 1, term = 2, index = 3, data = 4).
fn entry_fields(entry: &[u8]) -> Option<Entry> {
    let (mut index, mut term, mut kind) = (0, 0, NORMAL_ENTRY);
    let mut data: &[u8] = &[];
    for field in Fields(entry) {
        match field? {
            (1, Value::Varint(v)) => kind = v,
            (2, Value::Varint(v)) => term = v,
            (3, Value::Varint(v)) => index = v,
            (4, Value::Bytes(b)) => data = b,
            _ => {}
        }
    }
    Some(Entry {
        index,
        term,
        writes: kind == NORMAL_ENTRY && may_write(data),
    })
}

/// The v2 store's methods: an entry that is a bare `etcdserverpb.Request` (etcd 3.4
/// proposes its own member attributes and cluster version this way) names one of them
/// in field 2, where an `InternalRaftRequest` holds a message.
const V2_METHODS: &[&[u8]] = &[
    b"PUT", b"POST", b"DELETE", b"QGET", b"GET", b"SYNC", b"HEAD",
];

/// Whether applying a normal entry's `data` may add a revision: true unless it is known
/// not to (see the module's invariants).
pub fn may_write(data: &[u8]) -> bool {
    if data.is_empty() {
        // A new leader's empty entry.
        return false;
    }
    let fields: Option<Vec<(u64, Value<'_>)>> = Fields(data).collect();
    let Some(fields) = fields else {
        return true;
    };
    let bare_v2 = fields
        .iter()
        .any(|(n, v)| *n == 2 && matches!(v, Value::Bytes(m) if V2_METHODS.contains(m)));
    if bare_v2 {
        return false;
    }
    fields.iter().any(|(number, value)| match (number, value) {
        // header, ID, v2 (the v2 store: no revision), range, compaction, lease grant,
        // alarm, lease checkpoint.
        (100 | 1 | 2 | 3 | 7 | 8 | 10 | 11, _) => false,
        // put, delete range, lease revoke (deletes the lease's keys).
        (4 | 5 | 9, _) => true,
        (6, Value::Bytes(txn)) => txn_may_write(txn, 0),
        // Authentication requests (1000 and up) change the auth store, not the keys.
        (n, _) if *n >= 1000 && *n < 1100 => false,
        _ => true,
    })
}

/// Whether a TxnRequest (compare = 1, success = 2, failure = 3 of RequestOp) holds a put
/// or a delete in either branch, nested transactions included.
fn txn_may_write(txn: &[u8], depth: usize) -> bool {
    if depth > 16 {
        return true;
    }
    Fields(txn).any(|field| match field {
        None => true,
        Some((2 | 3, Value::Bytes(op))) => Fields(op).any(|f| match f {
            None => true,
            // request_range
            Some((1, _)) => false,
            // request_txn
            Some((4, Value::Bytes(inner))) => txn_may_write(inner, depth + 1),
            // request_put, request_delete_range, or what this reader does not know.
            Some(_) => true,
        }),
        Some(_) => false,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value<'a> {
    Varint(u64),
    Fixed,
    Bytes(&'a [u8]),
}

/// The fields of one protobuf message: (number, value); None once malformed.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Option<(u64, Value<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let parsed = (|| {
            let key = varint(&mut self.0)?;
            let value = match key & 7 {
                0 => Value::Varint(varint(&mut self.0)?),
                1 => {
                    self.0 = self.0.get(8..)?;
                    Value::Fixed
                }
                2 => {
                    let len = usize::try_from(varint(&mut self.0)?).ok()?;
                    let bytes = self.0.get(..len)?;
                    self.0 = &self.0[len..];
                    Value::Bytes(bytes)
                }
                5 => {
                    self.0 = self.0.get(4..)?;
                    Value::Fixed
                }
                _ => return None,
            };
            Some((key >> 3, value))
        })();
        if parsed.is_none() {
            // Malformed: report it once, then stop.
            self.0 = &[];
        }
        Some(parsed)
    }
}

fn varint(input: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, byte) in input.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *input = &input[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn bytes_field(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, number << 3 | 2);
        put_varint(&mut out, bytes.len() as u64);
        out.extend_from_slice(bytes);
        out
    }

    fn varint_field(number: u64, v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, number << 3);
        put_varint(&mut out, v);
        out
    }

    fn request(fields: &[Vec<u8>]) -> Vec<u8> {
        fields.concat()
    }

    #[test]
    fn writes_are_told_from_requests_that_leave_the_keys_alone() {
        let id = varint_field(1, 42);
        let put = request(&[id.clone(), bytes_field(4, &bytes_field(1, b"k"))]);
        let delete = request(&[id.clone(), bytes_field(5, &bytes_field(1, b"k"))]);
        let revoke = request(&[id.clone(), bytes_field(9, &varint_field(1, 7))]);
        let grant = request(&[id.clone(), bytes_field(8, &varint_field(1, 10))]);
        let compaction = request(&[id.clone(), bytes_field(7, &varint_field(1, 3))]);
        let alarm = request(&[id.clone(), bytes_field(10, &varint_field(1, 1))]);
        let auth = request(&[id.clone(), bytes_field(1000, &[])]);
        for write in [&put, &delete, &revoke] {
            assert!(may_write(write));
        }
        for quiet in [&grant, &compaction, &alarm, &auth, &Vec::new()] {
            assert!(!may_write(quiet));
        }
        // etcd 3.4 publishes its member attributes as a bare v2 request.
        let v2 = request(&[
            varint_field(1, 9),
            bytes_field(2, b"PUT"),
            bytes_field(3, b"/0/members/1/attributes"),
            bytes_field(4, b"{}"),
        ]);
        assert!(!may_write(&v2));
        // Unknown fields and malformed bytes count as writes: an upper bound.
        assert!(may_write(&request(&[id.clone(), bytes_field(50, b"?")])));
        assert!(may_write(&[0xff, 0xff]));
    }

    #[test]
    fn a_transaction_writes_when_either_branch_or_a_nested_one_does() {
        let compare = bytes_field(1, &bytes_field(3, b"k"));
        let range_op = bytes_field(1, &bytes_field(1, b"k"));
        let put_op = bytes_field(2, &bytes_field(1, b"k"));
        let txn = |success: &[u8], failure: &[u8]| {
            let body = [
                compare.clone(),
                bytes_field(2, success),
                bytes_field(3, failure),
            ]
            .concat();
            bytes_field(6, &body)
        };
        assert!(!may_write(&txn(&range_op, &range_op)));
        assert!(may_write(&txn(&range_op, &put_op)));
        assert!(may_write(&txn(&put_op, &range_op)));
        let nested_put = bytes_field(4, &[bytes_field(2, &put_op)].concat());
        let nested_read = bytes_field(4, &[bytes_field(2, &range_op)].concat());
        assert!(may_write(&txn(&nested_put, &range_op)));
        assert!(!may_write(&txn(&nested_read, &range_op)));
    }

    #[test]
    fn frame_lengths_carry_their_padding_and_zero_ends_the_log() {
        assert_eq!(frame_size(0), None);
        assert_eq!(frame_size(13), Some((13, 0)));
        // 13 bytes padded by 3: the top bit set and 3 in bits 56..59.
        assert_eq!(frame_size(13 | (0x83 << 56)), Some((13, 3)));
        assert_eq!(frame_size(MAX_RECORD + 1), None);
    }

    #[test]
    fn later_entries_replace_those_they_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let frame = |record: Vec<u8>| {
            let pad = (8 - record.len() % 8) % 8;
            let mut length = record.len() as u64;
            if pad > 0 {
                length |= (0x80 | pad as u64) << 56;
            }
            let mut out = length.to_le_bytes().to_vec();
            out.extend_from_slice(&record);
            out.extend(std::iter::repeat_n(0, pad));
            out
        };
        let entry = |term: u64, index: u64, data: &[u8]| {
            let e = [
                varint_field(2, term),
                varint_field(3, index),
                bytes_field(4, data),
            ]
            .concat();
            frame([varint_field(1, ENTRY_RECORD as u64), bytes_field(3, &e)].concat())
        };
        let put = [varint_field(1, 1), bytes_field(4, &bytes_field(1, b"k"))].concat();
        let mut log = Vec::new();
        log.extend(frame([varint_field(1, 4)].concat()));
        for index in 1..=5 {
            log.extend(entry(1, index, &put));
        }
        // A new leader in term 2 overwrites 4 and 5 with an empty entry at 4.
        log.extend(entry(2, 4, &[]));
        // Then a torn frame: a length with no record behind it.
        log.extend(64u64.to_le_bytes());
        log.extend(vec![0; 1000]);
        std::fs::write(
            dir.path().join("0000000000000000-0000000000000000.wal"),
            log,
        )
        .unwrap();
        let entries = read_wal(dir.path()).unwrap();
        let indexes: Vec<_> = entries.iter().map(|e| (e.term, e.index)).collect();
        assert_eq!(indexes, vec![(1, 1), (1, 2), (1, 3), (2, 4)]);
        assert_eq!(entries.iter().filter(|e| e.writes).count(), 3);
    }

    #[test]
    fn a_branch_sends_a_key_to_the_last_child_not_above_it() {
        let children: Vec<(&[u8], u64)> = vec![(b"b", 1), (b"d", 2), (b"f", 3)];
        assert_eq!(branch_child(&children, b"a"), Some(1));
        assert_eq!(branch_child(&children, b"b"), Some(1));
        assert_eq!(branch_child(&children, b"c"), Some(1));
        assert_eq!(branch_child(&children, b"d"), Some(2));
        assert_eq!(branch_child(&children, b"z"), Some(3));
        assert_eq!(branch_child(&[], b"a"), None);
    }

    #[test]
    fn a_page_past_the_end_of_the_database_is_refused_before_it_is_read() {
        // Two valid meta pages whose root names page 100 of a two-page file.
        let mut file = vec![0u8; 8192];
        for (page, txid) in [(0usize, 1u64), (1, 2)] {
            let at = page * 4096;
            file[at..at + 8].copy_from_slice(&(page as u64).to_le_bytes());
            file[at + 8..at + 10].copy_from_slice(&0x04u16.to_le_bytes());
            let m = at + PAGE_HEADER;
            file[m..m + 4].copy_from_slice(&META_MAGIC.to_le_bytes());
            file[m + 4..m + 8].copy_from_slice(&2u32.to_le_bytes());
            file[m + 8..m + 12].copy_from_slice(&4096u32.to_le_bytes());
            file[m + 16..m + 24].copy_from_slice(&100u64.to_le_bytes());
            file[m + 48..m + 56].copy_from_slice(&txid.to_le_bytes());
            let sum = fnv1a64(&file[m..m + 56]);
            file[m + 56..m + 64].copy_from_slice(&sum.to_le_bytes());
        }
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        std::fs::write(&db, &file).unwrap();
        let err = consistent_index(&db).unwrap_err();
        assert!(
            err.to_string().contains("page 100 lies past the end"),
            "{err}"
        );
    }

    #[test]
    fn a_database_that_is_not_bbolt_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        std::fs::write(&db, vec![7u8; 8192]).unwrap();
        let err = consistent_index(&db).unwrap_err();
        assert!(err.to_string().contains("is not an etcd database"), "{err}");
    }
}
