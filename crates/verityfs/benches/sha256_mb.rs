//! Multi-buffer SHA-256 against the `sha2` crate one block at a time, on
//! 256 blocks of 4 KiB (1 MiB) per iteration, as fs-verity hashes them.
//!
//! Run pinned to one core for stable numbers:
//! `taskset -c 0 cargo bench -p verityfs --bench sha256_mb`.

use criterion::{BenchmarkId, Criterion, Throughput};
use sha2::{Digest as _, Sha256};
use std::hint::black_box;

use verityfs::sha256_mb::{cpu_has_sha_ni, Backend, Sha256Prefix, DIGEST_SIZE};

const BLOCK_SIZE: usize = 4096;
const BLOCKS: usize = 256;

/// What `SaltedHasher::hash_blocks` does today: clone the salted state,
/// hash one block, finish.
fn sha2_one_at_a_time(salted: &Sha256, blocks: &[u8], out: &mut [u8]) {
    let digests = out.chunks_exact_mut(DIGEST_SIZE);
    for (block, digest) in blocks.chunks_exact(BLOCK_SIZE).zip(digests) {
        let mut h = salted.clone();
        h.update(block);
        digest.copy_from_slice(&h.finalize());
    }
}

fn bench(c: &mut Criterion) {
    let mut blocks = vec![0u8; BLOCKS * BLOCK_SIZE];
    fastrand::Rng::with_seed(1).fill(&mut blocks);
    let mut out = vec![0u8; BLOCKS * DIGEST_SIZE];
    let mut group = c.benchmark_group("sha256_4KiB_x256");
    group.throughput(Throughput::Bytes(blocks.len() as u64));

    let salted = Sha256::new();
    sha2_one_at_a_time(&salted, &blocks, &mut out);
    let expected = out.clone();
    group.bench_function("sha2", |b| {
        b.iter(|| {
            sha2_one_at_a_time(&salted, black_box(&blocks), &mut out);
            black_box(&out);
        })
    });
    let sha_ni = cpu_has_sha_ni();
    if !sha_ni {
        eprintln!("WARNING: this CPU lacks SHA-NI: only the Portable backend is measured");
    }
    // What the library hashes with here (timed at its first use).
    eprintln!("Backend::best() on this CPU: {:?}", Backend::best());
    for backend in Backend::ALL {
        let prefix = Sha256Prefix::with_backend(b"", backend);
        let runs_here = sha_ni || backend == Backend::Portable;
        assert_eq!(
            prefix.is_some(),
            runs_here,
            "{backend:?} available (SHA-NI: {sha_ni})"
        );
        let Some(prefix) = prefix else {
            continue;
        };
        prefix.hash_blocks(&blocks, BLOCK_SIZE, &mut out);
        assert_eq!(out, expected, "{backend:?} disagrees with sha2");
        let id = BenchmarkId::new("sha256_mb", format!("{backend:?}"));
        group.bench_function(id, |b| {
            b.iter(|| {
                prefix.hash_blocks(black_box(&blocks), BLOCK_SIZE, &mut out);
                black_box(&out);
            })
        });
    }
    group.finish();
}

// What `criterion_main!` does, without the undocumented public function
// `criterion_group!` would add.
fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
}
