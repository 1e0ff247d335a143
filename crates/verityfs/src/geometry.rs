//! Level geometry of a Merkle tree: how many levels, how many blocks each,
//! and where each level starts in the stored tree.
//!
//! Level 0 holds the hashes of the data blocks; level `num_levels - 1` is a
//! single block whose hash is the root hash. The stored tree puts the top
//! level first and level 0 last (`fs/verity/open.c`), which is the layout of
//! `FS_IOC_READ_VERITY_METADATA` and `fsverity digest --out-merkle-tree`.

use crate::error::{Error, Result};
use crate::params::MerkleTreeParams;

/// The kernel's limit on tree levels (`FS_VERITY_MAX_LEVELS`).
pub const MAX_KERNEL_LEVELS: usize = 8;

/// One level of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    /// Index of the level's first block in the stored tree.
    pub start_block: u64,
    /// Number of blocks in the level.
    pub num_blocks: u64,
}

/// The shape of the Merkle tree of a file of a given size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeGeometry {
    log_block_size: u32,
    log_arity: u32,
    data_size: u64,
    levels: Vec<Level>,
}

impl TreeGeometry {
    /// The geometry of the tree over `data_size` bytes with `params`.
    pub fn new(params: &MerkleTreeParams, data_size: u64) -> Self {
        let log_block_size = params.log_block_size() as u32;
        let log_arity = params.log_arity();
        let mut counts = Vec::new();
        let mut blocks = div_round_up(data_size, log_block_size);
        while blocks > 1 {
            blocks = div_round_up(blocks, log_arity);
            counts.push(blocks);
        }
        let mut levels = vec![
            Level {
                start_block: 0,
                num_blocks: 0
            };
            counts.len()
        ];
        let mut start = 0;
        for (level, &num_blocks) in levels.iter_mut().zip(&counts).rev() {
            *level = Level {
                start_block: start,
                num_blocks,
            };
            start += num_blocks;
        }
        TreeGeometry {
            log_block_size,
            log_arity,
            data_size,
            levels,
        }
    }

    /// Fails with `EFBIG` if the kernel would refuse a tree this tall.
    pub fn check_kernel_limits(&self) -> Result<()> {
        if self.num_levels() > MAX_KERNEL_LEVELS {
            return Err(Error::TooManyLevels {
                levels: self.num_levels(),
                max: MAX_KERNEL_LEVELS,
            });
        }
        Ok(())
    }

    /// The size of the data the tree covers.
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> usize {
        1 << self.log_block_size
    }

    /// Number of data blocks (the last one may be partial).
    pub fn data_blocks(&self) -> u64 {
        div_round_up(self.data_size, self.log_block_size)
    }

    /// Number of tree levels (0 for files of at most one block).
    pub fn num_levels(&self) -> usize {
        self.levels.len()
    }

    /// The levels, level 0 first.
    pub fn levels(&self) -> &[Level] {
        &self.levels
    }

    /// Total number of tree blocks.
    pub fn tree_blocks(&self) -> u64 {
        self.levels.iter().map(|l| l.num_blocks).sum()
    }

    /// Size of the stored tree in bytes.
    pub fn tree_size(&self) -> u64 {
        self.tree_blocks() << self.log_block_size
    }

    /// log2 of the number of hashes per tree block.
    pub fn log_arity(&self) -> u32 {
        self.log_arity
    }

    /// Where the hash of block `index` of the level below `level` lives:
    /// the stored tree block index and the byte offset within that block.
    /// (For `level` 0 the block below is data block `index`.)
    pub fn hash_location(&self, level: usize, index: u64) -> (u64, usize) {
        let tree_block = self.levels[level].start_block + (index >> self.log_arity);
        let digest_size = self.block_size() >> self.log_arity;
        let offset = (index & ((1 << self.log_arity) - 1)) as usize * digest_size;
        (tree_block, offset)
    }

    /// Index, within its own level, of the level-`level` block that holds
    /// the hash chain of data block `data_block`.
    pub fn block_index_in_level(&self, level: usize, data_block: u64) -> u64 {
        data_block >> (self.log_arity * (level as u32 + 1))
    }
}

fn div_round_up(n: u64, log_divisor: u32) -> u64 {
    (n >> log_divisor) + u64::from(n & ((1 << log_divisor) - 1) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash_algs::HashAlgorithm;
    use proptest::prelude::*;

    fn geometry(block_size: u64, alg: HashAlgorithm, size: u64) -> TreeGeometry {
        TreeGeometry::new(&MerkleTreeParams::new(alg, block_size, b"").unwrap(), size)
    }

    #[test]
    fn spec_examples() {
        let g = geometry(1024, HashAlgorithm::Sha256, 100_000);
        assert_eq!(g.data_blocks(), 98);
        assert_eq!(
            g.levels(),
            &[
                Level {
                    start_block: 1,
                    num_blocks: 4
                },
                Level {
                    start_block: 0,
                    num_blocks: 1
                }
            ]
        );
        assert_eq!(g.tree_size(), 5120);
        let g = geometry(4096, HashAlgorithm::Sha256, 1_000_000);
        assert_eq!(g.tree_size(), 12288);
        assert_eq!(g.levels()[0].start_block, 1);
        for size in [0, 1, 4096] {
            assert_eq!(geometry(4096, HashAlgorithm::Sha256, size).num_levels(), 0);
        }
        assert_eq!(
            geometry(4096, HashAlgorithm::Sha256, 4096 * 128).num_levels(),
            1
        );
        assert_eq!(
            geometry(4096, HashAlgorithm::Sha256, 4096 * 128 + 1).num_levels(),
            2
        );
    }

    #[test]
    fn kernel_level_limit() {
        // SHA-512 with 1 KiB blocks has arity 16: 16^8 blocks fit in 8 levels.
        assert!(geometry(1024, HashAlgorithm::Sha512, 1024 << 32)
            .check_kernel_limits()
            .is_ok());
        let g = geometry(1024, HashAlgorithm::Sha512, (1024 << 32) + 1);
        assert_eq!(g.check_kernel_limits().unwrap_err().errno(), libc::EFBIG);
    }

    /// The reference model: build level sizes by repeated division, as the
    /// kernel's `fsverity_init_merkle_tree_params()` does, with plain
    /// arithmetic.
    fn reference_levels(size: u64, block_size: u64, digest: u64) -> Vec<u64> {
        let arity = block_size / digest;
        let mut blocks = size.div_ceil(block_size);
        let mut out = Vec::new();
        while blocks > 1 {
            blocks = blocks.div_ceil(arity);
            out.push(blocks);
        }
        out
    }

    proptest! {
        #[test]
        fn matches_reference_model(
            size in prop_oneof![0u64..1 << 24, 0u64..u64::MAX >> 1],
            log_bs in 7u32..17,
            sha512 in any::<bool>(),
        ) {
            let alg = if sha512 { HashAlgorithm::Sha512 } else { HashAlgorithm::Sha256 };
            let bs = 1u64 << log_bs;
            let g = geometry(bs, alg, size);
            let want = reference_levels(size, bs, alg.digest_size() as u64);
            let got: Vec<u64> = g.levels().iter().map(|l| l.num_blocks).collect();
            prop_assert_eq!(&got, &want);
            // Levels are stored top first and contiguously.
            let mut next = 0;
            for level in g.levels().iter().rev() {
                prop_assert_eq!(level.start_block, next);
                next += level.num_blocks;
            }
            prop_assert_eq!(g.tree_size(), want.iter().sum::<u64>() * bs);
        }

        #[test]
        fn hash_locations_stay_inside_their_level(
            size in 1u64..1 << 40, pick in any::<u64>(), log_bs in 10u32..17,
        ) {
            let g = geometry(1 << log_bs, HashAlgorithm::Sha256, size);
            let mut index = pick % g.data_blocks();
            for (level_no, level) in g.levels().iter().enumerate() {
                let (block, offset) = g.hash_location(level_no, index);
                prop_assert!(block >= level.start_block);
                prop_assert!(block < level.start_block + level.num_blocks);
                prop_assert!(offset + 32 <= g.block_size());
                index >>= g.log_arity();
                prop_assert_eq!(block - level.start_block, index);
                prop_assert_eq!(g.block_index_in_level(level_no, pick % g.data_blocks()), index);
            }
        }
    }
}
