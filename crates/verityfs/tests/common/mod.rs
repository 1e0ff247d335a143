//! Helpers shared by the integration tests: test data, enabling and opening
//! verity files, and expected digests.

#![allow(dead_code)] // each test crate uses a different subset

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use verityfs::{
    build_merkle_tree, enable_verity, Descriptor, Digest, EnableRequest, MerkleTreeParams,
    Verifier, VerityFile,
};

/// `size` bytes of deterministic, non-repeating data.
pub fn pattern(size: usize, seed: u32) -> Vec<u8> {
    (0..size as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// Creates `dir/name` holding `data`.
pub fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let path = dir.join(name);
    File::create(&path).unwrap().write_all(data).unwrap();
    path
}

/// Opens `path` for reading and writing.
pub fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// Enables verity on `path` without a signature.
pub fn enable(path: &Path, params: MerkleTreeParams) -> verityfs::Result<Descriptor> {
    let request = EnableRequest {
        params,
        signature: None,
        progress: &mut |_| true,
    };
    enable_verity(&open_rw(path), request)
}

/// Opens the verity file `path`, which must open.
pub fn open(verifier: &Arc<Verifier>, path: &Path) -> VerityFile {
    VerityFile::open(verifier, File::open(path).unwrap(), path).unwrap()
}

/// The descriptor and stored Merkle tree of `data` with `params`.
pub fn build(data: &[u8], params: &MerkleTreeParams) -> (Descriptor, Vec<u8>) {
    let size = data.len() as u64;
    build_merkle_tree(params, size, data, Vec::new(), &mut |_| Ok(())).unwrap()
}

/// The fs-verity digest of `data` with `params`.
pub fn expected_digest(data: &[u8], params: &MerkleTreeParams) -> Digest {
    build(data, params).0.file_digest()
}

/// A small seeded random number generator (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
