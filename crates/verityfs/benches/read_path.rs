//! CPU time of `VerityFile::read_at` with a warm tree cache and the data in
//! the page cache, for the read patterns of `tests/common/read_path.rs`
//! with SHA-256 and SHA-512; and the heap allocations each read makes.
//!
//! Run pinned to one core for stable numbers (with one core, large reads
//! are hashed on one thread, so the time is the CPU time):
//! `taskset -c 1 cargo bench -p verityfs --bench read_path`.
//!
//! `read_path --count PATTERN ALG N` does only `N` reads of one pattern in
//! `measured_reads`, for instruction counts with
//! `valgrind --tool=callgrind --toggle-collect='*measured_reads*'`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use verityfs::HashAlgorithm;

#[path = "../tests/common/read_path.rs"]
mod read_path;

use read_path::{allocations, CountingAlloc, Pattern, WarmFile, PATTERNS};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Reads whose allocations are averaged.
const COUNTED_READS: u64 = 1000;

fn bench(c: &mut Criterion, alg: HashAlgorithm) {
    let warm = WarmFile::new(alg);
    let mut buf = vec![0u8; 1 << 20];
    let mut group = c.benchmark_group(format!("read_at_{alg}"));
    for pattern in &PATTERNS {
        for i in 0..64 {
            warm.read_checked(pattern, i, &mut buf);
        }
        let before = allocations();
        for i in 0..COUNTED_READS {
            warm.read(pattern, i, &mut buf);
        }
        let per_read = (allocations() - before) as f64 / COUNTED_READS as f64;
        println!("{alg} {}: {per_read} allocations per read", pattern.name);
        group.throughput(Throughput::Bytes(pattern.len as u64));
        let mut i = 0;
        group.bench_function(BenchmarkId::from_parameter(pattern.name), |b| {
            b.iter(|| {
                warm.read(pattern, i, black_box(&mut buf));
                i += 1;
            })
        });
    }
    group.finish();
}

/// `n` reads of `pattern`, alone in a function for callgrind to select.
#[inline(never)]
fn measured_reads(warm: &WarmFile, pattern: &Pattern, n: u64, buf: &mut [u8]) {
    for i in 0..n {
        warm.read(pattern, i, buf);
    }
}

/// The `--count PATTERN ALG N` mode.
fn count(args: &[String]) {
    let [pattern, alg, n] = args else {
        panic!("usage: read_path --count PATTERN sha256|sha512 N");
    };
    let pattern = PATTERNS
        .iter()
        .find(|p| p.name == pattern)
        .expect("a pattern name");
    let alg = HashAlgorithm::from_name(alg).expect("sha256 or sha512");
    let warm = WarmFile::new(alg);
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..64 {
        warm.read_checked(pattern, i, &mut buf);
    }
    measured_reads(
        &warm,
        pattern,
        n.parse().expect("a number of reads"),
        &mut buf,
    );
}

// What `criterion_main!` does, without the undocumented public function
// `criterion_group!` would add.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--count") {
        return count(&args[1..]);
    }
    let mut criterion = Criterion::default().configure_from_args();
    for alg in HashAlgorithm::ALL {
        bench(&mut criterion, alg);
    }
    criterion.final_summary();
}
