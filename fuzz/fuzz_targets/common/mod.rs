//! Shared by the fuzz targets: an allocation counter (to catch allocations
//! proportional to untrusted sizes) and a reference implementation of
//! fs-verity hashing written straight from the kernel's documentation
//! (`Documentation/filesystems/fsverity.rst`), on the plain `sha2` crate
//! (the library uses its own multi-buffer SHA-256 and OpenSSL's SHA-512, so
//! this is a real second implementation).

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::Digest as _;
use verityfs::HashAlgorithm;

/// The system allocator, counting the bytes requested.
pub struct CountingAlloc;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs `f` and returns its result and the bytes it allocated (all threads
/// count, so use it around single-threaded code only).
pub fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATED.load(Ordering::Relaxed);
    let out = f();
    (out, ALLOCATED.load(Ordering::Relaxed) - before)
}

/// Reads a little-endian u32 at `at`.
pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Reads a little-endian u64 at `at`.
pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Digest size of `alg` in bytes.
pub fn digest_size(alg: HashAlgorithm) -> usize {
    match alg {
        HashAlgorithm::Sha256 => 32,
        HashAlgorithm::Sha512 => 64,
    }
}

/// The plain hash of `data`.
pub fn hash(alg: HashAlgorithm, data: &[u8]) -> Vec<u8> {
    match alg {
        HashAlgorithm::Sha256 => sha2::Sha256::digest(data).to_vec(),
        HashAlgorithm::Sha512 => sha2::Sha512::digest(data).to_vec(),
    }
}

/// `H(salt zero-padded to the hash's input block size || block)`; an empty
/// salt is no salt at all.
pub fn salted_hash(alg: HashAlgorithm, salt: &[u8], block: &[u8]) -> Vec<u8> {
    fn run<H: sha2::Digest>(padded_salt: &[u8], block: &[u8]) -> Vec<u8> {
        let mut h = H::new();
        h.update(padded_salt);
        h.update(block);
        h.finalize().to_vec()
    }
    let unit = match alg {
        HashAlgorithm::Sha256 => 64,
        HashAlgorithm::Sha512 => 128,
    };
    let mut padded = [0u8; 128];
    padded[..salt.len()].copy_from_slice(salt);
    let padded = &padded[..salt.len().div_ceil(unit) * unit];
    match alg {
        HashAlgorithm::Sha256 => run::<sha2::Sha256>(padded, block),
        HashAlgorithm::Sha512 => run::<sha2::Sha512>(padded, block),
    }
}

/// The salted hashes of the `block_size` blocks of `bytes`, the last one
/// zero-padded, one after another.
fn hash_blocks(alg: HashAlgorithm, block_size: usize, salt: &[u8], bytes: &[u8]) -> Vec<u8> {
    let mut hashes = Vec::new();
    let mut block = vec![0u8; block_size];
    for chunk in bytes.chunks(block_size) {
        block[..chunk.len()].copy_from_slice(chunk);
        block[chunk.len()..].fill(0);
        hashes.extend_from_slice(&salted_hash(alg, salt, &block));
    }
    hashes
}

/// The straightforward Merkle tree: hash every (zero-padded) data block,
/// pack the hashes into zero-padded blocks, hash those, and so on until one
/// block is left. Returns the root hash and the stored tree (top level
/// first). An empty file has an all-zero root and no tree.
pub fn merkle_tree(
    alg: HashAlgorithm,
    block_size: usize,
    salt: &[u8],
    data: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    if data.is_empty() {
        return (vec![0; digest_size(alg)], Vec::new());
    }
    let mut hashes = hash_blocks(alg, block_size, salt, data);
    let mut levels: Vec<Vec<u8>> = Vec::new();
    while hashes.len() > digest_size(alg) {
        let mut level = hashes;
        level.resize(level.len().div_ceil(block_size) * block_size, 0);
        hashes = hash_blocks(alg, block_size, salt, &level);
        levels.push(level);
    }
    let mut tree = Vec::new();
    for level in levels.iter().rev() {
        tree.extend_from_slice(level);
    }
    (hashes, tree)
}

/// `struct fsverity_descriptor` (256 bytes, `sig_size` 0), built by hand.
pub fn descriptor_bytes(
    alg: HashAlgorithm,
    log_block_size: u8,
    salt: &[u8],
    data_size: u64,
    root: &[u8],
) -> Vec<u8> {
    let mut d = vec![0u8; 256];
    d[0] = 1;
    d[1] = match alg {
        HashAlgorithm::Sha256 => 1,
        HashAlgorithm::Sha512 => 2,
    };
    d[2] = log_block_size;
    d[3] = salt.len() as u8;
    d[8..16].copy_from_slice(&data_size.to_le_bytes());
    d[16..16 + root.len()].copy_from_slice(root);
    d[80..80 + salt.len()].copy_from_slice(salt);
    d
}
