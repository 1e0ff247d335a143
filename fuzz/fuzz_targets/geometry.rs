//! Tree parameters and geometry from arbitrary numbers, up to
//! `data_size = u64::MAX`: `MerkleTreeParams::new` accepts exactly what
//! libfsverity accepts; `TreeGeometry` matches a 128-bit reference model,
//! allocates only per level (never in proportion to the size), and every
//! `hash_location` lies inside its level.
//!
//! Input (24 bytes, little endian; missing bytes are zero):
//! `[alg id, log2 block size, salt length, size shift]`, `data_size: u64`,
//! `data block pick: u64`, `raw block size: u32` (used instead of the log2
//! when the log2 byte is 0xff). The size is `data_size >> (shift % 64)`, so
//! small and huge sizes are equally easy to reach.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use verityfs::geometry::MAX_KERNEL_LEVELS;
use verityfs::{HashAlgorithm, MerkleTreeParams, TreeGeometry};

fuzz_target!(|input: &[u8]| {
    let mut b = [0u8; 24];
    let n = input.len().min(24);
    b[..n].copy_from_slice(&input[..n]);
    let Ok(alg) = HashAlgorithm::from_id(b[0].into()) else {
        assert!(b[0] == 0 || b[0] > 2);
        return;
    };
    let block_size: u64 = if b[1] == 0xff {
        common::le32(&b, 20).into()
    } else {
        1u64.checked_shl(b[1].into()).unwrap_or(0)
    };
    let salt = vec![0x5a; usize::from(b[2] % 48)];
    let data_size = common::le64(&b, 4) >> (b[3] % 64);
    let pick = common::le64(&b, 12);

    let digest = common::digest_size(alg) as u64;
    let valid = block_size.is_power_of_two()
        && block_size <= 1 << 31
        && block_size >= 2 * digest
        && salt.len() <= 32;
    let Ok(params) = MerkleTreeParams::new(alg, block_size, &salt) else {
        assert!(
            !valid,
            "valid parameters refused: {block_size} {}",
            salt.len()
        );
        return;
    };
    assert!(
        valid,
        "invalid parameters accepted: {block_size} {}",
        salt.len()
    );
    assert_eq!(params.block_size() as u64, block_size);
    assert_eq!(1u64 << params.log_arity(), block_size / digest);
    assert_eq!(
        params.check_kernel_limits().is_ok(),
        (1024..=65536).contains(&block_size)
    );

    let (geometry, allocated) = common::allocated_by(|| TreeGeometry::new(&params, data_size));
    assert!(allocated <= 4096, "geometry allocated {allocated} bytes");

    // The reference: levels by repeated division, in 128-bit arithmetic.
    let (bs, arity) = (block_size as u128, (block_size / digest) as u128);
    let data_blocks = (data_size as u128).div_ceil(bs);
    let mut want = Vec::new();
    let mut blocks = data_blocks;
    while blocks > 1 {
        blocks = blocks.div_ceil(arity);
        want.push(blocks);
    }
    let got: Vec<u128> = geometry
        .levels()
        .iter()
        .map(|l| l.num_blocks.into())
        .collect();
    assert_eq!(got, want);
    assert_eq!(u128::from(geometry.data_blocks()), data_blocks);
    assert_eq!(geometry.data_size(), data_size);
    assert_eq!(geometry.block_size() as u64, block_size);
    let tree_blocks: u128 = want.iter().sum();
    assert_eq!(u128::from(geometry.tree_blocks()), tree_blocks);
    assert_eq!(
        u128::from(geometry.tree_size()),
        tree_blocks * bs,
        "tree size wrapped"
    );
    assert_eq!(
        geometry.check_kernel_limits().is_ok(),
        want.len() <= MAX_KERNEL_LEVELS
    );
    // Stored top level first, contiguously.
    let mut next = 0;
    for level in geometry.levels().iter().rev() {
        assert_eq!(level.start_block, next);
        next += level.num_blocks;
    }

    // The hash chain of one data block, level by level.
    if data_blocks == 0 {
        return;
    }
    let data_block = pick % geometry.data_blocks();
    let mut index = data_block;
    for (level_no, level) in geometry.levels().iter().enumerate() {
        let (tree_block, offset) = geometry.hash_location(level_no, index);
        assert!(tree_block >= level.start_block);
        assert!(tree_block - level.start_block < level.num_blocks);
        assert_eq!(offset as u64 % digest, 0);
        assert!(offset as u64 + digest <= block_size);
        assert_eq!(
            (tree_block - level.start_block) * (block_size / digest) + offset as u64 / digest,
            index
        );
        index >>= geometry.log_arity();
        assert_eq!(tree_block - level.start_block, index);
        assert_eq!(geometry.block_index_in_level(level_no, data_block), index);
    }
    assert_eq!(index, 0, "the top level has more than one block");
});
