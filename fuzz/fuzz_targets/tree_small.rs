//! Differential: `build_merkle_tree` against the straightforward Merkle tree
//! in `common` (hash each block, pack the hashes, repeat), for small files
//! with every block size from 64 bytes to 64 KiB (so trees up to ten levels
//! tall), both algorithms, and any salt. The root hash, the stored tree
//! byte for byte, its size (the geometry's `tree_size`) and the file digest
//! must all agree.
//!
//! Input: `[alg (bit 0), log2 block size - 6 (mod 11), salt length (mod 33),
//! mode, read size]`, then the salt, then the data (at most 64 KiB). Mode 0
//! builds over exactly the data; mode 1 declares more bytes than the reader
//! has (must fail, not panic or hang); mode 2 declares fewer (the bytes past
//! the size must be ignored). The reader returns at most
//! `read size * 97 + 1` bytes per `read` call.

#![no_main]

mod common;

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use verityfs::{build_merkle_tree, HashAlgorithm, MerkleTreeParams, TreeGeometry};

const MAX_DATA: usize = 64 * 1024;

/// Hands out at most `limit` bytes per read.
struct Dribble<'a> {
    data: &'a [u8],
    limit: usize,
}

impl Read for Dribble<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.limit).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((head, rest)) = input.split_first_chunk::<5>() else {
        return;
    };
    let alg = if head[0] & 1 == 0 {
        HashAlgorithm::Sha256
    } else {
        HashAlgorithm::Sha512
    };
    let log_block_size = 6 + head[1] % 11;
    let block_size = 1usize << log_block_size;
    let salt_len = usize::from(head[2] % 33).min(rest.len());
    let (salt, data) = rest.split_at(salt_len);
    let data = &data[..data.len().min(MAX_DATA)];
    let mode = head[3] % 3;
    let limit = usize::from(head[4]) * 97 + 1;

    let Ok(params) = MerkleTreeParams::new(alg, block_size as u64, salt) else {
        assert!(alg == HashAlgorithm::Sha512 && block_size == 64);
        return;
    };
    let (data_size, covered) = match mode {
        0 => (data.len(), data),
        1 => (data.len() + 1 + usize::from(head[4]), data),
        _ => {
            let size = data.len() - data.len().min(usize::from(head[4]) * 3);
            (size, &data[..size])
        }
    };
    let reader = Dribble { data, limit };
    let result = build_merkle_tree(&params, data_size as u64, reader, Vec::new(), &mut |_| {
        Ok(())
    });
    if mode == 1 {
        assert!(result.is_err(), "built a tree from a short read");
        return;
    }
    let (descriptor, tree) = result.expect("build failed");

    let geometry = TreeGeometry::new(&params, data_size as u64);
    assert_eq!(tree.len() as u64, geometry.tree_size());
    let (root, want_tree) = common::merkle_tree(alg, block_size, salt, covered);
    assert_eq!(
        descriptor.root_hash().as_bytes(),
        &root[..],
        "root hash differs"
    );
    assert!(tree == want_tree, "stored tree differs");
    assert_eq!(descriptor.data_size(), data_size as u64);
    assert_eq!(descriptor.params(), &params);
    let want_descriptor =
        common::descriptor_bytes(alg, log_block_size, salt, data_size as u64, &root);
    assert_eq!(descriptor.to_bytes()[..], want_descriptor[..]);
    assert_eq!(
        descriptor.file_digest().as_bytes(),
        common::hash(alg, &want_descriptor)
    );
});
