//! The hash algorithms fs-verity supports, and salted block hashing.
//!
//! Every data and tree block is hashed as `H(padded_salt || block)`, where
//! the salt is zero-padded to a multiple of the hash's internal block size
//! (64 bytes for SHA-256, 128 for SHA-512), so the state after the salt can be
//! computed once and cloned for each block, as the kernel does in
//! `fsverity_prepare_hash_state()`.

use std::fmt;

use sha2::Digest as _;

use crate::error::{Error, Result};
use crate::sha256_mb::Sha256Prefix;

/// The largest digest of any supported algorithm (SHA-512), in bytes.
pub const MAX_DIGEST_SIZE: usize = 64;

/// A hash algorithm as numbered in `include/uapi/linux/fsverity.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HashAlgorithm {
    /// `FS_VERITY_HASH_ALG_SHA256` (1), the default.
    #[default]
    Sha256,
    /// `FS_VERITY_HASH_ALG_SHA512` (2).
    Sha512,
}

impl HashAlgorithm {
    /// All supported algorithms, in numeric order.
    pub const ALL: [HashAlgorithm; 2] = [HashAlgorithm::Sha256, HashAlgorithm::Sha512];

    /// The algorithm with the kernel's number `id`.
    pub fn from_id(id: u32) -> Result<Self> {
        match id {
            1 => Ok(HashAlgorithm::Sha256),
            2 => Ok(HashAlgorithm::Sha512),
            _ => Err(Error::UnknownHashAlgorithm(id)),
        }
    }

    /// The algorithm named `name` ("sha256" or "sha512"), as fsverity-utils
    /// names them.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|alg| alg.name() == name)
    }

    /// The kernel's number for the algorithm.
    pub const fn id(self) -> u8 {
        match self {
            HashAlgorithm::Sha256 => 1,
            HashAlgorithm::Sha512 => 2,
        }
    }

    /// The name fsverity-utils prints before a digest.
    pub const fn name(self) -> &'static str {
        match self {
            HashAlgorithm::Sha256 => "sha256",
            HashAlgorithm::Sha512 => "sha512",
        }
    }

    /// Digest size in bytes (32 or 64).
    pub const fn digest_size(self) -> usize {
        match self {
            HashAlgorithm::Sha256 => 32,
            HashAlgorithm::Sha512 => 64,
        }
    }

    /// Input block size of the compression function (64 or 128): the salt
    /// is zero-padded to a multiple of this.
    pub(crate) const fn internal_block_size(self) -> usize {
        match self {
            HashAlgorithm::Sha256 => 64,
            HashAlgorithm::Sha512 => 128,
        }
    }

    /// The plain (unsalted) hash of `data`, as used for the file digest.
    pub fn hash(self, data: &[u8]) -> Digest {
        let mut state = HashState::new(self);
        state.update(data);
        state.finish()
    }
}

impl fmt::Display for HashAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A digest of one of the supported algorithms.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    len: u8,
    bytes: [u8; MAX_DIGEST_SIZE],
}

impl Digest {
    /// A digest holding `bytes`; `None` unless it is 32 or 64 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 32 && bytes.len() != MAX_DIGEST_SIZE {
            return None;
        }
        let mut d = Digest::zero(bytes.len());
        d.bytes[..bytes.len()].copy_from_slice(bytes);
        Some(d)
    }

    /// The all-zero digest of `len` bytes (the root hash of an empty file).
    pub(crate) fn zero(len: usize) -> Self {
        Digest {
            len: len as u8,
            bytes: [0; MAX_DIGEST_SIZE],
        }
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Lowercase hexadecimal, as fsverity-utils prints it.
    pub fn to_hex(&self) -> String {
        to_hex(self.as_bytes())
    }
}

impl AsRef<[u8]> for Digest {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Lowercase hexadecimal of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(feature = "openssl")]
type Sha512Engine = openssl::sha::Sha512;
#[cfg(not(feature = "openssl"))]
type Sha512Engine = sha2::Sha512;

/// An incremental hash of either algorithm.
#[derive(Clone)]
enum HashState {
    Sha256(sha2::Sha256),
    Sha512(Sha512Engine),
}

impl HashState {
    fn new(alg: HashAlgorithm) -> Self {
        match alg {
            HashAlgorithm::Sha256 => HashState::Sha256(sha2::Sha256::new()),
            HashAlgorithm::Sha512 => HashState::Sha512(Sha512Engine::new()),
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            HashState::Sha256(h) => h.update(data),
            HashState::Sha512(h) => h.update(data),
        }
    }

    fn finish(self) -> Digest {
        let mut d = Digest::zero(32);
        match self {
            HashState::Sha256(h) => d.bytes[..32].copy_from_slice(&h.finalize()),
            HashState::Sha512(h) => {
                d.len = 64;
                d.bytes.copy_from_slice(&finish_sha512(h));
            }
        }
        d
    }
}

#[cfg(feature = "openssl")]
fn finish_sha512(h: Sha512Engine) -> [u8; 64] {
    h.finish()
}

#[cfg(not(feature = "openssl"))]
fn finish_sha512(h: Sha512Engine) -> [u8; 64] {
    h.finalize().into()
}

/// Hashes Merkle tree and data blocks with a salt, starting each block from
/// the state precomputed after the padded salt.
#[derive(Clone)]
pub struct SaltedHasher {
    alg: HashAlgorithm,
    salted: HashState,
    /// For SHA-256: the multi-buffer hasher that runs several blocks at
    /// once (interleaved SHA-NI where the CPU has it).
    multi: Option<Sha256Prefix>,
}

impl SaltedHasher {
    /// A hasher for `alg` and `salt` (at most 32 bytes; an empty salt means
    /// no salt at all, not a block of zeroes).
    pub(crate) fn new(alg: HashAlgorithm, salt: &[u8]) -> Self {
        let mut salted = HashState::new(alg);
        if !salt.is_empty() {
            let padded_len = salt.len().next_multiple_of(alg.internal_block_size());
            let mut padded = [0u8; 128];
            padded[..salt.len()].copy_from_slice(salt);
            salted.update(&padded[..padded_len]);
        }
        let multi = (alg == HashAlgorithm::Sha256).then(|| Sha256Prefix::new(salt));
        SaltedHasher { alg, salted, multi }
    }

    /// The algorithm this hasher uses.
    pub fn algorithm(&self) -> HashAlgorithm {
        self.alg
    }

    /// The salted hash of one block.
    pub fn hash_block(&self, block: &[u8]) -> Digest {
        let mut state = self.salted.clone();
        state.update(block);
        state.finish()
    }

    /// Hashes each `block_size` piece of `blocks` (whose length must be a
    /// multiple of `block_size`) into consecutive digests in `out`.
    /// SHA-256 blocks are hashed several at a time.
    pub fn hash_blocks(&self, blocks: &[u8], block_size: usize, out: &mut [u8]) {
        let d = self.alg.digest_size();
        debug_assert_eq!(blocks.len() % block_size, 0);
        debug_assert_eq!(out.len(), blocks.len() / block_size * d);
        if let Some(multi) = self.multi.as_ref().filter(|_| block_size % 64 == 0) {
            return multi.hash_blocks(blocks, block_size, out);
        }
        for (block, out) in blocks.chunks_exact(block_size).zip(out.chunks_exact_mut(d)) {
            out.copy_from_slice(self.hash_block(block).as_bytes());
        }
    }
}

impl SaltedHasher {
    /// Hashes the data blocks of `data` into consecutive digests in `out`
    /// (`data.len().div_ceil(block_size)` of them), a partial last block
    /// zero-padded to `block_size` as fs-verity pads it; large inputs on
    /// all cores.
    pub(crate) fn hash_data_blocks(&self, data: &[u8], block_size: usize, out: &mut [u8]) {
        let d = self.alg.digest_size();
        let full = data.len() / block_size * block_size;
        let (full_out, tail_out) = out.split_at_mut(full / block_size * d);
        self.par_hash_blocks(&data[..full], block_size, full_out);
        if full < data.len() {
            let tail = self.hash_padded_block(&data[full..], block_size);
            tail_out.copy_from_slice(tail.as_bytes());
        }
    }

    /// The salted hash of `partial` zero-padded to `block_size` bytes,
    /// hashing the zeroes from a constant instead of copying the block.
    fn hash_padded_block(&self, partial: &[u8], block_size: usize) -> Digest {
        static ZEROES: [u8; 4096] = [0; 4096];
        let mut state = self.salted.clone();
        state.update(partial);
        let mut padding = block_size - partial.len();
        while padding > 0 {
            let n = padding.min(ZEROES.len());
            state.update(&ZEROES[..n]);
            padding -= n;
        }
        state.finish()
    }

    /// Like [`SaltedHasher::hash_blocks`], spread over rayon's thread pool
    /// (one thread per core) in pieces of at least `MIN_PARALLEL_BYTES`.
    pub(crate) fn par_hash_blocks(&self, blocks: &[u8], block_size: usize, out: &mut [u8]) {
        use rayon::prelude::*;
        let d = self.alg.digest_size();
        let per_task = (MIN_PARALLEL_BYTES / block_size).max(1);
        if blocks.len() <= per_task * block_size || rayon::current_num_threads() == 1 {
            return self.hash_blocks(blocks, block_size, out);
        }
        blocks
            .par_chunks(per_task * block_size)
            .zip(out.par_chunks_mut(per_task * d))
            .for_each(|(blocks, out)| self.hash_blocks(blocks, block_size, out));
    }
}

/// Smallest amount of data worth handing to another thread (hashing it takes
/// about 100 us, far more than the hand-off).
const MIN_PARALLEL_BYTES: usize = 128 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_hashes_match_known_values() {
        assert_eq!(
            HashAlgorithm::Sha256.hash(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(HashAlgorithm::Sha512
            .hash(b"abc")
            .to_hex()
            .starts_with("ddaf35a193617aba"));
    }

    #[test]
    fn salt_is_padded_to_the_internal_block_size() {
        for alg in HashAlgorithm::ALL {
            let salt = b"abcd";
            let mut input = vec![0u8; alg.internal_block_size()];
            input[..4].copy_from_slice(salt);
            input.extend_from_slice(b"block");
            assert_eq!(
                SaltedHasher::new(alg, salt).hash_block(b"block"),
                alg.hash(&input)
            );
        }
    }

    #[test]
    fn data_blocks_are_zero_padded() {
        for alg in HashAlgorithm::ALL {
            let h = SaltedHasher::new(alg, b"salt");
            let d = alg.digest_size();
            for len in [1usize, 1024, 5000, 9000, 12288] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
                let mut out = vec![0u8; len.div_ceil(4096) * d];
                h.hash_data_blocks(&data, 4096, &mut out);
                for (block, hash) in data.chunks(4096).zip(out.chunks(d)) {
                    let mut padded = block.to_vec();
                    padded.resize(4096, 0);
                    assert_eq!(hash, h.hash_block(&padded).as_bytes(), "{alg} {len}");
                }
            }
        }
    }

    #[test]
    fn empty_salt_means_no_salt() {
        let h = SaltedHasher::new(HashAlgorithm::Sha256, b"");
        assert_eq!(h.hash_block(b"x"), HashAlgorithm::Sha256.hash(b"x"));
    }

    #[test]
    fn names_and_ids_round_trip() {
        for alg in HashAlgorithm::ALL {
            assert_eq!(HashAlgorithm::from_name(alg.name()), Some(alg));
            assert_eq!(HashAlgorithm::from_id(alg.id() as u32).unwrap(), alg);
        }
        assert!(HashAlgorithm::from_id(0).is_err());
        assert!(HashAlgorithm::from_id(3).is_err());
    }
}
