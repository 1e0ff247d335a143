//! Shared by the read path benchmark and the allocation test: a verity file
//! whose tree cache and page cache are warm, the read patterns measured, and
//! an allocator that counts allocations.

#![allow(dead_code)] // the benchmark and the test use different subsets

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use verityfs::{
    build_merkle_tree, HashAlgorithm, MerkleTreeParams, ReadOptions, Verifier, VerityFile,
};

/// The system allocator, counting allocations (on every thread).
pub struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on unchanged to the system allocator; the
// counter is an atomic and allocates nothing.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Relaxed);
        // SAFETY: `ptr` came from this allocator, that is from System.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from System.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations (including reallocations) made so far by the process.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Relaxed)
}

/// Data size of the fixture: large enough that random reads are not all
/// "near the previous one", small enough to build in well under a second.
pub const FILE_SIZE: usize = 64 << 20;

/// A read pattern: how long each read is and where the `i`th one starts.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    /// Name in reports.
    pub name: &'static str,
    /// Bytes per read.
    pub len: usize,
    /// Whether reads start on block boundaries and cover whole blocks.
    pub aligned: bool,
}

/// The patterns measured: aligned streams of 4 KiB, 128 KiB and 1 MiB
/// reads (what FUSE sends), and small and block-sized reads at unaligned,
/// scattered offsets.
pub const PATTERNS: [Pattern; 5] = [
    Pattern {
        name: "aligned_4k",
        len: 4096,
        aligned: true,
    },
    Pattern {
        name: "aligned_128k",
        len: 128 << 10,
        aligned: true,
    },
    Pattern {
        name: "aligned_1m",
        len: 1 << 20,
        aligned: true,
    },
    Pattern {
        name: "unaligned_100b",
        len: 100,
        aligned: false,
    },
    Pattern {
        name: "unaligned_4k",
        len: 4096,
        aligned: false,
    },
];

impl Pattern {
    /// Where read number `i` starts: aligned patterns stream through the
    /// file and wrap around; unaligned ones jump about (a fixed sequence).
    pub fn offset(&self, i: u64) -> u64 {
        let size = FILE_SIZE as u64;
        if self.aligned {
            return i * self.len as u64 % size;
        }
        let block = fastrand::Rng::with_seed(i).u64(..size / 4096);
        (block * 4096 + 1000) % (size - self.len as u64)
    }
}

/// A verity file of [`FILE_SIZE`] bytes (data and tree kept apart, in a
/// temporary directory), read once from end to end so that its whole tree
/// is cached and verified and its data is in the page cache.
pub struct WarmFile {
    /// The open file.
    pub file: VerityFile,
    /// Its data, to check what reads return.
    pub data: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl WarmFile {
    /// The fixture for `alg` with 4 KiB blocks and a salt.
    pub fn new(alg: HashAlgorithm) -> Self {
        let mut data = vec![0; FILE_SIZE];
        fastrand::Rng::with_seed(FILE_SIZE as u64).fill(&mut data);
        let params = MerkleTreeParams::new(alg, 4096, b"salt").unwrap();
        let size = data.len() as u64;
        let (descriptor, tree) =
            build_merkle_tree(&params, size, &data[..], Vec::new(), &mut |_| Ok(())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data"), &data).unwrap();
        std::fs::write(dir.path().join("tree"), &tree).unwrap();
        let verifier: Arc<Verifier> = Verifier::new(ReadOptions::default());
        let file = VerityFile::open_detached(
            &verifier,
            File::open(dir.path().join("data")).unwrap(),
            File::open(dir.path().join("tree")).unwrap(),
            &descriptor.to_unsigned_bytes(),
            "data".as_ref(),
        )
        .unwrap();
        let mut buf = vec![0u8; 1 << 20];
        for offset in (0..size).step_by(buf.len()) {
            file.read_at(&mut buf, offset).unwrap();
        }
        WarmFile {
            file,
            data,
            _dir: dir,
        }
    }

    /// Does read number `i` of `pattern` into `buf`.
    pub fn read(&self, pattern: &Pattern, i: u64, buf: &mut [u8]) {
        let n = self
            .file
            .read_at(&mut buf[..pattern.len], pattern.offset(i));
        assert_eq!(n.unwrap(), pattern.len, "{pattern:?} read {i}");
    }

    /// Like [`WarmFile::read`], and checks the bytes read.
    pub fn read_checked(&self, pattern: &Pattern, i: u64, buf: &mut [u8]) {
        self.read(pattern, i, buf);
        let want = &self.data[pattern.offset(i) as usize..][..pattern.len];
        assert!(&buf[..pattern.len] == want, "{pattern:?} read {i}");
    }
}
