//! `VerityFile::read_at` returns exactly the original bytes for every tree
//! shape: SHA-256 and SHA-512, every block size from 1 to 64 KiB, no salt,
//! a short salt and the longest one, files of 0 bytes, of a partial block,
//! of exact block multiples and of 1 to 8 tree levels, with reads at any
//! offset and of any length (unaligned, crossing data and level-0 block
//! boundaries, running past the end, large enough to be hashed on several
//! threads), through a large cache, a cache too small to hold a tree path
//! and with tree readahead off.
//!
//! Trees of up to 8 levels need hundreds of GiB of data: those files are
//! sparse, with a few non-zero blocks, and their trees are computed from
//! the two kinds of block every level of a mostly-zero tree has, then
//! written only where the reads need them.

mod common;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use common::{build, random_bytes, write_file};
use fastrand::Rng;
use verityfs::{
    Descriptor, HashAlgorithm, MerkleTreeParams, ReadOptions, SaltedHasher, TreeGeometry, Verifier,
    VerityFile,
};

/// The largest file of the in-memory sweep, but for one file per geometry
/// whose level 0 has more than 1024 blocks, if no larger than the second.
const MAX_SWEEP_SIZE: u64 = 6 << 20;
const MAX_LONG_LEVEL0_SIZE: u64 = 20 << 20;

/// Verifiers with a cache large enough for any tree here, one that holds
/// about one block per shard (every walk up the tree evicts), and one
/// without tree readahead.
fn verifiers() -> [Arc<Verifier>; 3] {
    let options = |merkle_readahead, cache_bytes| ReadOptions {
        merkle_readahead,
        cache_bytes,
    };
    [
        Verifier::new(options(true, 64 << 20)),
        Verifier::new(options(true, 0)),
        Verifier::new(options(false, 64 << 10)),
    ]
}

fn open_detached(verifier: &Arc<Verifier>, dir: &Path, descriptor: &Descriptor) -> VerityFile {
    VerityFile::open_detached(
        verifier,
        File::open(dir.join("data")).unwrap(),
        File::open(dir.join("tree")).unwrap(),
        &descriptor.to_unsigned_bytes(),
        "data".as_ref(),
    )
    .unwrap()
}

/// Reads `len` bytes at `offset` and checks them against `data`, which the
/// file must hold.
fn check_read(file: &VerityFile, data: &[u8], offset: u64, len: usize, what: &str) {
    let mut buf = vec![0xa5u8; len];
    let n = file
        .read_at(&mut buf, offset)
        .unwrap_or_else(|e| panic!("{what}: read of {len} at {offset}: {e}"));
    let size = data.len() as u64;
    let expected = if offset >= size {
        &[][..]
    } else {
        &data[offset as usize..][..len.min((size - offset) as usize)]
    };
    assert_eq!(
        n,
        expected.len(),
        "{what}: length of read {len} at {offset}"
    );
    assert!(
        buf[..n] == *expected,
        "{what}: wrong bytes from read of {len} at {offset}"
    );
    assert!(
        buf[n..].iter().all(|&b| b == 0xa5),
        "{what}: read of {len} at {offset} wrote past what it returned"
    );
}

/// The reads every file gets: the edges of the file, of data blocks and of
/// level-0 tree blocks, and random ones; large unaligned reads come before
/// small ones near the end, so that a reused buffer holds other bytes.
fn reads(size: u64, bs: u64, arity: u64, rng: &mut Rng) -> Vec<(u64, usize)> {
    let group = bs * arity;
    let mut reads = vec![
        (0, size as usize + 1),
        (1, (size as usize).min(300 << 10)),
        (0, 1),
        (size.saturating_sub(1), 1),
        (size.saturating_sub(1), 2),
        (size.saturating_sub(bs + 1), bs as usize + 7),
        (size.saturating_sub(size % bs), bs as usize),
        (bs - 1, 2),
        (bs, bs as usize),
        (group - 1, 2),
        (group - bs / 2, bs as usize),
        (group.saturating_sub(bs), 2 * bs as usize),
        (size, 1),
        (size + 5000, 10),
    ];
    for _ in 0..40 {
        let offset = rng.u64(..size + 2);
        let len = match rng.u64(..4) {
            0 => rng.u64(..2 * bs) + 1,
            1 => rng.u64(..5 * bs) + 1,
            2 => rng.u64(..600 << 10) + 1,
            _ => (rng.u64(..8) + 1) * bs,
        };
        let offset = if rng.u64(..2) == 0 {
            offset / bs * bs
        } else {
            offset
        };
        reads.push((offset, len as usize));
    }
    reads
}

/// File sizes for one geometry: empty, around one block, and around each
/// number of blocks where the tree gains a level, up to `MAX_SWEEP_SIZE`.
fn sizes(bs: u64, arity: u64) -> Vec<u64> {
    let mut sizes = vec![0, 1, bs - 1, bs, bs + 1, 3 * bs + 17];
    let mut blocks = arity;
    while blocks * bs <= MAX_SWEEP_SIZE {
        let at = blocks * bs;
        sizes.extend([at - 1, at, at + 1, at + bs]);
        blocks *= arity;
    }
    sizes.retain(|&s| s <= MAX_SWEEP_SIZE);
    // A level 0 of more than 1024 blocks, read as one run from the start:
    // one `preadv` takes at most 1024 buffers.
    let long_level0 = 1025 * arity * bs + 1;
    if long_level0 <= MAX_LONG_LEVEL0_SIZE {
        sizes.push(long_level0);
    }
    sizes
}

#[test]
fn every_geometry_reads_back_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let salts: [&[u8]; 3] = [b"", b"s", &[0x5c; 32]];
    let mut rng = Rng::with_seed(7);
    let mut cases = 0;
    let mut max_levels = 0;
    for alg in HashAlgorithm::ALL {
        for log_bs in 10..=16 {
            let bs = 1u64 << log_bs;
            let salt = salts[(log_bs as usize + alg.id() as usize) % salts.len()];
            let params = MerkleTreeParams::new(alg, bs, salt).unwrap();
            let arity = bs / alg.digest_size() as u64;
            for size in sizes(bs, arity) {
                let what = format!("{alg}, {bs}-byte blocks, salt {salt:02x?}, {size} bytes");
                let data = random_bytes(size as usize, size ^ log_bs as u64);
                let (descriptor, tree) = build(&data, &params);
                write_file(dir.path(), "data", &data);
                write_file(dir.path(), "tree", &tree);
                let levels = TreeGeometry::new(&params, size).num_levels();
                max_levels = max_levels.max(levels);
                for (v, verifier) in verifiers().iter().enumerate() {
                    let file = open_detached(verifier, dir.path(), &descriptor);
                    for (offset, len) in reads(size, bs, arity, &mut rng) {
                        check_read(&file, &data, offset, len, &format!("{what}, verifier {v}"));
                    }
                }
                cases += 1;
            }
        }
    }
    assert!(cases > 100, "only {cases} geometries");
    assert!(max_levels >= 4, "tallest tree has {max_levels} levels");
}

/// The tree of a sparse file that is zero except for a few blocks: tree
/// blocks are stored explicitly only where those blocks change them; every
/// other block of a level is one of the two blocks a tree over zeroes has
/// there (a full one, or the last one of the level).
struct SparseTree {
    geometry: TreeGeometry,
    hasher: SaltedHasher,
    /// Per level: the block whose children are all full ones, and the last
    /// block of the level.
    zero_blocks: Vec<[Vec<u8>; 2]>,
    /// Blocks that differ from those, by level and index in the level.
    changed: HashMap<(usize, u64), Vec<u8>>,
}

impl SparseTree {
    fn new(params: &MerkleTreeParams, data_size: u64) -> Self {
        let geometry = TreeGeometry::new(params, data_size);
        let hasher = params.hasher();
        let bs = geometry.block_size();
        let d = params.digest_size();
        let arity = (bs / d) as u64;
        let zero = hasher.hash_block(&vec![0; bs]);
        let (mut full_child, mut last_child) = (zero, zero);
        let mut children = data_size.div_ceil(bs as u64);
        let mut zero_blocks = Vec::new();
        for level in geometry.levels() {
            let mut full = Vec::with_capacity(bs);
            (0..arity).for_each(|_| full.extend_from_slice(full_child.as_bytes()));
            let in_last = children - (level.num_blocks - 1) * arity;
            let mut last = Vec::with_capacity(bs);
            (1..in_last).for_each(|_| last.extend_from_slice(full_child.as_bytes()));
            last.extend_from_slice(last_child.as_bytes());
            last.resize(bs, 0);
            (full_child, last_child) = (hasher.hash_block(&full), hasher.hash_block(&last));
            zero_blocks.push([full, last]);
            children = level.num_blocks;
        }
        SparseTree {
            geometry,
            hasher,
            zero_blocks,
            changed: HashMap::new(),
        }
    }

    fn block(&self, level: usize, index: u64) -> &[u8] {
        if let Some(block) = self.changed.get(&(level, index)) {
            return block;
        }
        let last = index + 1 == self.geometry.levels()[level].num_blocks;
        &self.zero_blocks[level][last as usize]
    }

    /// Records that data block `block` holds `bytes` (zero-padded).
    fn set_data_block(&mut self, block: u64, bytes: &[u8]) {
        let mut padded = bytes.to_vec();
        padded.resize(self.geometry.block_size(), 0);
        let mut hash = self.hasher.hash_block(&padded);
        let mut child = block;
        for level in 0..self.geometry.num_levels() {
            let (_, offset) = self.geometry.hash_location(level, child);
            let index = child >> self.geometry.log_arity();
            let mut tree_block = self.block(level, index).to_vec();
            tree_block[offset..][..hash.as_bytes().len()].copy_from_slice(hash.as_bytes());
            hash = self.hasher.hash_block(&tree_block);
            self.changed.insert((level, index), tree_block);
            child = index;
        }
    }

    /// The root hash: of the top tree block, of the only data block
    /// (`data`) of a one-block file, or zeroes for an empty file.
    fn root_hash(&self, data: &[u8]) -> verityfs::Digest {
        let top = self.geometry.num_levels();
        if self.geometry.data_size() == 0 {
            let d = self.hasher.algorithm().digest_size();
            return verityfs::Digest::from_slice(&vec![0; d]).unwrap();
        }
        if top == 0 {
            let mut padded = data.to_vec();
            padded.resize(self.geometry.block_size(), 0);
            return self.hasher.hash_block(&padded);
        }
        self.hasher.hash_block(self.block(top - 1, 0))
    }

    /// Writes the tree blocks on the path of data block `block` at their
    /// place in `tree`.
    fn write_path(&self, tree: &File, block: u64) {
        let bs = self.geometry.block_size() as u64;
        for (level, info) in self.geometry.levels().iter().enumerate() {
            let index = self.geometry.block_index_in_level(level, block);
            let pos = (info.start_block + index) * bs;
            tree.write_all_at(self.block(level, index), pos).unwrap();
        }
    }

    /// The whole stored tree (for small files).
    fn stored(&self) -> Vec<u8> {
        let mut tree = Vec::new();
        for (level, info) in self.geometry.levels().iter().enumerate().rev() {
            for index in 0..info.num_blocks {
                tree.extend_from_slice(self.block(level, index));
            }
        }
        tree
    }
}

/// Where the sparse files have their non-zero blocks: the first and last
/// blocks, both sides of the last full level-0 group, and a few scattered.
fn marked_blocks(blocks: u64, arity: u64, rng: &mut Rng) -> Vec<u64> {
    let group_edge = (blocks - 1) / arity * arity;
    let mut marked = vec![0, 1, blocks - 1, group_edge, group_edge.saturating_sub(1)];
    marked.extend((0..6).map(|_| rng.u64(..blocks)));
    marked.sort_unstable();
    marked.dedup();
    marked.retain(|&b| b < blocks);
    marked
}

#[test]
fn sparse_tree_model_matches_the_tree_builder() {
    let mut rng = Rng::with_seed(11);
    for (alg, bs, size) in [
        (HashAlgorithm::Sha512, 1024, 70_000),
        (HashAlgorithm::Sha512, 1024, 4096 * 1024),
        (HashAlgorithm::Sha256, 1024, 33 * 1024 - 5),
        (HashAlgorithm::Sha256, 4096, 1),
        (HashAlgorithm::Sha256, 4096, 0),
    ] {
        let params = MerkleTreeParams::new(alg, bs, b"salty").unwrap();
        let mut model = SparseTree::new(&params, size);
        let mut data = vec![0u8; size as usize];
        if size > 0 {
            let blocks = size.div_ceil(bs);
            for block in marked_blocks(blocks, bs / alg.digest_size() as u64, &mut rng) {
                let range = (block * bs) as usize..(((block + 1) * bs).min(size)) as usize;
                data[range.clone()].copy_from_slice(&random_bytes(range.len(), rng.u64(..)));
                model.set_data_block(block, &data[range]);
            }
        }
        let (descriptor, tree) = build(&data, &params);
        assert!(model.stored() == tree, "{alg} {bs} {size}: stored tree");
        assert_eq!(
            model.root_hash(&data),
            *descriptor.root_hash(),
            "{alg} {bs} {size}: root hash"
        );
    }
}

/// A sparse file of `size` bytes with a tree of `levels` levels: reads of
/// its non-zero blocks and around them return the right bytes; a read
/// needing a tree block that was never written fails with `EIO`.
fn tall_tree(alg: HashAlgorithm, bs: u64, size: u64, levels: usize) {
    let params = MerkleTreeParams::new(alg, bs, b"tall").unwrap();
    let geometry = TreeGeometry::new(&params, size);
    assert_eq!(geometry.num_levels(), levels, "{alg} {bs} {size}");
    let dir = tempfile::tempdir().unwrap();
    let data_file = File::create(dir.path().join("data")).unwrap();
    data_file.set_len(size).unwrap();
    let tree_file = File::create(dir.path().join("tree")).unwrap();
    tree_file.set_len(geometry.tree_size()).unwrap();
    let mut model = SparseTree::new(&params, size);
    let mut rng = Rng::with_seed(size ^ bs);
    let blocks = size.div_ceil(bs);
    let marked = marked_blocks(blocks, bs / alg.digest_size() as u64, &mut rng);
    let mut contents = HashMap::new();
    for &block in &marked {
        let len = ((block + 1) * bs).min(size) - block * bs;
        let bytes = random_bytes(len as usize, rng.u64(..));
        data_file.write_all_at(&bytes, block * bs).unwrap();
        model.set_data_block(block, &bytes);
        contents.insert(block, bytes);
    }
    for &block in &marked {
        model.write_path(&tree_file, block);
    }
    let descriptor = Descriptor::new(params, size, model.root_hash(&[]));
    let what = format!("{alg}, {bs}-byte blocks, {size} bytes, {levels} levels");
    for (v, verifier) in verifiers().iter().enumerate() {
        let file = open_detached(verifier, dir.path(), &descriptor);
        for &block in &marked {
            let expected = &contents[&block];
            let mut buf = vec![0u8; bs as usize];
            let n = file.read_at(&mut buf, block * bs).unwrap();
            assert_eq!(
                &buf[..n],
                &expected[..],
                "{what}, verifier {v}, block {block}"
            );
            // A few bytes inside the block, which may run into the next
            // one (zero unless marked) or past the end of the file.
            let offset = block * bs + rng.u64(..bs);
            let n = file.read_at(&mut buf[..7], offset).unwrap_or_else(|e| {
                panic!("{what}, verifier {v}: 7 bytes at {offset}: {e}");
            });
            assert_eq!(n as u64, 7.min(size.saturating_sub(offset)), "{what}");
            let start = ((offset - block * bs) as usize).min(expected.len());
            let mut want = expected[start..].to_vec();
            let next = contents.get(&(block + 1));
            want.extend_from_slice(next.map_or(&[0; 7][..], |c| &c[..7.min(c.len())]));
            want.resize(7, 0);
            assert_eq!(&buf[..n], &want[..n], "{what}, verifier {v}, 7 at {offset}");
        }
        // Small trees have every level-0 block on a marked path.
        if geometry.levels()[0].num_blocks < 64 {
            continue;
        }
        let unwritten = (0..1000)
            .map(|_| rng.u64(..blocks))
            .find(|b| {
                let level0 = geometry.block_index_in_level(0, *b);
                marked
                    .iter()
                    .all(|&m| geometry.block_index_in_level(0, m) != level0)
            })
            .expect("a data block whose level-0 tree block was not written");
        let err = file.read_at(&mut [0; 10], unwritten * bs).unwrap_err();
        assert_eq!(err.errno(), libc::EIO, "{what}: block {unwritten}: {err}");
    }
}

#[test]
fn trees_of_every_height_up_to_eight_levels() {
    // 1 KiB SHA-512 blocks hold 16 hashes: a tree of L levels covers more
    // than 16^(L-1) blocks.
    let (alg, bs) = (HashAlgorithm::Sha512, 1024);
    for levels in 1..=8u32 {
        let blocks = 16u64.pow(levels - 1) + 1;
        tall_tree(alg, bs, blocks * bs - 100, levels as usize);
    }
    // Exactly 16^7 blocks is still 7 levels; one byte more is 8.
    tall_tree(alg, bs, 16u64.pow(7) * bs, 7);
    tall_tree(alg, bs, 16u64.pow(7) * bs + 1, 8);
    tall_tree(alg, bs, 16u64.pow(8) * bs, 8);
    tall_tree(HashAlgorithm::Sha256, 4096, 128u64.pow(3) * 4096 + 4095, 4);
    tall_tree(HashAlgorithm::Sha256, 65536, 2048u64.pow(2) * 65536 + 1, 3);
}
