//! [`ChunkMap`]: an ordered map whose clones share their unchanged parts, so that the
//! node snapshot (one per change of any node record, kept by every curator) costs a
//! change in proportion to one chunk, not to the whole table.
//!
//! ```text
//!   ChunkMap = [Arc<chunk 0>, Arc<chunk 1>, …]   chunks: BTreeMaps of consecutive keys
//!   clone    → copies the Arcs (N / CHUNK of them), no entry
//!   insert / remove → copy-on-write of the one chunk holding the key (≤ 2 × CHUNK
//!                     entries); a chunk over 2 × CHUNK splits, a small one merges
//!   ==       → chunk by chunk, chunks shared by both maps compared by pointer
//! ```
//! Pure: no I/O, imports nothing of this crate.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Entries per chunk after a split; a chunk holds at most twice as many.
const CHUNK: usize = 16;

/// An ordered map from `String` keys, cheap to clone and to change in a clone.
#[derive(Clone)]
pub struct ChunkMap<V> {
    /// Non-empty chunks in key order: every key of a chunk is less than every key of the
    /// next one.
    chunks: Vec<Arc<BTreeMap<String, V>>>,
    len: usize,
}

impl<V> Default for ChunkMap<V> {
    fn default() -> Self {
        ChunkMap {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<V: Clone> ChunkMap<V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that holds `key` if it is in the map (and where it goes if not): the
    /// last chunk whose first key is not after it, else the first.
    fn chunk_of<Q>(&self, key: &Q) -> usize
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunks
            .partition_point(|c| c.keys().next().is_some_and(|first| first.borrow() <= key))
            .saturating_sub(1)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunks.get(self.chunk_of(key))?.get(key)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Inserts `value` under `key`; returns the value it replaces.
    pub fn insert(&mut self, key: String, value: V) -> Option<V> {
        if self.chunks.is_empty() {
            self.chunks.push(Arc::new(BTreeMap::new()));
        }
        let i = self.chunk_of(key.as_str());
        let chunk = Arc::make_mut(&mut self.chunks[i]);
        let old = chunk.insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        if chunk.len() > 2 * CHUNK {
            let middle = chunk
                .keys()
                .nth(chunk.len() / 2)
                .cloned()
                .expect("a middle key");
            let upper = chunk.split_off(&middle);
            self.chunks.insert(i + 1, Arc::new(upper));
        }
        old
    }

    /// Removes `key`; returns its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let i = self.chunk_of(key);
        if !self.chunks.get(i)?.contains_key(key) {
            return None;
        }
        let old = Arc::make_mut(&mut self.chunks[i]).remove(key);
        self.len -= 1;
        let len = self.chunks[i].len();
        if len == 0 {
            self.chunks.remove(i);
        } else if len < CHUNK / 2
            && i + 1 < self.chunks.len()
            && len + self.chunks[i + 1].len() <= 2 * CHUNK
        {
            let next = self.chunks.remove(i + 1);
            let next = Arc::try_unwrap(next).unwrap_or_else(|shared| (*shared).clone());
            Arc::make_mut(&mut self.chunks[i]).extend(next);
        }
        old
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Entries per chunk (for tests and measurements).
    #[cfg(test)]
    fn layout(&self) -> Vec<usize> {
        self.chunks.iter().map(|c| c.len()).collect()
    }
}

impl<V: PartialEq + Clone> PartialEq for ChunkMap<V> {
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        let same_layout = self.chunks.len() == other.chunks.len()
            && self
                .chunks
                .iter()
                .zip(&other.chunks)
                .all(|(a, b)| a.len() == b.len());
        if same_layout {
            // Equal maps cut into chunks of the same sizes have equal chunks.
            self.chunks
                .iter()
                .zip(&other.chunks)
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b)
        } else {
            self.iter().eq(other.iter())
        }
    }
}

impl<V: std::fmt::Debug + Clone> std::fmt::Debug for ChunkMap<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V: Clone> FromIterator<(String, V)> for ChunkMap<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(entries: I) -> Self {
        let mut map = ChunkMap::new();
        for (k, v) in entries {
            map.insert(k, v);
        }
        map
    }
}

impl<'a, V: Clone> IntoIterator for &'a ChunkMap<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = Box<dyn Iterator<Item = (&'a String, &'a V)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no randomness crate needed).
    fn next(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn behaves_like_a_btreemap_under_random_changes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        let mut map = ChunkMap::new();
        let mut model = BTreeMap::new();
        for step in 0..20_000u64 {
            let key = format!("node-{:04}", next(&mut seed) % 700);
            // Inserts outnumber removals at first, then the table shrinks.
            let insert = next(&mut seed) % 100 < if step < 12_000 { 70 } else { 30 };
            if insert {
                assert_eq!(map.insert(key.clone(), step), model.insert(key, step));
            } else {
                assert_eq!(map.remove(key.as_str()), model.remove(&key));
            }
            assert_eq!(map.len(), model.len());
            if step % 997 == 0 {
                assert!(map.iter().eq(model.iter()), "step {step}");
                assert!(map.layout().iter().all(|&n| n > 0 && n <= 2 * CHUNK));
            }
        }
        assert!(map.iter().eq(model.iter()));
        for k in model.keys() {
            assert_eq!(map.get(k.as_str()), model.get(k));
        }
        assert_eq!(map.get("absent"), None);
        assert_eq!(map.get(""), None);
        assert_eq!(map.get("zzz"), None);
    }

    #[test]
    fn a_change_in_a_clone_copies_one_chunk_and_leaves_the_original() {
        let original: ChunkMap<u64> = (0..1000).map(|i| (format!("n{i:04}"), i)).collect();
        assert!(original.layout().len() > 10, "{:?}", original.layout());
        let mut changed = original.clone();
        changed.insert("n0500".into(), 7);
        // Only the chunk holding n0500 is a copy; every other is shared.
        let copied = original
            .chunks
            .iter()
            .zip(&changed.chunks)
            .filter(|(a, b)| !Arc::ptr_eq(a, b))
            .count();
        assert_eq!(copied, 1);
        assert_eq!(original.get("n0500"), Some(&500));
        assert_eq!(changed.get("n0500"), Some(&7));
        assert_ne!(original, changed);
        changed.insert("n0500".into(), 500);
        assert_eq!(original, changed);
        changed.remove("n0001");
        assert_eq!(original.get("n0001"), Some(&1));
        assert_eq!(changed.get("n0001"), None);
        assert_eq!(changed.len(), 999);
    }

    #[test]
    fn equal_content_in_different_chunks_is_equal() {
        let ascending: ChunkMap<u32> = (0..300).map(|i| (format!("k{i:03}"), i)).collect();
        let descending: ChunkMap<u32> = (0..300).rev().map(|i| (format!("k{i:03}"), i)).collect();
        assert_eq!(ascending, descending);
        let mut other = descending.clone();
        other.insert("k150".into(), 0);
        assert_ne!(ascending, other);
        assert_ne!(ascending, ChunkMap::new());
    }
}
