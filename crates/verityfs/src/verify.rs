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
//! Readahead follows the kernel's 2026 design (readahead at submission time)
//! and the 2019 rule (a quarter of the data window ahead on level 0):
//! before the data is read, every level's missing tree blocks for the read
//! are requested asynchronously (`POSIX_FADV_WILLNEED`), so that tree and
//! data I/O overlap; a missing tree block is then read together with the
//! rest of the run the read needs, in one request per level; and on a
//! sequential stream the level-0 blocks beyond the read are requested ahead
//! of time.

use std::num::NonZeroU64;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustix::fs::{fadvise, Advice};

use crate::build::hash_data_blocks;
use crate::cache::TreeBlock;
use crate::error::{Corruption, Error, Result};
use crate::hash_algs::Digest;
use crate::open::VerityFile;
use crate::stats::bump;

/// Level-0 tree bytes requested at once ahead of a sequential stream: with
/// 4 KiB blocks and SHA-256, 2 MiB of hashes covers 256 MiB of data, so a
/// 250 MB stream costs one level-0 tree request.
const SEQUENTIAL_WINDOW_BYTES: u64 = 2 << 20;

/// How far from where the previous read ended a read may start and still
/// count as part of a sequential stream.
const SEQUENTIAL_SLACK: u64 = 8 << 20;

/// The most of the levels above level 0 read at once.
const UPPER_LEVELS_BYTES: u64 = 1 << 20;

/// For one read: per level, the last block (index within the level) worth
/// fetching together with a missing block.
struct TreePlan {
    fetch_until: Vec<u64>,
}

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
        let start = first << log_bs;
        let end = ((last + 1) << log_bs).min(size);
        let plan = self.plan_tree_reads(first, last, offset, len);
        let buf = &mut buf[..len];
        if start == offset && end == offset + len as u64 {
            self.read_data(buf, start)?;
            self.verify_data(first, buf, &plan)?;
        } else {
            let mut blocks = vec![0u8; (end - start) as usize];
            self.read_data(&mut blocks, start)?;
            self.verify_data(first, &blocks, &plan)?;
            buf.copy_from_slice(&blocks[(offset - start) as usize..][..len]);
        }
        Ok(len)
    }

    fn log_block_size(&self) -> u32 {
        self.geometry.block_size().trailing_zeros()
    }

    fn read_data(&self, buf: &mut [u8], pos: u64) -> Result<()> {
        self.data
            .read_exact_at(buf, pos)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::MetadataTruncated,
                _ => e.into(),
            })
    }

    /// Decides what to fetch for a read of data blocks `first..=last` and
    /// issues the asynchronous readahead.
    fn plan_tree_reads(&self, first: u64, last: u64, offset: u64, len: usize) -> TreePlan {
        let previous_end = self.last_end.swap(offset + len as u64, Ordering::Relaxed);
        // Requests of one stream may arrive slightly out of order (the
        // kernel keeps several readahead requests in flight, served by
        // several threads): near the previous end still counts.
        let sequential = offset == 0 || offset.abs_diff(previous_end) <= SEQUENTIAL_SLACK;
        let levels = self.geometry.levels();
        if !self.verifier.options.merkle_readahead {
            return TreePlan {
                fetch_until: vec![0; levels.len()],
            };
        }
        let la = self.geometry.log_arity();
        let mut fetch_until = Vec::with_capacity(levels.len());
        let mut upper_missing = false;
        for (level, info) in levels.iter().enumerate() {
            let shift = la * (level as u32 + 1);
            let (s, e) = (first >> shift, last >> shift);
            if level == 0 {
                fetch_until.push(match sequential {
                    true => self.readahead_level0(s, e),
                    false => self.hint_needed(0, s, e),
                });
                continue;
            }
            upper_missing |= !self.is_cached(level, s) || !self.is_cached(level, e);
            // The levels above 0 are small: read each whole, up to a cap.
            let cap = (UPPER_LEVELS_BYTES >> self.log_block_size()).max(1);
            fetch_until.push(e.max((s + cap).min(info.num_blocks) - 1));
        }
        if upper_missing {
            self.hint_upper_levels();
        }
        TreePlan { fetch_until }
    }

    /// Asks, at submission time, for the blocks `s..=e` of `level` this read
    /// needs if they are not cached, so that tree and data I/O overlap.
    fn hint_needed(&self, level: usize, s: u64, e: u64) -> u64 {
        let requested = level == 0 && e < self.readahead_until.load(Ordering::Relaxed);
        if !requested && (!self.is_cached(level, s) || !self.is_cached(level, e)) {
            self.hint_tree_range(level, s, e);
        }
        e
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
    fn readahead_level0(&self, s: u64, e: u64) -> u64 {
        let blocks = self.geometry.levels()[0].num_blocks;
        let window = (SEQUENTIAL_WINDOW_BYTES >> self.log_block_size()).max(1);
        let until = self.readahead_until.load(Ordering::Relaxed);
        if until < blocks && e + window / 2 >= until {
            // Continue the window, or start afresh if the stream jumped.
            let start = if (s..=e + 1).contains(&until) {
                until
            } else {
                s
            };
            let end = (start + window).min(blocks);
            if self.readahead_until.fetch_max(end, Ordering::Relaxed) < end {
                self.hint_tree_range(0, start, end - 1);
            }
        }
        let until = self.readahead_until.load(Ordering::Relaxed);
        until.saturating_sub(1).clamp(e, blocks - 1)
    }

    /// `POSIX_FADV_WILLNEED` on tree blocks `s..=e` of `level`: the kernel
    /// starts reading them without waiting.
    fn hint_tree_range(&self, level: usize, s: u64, e: u64) {
        if s > e {
            return;
        }
        let log_bs = self.log_block_size();
        let pos =
            self.location.tree_pos + ((self.geometry.levels()[level].start_block + s) << log_bs);
        let len = NonZeroU64::new((e - s + 1) << log_bs);
        // A hint: failure only costs speed.
        let _ = fadvise(&self.tree, pos, len, Advice::WillNeed);
        bump(
            (
                &self.stats.readahead_requests,
                &self.verifier.totals.readahead_requests,
            ),
            1,
        );
        bump(
            (
                &self.stats.readahead_blocks,
                &self.verifier.totals.readahead_blocks,
            ),
            e - s + 1,
        );
    }

    fn cache_key(&self, level: usize, index: u64) -> (u64, u64) {
        (
            self.cache_id,
            self.geometry.levels()[level].start_block + index,
        )
    }

    fn is_cached(&self, level: usize, index: u64) -> bool {
        self.verifier.cache.contains(self.cache_key(level, index))
    }

    /// Hashes the data blocks starting at block `first` held in `data` and
    /// checks each against the tree.
    fn verify_data(&self, first: u64, data: &[u8], plan: &TreePlan) -> Result<()> {
        let bs = self.geometry.block_size();
        let d = self.hasher.algorithm().digest_size();
        let mut hashes = Vec::new();
        hash_data_blocks(&self.hasher, data, bs, &mut hashes);
        let n = hashes.len() / d;
        bump(
            (
                &self.stats.data_blocks_verified,
                &self.verifier.totals.data_blocks_verified,
            ),
            n as u64,
        );
        if self.geometry.num_levels() == 0 {
            let root = self.descriptor.root_hash().as_bytes();
            return self.check(&hashes, root, first << self.log_block_size(), -1);
        }
        let la = self.geometry.log_arity();
        let mut i = 0;
        while i < n {
            let block = first + i as u64;
            let pos = block << self.log_block_size();
            let tree_block = self.verified_tree_block(0, block >> la, pos, plan)?;
            let group_end = n.min((((block >> la) + 1) << la) as usize - first as usize);
            for j in i..group_end {
                let (_, off) = self.geometry.hash_location(0, first + j as u64);
                let pos = (first + j as u64) << self.log_block_size();
                self.check(
                    &hashes[j * d..][..d],
                    &tree_block.data()[off..off + d],
                    pos,
                    -1,
                )?;
            }
            i = group_end;
        }
        Ok(())
    }

    /// The verified level-`level` tree block `index`: walks up to the first
    /// verified block (or the root hash), then verifies back down.
    fn verified_tree_block(
        &self,
        level: usize,
        index: u64,
        data_pos: u64,
        plan: &TreePlan,
    ) -> Result<Arc<TreeBlock>> {
        let la = self.geometry.log_arity();
        let mut chain = Vec::new();
        let (mut lvl, mut idx) = (level, index);
        let mut parent = loop {
            let block = self.tree_block(lvl, idx, plan)?;
            if block.is_verified() {
                break Some(block);
            }
            chain.push((lvl, idx, block));
            if lvl + 1 == self.geometry.num_levels() {
                break None;
            }
            lvl += 1;
            idx >>= la;
        };
        let d = self.hasher.algorithm().digest_size();
        for (lvl, idx, block) in chain.into_iter().rev() {
            let want = match &parent {
                Some(p) => &p.data()[self.geometry.hash_location(lvl + 1, idx).1..][..d],
                None => self.descriptor.root_hash().as_bytes(),
            };
            let real = self.hasher.hash_block(block.data());
            self.check(real.as_bytes(), want, data_pos, lvl as i32)?;
            block.set_verified();
            parent = Some(block);
        }
        Ok(parent.expect("the chain or the loop yields a block"))
    }

    /// Tree block `index` of `level`, from the cache or read from storage
    /// together with the rest of the planned run.
    fn tree_block(&self, level: usize, index: u64, plan: &TreePlan) -> Result<Arc<TreeBlock>> {
        let (stats, totals) = (&self.stats, &self.verifier.totals);
        if let Some(block) = self.verifier.cache.get(self.cache_key(level, index)) {
            bump((&stats.cache_hits, &totals.cache_hits), 1);
            return Ok(block);
        }
        bump((&stats.cache_misses, &totals.cache_misses), 1);
        let until =
            plan.fetch_until[level].clamp(index, self.geometry.levels()[level].num_blocks - 1);
        let count = (index + 1..=until)
            .take_while(|&i| !self.is_cached(level, i))
            .count()
            + 1;
        let bs = self.geometry.block_size();
        let mut buf = vec![0u8; count * bs];
        let (_, start) = self.cache_key(level, index);
        let pos = self.location.tree_pos + (start << self.log_block_size());
        self.tree
            .read_exact_at(&mut buf, pos)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::MetadataTruncated,
                _ => e.into(),
            })?;
        bump((&stats.tree_read_requests, &totals.tree_read_requests), 1);
        bump(
            (&stats.tree_blocks_read, &totals.tree_blocks_read),
            count as u64,
        );
        let mut blocks = buf.chunks_exact(bs).enumerate().map(|(k, bytes)| {
            let block = Arc::new(TreeBlock::new(bytes.into()));
            self.verifier
                .cache
                .insert((self.cache_id, start + k as u64), block)
        });
        let wanted = blocks.next().expect("count >= 1");
        blocks.for_each(drop);
        Ok(wanted)
    }

    /// Fails with the kernel's "FILE CORRUPTED!" report unless the hashes
    /// match.
    fn check(&self, real: &[u8], want: &[u8], pos: u64, level: i32) -> Result<()> {
        if real == want {
            return Ok(());
        }
        bump(
            (
                &self.stats.verification_failures,
                &self.verifier.totals.verification_failures,
            ),
            1,
        );
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
