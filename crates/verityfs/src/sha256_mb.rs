//! Multi-buffer SHA-256 for fs-verity's salted block hashes.
//!
//! fs-verity hashes every data and tree block as
//! `SHA-256(padded_salt || block)`. Blocks are independent, which matters
//! because one SHA-256 is a single long dependency chain: each
//! `sha256rnds2` needs the result of the one before, so hashing one message
//! at a time runs at the instruction's latency and leaves the SHA unit idle
//! most of the time. x86 cores pipeline the instruction (the AMD Zen 5 this
//! was measured on starts one every 2 cycles with a latency of about 4; Zen 4
//! is reported to keep up to four in flight), so this module hashes 2 or 4
//! blocks at once with their instructions interleaved, which fills those
//! slots.
//!
//! Two properties of fs-verity's messages make the rest cheap:
//! - The salt is zero-padded to a multiple of 64 bytes, the compression
//!   function's block, so the state after it is computed once
//!   (a [`Sha256Prefix`]) and every block starts from there.
//! - Blocks are a multiple of 64 bytes too, so every message ends exactly on
//!   a compression block and its padding is a whole extra block of its own:
//!   `0x80`, zeroes, and the message length in bits. That block is the same
//!   for every block of a given size, so its message schedule is computed
//!   once per call (`PaddingSchedule`) and the SHA-NI code runs its 64
//!   rounds without any message expansion.
//!
//! This module and `signature` are the only ones where the crate allows
//! `unsafe` code. Here it is the SHA-NI functions
//! (`#[target_feature]`, hence `unsafe fn` under the crate's minimum Rust
//! version 1.85) and the one call into them, which is reached only through a
//! `ShaNi` token that exists only if the CPU was seen to have the
//! features. The SIMD code reads and writes memory only through safe slices.
//!
//! [`SaltedHasher`](crate::SaltedHasher) hashes SHA-256 blocks with it; it
//! is public (hidden from the documentation) only for the benchmark in
//! `benches/sha256_mb.rs`, which compares its backends.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sha2::block_api::compress256;
use sha2::{Digest as _, Sha256};

/// Size of a SHA-256 digest in bytes.
pub const DIGEST_SIZE: usize = 32;

/// Size of the SHA-256 compression function's input block in bytes.
const CHUNK: usize = 64;

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const IV: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// SHA-256's round constants (FIPS 180-4, 4.2.2).
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// Which code [`Sha256Prefix::hash_blocks`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The `sha2` crate, one block after another. Runs everywhere (and uses
    /// SHA-NI itself where the CPU has it).
    Portable,
    /// SHA-NI, one block at a time.
    ShaNi1,
    /// SHA-NI, two blocks interleaved.
    ShaNi2,
    /// SHA-NI, four blocks interleaved (two for a remainder of 2 or 3).
    ShaNi4,
}

impl Backend {
    /// Every backend, slowest first.
    pub const ALL: [Backend; 4] = [
        Backend::Portable,
        Backend::ShaNi1,
        Backend::ShaNi2,
        Backend::ShaNi4,
    ];

    /// The fastest backend this CPU runs, timed the first time it is asked
    /// for (about a millisecond), as the kernel picks its RAID and XOR
    /// routines. Which one wins depends on the core, not only on its
    /// features: four lanes beat two by 5-10% on the Zen 5 this module was
    /// written on, while on an Ice Lake Xeon four lanes are 15-25% slower
    /// than one or two (the interleaved state no longer fits the registers,
    /// and that core's SHA unit gains little from more in flight).
    pub fn best() -> Backend {
        static BEST: OnceLock<Backend> = OnceLock::new();
        *BEST.get_or_init(|| match ShaNi::detect() {
            // Widest first: where a coarse clock times them all alike,
            // the tie keeps four lanes.
            Some(_) => fastest(&[Backend::ShaNi4, Backend::ShaNi2, Backend::ShaNi1]),
            None => Backend::Portable,
        })
    }

    /// How many blocks the SHA-NI code may hash at once; 0 for `Portable`.
    fn max_lanes(self) -> usize {
        match self {
            Backend::Portable => 0,
            Backend::ShaNi1 => 1,
            Backend::ShaNi2 => 2,
            Backend::ShaNi4 => 4,
        }
    }
}

/// The backend among `candidates` (all supported) that hashed the same
/// 16 blocks of 4 KiB fastest, each timed in several rounds taken in turn
/// and judged by its best round: the one least disturbed by other work.
/// A tie goes to the earlier one.
fn fastest(candidates: &[Backend]) -> Backend {
    const BLOCKS: usize = 16;
    const ROUNDS: usize = 5;
    let blocks = vec![0x5a; BLOCKS * 4096];
    let mut out = [0; BLOCKS * DIGEST_SIZE];
    let prefixes: Vec<Sha256Prefix> = candidates
        .iter()
        .filter_map(|&b| Sha256Prefix::with_backend(b"", b))
        .collect();
    let mut best = vec![Duration::MAX; prefixes.len()];
    for _ in 0..ROUNDS {
        for (prefix, best) in prefixes.iter().zip(&mut best) {
            let start = Instant::now();
            prefix.hash_blocks(&blocks, 4096, &mut out);
            *best = (*best).min(start.elapsed());
        }
    }
    let fastest = (0..prefixes.len()).min_by_key(|&i| best[i]);
    fastest.map_or(Backend::Portable, |i| prefixes[i].backend)
}

/// The SHA-256 state after a zero-padded salt, from which every block's
/// hash starts.
#[derive(Clone, Debug)]
pub struct Sha256Prefix {
    /// Chaining value after the padded salt (the IV if there is no salt).
    state: [u32; 8],
    /// The same state as a `sha2` hasher, for the portable backend.
    salted: Sha256,
    /// Length of the padded salt in bytes: 0 or a multiple of 64.
    prefix_len: u64,
    backend: Backend,
    /// Present if and only if `backend` is one of the SHA-NI ones.
    sha_ni: Option<ShaNi>,
}

impl Sha256Prefix {
    /// The state after `salt` zero-padded to a multiple of 64 bytes (an
    /// empty salt means no salt at all), hashing with the fastest backend
    /// this CPU supports.
    pub(crate) fn new(salt: &[u8]) -> Self {
        Self::with_backend(salt, Backend::best()).expect("the best backend is supported")
    }

    /// Like [`Sha256Prefix::new`] with an explicit backend; `None` if this
    /// CPU cannot run it.
    pub fn with_backend(salt: &[u8], backend: Backend) -> Option<Self> {
        let sha_ni = match backend {
            Backend::Portable => None,
            _ => Some(ShaNi::detect()?),
        };
        let padded = padded_salt(salt);
        let mut state = IV;
        for chunk in padded.chunks_exact(CHUNK) {
            compress256(&mut state, core::slice::from_ref(as_chunk(chunk)));
        }
        Some(Sha256Prefix {
            state,
            salted: Sha256::new_with_prefix(&padded),
            prefix_len: padded.len() as u64,
            backend,
            sha_ni,
        })
    }

    /// Hashes each `block_size` piece of `blocks` as
    /// `SHA-256(padded_salt || piece)`, writing the 32-byte digests one after
    /// another into `out`.
    ///
    /// # Panics
    ///
    /// If `block_size` is not a positive multiple of 64, `blocks.len()` not a
    /// multiple of `block_size`, or `out.len()` not 32 bytes per block.
    pub fn hash_blocks(&self, blocks: &[u8], block_size: usize, out: &mut [u8]) {
        assert!(
            block_size > 0 && block_size % CHUNK == 0,
            "block size {block_size} is not a positive multiple of 64"
        );
        assert_eq!(blocks.len() % block_size, 0, "partial block");
        assert_eq!(
            out.len(),
            blocks.len() / block_size * DIGEST_SIZE,
            "wrong output size"
        );
        match self.sha_ni {
            Some(cpu) => {
                let padding = padding_block(self.prefix_len + block_size as u64);
                let schedule = PaddingSchedule::new(&padding);
                let job = Job {
                    state: &self.state,
                    padding: &schedule,
                    blocks,
                    block_size,
                };
                cpu.hash_blocks(self.backend.max_lanes(), job, out);
            }
            None => self.hash_blocks_portable(blocks, block_size, out),
        }
    }

    /// [`Sha256Prefix::hash_blocks`] with the `sha2` crate, one block at a
    /// time (as `SaltedHasher` does without this module).
    fn hash_blocks_portable(&self, blocks: &[u8], block_size: usize, out: &mut [u8]) {
        let blocks = blocks.chunks_exact(block_size);
        for (block, digest) in blocks.zip(out.chunks_exact_mut(DIGEST_SIZE)) {
            let mut hasher = self.salted.clone();
            hasher.update(block);
            digest.copy_from_slice(&hasher.finalize());
        }
    }
}

/// `salt` zero-padded to a multiple of 64 bytes; empty if `salt` is.
fn padded_salt(salt: &[u8]) -> Vec<u8> {
    let mut padded = salt.to_vec();
    padded.resize(salt.len().next_multiple_of(CHUNK), 0);
    padded
}

/// The 64-byte `chunk` as an array reference.
fn as_chunk(chunk: &[u8]) -> &[u8; CHUNK] {
    chunk.try_into().expect("chunks_exact yields 64 bytes")
}

/// The final compression block of a message of `message_len` bytes, a
/// multiple of 64: since the message fills its last block, the padding (a 1
/// bit, zeroes, then the length in bits as a 64-bit big-endian number) is a
/// block of its own, and the same for every block hashed in one call.
fn padding_block(message_len: u64) -> [u8; CHUNK] {
    debug_assert_eq!(message_len % CHUNK as u64, 0);
    let mut block = [0u8; CHUNK];
    block[0] = 0x80;
    block[CHUNK - 8..].copy_from_slice(&(message_len * 8).to_be_bytes());
    block
}

/// The padding block's 64 message schedule words with the round constants
/// added (`W[t] + K[t]`): exactly what each pair of `sha256rnds2` takes, so
/// compressing the padding block needs no message expansion at all.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PaddingSchedule([u32; 64]);

impl PaddingSchedule {
    fn new(padding: &[u8; CHUNK]) -> Self {
        let mut w = [0u32; 64];
        for (word, bytes) in w.iter_mut().zip(padding.chunks_exact(4)) {
            *word = u32::from_be_bytes(bytes.try_into().expect("4 bytes"));
        }
        for t in 16..64 {
            w[t] = small_sigma1(w[t - 2])
                .wrapping_add(w[t - 7])
                .wrapping_add(small_sigma0(w[t - 15]))
                .wrapping_add(w[t - 16]);
        }
        for (word, k) in w.iter_mut().zip(K) {
            *word = word.wrapping_add(k);
        }
        PaddingSchedule(w)
    }
}

/// FIPS 180-4's σ0, used by the message schedule.
fn small_sigma0(x: u32) -> u32 {
    x.rotate_right(7) ^ x.rotate_right(18) ^ (x >> 3)
}

/// FIPS 180-4's σ1, used by the message schedule.
fn small_sigma1(x: u32) -> u32 {
    x.rotate_right(17) ^ x.rotate_right(19) ^ (x >> 10)
}

/// Everything the SHA-NI code needs besides the output.
#[derive(Clone, Copy)]
struct Job<'a> {
    /// State after the padded salt.
    state: &'a [u32; 8],
    padding: &'a PaddingSchedule,
    blocks: &'a [u8],
    block_size: usize,
}

#[cfg(target_arch = "x86_64")]
use sha_ni::ShaNi;

/// Without x86-64 there is no SHA-NI: a [`ShaNi`] can never exist.
#[cfg(not(target_arch = "x86_64"))]
mod no_sha_ni {
    use super::Job;

    /// Uninhabited: SHA-NI is an x86 extension.
    #[derive(Clone, Copy, Debug)]
    pub(super) enum ShaNi {}

    impl ShaNi {
        pub(super) fn detect() -> Option<Self> {
            None
        }

        pub(super) fn hash_blocks(self, _max_lanes: usize, _job: Job<'_>, _out: &mut [u8]) {
            match self {}
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
use no_sha_ni::ShaNi;

/// SHA-256 with the SHA extensions, hashing up to four blocks at once.
///
/// SHA-NI keeps the eight state words in two registers, `[A, B, E, F]` and
/// `[C, D, G, H]` (first word in the highest lane). `sha256rnds2` does two
/// rounds and returns the new `ABEF`; since two rounds shift A, B, E, F into
/// C, D, G, H, the old `ABEF` register is the new `CDGH`, so a pair of them,
/// with the roles swapped, does four rounds. `sha256msg1` and `sha256msg2`
/// compute the message schedule four words at a time.
#[cfg(target_arch = "x86_64")]
mod sha_ni {
    use core::arch::x86_64::{
        __m128i, _mm_add_epi32, _mm_alignr_epi8, _mm_extract_epi32, _mm_set_epi32, _mm_set_epi64x,
        _mm_sha256msg1_epu32, _mm_sha256msg2_epu32, _mm_sha256rnds2_epu32, _mm_shuffle_epi32,
        _mm_shuffle_epi8,
    };

    use core::slice::{ChunksExact, ChunksExactMut};

    use super::{Job, CHUNK, DIGEST_SIZE, K};

    /// Proof that this CPU has SHA-NI, SSE2, SSSE3 and SSE4.1, the features
    /// the functions below enable: only [`ShaNi::detect`] makes one.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct ShaNi(());

    impl ShaNi {
        /// A token if this CPU has the features (the standard library
        /// caches CPUID, so this is a few memory reads).
        pub(super) fn detect() -> Option<Self> {
            let has_all = is_x86_feature_detected!("sha")
                && is_x86_feature_detected!("sse2")
                && is_x86_feature_detected!("ssse3")
                && is_x86_feature_detected!("sse4.1");
            has_all.then_some(ShaNi(()))
        }

        /// Hashes `job`'s blocks into `out`, up to `max_lanes` (1, 2 or 4)
        /// at a time.
        pub(super) fn hash_blocks(self, max_lanes: usize, job: Job<'_>, out: &mut [u8]) {
            // SAFETY: `self` exists, so `detect` saw every feature that
            // `hash_job` enables. It touches memory only through `job`'s
            // and `out`'s slices.
            unsafe { hash_job(max_lanes, job, out) }
        }
    }

    // Safety of the functions below: each is `unsafe` only because it is
    // compiled for SHA-NI, SSE2, SSSE3 and SSE4.1 (`#[target_feature]`), so
    // it may only run on a CPU that has them. Each is called only by
    // another of them, and the root, `hash_job`, only from
    // `ShaNi::hash_blocks`, which holds a `ShaNi`. None uses raw
    // pointers: they read and write memory through slices with safe,
    // bounds-checked indexing, so they are sound for any arguments.

    /// The SHA-256 state in SHA-NI's layout.
    #[derive(Clone, Copy)]
    struct State {
        abef: __m128i,
        cdgh: __m128i,
    }

    /// Hashes `job`'s blocks into `out`: four at a time while at least
    /// four are left (if `max_lanes` allows), then two, then one.
    // SAFETY: see "Safety of the functions below".
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn hash_job(max_lanes: usize, job: Job<'_>, out: &mut [u8]) {
        let start = State::from_words(job.state);
        let padding = padding_vectors(&job.padding.0);
        let mut blocks = job.blocks.chunks_exact(job.block_size);
        let mut digests = out.chunks_exact_mut(DIGEST_SIZE);
        while blocks.len() > 0 {
            let lanes = blocks.len().min(max_lanes);
            match lanes {
                4.. => hash_lanes::<4>(start, &padding, &mut blocks, &mut digests),
                2 | 3 => hash_lanes::<2>(start, &padding, &mut blocks, &mut digests),
                _ => hash_lanes::<1>(start, &padding, &mut blocks, &mut digests),
            }
        }
    }

    /// Takes the next `N` blocks and digest slots from the iterators
    /// and hashes those blocks together, each starting from `start`.
    // SAFETY: see "Safety of the functions below".
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn hash_lanes<const N: usize>(
        start: State,
        padding: &[__m128i; 16],
        blocks: &mut ChunksExact<'_, u8>,
        digests: &mut ChunksExactMut<'_, u8>,
    ) {
        let mut lanes: [&[u8]; N] = [&[]; N];
        for lane in &mut lanes {
            *lane = blocks.next().expect("N blocks left");
        }
        let mut states = [start; N];
        for offset in (0..lanes[0].len()).step_by(CHUNK) {
            let mut message = [[_mm_set_epi64x(0, 0); 4]; N];
            for (words, lane) in message.iter_mut().zip(lanes) {
                *words = load_message(&lane[offset..offset + CHUNK]);
            }
            compress_chunks(&mut states, message);
        }
        compress_padding(&mut states, padding);
        for state in &states {
            state.write_digest(digests.next().expect("N digest slots left"));
        }
    }

    /// Runs the compression function on one 64-byte chunk per lane,
    /// given as big-endian words.
    ///
    /// The interleaving: for each group of four rounds the loop over the
    /// lanes emits every lane's two `sha256rnds2` and message expansion
    /// back to back. The lanes do not depend on each other, so the CPU
    /// runs their `sha256rnds2` in parallel, where a single message
    /// would wait out each one's latency.
    ///
    /// `schedule[lane][j]` holds four message words; for group
    /// `g = 4 * quarter + j` it holds `W[4g..4g + 4]`, and once used it
    /// is overwritten by `W[4g + 16..4g + 20]`, which group `g + 4` uses.
    // SAFETY: see "Safety of the functions below".
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn compress_chunks<const N: usize>(
        states: &mut [State; N],
        mut schedule: [[__m128i; 4]; N],
    ) {
        let initial = *states;
        for quarter in 0..4 {
            for j in 0..4 {
                let k = load_words(&K, 4 * quarter + j);
                for (state, w) in states.iter_mut().zip(&mut schedule) {
                    state.rounds4(_mm_add_epi32(w[j], k));
                    if quarter < 3 {
                        w[j] = next_schedule(w[j], w[(j + 1) % 4], w[(j + 2) % 4], w[(j + 3) % 4]);
                    }
                }
            }
        }
        for (state, initial) in states.iter_mut().zip(initial) {
            state.add(initial);
        }
    }

    /// Runs the compression function on the padding block, whose
    /// `W[t] + K[t]` are precomputed and shared by all lanes.
    // SAFETY: see "Safety of the functions below".
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn compress_padding<const N: usize>(states: &mut [State; N], padding: &[__m128i; 16]) {
        let initial = *states;
        for wk in padding {
            for state in states.iter_mut() {
                state.rounds4(*wk);
            }
        }
        for (state, initial) in states.iter_mut().zip(initial) {
            state.add(initial);
        }
    }

    /// The message schedule words `W[t..t + 4]` from the previous
    /// sixteen, `w0 = W[t - 16..]`, `w4 = W[t - 12..]`, `w8 = W[t - 8..]`,
    /// `w12 = W[t - 4..]`: `W[t] = σ1(W[t-2]) + W[t-7] + σ0(W[t-15]) + W[t-16]`.
    // SAFETY: see "Safety of the functions below".
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn next_schedule(w0: __m128i, w4: __m128i, w8: __m128i, w12: __m128i) -> __m128i {
        // W[t-16] + σ0(W[t-15]).
        let partial = _mm_sha256msg1_epu32(w0, w4);
        // + W[t-7]: the upper three words of `w8` and the first of `w12`.
        let partial = _mm_add_epi32(partial, _mm_alignr_epi8::<4>(w12, w8));
        // + σ1(W[t-2]), including the words computed in this step.
        _mm_sha256msg2_epu32(partial, w12)
    }

    /// The 64-byte `chunk` as four vectors of big-endian words.
    // SAFETY: see "Safety of the functions below".
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn load_message(chunk: &[u8]) -> [__m128i; 4] {
        // pshufb mask reversing the bytes of each 32-bit lane.
        let byte_swap = _mm_set_epi64x(0x0c0d_0e0f_0809_0a0b, 0x0405_0607_0001_0203);
        let mut words = [_mm_set_epi64x(0, 0); 4];
        for (word, bytes) in words.iter_mut().zip(chunk.chunks_exact(16)) {
            // Two safe 8-byte reads that LLVM merges into one `movdqu`.
            let low = i64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
            let high = i64::from_le_bytes(bytes[8..].try_into().expect("8 bytes"));
            *word = _mm_shuffle_epi8(_mm_set_epi64x(high, low), byte_swap);
        }
        words
    }

    /// Words `4 * group .. 4 * group + 4` of `words` as a vector, the
    /// first in the lowest lane.
    // SAFETY: see "Safety of the functions below".
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn load_words(words: &[u32; 64], group: usize) -> __m128i {
        let w = &words[4 * group..4 * group + 4];
        _mm_set_epi32(w[3] as i32, w[2] as i32, w[1] as i32, w[0] as i32)
    }

    /// The padding block's `W[t] + K[t]` as sixteen vectors.
    // SAFETY: see "Safety of the functions below".
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    unsafe fn padding_vectors(words: &[u32; 64]) -> [__m128i; 16] {
        let mut vectors = [_mm_set_epi64x(0, 0); 16];
        for (group, vector) in vectors.iter_mut().enumerate() {
            *vector = load_words(words, group);
        }
        vectors
    }

    impl State {
        /// `[a, b, c, d, e, f, g, h]` in SHA-NI's layout.
        // SAFETY: see "Safety of the functions below".
        #[inline]
        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        unsafe fn from_words(h: &[u32; 8]) -> Self {
            let h = h.map(|word| word as i32);
            State {
                abef: _mm_set_epi32(h[0], h[1], h[4], h[5]),
                cdgh: _mm_set_epi32(h[2], h[3], h[6], h[7]),
            }
        }

        /// Writes the state as a 32-byte big-endian digest into `out`.
        // SAFETY: see "Safety of the functions below".
        #[inline]
        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        unsafe fn write_digest(&self, out: &mut [u8]) {
            let words = [
                _mm_extract_epi32::<3>(self.abef),
                _mm_extract_epi32::<2>(self.abef),
                _mm_extract_epi32::<3>(self.cdgh),
                _mm_extract_epi32::<2>(self.cdgh),
                _mm_extract_epi32::<1>(self.abef),
                _mm_extract_epi32::<0>(self.abef),
                _mm_extract_epi32::<1>(self.cdgh),
                _mm_extract_epi32::<0>(self.cdgh),
            ];
            for (word, bytes) in words.iter().zip(out.chunks_exact_mut(4)) {
                bytes.copy_from_slice(&word.to_be_bytes());
            }
        }

        /// Four rounds with `wk = W[t..t+4] + K[t..t+4]`.
        // SAFETY: see "Safety of the functions below".
        #[inline]
        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        unsafe fn rounds4(&mut self, wk: __m128i) {
            self.cdgh = _mm_sha256rnds2_epu32(self.cdgh, self.abef, wk);
            // The upper two words of `wk` for the next two rounds.
            let wk_high = _mm_shuffle_epi32::<0x0e>(wk);
            self.abef = _mm_sha256rnds2_epu32(self.abef, self.cdgh, wk_high);
        }

        /// Adds `other` word by word (the compression function's
        /// feed-forward).
        // SAFETY: see "Safety of the functions below".
        #[inline]
        #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
        unsafe fn add(&mut self, other: State) {
            self.abef = _mm_add_epi32(self.abef, other.abef);
            self.cdgh = _mm_add_epi32(self.cdgh, other.cdgh);
        }
    }
}

/// Whether the CPU has the instructions the SHA-NI backends need, asked
/// of the CPU itself rather than through the backends' own detection, so
/// that tests and benchmarks can check that a detection bug does not
/// quietly leave those backends unused.
#[doc(hidden)]
pub fn cpu_has_sha_ni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("sha")
        && is_x86_feature_detected!("sse2")
        && is_x86_feature_detected!("ssse3")
        && is_x86_feature_detected!("sse4.1");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// SHA-256(padded_salt || block) for each block, straight from `sha2`.
    fn reference(salt: &[u8], blocks: &[u8], block_size: usize) -> Vec<u8> {
        blocks
            .chunks_exact(block_size)
            .flat_map(|block| {
                let mut h = Sha256::new();
                h.update(padded_salt(salt));
                h.update(block);
                h.finalize().to_vec()
            })
            .collect()
    }

    /// `len` random bytes from a generator seeded with `seed`.
    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut bytes = vec![0; len];
        fastrand::Rng::with_seed(seed).fill(&mut bytes);
        bytes
    }

    /// The backends the tests run: every one on a CPU with SHA-NI (each
    /// must be available), only `Portable` without it. That gap is written
    /// straight to stderr, which the test harness does not capture, so that
    /// a passing run still shows it.
    fn supported_backends() -> Vec<Backend> {
        let available: Vec<Backend> = Backend::ALL
            .into_iter()
            .filter(|&b| Sha256Prefix::with_backend(b"", b).is_some())
            .collect();
        if cpu_has_sha_ni() {
            assert_eq!(available, Backend::ALL, "the CPU has SHA-NI");
        } else {
            assert_eq!(available, [Backend::Portable], "the CPU lacks SHA-NI");
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                let warning = "WARNING: sha256_mb: this CPU lacks SHA-NI: the ShaNi1, ShaNi2 \
                               and ShaNi4 backends are NOT tested, only Portable\n";
                std::io::Write::write_all(&mut std::io::stderr(), warning.as_bytes())
                    .expect("writing to stderr");
            });
        }
        available
    }

    #[test]
    fn sha_ni_is_used_when_the_cpu_has_it_in_its_fastest_form() {
        let best = Backend::best();
        assert!(supported_backends().contains(&best), "{best:?}");
        assert_eq!(cpu_has_sha_ni(), best != Backend::Portable, "{best:?}");
        assert_eq!(Backend::best(), best);
        assert_eq!(Sha256Prefix::new(b"").backend, best);
        for only in supported_backends() {
            assert_eq!(fastest(&[only]), only);
        }
    }

    fn hash_with(backend: Backend, salt: &[u8], blocks: &[u8], block_size: usize) -> Vec<u8> {
        let prefix = Sha256Prefix::with_backend(salt, backend).expect("supported backend");
        assert_eq!(prefix.backend, backend);
        let mut out = vec![0u8; blocks.len() / block_size * DIGEST_SIZE];
        prefix.hash_blocks(blocks, block_size, &mut out);
        out
    }

    fn assert_all_backends_match(salt: &[u8], blocks: &[u8], block_size: usize) {
        let expected = reference(salt, blocks, block_size);
        for backend in supported_backends() {
            assert_eq!(
                hash_with(backend, salt, blocks, block_size),
                expected,
                "{backend:?}, salt {salt:02x?}, block size {block_size}, {} blocks",
                blocks.len() / block_size
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn matches_sha2(
            salt in prop::collection::vec(any::<u8>(), 0..=32),
            log_block_size in 6u32..=16,
            count in 0usize..=9,
            seed in any::<u64>(),
        ) {
            let block_size = 1 << log_block_size;
            let blocks = random_bytes(count * block_size, seed);
            assert_all_backends_match(&salt, &blocks, block_size);
        }
    }

    #[test]
    fn every_block_size_and_remainder() {
        for salt in [&b""[..], b"s", &[0xa5; 32], &[0x5a; 64], &[7; 65]] {
            for log_block_size in 6..=16 {
                let block_size = 1 << log_block_size;
                for count in 0..=9 {
                    let blocks = random_bytes(count * block_size, count as u64);
                    assert_all_backends_match(salt, &blocks, block_size);
                }
            }
        }
    }

    #[test]
    fn one_prefix_serves_every_block_size() {
        // The padding block depends on the block size: it must not be
        // cached across calls.
        for backend in supported_backends() {
            let prefix = Sha256Prefix::with_backend(b"salt", backend).unwrap();
            for block_size in [4096, 64, 1024, 4096] {
                let blocks = random_bytes(5 * block_size, block_size as u64);
                let mut out = vec![0u8; 5 * DIGEST_SIZE];
                prefix.hash_blocks(&blocks, block_size, &mut out);
                assert_eq!(out, reference(b"salt", &blocks, block_size), "{backend:?}");
            }
        }
    }

    #[test]
    fn lanes_do_not_mix() {
        // Only the third of eight blocks differs: exactly its digest must.
        let mut changed = vec![0u8; 8 * 1024];
        changed[2 * 1024 + 100] = 1;
        for backend in supported_backends() {
            let base = hash_with(backend, b"", &[0u8; 8 * 1024], 1024);
            let changed = hash_with(backend, b"", &changed, 1024);
            for (i, (a, b)) in base.chunks(32).zip(changed.chunks(32)).enumerate() {
                assert_eq!(a == b, i != 2, "{backend:?}, digest {i}");
            }
        }
    }

    #[test]
    fn known_answers() {
        // Values from Python's hashlib.
        let cases: [(&[u8], Vec<u8>, usize, &str); 3] = [
            (
                b"",
                vec![0; 64],
                64,
                "f5a5fd42d16a20302798ef6ed309979b43003d2320d9f0e8ea9831a92759fb4b",
            ),
            (
                b"verityfs",
                vec![0x5a; 4096],
                4096,
                "9fc11219060a6f8d5c76fe72077adc9340da7f695eb86ad6f203c9c0bf126e00",
            ),
            (
                b"",
                (0..1024).map(|i| (i % 251) as u8).collect(),
                1024,
                "2bce1ba628720664be4b9fdd77aae0678e5f0f3f02fc6ff641ec879094f6a404",
            ),
        ];
        for (salt, block, block_size, hex) in cases {
            for backend in supported_backends() {
                let digest = hash_with(backend, salt, &block, block_size);
                assert_eq!(hex::encode(digest), hex, "{backend:?}");
            }
        }
    }

    #[test]
    fn portable_backend_is_always_available() {
        let prefix = Sha256Prefix::with_backend(b"salt", Backend::Portable).unwrap();
        assert_eq!(prefix.backend, Backend::Portable);
        let blocks = random_bytes(5 * 4096, 1);
        let mut out = vec![0u8; 5 * DIGEST_SIZE];
        prefix.hash_blocks(&blocks, 4096, &mut out);
        assert_eq!(out, reference(b"salt", &blocks, 4096));
    }

    #[test]
    fn prefix_is_the_padded_salt() {
        assert_eq!(Sha256Prefix::new(b"").state, IV);
        assert_eq!(Sha256Prefix::new(b"").prefix_len, 0);
        assert_eq!(Sha256Prefix::new(b"x").prefix_len, 64);
        assert_eq!(Sha256Prefix::new(&[1; 64]).prefix_len, 64);
        assert_eq!(Sha256Prefix::new(&[1; 65]).prefix_len, 128);
        // A one-byte salt and its explicit zero padding give the same state.
        let mut padded = [0u8; 64];
        padded[0] = b'x';
        assert_eq!(
            Sha256Prefix::new(b"x").state,
            Sha256Prefix::new(&padded).state
        );
    }

    #[test]
    fn padding_block_encodes_the_bit_length() {
        let block = padding_block(64 + 4096);
        assert_eq!(block[0], 0x80);
        assert!(block[1..56].iter().all(|&b| b == 0));
        assert_eq!(block[56..], ((64 + 4096) * 8u64).to_be_bytes());
    }

    #[test]
    fn padding_schedule_matches_sha256_of_the_padding() {
        // Compressing the padding block from the IV with the schedule must
        // equal compress256 on its bytes; checked via a plain scalar round.
        let block = padding_block(4096);
        let schedule = PaddingSchedule::new(&block);
        let mut expected = IV;
        compress256(&mut expected, core::slice::from_ref(&block));
        assert_eq!(scalar_compress(IV, &schedule.0), expected);
    }

    /// FIPS 180-4's compression function from precomputed `W[t] + K[t]`.
    fn scalar_compress(state: [u32; 8], wk: &[u32; 64]) -> [u32; 8] {
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = state;
        for &wk in wk {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = h.wrapping_add(s1).wrapping_add(ch).wrapping_add(wk);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            (h, g, f, e, d, c, b, a) = (g, f, e, d.wrapping_add(t1), c, b, a, t1.wrapping_add(t2));
        }
        let mut out = state;
        for (o, x) in out.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *o = o.wrapping_add(x);
        }
        out
    }

    #[test]
    #[should_panic(expected = "not a positive multiple of 64")]
    fn rejects_block_sizes_that_are_not_multiples_of_64() {
        Sha256Prefix::new(b"").hash_blocks(&[0; 96], 96, &mut [0; 32]);
    }

    #[test]
    #[should_panic(expected = "wrong output size")]
    fn rejects_a_short_output() {
        Sha256Prefix::new(b"").hash_blocks(&[0; 128], 64, &mut [0; 32]);
    }
}
