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
    for alg in HashAlgorithm::ALL {
        let warm = WarmFile::new(alg);
        let mut buf = vec![0u8; 1 << 20];
        for pattern in &PATTERNS {
            // The first reads of a thread may set up its buffers.
            for i in 0..16 {
                warm.read_checked(pattern, i, &mut buf);
            }
            let before = allocations();
            for i in 16..272 {
                warm.read(pattern, i, &mut buf);
            }
            let made = allocations() - before;
            assert_eq!(made, 0, "{alg} {}: allocations in 256 reads", pattern.name);
        }
    }
}
