//! How many requests the verified read path makes of its sources: a small
//! file is fetched whole at open, a random pattern fetches level 0 of the
//! tree in bulk, and interleaved sequential streams each keep their tree
//! readahead. Counted by a [`Source`] that records every call it gets.

mod common;

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{fadvise, Advice};
use verityfs::{HashAlgorithm, Lent, MerkleTreeParams, ReadOptions, Source, Verifier, VerityFile};

/// What a source was asked for: (offset, length) of each call.
#[derive(Default, Debug)]
struct Calls {
    reads: Vec<(u64, u64)>,
    prefetches: Vec<(u64, u64)>,
}

/// A file that records the calls it gets; it lends the bytes of a copy
/// in memory, if it has one, until that copy is invalidated.
struct Counting {
    file: File,
    calls: Mutex<Calls>,
    memory: Mutex<Option<Arc<[u8]>>>,
}

impl Counting {
    fn new(path: &Path) -> Arc<Counting> {
        Arc::new(Counting {
            file: File::open(path).unwrap(),
            calls: Mutex::default(),
            memory: Mutex::default(),
        })
    }

    /// Lends `memory` from now on.
    fn keep(&self, memory: Vec<u8>) {
        *self.memory.lock().unwrap() = Some(memory.into());
    }

    fn reads(&self) -> Vec<(u64, u64)> {
        self.calls.lock().unwrap().reads.clone()
    }

    fn prefetches(&self) -> Vec<(u64, u64)> {
        self.calls.lock().unwrap().prefetches.clone()
    }
}

impl Source for Counting {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let call = (offset, buf.len() as u64);
        self.calls.lock().unwrap().reads.push(call);
        FileExt::read_exact_at(&self.file, buf, offset)
    }

    fn read_exact_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.calls.lock().unwrap().reads.push((offset, len));
        Source::read_exact_vectored_at(&self.file, bufs, offset)
    }

    fn prefetch(&self, offset: u64, len: u64) {
        self.calls.lock().unwrap().prefetches.push((offset, len));
        self.file.prefetch(offset, len);
    }

    fn size(&self) -> io::Result<u64> {
        Source::size(&self.file)
    }

    fn lend(&self, offset: u64, len: usize) -> Option<Lent> {
        let memory = self.memory.lock().unwrap().clone()?;
        let from = offset as usize;
        Lent::new(memory).narrow(from..from + len)
    }

    fn invalidate(&self, _offset: u64, _len: u64) -> bool {
        self.memory.lock().unwrap().take().is_some()
    }
}

/// Makes a verity file of `data` (or, if `None`, a sparse one of `size`
/// bytes) with `params`.
fn verity_file(dir: &Path, data: Option<&[u8]>, size: u64, params: MerkleTreeParams) -> File {
    let path = dir.join("file");
    let file = File::create(&path).unwrap();
    match data {
        Some(data) => file.write_all_at(data, 0).unwrap(),
        None => file.set_len(size).unwrap(),
    }
    drop(file);
    common::enable(&path, params).unwrap();
    File::open(&path).unwrap()
}

/// Opens the verity file at `dir/file` over one counting source for data
/// and tree alike.
fn open_counting(verifier: &Arc<Verifier>, dir: &Path) -> (VerityFile, Arc<Counting>) {
    let path = dir.join("file");
    let location = *common::open(verifier, &path).location();
    let mut descriptor = vec![0u8; location.desc_size as usize];
    let backing = File::open(&path).unwrap();
    FileExt::read_exact_at(&backing, &mut descriptor, location.desc_pos).unwrap();
    let source = Counting::new(&path);
    let sources = (source.clone() as Arc<dyn Source>, source.clone() as _);
    let file = VerityFile::open_sources(verifier, sources, location, &descriptor, &path).unwrap();
    (file, source)
}

/// The reads `source` got for the tree of `file`.
fn tree_reads(file: &VerityFile, source: &Counting) -> Vec<(u64, u64)> {
    let tree_pos = file.location().tree_pos;
    let reads = source.reads().into_iter();
    reads.filter(|&(pos, _)| pos >= tree_pos).collect()
}

/// Checks that `source` got at most `level0` reads for level 0 of the tree
/// of `file` and one for each level above.
fn assert_tree_reads_at_most(file: &VerityFile, source: &Counting, level0: usize) {
    let reads = tree_reads(file, source);
    let most = level0 + file.geometry().num_levels() - 1;
    assert!(
        reads.len() <= most,
        "{} tree reads, expected at most {most}: {reads:?}",
        reads.len()
    );
}

fn verifier() -> Arc<Verifier> {
    Verifier::new(ReadOptions::default())
}

/// Which pages of `file` (of `len` bytes) are in the page cache, asked
/// without touching them (a read, even `RWF_NOWAIT`, would start readahead).
fn resident_pages(file: &File, len: u64) -> Vec<bool> {
    let pages = len.div_ceil(4096) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: a fresh read-only shared mapping of the file, never
    // dereferenced, only asked about by mincore, then unmapped.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(map, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        let ok = libc::mincore(map, len as usize, vec.as_mut_ptr());
        assert_eq!(ok, 0, "{}", io::Error::last_os_error());
        libc::munmap(map, len as usize);
    }
    vec.iter().map(|&v| v & 1 == 1).collect()
}

/// The pages of the data, the tree and the descriptor.
fn metadata_and_data_pages(file: &VerityFile) -> Vec<u64> {
    let l = file.location();
    let data = (0..l.data_size).step_by(4096);
    data.chain((l.tree_pos..l.desc_pos + u64::from(l.desc_size)).step_by(4096))
        .collect()
}

#[test]
fn opening_a_small_file_fetches_it_whole() {
    // Not in /tmp, which may be a tmpfs whose pages cannot be dropped.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    for size in [16 << 10, 256 << 10] {
        let data = common::random_bytes(size, 16);
        let backing = verity_file(dir.path(), Some(&data), 0, MerkleTreeParams::default());
        let len = backing.metadata().unwrap().len();
        fadvise(&backing, 0, None, Advice::DontNeed).unwrap();
        assert!(
            resident_pages(&backing, len).iter().all(|&r| !r),
            "the test needs a filesystem whose cached pages can be dropped"
        );
        let path = dir.path().join("file");
        let file = VerityFile::open(&verifier(), backing.try_clone().unwrap(), &path).unwrap();
        let pages = metadata_and_data_pages(&file);
        // The fetch runs in the background: wait for it.
        let deadline = Instant::now() + Duration::from_secs(5);
        let all_in = || {
            let resident = resident_pages(&backing, len);
            pages.iter().all(|&page| resident[(page / 4096) as usize])
        };
        while !all_in() {
            assert!(Instant::now() < deadline, "{size}: not all fetched at open");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_small_file_is_one_prefetch_and_reads_within_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = common::random_bytes(100_000, 17);
    verity_file(dir.path(), Some(&data), 0, MerkleTreeParams::default());
    let (file, source) = open_counting(&verifier(), dir.path());
    let mut buf = vec![0u8; data.len()];
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), data.len());
    assert!(buf == data);
    let end = file.location().desc_pos + u64::from(file.location().desc_size);
    let within = |&(pos, len): &(u64, u64)| pos + len <= end;
    // Fetched whole at open; what the read asks for after is in there.
    let prefetches = source.prefetches();
    assert_eq!(prefetches[0], (0, end));
    assert!(prefetches.iter().all(within), "{prefetches:?}");
    // The data, and the tree in one read.
    let reads = source.reads();
    assert_eq!(reads.len(), 2, "{reads:?}");
    assert!(reads.iter().all(within), "{reads:?}");
}

#[test]
fn random_reads_fetch_level_0_in_bulk() {
    let dir = tempfile::tempdir().unwrap();
    // 128 MiB of data: 1 MiB of level 0, 256 blocks.
    let size = 128 << 20;
    verity_file(dir.path(), None, size, MerkleTreeParams::default());
    let (file, source) = open_counting(&verifier(), dir.path());
    let level0_bytes = file.geometry().levels()[0].num_blocks * 4096;
    let mut rng = fastrand::Rng::with_seed(3);
    let mut buf = [0u8; 4096];
    for _ in 0..500 {
        let offset = rng.u64(1..size / 4096) * 4096;
        assert_eq!(file.read_at(&mut buf, offset).unwrap(), 4096);
        assert!(buf.iter().all(|&b| b == 0));
    }
    let tree_reads = tree_reads(&file, &source);
    let bulk: Vec<_> = tree_reads.iter().filter(|r| r.1 == level0_bytes).collect();
    assert_eq!(bulk.len(), 1, "one read of all of level 0: {tree_reads:?}");
    // Before it, the first few random reads fetch their own blocks, and
    // each level above is one read.
    assert_tree_reads_at_most(&file, &source, 3 + 1);
}

#[test]
fn interleaved_streams_each_keep_their_readahead() {
    let dir = tempfile::tempdir().unwrap();
    // With 1 KiB blocks a level-0 readahead window covers 64 MiB of data:
    // streams 128 MiB apart need windows of their own.
    let params = MerkleTreeParams::new(HashAlgorithm::Sha256, 1024, b"").unwrap();
    let size = 256 << 20;
    verity_file(dir.path(), None, size, params);
    let (file, source) = open_counting(&verifier(), dir.path());
    let starts = [0, 128 << 20, 192 << 20];
    let chunk = 128 << 10;
    let mut buf = vec![0u8; chunk as usize];
    for step in 0..128 {
        for start in starts {
            let n = file.read_at(&mut buf, start + step * chunk).unwrap();
            assert_eq!(n, chunk as usize);
        }
    }
    // Per stream: its first read's blocks (unless it starts at 0), then one
    // window; each level above level 0 once. One read per missing block
    // would be 1536.
    assert_tree_reads_at_most(&file, &source, 2 * starts.len());
}

#[test]
fn parallel_readers_of_one_file_each_keep_their_readahead() {
    let dir = tempfile::tempdir().unwrap();
    let params = MerkleTreeParams::new(HashAlgorithm::Sha256, 1024, b"").unwrap();
    let size = 512 << 20;
    verity_file(dir.path(), None, size, params);
    let (file, source) = open_counting(&verifier(), dir.path());
    let readers = 4;
    let chunk = 128 << 10;
    std::thread::scope(|scope| {
        for r in 0..readers {
            let file = &file;
            scope.spawn(move || {
                let mut buf = vec![0u8; chunk as usize];
                let start = r * (size / readers);
                for step in 0..256 {
                    file.read_at(&mut buf, start + step * chunk).unwrap();
                }
            });
        }
    });
    // As above, with room for readers racing for the same missing block.
    assert_tree_reads_at_most(&file, &source, 4 * readers as usize);
}

#[test]
fn bytes_a_source_lends_are_verified_and_returned_without_a_read() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
    verity_file(dir.path(), Some(&data), 0, MerkleTreeParams::default());
    let (file, source) = open_counting(&verifier(), dir.path());
    let tree_pos = file.location().tree_pos;
    let data_reads = || source.reads().iter().filter(|r| r.0 < tree_pos).count();
    let reads = data_reads();
    assert!(
        file.read_lent(0, 4096).unwrap().is_none(),
        "nothing kept yet"
    );
    source.keep(data.clone());
    let lent = file.read_lent(4000, 5000).unwrap().unwrap();
    assert!(lent[..] == data[4000..9000]);
    let end = file.read_lent(3 * 4096, 4096).unwrap().unwrap();
    assert!(end[..] == data[3 * 4096..], "the end of the data only");
    assert!(file.read_lent(data.len() as u64, 1).unwrap().is_none());
    assert_eq!(data_reads(), reads, "no read of the data for lent bytes");
}

#[test]
fn a_lent_copy_that_fails_its_check_is_dropped_and_the_source_read() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..8 * 4096).map(|i| (i % 251) as u8).collect();
    verity_file(dir.path(), Some(&data), 0, MerkleTreeParams::default());
    let (file, source) = open_counting(&verifier(), dir.path());
    let mut damaged = data.clone();
    damaged[5000] ^= 1;
    source.keep(damaged);
    assert!(file.read_lent(4096, 4096).unwrap().is_none());
    assert!(source.lend(0, 1).is_none(), "the copy was dropped");
    let mut buf = vec![0; 4096];
    assert_eq!(file.read_at(&mut buf, 4096).unwrap(), 4096);
    assert!(buf[..] == data[4096..8192]);
}
