//! Helpers shared by the integration tests: test data, enabling and opening
//! verity files, and expected digests.

#![allow(dead_code)] // each test crate uses a different subset

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use verityfs::{
    build_merkle_tree, enable_verity, Descriptor, Digest, EnableRequest, MerkleTreeParams,
    Verifier, VerityFile,
};

/// `len` random bytes from a generator seeded with `seed`.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0; len];
    fastrand::Rng::with_seed(seed).fill(&mut bytes);
    bytes
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

/// Changes byte `pos` of `path` (XOR 0x40); a second call restores it.
pub fn flip(path: &Path, pos: u64) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, pos).unwrap();
    file.write_all_at(&[b[0] ^ 0x40], pos).unwrap();
}
