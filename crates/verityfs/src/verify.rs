//! The verified read path (kernel: `fs/verity/verify.c`), with Merkle tree
//! readahead.
//!
//! A read fetches whole data blocks into one buffer, hashes them (on all
//! cores for large reads), checks each hash against its level-0 tree block,
//! and returns bytes from that same buffer: nothing is fetched twice. A tree
//! block is checked against its parent when it enters the cache; walking up
//! stops at the first block already verified, as in the kernel, so a
//! sequential read verifies each tree block once.
//!
//! As in the kernel, a read keeps its bookkeeping on the stack: the plan,
//! the hashes of its data blocks and the chain of tree blocks being
//! verified are fixed-size arrays (a tree has at most
//! [`MAX_KERNEL_LEVELS`] levels), and an unaligned read's whole blocks go
//! to a buffer kept per thread. An aligned read of cached tree blocks
//! makes no heap allocation, and looks each tree block up in the cache
//! once: the blocks the plan looked up are used from the plan.
//!
//! Readahead follows the kernel's 2026 design (readahead at submission time)
//! and the 2019 rule (a quarter of the data window ahead on level 0):
//! before the data is read, every level's missing tree blocks for the read
//! are requested asynchronously ([`Source::prefetch`](crate::Source::prefetch),
//! `POSIX_FADV_WILLNEED` for a local file), so that tree and data I/O
//! overlap; a missing tree block is then read together with the
//! rest of the run the read needs, in one request per level, straight into
//! the buffers the cache keeps; and on a sequential stream the level-0
//! blocks beyond the read are requested ahead of time. Reads that belong to
//! no stream ([`crate::access`]) fetch level 0 a large window at a time once
//! the file is seen to be read randomly: a few large tree reads replace one
//! small read per random read.

use std::cell::Cell;
use std::io::{self, IoSliceMut};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::access::{Pattern, Stream};
use crate::cache::{BlockKey, TreeBlock};
use crate::error::{Corruption, Error, Result};
use crate::geometry::MAX_KERNEL_LEVELS;
use crate::hash_algs::Digest;
use crate::open::VerityFile;
use crate::source::Lent;
use crate::stats::Counters;

/// Level-0 tree bytes requested at once ahead of a sequential stream: with
/// 4 KiB blocks and SHA-256, 2 MiB of hashes covers 256 MiB of data, so a
/// 250 MB stream costs one level-0 tree request.
const SEQUENTIAL_WINDOW_BYTES: u64 = 2 << 20;

/// Level-0 tree bytes fetched at once around a block that a random read
/// misses: 2 MiB covers 256 MiB of data with 4 KiB blocks and SHA-256, in
/// one device request where one request per random read would otherwise
/// go to the tree. Only for files whose level 0 takes at most half the
/// cache (2 GiB of data with the default cache): the blocks fetched in bulk
/// must stay cached to pay off.
const RANDOM_WINDOW_BYTES: u64 = 2 << 20;

/// Random reads of a file before its misses fetch level 0 a window at a
/// time: a lone read far from the others (a stream's first) fetches only
/// what it needs.
const RANDOM_READS_BEFORE_BULK: u64 = 4;

/// The most of the levels above level 0 read at once.
const UPPER_LEVELS_BYTES: u64 = 1 << 20;

/// Bytes of data-block hashes computed at once by reads of many blocks
/// (on the stack): 512 SHA-256 hashes, 2 MiB of 4 KiB blocks, enough to
/// keep every core busy.
const LARGE_HASH_BATCH: usize = 16 << 10;

/// The hash batch of reads of up to 64 SHA-256 (32 SHA-512) blocks, which
/// need not clear the large one.
const SMALL_HASH_BATCH: usize = 2 << 10;

/// The largest unaligned read whose block buffer a thread keeps for its
/// next unaligned read (more than FUSE's largest read); larger ones
/// allocate their own.
const KEPT_BOUNCE_BYTES: usize = 4 << 20;

thread_local! {
    /// The buffer of this thread's unaligned reads, taken while in use.
    static BOUNCE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// What one read needs from one tree level.
#[derive(Default)]
struct LevelPlan {
    /// The first and last blocks (indexes within the level) the read needs.
    first: u64,
    last: u64,
    /// The last block worth fetching together with a missing block (the
    /// run of uncached blocks that follows it).
    fetch_until: u64,
    /// The first block of a window fetched in bulk (from its first to its
    /// last uncached block, across cached ones): on a random pattern, and
    /// on the levels above level 0.
    window_from: Option<u64>,
    /// The cached copies of `first` and `last`, once looked up.
    held: [Option<Arc<TreeBlock>>; 2],
}

impl LevelPlan {
    /// The place for the copy of block `index`, if it is `first` or `last`.
    fn held(&mut self, index: u64) -> Option<&mut Option<Arc<TreeBlock>>> {
        let slot = match index {
            i if i == self.first => 0,
            i if i == self.last => 1,
            _ => return None,
        };
        Some(&mut self.held[slot])
    }
}

/// What one read needs from each tree level.
type ReadPlan = [LevelPlan; MAX_KERNEL_LEVELS];

impl VerityFile {
    /// Reads up to `buf.len()` bytes at `offset`, like `pread`, returning
    /// only bytes whose blocks matched the tree up to the root hash. Returns
    /// 0 at or past the end of the data. A mismatch is
    /// [`Error::Corrupted`] (`EIO`); nothing is returned from a read that
    /// touches a bad block.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let size = self.data_size();
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let len = (buf.len() as u64).min(size - offset) as usize;
        let log_bs = self.log_block_size();
        let (first, last) = (offset >> log_bs, (offset + len as u64 - 1) >> log_bs);
        let blocks = first << log_bs..((last + 1) << log_bs).min(size);
        let mut plan = self.plan_tree_reads(first, last, offset, len);
        let buf = &mut buf[..len];
        match self.read_blocks(buf, offset, &blocks, &mut plan) {
            // The bad bytes may be a copy the source kept, fetched while
            // the storage was bad (read ahead with a neighbour): once it is
            // dropped, the storage is read and checked once more, so that
            // the first read after a repair does not fail.
            Err(e) if self.forget_corrupt(&e, &blocks) => self
                .read_blocks(buf, offset, &blocks, &mut plan)
                .inspect_err(|e| {
                    self.forget_corrupt(e, &blocks);
                })?,
            checked => checked?,
        }
        Ok(len)
    }

    /// Up to `len` bytes at `offset`, verified, in the memory the data's
    /// source lent them from ([`Source::lend`](crate::Source::lend)): the
    /// very bytes checked are the bytes returned, with no copy. `None` when
    /// the source does not hold them all, or held a copy that failed its
    /// check (dropped now): then [`VerityFile::read_at`] reads them. Also
    /// `None` at or past the end of the data.
    pub fn read_lent(&self, offset: u64, len: usize) -> Result<Option<Lent>> {
        let size = self.data_size();
        if offset >= size || len == 0 {
            return Ok(None);
        }
        let len = (len as u64).min(size - offset) as usize;
        let log_bs = self.log_block_size();
        let (first, last) = (offset >> log_bs, (offset + len as u64 - 1) >> log_bs);
        let blocks = first << log_bs..((last + 1) << log_bs).min(size);
        let Some(lent) = self
            .data
            .lend(blocks.start, (blocks.end - blocks.start) as usize)
        else {
            return Ok(None);
        };
        let mut plan = self.plan_tree_reads(first, last, offset, len);
        match self.verify_data(first, &lent, &mut plan) {
            Ok(()) => {
                let from = (offset - blocks.start) as usize;
                Ok(lent.narrow(from..from + len))
            }
            Err(e) if self.forget_corrupt(&e, &blocks) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Fills `buf` with the data at `offset`, which lies in `blocks` (the
    /// whole blocks it touches), verified.
    fn read_blocks(
        &self,
        buf: &mut [u8],
        offset: u64,
        blocks: &Range<u64>,
        plan: &mut ReadPlan,
    ) -> Result<()> {
        let first = blocks.start >> self.log_block_size();
        if blocks.start == offset && blocks.end == offset + buf.len() as u64 {
            // The data is read straight into the caller's buffer: if it
            // fails its check, the caller must not be left holding it.
            let checked = self
                .read_data(buf, offset)
                .and_then(|()| self.verify_data(first, buf, plan));
            if checked.is_err() {
                buf.fill(0);
            }
            checked
        } else {
            let len = (blocks.end - blocks.start) as usize;
            with_bounce_buffer(len, |data| -> Result<()> {
                self.read_data(data, blocks.start)?;
                self.verify_data(first, data, plan)?;
                buf.copy_from_slice(&data[(offset - blocks.start) as usize..][..buf.len()]);
                Ok(())
            })
        }
    }

    /// If `e` is a failed check of data in `blocks`, tells the data's
    /// source to drop any copy it keeps of them; returns whether it had
    /// one.
    fn forget_corrupt(&self, e: &Error, blocks: &Range<u64>) -> bool {
        match e {
            Error::Corrupted(c) if c.level < 0 => self
                .data
                .invalidate(blocks.start, blocks.end - blocks.start),
            _ => false,
        }
    }

    fn log_block_size(&self) -> u32 {
        self.geometry.block_size().trailing_zeros()
    }

    fn read_data(&self, buf: &mut [u8], pos: u64) -> Result<()> {
        self.data.read_exact_at(buf, pos).map_err(metadata_error)
    }

    /// Adds `n` to one of this file's counters and to the same total.
    fn count(&self, counter: fn(&Counters) -> &AtomicU64, n: u64) {
        crate::stats::bump(&self.stats, &self.verifier.totals, counter, n);
    }

    /// Decides what to fetch for a read of data blocks `first..=last` and
    /// issues the asynchronous readahead.
    fn plan_tree_reads(&self, first: u64, last: u64, offset: u64, len: usize) -> ReadPlan {
        let pattern = self.access.observe(offset, offset + len as u64);
        let levels = self.geometry.levels();
        let la = self.geometry.log_arity();
        let mut plan = ReadPlan::default();
        for (level, lp) in plan.iter_mut().enumerate().take(levels.len()) {
            let shift = la * (level as u32 + 1);
            (lp.first, lp.last) = (first >> shift, last >> shift);
        }
        if !self.verifier.options.merkle_readahead {
            return plan;
        }
        // The levels above 0 are small: read each whole (the missing part
        // of the aligned window of `cap` blocks), up to a cap.
        let cap = (UPPER_LEVELS_BYTES >> self.log_block_size()).max(1);
        let mut upper_missing = false;
        for (level, info) in levels.iter().enumerate() {
            let lp = &mut plan[level];
            let (s, e) = (lp.first, lp.last);
            lp.fetch_until = match (level, &pattern) {
                (0, Pattern::Sequential(stream)) => self.readahead_level0(stream, s, e),
                (0, &Pattern::Random(n)) if n >= RANDOM_READS_BEFORE_BULK && self.bulk_fits() => {
                    self.fetch_level0_window(lp)
                }
                (0, Pattern::Random(_)) => self.hint_needed(lp),
                _ => {
                    upper_missing |= !self.all_cached(level, lp);
                    let from = s / cap * cap;
                    lp.window_from = Some(from);
                    e.max((from + cap).min(info.num_blocks) - 1)
                }
            };
        }
        if upper_missing {
            self.hint_upper_levels();
        }
        plan
    }

    /// Asks, at submission time, for the level-0 blocks the read needs if
    /// they are not cached, so that tree and data I/O overlap.
    fn hint_needed(&self, lp: &mut LevelPlan) -> u64 {
        if !self.all_cached(0, lp) {
            self.hint_tree_range(0, lp.first, lp.last);
        }
        lp.last
    }

    /// On a random pattern, plans to fetch the aligned window of level 0
    /// around the blocks the read needs, in one request, and asks for it at
    /// submission time if the read misses. Returns the window's last block.
    fn fetch_level0_window(&self, lp: &mut LevelPlan) -> u64 {
        let blocks = self.geometry.levels()[0].num_blocks;
        let window = (RANDOM_WINDOW_BYTES >> self.log_block_size()).max(1);
        let (from, until) = (
            lp.first / window * window,
            ((lp.last / window + 1) * window).min(blocks) - 1,
        );
        lp.window_from = Some(from);
        if !self.all_cached(0, lp) {
            self.hint_tree_range(0, from, until);
        }
        until
    }

    /// Whether level 0 is small enough for the cache to keep what random
    /// reads fetch in bulk.
    fn bulk_fits(&self) -> bool {
        let level0 = self.geometry.levels()[0].num_blocks << self.log_block_size();
        level0 <= self.verifier.options.cache_bytes as u64 / 2
    }

    /// Whether the first and last blocks `lp` needs of `level` are cached;
    /// keeps the cached copies for the walk.
    fn all_cached(&self, level: usize, lp: &mut LevelPlan) -> bool {
        let mut look_up = |slot: usize, index: u64| {
            lp.held[slot] = self.verifier.cache.peek(self.cache_key(level, index));
            lp.held[slot].is_some()
        };
        look_up(0, lp.first) && (lp.first == lp.last || look_up(1, lp.last))
    }

    /// Asks for all the levels above level 0 in one request: they are
    /// stored together at the start of the tree (top level first) and are
    /// about 1/128 of level 0, so one device request brings them all (up to
    /// [`UPPER_LEVELS_BYTES`]) instead of one small request per level.
    fn hint_upper_levels(&self) {
        let levels = self.geometry.levels();
        let top = levels.len() - 1;
        let cap = (UPPER_LEVELS_BYTES >> self.log_block_size()).max(1);
        let blocks = levels[0].start_block.min(cap);
        if blocks > 0 {
            self.hint_tree_range(top, 0, blocks - 1);
        }
    }

    /// Keeps a window of level-0 blocks requested ahead of a sequential
    /// stream. The window is large and requested in one go, so that the
    /// device sees a few large tree reads rather than one small read per
    /// data request; the next window is requested when the stream reaches
    /// the second half of the current one. Returns the last block worth
    /// reading together with a missing block (the end of the window).
    fn readahead_level0(&self, stream: &Stream, s: u64, e: u64) -> u64 {
        let blocks = self.geometry.levels()[0].num_blocks;
        let window = (SEQUENTIAL_WINDOW_BYTES >> self.log_block_size()).max(1);
        let until = stream.readahead_until.load(Ordering::Relaxed);
        if until < blocks && e + window / 2 >= until {
            // Continue the window, or start afresh if the stream jumped.
            let start = if (s..=e + 1).contains(&until) {
                until
            } else {
                s
            };
            let end = (start + window).min(blocks);
            // A window whose end is cached was fetched already (by another
            // stream, or in bulk): asking again would only cost a call.
            let fetched = self.verifier.cache.contains(self.cache_key(0, end - 1));
            if stream.readahead_until.fetch_max(end, Ordering::Relaxed) < end && !fetched {
                self.hint_tree_range(0, start, end - 1);
            }
        }
        let until = stream.readahead_until.load(Ordering::Relaxed);
        until.saturating_sub(1).clamp(e, blocks - 1)
    }

    /// Asks the tree's source to start fetching blocks `s..=e` of `level`
    /// (`POSIX_FADV_WILLNEED` for a local file) without waiting.
    fn hint_tree_range(&self, level: usize, s: u64, e: u64) {
        if s > e || self.fetched_whole {
            return;
        }
        let len = (e - s + 1) << self.log_block_size();
        self.tree.prefetch(self.tree_pos(level, s), len);
        self.count(|c| &c.readahead_requests, 1);
        self.count(|c| &c.readahead_blocks, e - s + 1);
    }

    fn cache_key(&self, level: usize, index: u64) -> BlockKey {
        (
            self.cache_id,
            self.geometry.levels()[level].start_block + index,
        )
    }

    /// Where block `index` of `level` is stored.
    fn tree_pos(&self, level: usize, index: u64) -> u64 {
        let (_, block) = self.cache_key(level, index);
        self.location.tree_pos + (block << self.log_block_size())
    }

    /// Hashes the data blocks starting at block `first` held in `data` and
    /// checks each against the tree, a batch of hashes at a time.
    fn verify_data(&self, first: u64, data: &[u8], plan: &mut ReadPlan) -> Result<()> {
        let blocks = data.len().div_ceil(self.geometry.block_size());
        self.count(|c| &c.data_blocks_verified, blocks as u64);
        let hashes = blocks * self.hasher.algorithm().digest_size();
        match hashes <= SMALL_HASH_BATCH {
            true => self.verify_batches::<SMALL_HASH_BATCH>(first, data, plan),
            false => self.verify_batches::<LARGE_HASH_BATCH>(first, data, plan),
        }
    }

    /// [`VerityFile::verify_data`] with `BATCH` bytes of hashes at a time.
    fn verify_batches<const BATCH: usize>(
        &self,
        first: u64,
        data: &[u8],
        plan: &mut ReadPlan,
    ) -> Result<()> {
        let bs = self.geometry.block_size();
        let d = self.hasher.algorithm().digest_size();
        let mut hashes = [0u8; BATCH];
        let mut group = None;
        let mut block = first;
        for batch in data.chunks(BATCH / d * bs) {
            let hashes = &mut hashes[..batch.len().div_ceil(bs) * d];
            self.hasher.hash_data_blocks(batch, bs, hashes);
            for real in hashes.chunks_exact(d) {
                self.check_data_block(block, real, plan, &mut group)?;
                block += 1;
            }
        }
        Ok(())
    }

    /// Checks the hash `real` of data block `block` against the tree.
    /// `group` keeps the verified level-0 block of the previous data block.
    fn check_data_block(
        &self,
        block: u64,
        real: &[u8],
        plan: &mut ReadPlan,
        group: &mut Option<(u64, Arc<TreeBlock>)>,
    ) -> Result<()> {
        let pos = block << self.log_block_size();
        if self.geometry.num_levels() == 0 {
            return self.check(real, self.descriptor.root_hash().as_bytes(), pos, -1);
        }
        let index = block >> self.geometry.log_arity();
        let tree_block = match group {
            Some((i, tree_block)) if *i == index => tree_block,
            _ => {
                let tree_block = self.verified_tree_block(index, pos, plan)?;
                &group.insert((index, tree_block)).1
            }
        };
        let (_, off) = self.geometry.hash_location(0, block);
        self.check(real, &tree_block.data()[off..][..real.len()], pos, -1)
    }

    /// The verified level-0 tree block `index`. A path that fails its
    /// check is dropped from the cache and fetched and checked once more
    /// from storage: an unverified block cached while the storage was bad
    /// (read ahead with a neighbour) must not fail reads after a repair.
    fn verified_tree_block(
        &self,
        index: u64,
        data_pos: u64,
        plan: &mut ReadPlan,
    ) -> Result<Arc<TreeBlock>> {
        match self.verified_tree_path(index, data_pos, plan) {
            Err(Error::Corrupted(_)) => self.verified_tree_path(index, data_pos, plan),
            verified => verified,
        }
    }

    /// The verified level-0 tree block `index`: walks up to the first
    /// verified block (or the root hash), then verifies back down.
    fn verified_tree_path(
        &self,
        index: u64,
        data_pos: u64,
        plan: &mut ReadPlan,
    ) -> Result<Arc<TreeBlock>> {
        let la = self.geometry.log_arity();
        let mut chain: [Option<Arc<TreeBlock>>; MAX_KERNEL_LEVELS] = Default::default();
        let mut level = 0;
        let mut parent = loop {
            let block = self.tree_block(level, index >> (la * level as u32), plan)?;
            if block.is_verified() {
                break Some(block);
            }
            chain[level] = Some(block);
            level += 1;
            if level == self.geometry.num_levels() {
                break None;
            }
        };
        for lvl in (0..level).rev() {
            let block = chain[lvl].take().expect("the walk filled the chain");
            let want = match &parent {
                Some(p) => {
                    let (_, off) = self
                        .geometry
                        .hash_location(lvl + 1, index >> (la * lvl as u32));
                    &p.data()[off..][..self.hasher.algorithm().digest_size()]
                }
                None => self.descriptor.root_hash().as_bytes(),
            };
            let real = self.hasher.hash_block(block.data());
            if let Err(e) = self.check(real.as_bytes(), want, data_pos, lvl as i32) {
                // Neither this block nor the unverified ones below it may
                // stay cached: once the storage is repaired, the next reads
                // must fetch them again.
                let below = chain[..lvl]
                    .iter_mut()
                    .enumerate()
                    .filter_map(|(l, b)| Some((l, b.take()?)));
                for (l, b) in below.chain([(lvl, block)]) {
                    let i = index >> (la * l as u32);
                    self.verifier.cache.remove(self.cache_key(l, i), &b);
                    let bs = self.geometry.block_size() as u64;
                    self.tree.invalidate(self.tree_pos(l, i), bs);
                }
                return Err(e);
            }
            block.set_verified();
            parent = Some(block);
        }
        Ok(parent.expect("the chain or the walk yields a block"))
    }

    /// Tree block `index` of `level`: the copy the plan holds if it is still
    /// cached, else from the cache, else read from storage together with the
    /// rest of the planned run.
    fn tree_block(&self, level: usize, index: u64, plan: &mut ReadPlan) -> Result<Arc<TreeBlock>> {
        let lp = &mut plan[level];
        let held = lp.held(index).and_then(|held| held.as_ref());
        if let Some(block) = held.filter(|block| block.is_cached()) {
            block.touch();
            self.count(|c| &c.cache_hits, 1);
            return Ok(block.clone());
        }
        let block = match self.verifier.cache.get(self.cache_key(level, index)) {
            Some(block) => {
                self.count(|c| &c.cache_hits, 1);
                block
            }
            None => {
                self.count(|c| &c.cache_misses, 1);
                self.read_run(level, index, lp)?
            }
        };
        if let Some(held) = lp.held(index) {
            *held = Some(block.clone());
        }
        Ok(block)
    }

    /// Reads block `index` of `level` and the blocks `lp` says are worth
    /// fetching with it in one request, straight into new cache blocks,
    /// caches them (a copy already cached wins) and returns the cached
    /// block `index`.
    fn read_run(&self, level: usize, index: u64, lp: &LevelPlan) -> Result<Arc<TreeBlock>> {
        let until = lp
            .fetch_until
            .clamp(index, self.geometry.levels()[level].num_blocks - 1);
        let cache = &self.verifier.cache;
        let uncached = |i: &u64| !cache.contains(self.cache_key(level, *i));
        let (from, until) = match lp.window_from {
            Some(from) => (
                (from.min(index)..index).find(uncached).unwrap_or(index),
                (index + 1..=until).rev().find(uncached).unwrap_or(index),
            ),
            None => (
                index,
                index + (index + 1..=until).take_while(uncached).count() as u64,
            ),
        };
        let (before, count) = ((index - from) as usize, (until - from + 1) as usize);
        let bs = self.geometry.block_size();
        let mut blocks: Vec<Box<[u8]>> = (0..count).map(|_| vec![0; bs].into()).collect();
        let mut bufs: Vec<IoSliceMut<'_>> = blocks.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        self.tree
            .read_exact_vectored_at(&mut bufs, self.tree_pos(level, from))
            .map_err(metadata_error)?;
        self.count(|c| &c.tree_read_requests, 1);
        self.count(|c| &c.tree_blocks_read, count as u64);
        let (_, start) = self.cache_key(level, from);
        let mut cached = blocks.into_iter().zip(start..).map(|(bytes, block)| {
            cache.insert((self.cache_id, block), Arc::new(TreeBlock::new(bytes)))
        });
        let wanted = cached.nth(before).expect("count > before");
        cached.for_each(drop);
        Ok(wanted)
    }

    /// Fails with the kernel's "FILE CORRUPTED!" report unless the hashes
    /// match.
    fn check(&self, real: &[u8], want: &[u8], pos: u64, level: i32) -> Result<()> {
        if real == want {
            return Ok(());
        }
        self.count(|c| &c.verification_failures, 1);
        let digest = |b: &[u8]| Digest::from_slice(b).expect("digest-sized");
        Err(Error::Corrupted(Box::new(Corruption {
            file: self.name.clone(),
            pos,
            level,
            alg: self.hasher.algorithm(),
            want: digest(want),
            real: digest(real),
        })))
    }
}

/// Reading metadata that is cut off is a truncated file, not an I/O error.
fn metadata_error(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => Error::MetadataTruncated,
        _ => e.into(),
    }
}

/// Calls `f` with a buffer of `len` bytes: this thread's unaligned-read
/// buffer, which is kept for the next read unless it grew too large.
fn with_bounce_buffer<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    // Taken, not borrowed: a read on this thread while `f` runs (rayon may
    // run another task here while it waits for the hashing) gets a fresh
    // buffer instead of a conflict.
    let mut buf = BOUNCE.take();
    buf.resize(len, 0);
    let result = f(&mut buf);
    if buf.capacity() <= KEPT_BOUNCE_BYTES {
        BOUNCE.set(buf);
    }
    result
}
