//! The verified read path makes no heap allocation once its tree blocks are
//! cached: counted by a global allocator for every pattern the read path
//! benchmark measures, with both hash algorithms.

#[path = "common/read_path.rs"]
mod read_path;

use read_path::{allocations, CountingAlloc, WarmFile, PATTERNS};
use verityfs::HashAlgorithm;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

// The only test of this binary, so that no other test allocates while it
// counts.
#[test]
fn reads_of_cached_blocks_do_not_allocate() {
    // Reads of more than 128 KiB are hashed on all of rayon's threads, and
    // rayon's job queue allocates a block every few dozen hand-offs: with
    // one thread, what is counted is the read path's own allocations.
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .expect("the first use of rayon in this process");
    for alg in HashAlgorithm::ALL {
        let warm = WarmFile::new(alg);
        let mut buf = vec![0u8; 1 << 20];
        for pattern in &PATTERNS {
            // The first reads of a thread may set up (and grow) its
            // buffers: the counted reads are these same reads again.
            for i in 0..256 {
                warm.read_checked(pattern, i, &mut buf);
            }
            let before = allocations();
            for i in 0..256 {
                warm.read(pattern, i, &mut buf);
            }
            let made = allocations() - before;
            assert_eq!(made, 0, "{alg} {}: allocations in 256 reads", pattern.name);
        }
    }
}
