//! The cache of Merkle tree blocks, shared by every reader of every file and
//! bounded in bytes.
//!
//! A block carries a *verified* flag, set once its hash matched its parent's
//! (or the root hash). Like the kernel's `PG_checked`, the flag lives and dies
//! with the cached copy: an evicted block is read and verified again.
//! Eviction is CLOCK (second chance), per shard.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The default cache size: the tree of 4 GiB of data with 4 KiB blocks and
/// SHA-256, far more than a sequential stream needs.
pub(crate) const DEFAULT_CACHE_BYTES: usize = 32 << 20;

const SHARDS: usize = 16;

/// Identifies a tree block: the file's cache id and the block's index in the
/// stored tree.
pub(crate) type BlockKey = (u64, u64);

/// A cached tree block. Its flags are atomics so that a reader holding
/// the block can use them without the shard's lock.
#[derive(Debug)]
pub(crate) struct TreeBlock {
    data: Box<[u8]>,
    verified: AtomicBool,
    /// Used since the clock hand last passed (CLOCK's reference bit).
    referenced: AtomicBool,
    /// Still in the cache: set when inserted, cleared when evicted.
    cached: AtomicBool,
}

impl TreeBlock {
    /// A block read from storage, not yet verified.
    pub(crate) fn new(data: Box<[u8]>) -> Self {
        TreeBlock {
            data,
            verified: AtomicBool::new(false),
            referenced: AtomicBool::new(false),
            cached: AtomicBool::new(false),
        }
    }

    /// The block's bytes.
    pub(crate) fn data(&self) -> &[u8] {
        &self.data
    }

    /// Whether the block's hash was checked against its parent.
    pub(crate) fn is_verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    /// Records that the block's hash matched its parent's.
    pub(crate) fn set_verified(&self) {
        self.verified.store(true, Ordering::Release);
    }

    /// Whether the block is still in the cache (not evicted).
    pub(crate) fn is_cached(&self) -> bool {
        self.cached.load(Ordering::Relaxed)
    }

    /// Marks the block used, as a cache lookup does.
    pub(crate) fn touch(&self) {
        self.referenced.store(true, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<BlockKey, Arc<TreeBlock>>,
    clock: VecDeque<BlockKey>,
    bytes: usize,
}

impl Shard {
    /// Evicts blocks until `incoming` more bytes fit in `capacity` (or the
    /// shard is empty).
    fn make_room(&mut self, incoming: usize, capacity: usize) {
        while self.bytes + incoming > capacity {
            let Some(key) = self.clock.pop_front() else {
                return;
            };
            let block = &self.map[&key];
            if block.referenced.swap(false, Ordering::Relaxed) {
                self.clock.push_back(key);
            } else {
                self.bytes -= block.data.len();
                block.cached.store(false, Ordering::Relaxed);
                self.map.remove(&key);
            }
        }
    }
}

/// The shard holding `key`. Consecutive blocks of a file land in different
/// shards.
fn shard_index(key: BlockKey) -> usize {
    let h = key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ key.1;
    h as usize % SHARDS
}

/// A bounded, sharded cache of tree blocks.
pub(crate) struct TreeCache {
    shards: Vec<Mutex<Shard>>,
    shard_capacity: usize,
}

impl TreeCache {
    /// A cache holding at most about `capacity_bytes` of blocks.
    pub(crate) fn new(capacity_bytes: usize) -> Self {
        TreeCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_capacity: capacity_bytes / SHARDS,
        }
    }

    fn shard(&self, key: BlockKey) -> std::sync::MutexGuard<'_, Shard> {
        let shard = &self.shards[shard_index(key)];
        shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The cached block for `key`, if any, marked used.
    pub(crate) fn get(&self, key: BlockKey) -> Option<Arc<TreeBlock>> {
        let block = self.peek(key)?;
        block.touch();
        Some(block)
    }

    /// The cached block for `key`, if any, without marking it used.
    pub(crate) fn peek(&self, key: BlockKey) -> Option<Arc<TreeBlock>> {
        self.shard(key).map.get(&key).cloned()
    }

    /// Whether `key` is cached (without marking it used).
    pub(crate) fn contains(&self, key: BlockKey) -> bool {
        self.shard(key).map.contains_key(&key)
    }

    /// Caches `block` under `key` and returns the cached block: an already
    /// cached copy wins, since it may be verified.
    pub(crate) fn insert(&self, key: BlockKey, block: Arc<TreeBlock>) -> Arc<TreeBlock> {
        let capacity = self.shard_capacity;
        let mut shard = self.shard(key);
        if let Some(cached) = shard.map.get(&key) {
            cached.touch();
            return cached.clone();
        }
        shard.make_room(block.data.len(), capacity);
        shard.bytes += block.data.len();
        shard.clock.push_back(key);
        block.cached.store(true, Ordering::Relaxed);
        shard.map.insert(key, block.clone());
        block
    }

    /// Drops `block` from the cache if it is the copy cached under `key`:
    /// a block that failed its check must not stay, or the file would keep
    /// failing after its storage is repaired.
    pub(crate) fn remove(&self, key: BlockKey, block: &Arc<TreeBlock>) {
        let mut shard = self.shard(key);
        if !shard.map.get(&key).is_some_and(|b| Arc::ptr_eq(b, block)) {
            return;
        }
        shard.map.remove(&key);
        shard.clock.retain(|k| *k != key);
        shard.bytes -= block.data.len();
        block.cached.store(false, Ordering::Relaxed);
    }

    /// Bytes of blocks held.
    pub(crate) fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.bytes))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(byte: u8) -> Arc<TreeBlock> {
        Arc::new(TreeBlock::new(vec![byte; 1024].into()))
    }

    #[test]
    fn stays_within_its_bound() {
        let cache = TreeCache::new(64 * 1024);
        for i in 0..10_000 {
            cache.insert((1, i), block(i as u8));
            assert!(cache.bytes() <= 64 * 1024);
        }
        assert!(
            cache.bytes() >= 32 * 1024,
            "cache should stay reasonably full"
        );
    }

    #[test]
    fn first_copy_wins_and_keeps_its_verified_flag() {
        let cache = TreeCache::new(1 << 20);
        let a = cache.insert((7, 3), block(1));
        a.set_verified();
        let b = cache.insert((7, 3), block(2));
        assert!(b.is_verified());
        assert_eq!(b.data()[0], 1);
        assert!(cache.get((7, 4)).is_none());
        assert!(cache.contains((7, 3)));
    }

    #[test]
    fn consecutive_blocks_spread_over_every_shard() {
        for file in [0, 1, 7, u64::MAX] {
            let shards: std::collections::HashSet<usize> = (0..SHARDS as u64)
                .map(|block| shard_index((file, block)))
                .collect();
            assert_eq!(shards.len(), SHARDS, "file {file}");
        }
    }

    #[test]
    fn removes_only_the_copy_it_is_given() {
        let cache = TreeCache::new(1 << 20);
        let key = (1, 0);
        let cached = cache.insert(key, block(1));
        cache.remove(key, &block(1));
        assert!(cache.contains(key));
        cache.remove(key, &cached);
        assert!(!cache.contains(key) && !cached.is_cached());
        assert_eq!(cache.bytes(), 0);
        cache.insert(key, block(2));
        assert_eq!(cache.get(key).unwrap().data()[0], 2);
    }

    #[test]
    fn referenced_blocks_get_a_second_chance() {
        let cache = TreeCache::new(SHARDS * 2048); // two blocks per shard
        let key_in_same_shard = |n: usize| {
            (1u64..)
                .map(|i| (0, i))
                .filter(|&k| shard_index(k) == shard_index((0, 0)))
                .nth(n)
                .unwrap()
        };
        let (a, b, c) = ((0, 0), key_in_same_shard(0), key_in_same_shard(1));
        let held_a = cache.insert(a, block(0));
        let held_b = cache.insert(b, block(0));
        cache.get(a);
        cache.insert(c, block(0));
        assert!(cache.contains(a), "recently used block was evicted");
        assert!(!cache.contains(b));
        // Readers holding a block see whether it is still cached.
        assert!(held_a.is_cached() && !held_b.is_cached());
    }
}
