//! A backing file changed under the verified read path, while it reads.
//!
//! The attacker's best move is a *forged* file: the data of some blocks
//! changed and the tree rebuilt to match, so that every hash checks out
//! except against the root hash. Written over the real file (in part, at
//! random moments, while other threads read through a cache too small to
//! hold a tree path), or with the file cut short, it must never make a read
//! return anything but the original bytes: a read returns them or fails
//! with `EIO`. That holds only if every tree block is checked against a
//! verified parent whenever it is (re)loaded, and if the bytes hashed are
//! the bytes returned, whatever buffer they pass through.

mod common;

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{build, enable, open_rw, random_bytes, write_file};
use fastrand::Rng;
use rayon::prelude::*;
use verityfs::{HashAlgorithm, MerkleTreeParams, ReadOptions, Verifier, VerityFile};

/// The shapes attacked: 4 tree levels of 1 KiB SHA-512 blocks with the
/// tree stored after the data, 3 levels of 1 KiB SHA-256 blocks and 2
/// levels of 4 KiB SHA-256 blocks with the tree in a file of its own.
fn subjects(dir: &Path) -> Vec<Subject> {
    vec![
        Subject::new(dir, HashAlgorithm::Sha512, 1024, 5 << 20, false),
        Subject::new(dir, HashAlgorithm::Sha256, 1024, (3 << 20) + 100, true),
        Subject::new(dir, HashAlgorithm::Sha256, 4096, (9 << 20) - 7, true),
    ]
}

/// Bytes of one file: the data, or the tree (which may follow the data in
/// the same file).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Part {
    Data,
    Tree,
}

/// A verity file and a forgery of it.
struct Subject {
    name: String,
    data_path: PathBuf,
    /// The file holding the tree, at `tree_pos`.
    tree_path: PathBuf,
    tree_pos: u64,
    /// The descriptor, for a detached tree.
    descriptor: Option<Vec<u8>>,
    data: Vec<u8>,
    tree: Vec<u8>,
    forged_data: Vec<u8>,
    forged_tree: Vec<u8>,
    /// Everything the forgery changes, in whole blocks.
    forged_regions: Vec<(Part, Range<usize>)>,
    /// The forged data blocks.
    forged_blocks: Vec<u64>,
    /// The whole backing files, to undo truncations.
    backing: Vec<(PathBuf, Vec<u8>)>,
    bs: usize,
    /// Where the top level's only block is in the stored tree.
    top_block: Range<usize>,
}

impl Subject {
    fn new(dir: &Path, alg: HashAlgorithm, bs: u64, size: usize, detached: bool) -> Self {
        let name = format!(
            "{alg}-{bs}-{}",
            if detached { "detached" } else { "enabled" }
        );
        let dir = dir.join(&name);
        std::fs::create_dir(&dir).unwrap();
        let params = MerkleTreeParams::new(alg, bs, b"forge").unwrap();
        let data = random_bytes(size, bs);
        let mut rng = Rng::with_seed(size as u64);
        let mut forged_data = data.clone();
        for _ in 0..12 {
            let pos = rng.u64(..size as u64) as usize;
            forged_data[pos] ^= 0x40;
        }
        let (descriptor, tree) = build(&data, &params);
        let (_, forged_tree) = build(&forged_data, &params);
        let data_path = write_file(&dir, "data", &data);
        let (tree_path, tree_pos, descriptor) = if detached {
            let tree_path = write_file(&dir, "tree", &tree);
            (tree_path, 0, Some(descriptor.to_unsigned_bytes().to_vec()))
        } else {
            enable(&data_path, params).unwrap();
            let verifier = Verifier::new(ReadOptions::default());
            let file = common::open(&verifier, &data_path);
            (data_path.clone(), file.location().tree_pos, None)
        };
        let bs = bs as usize;
        let differing = |part, a: &[u8], b: &[u8]| {
            let blocks = a.chunks(bs).zip(b.chunks(bs)).enumerate();
            let changed = blocks.filter(|(_, (x, y))| x != y);
            let region = |(i, _): (usize, _)| (part, i * bs..((i + 1) * bs).min(a.len()));
            changed.map(region).collect::<Vec<_>>()
        };
        let mut forged_regions = differing(Part::Data, &data, &forged_data);
        let forged_blocks = forged_regions
            .iter()
            .map(|(_, r)| (r.start / bs) as u64)
            .collect();
        forged_regions.extend(differing(Part::Tree, &tree, &forged_tree));
        let mut backing = vec![(data_path.clone(), std::fs::read(&data_path).unwrap())];
        if detached {
            backing.push((tree_path.clone(), tree.clone()));
        }
        // The levels are stored top first: the top one is the first block.
        let top_block = 0..bs;
        Subject {
            name,
            data_path,
            tree_path,
            tree_pos,
            descriptor,
            data,
            tree,
            forged_data,
            forged_tree,
            forged_regions,
            forged_blocks,
            backing,
            bs,
            top_block,
        }
    }

    fn open(&self, verifier: &Arc<Verifier>) -> VerityFile {
        let data = File::open(&self.data_path).unwrap();
        let Some(descriptor) = &self.descriptor else {
            return VerityFile::open(verifier, data, "data".as_ref()).unwrap();
        };
        let tree = File::open(&self.tree_path).unwrap();
        VerityFile::open_detached(verifier, data, tree, descriptor, "data".as_ref()).unwrap()
    }

    /// Writes `range` of the data or tree, forged or original.
    fn write(&self, part: Part, range: Range<usize>, forged: bool) {
        let (file, pos, bytes) = match (part, forged) {
            (Part::Data, false) => (&self.data_path, 0, &self.data),
            (Part::Data, true) => (&self.data_path, 0, &self.forged_data),
            (Part::Tree, false) => (&self.tree_path, self.tree_pos, &self.tree),
            (Part::Tree, true) => (&self.tree_path, self.tree_pos, &self.forged_tree),
        };
        let at = pos + range.start as u64;
        open_rw(file).write_all_at(&bytes[range], at).unwrap();
    }

    /// Writes the whole forgery (but the top tree block, if `keep_top`),
    /// or undoes it.
    fn forge_all(&self, forged: bool, keep_top: bool) {
        for (part, range) in &self.forged_regions {
            if !(keep_top && *part == Part::Tree && *range == self.top_block) {
                self.write(*part, range.clone(), forged);
            }
        }
    }

    /// Cuts backing file `which` to `len` bytes.
    fn truncate(&self, which: usize, len: u64) {
        open_rw(&self.backing[which].0).set_len(len).unwrap();
    }

    /// Puts every backing file back as it was.
    fn restore(&self) {
        self.forge_all(false, false);
        for (path, bytes) in &self.backing {
            let file = open_rw(path);
            file.write_all_at(bytes, 0).unwrap();
            file.set_len(bytes.len() as u64).unwrap();
        }
    }

    /// Reads `len` bytes at `offset`: `Ok` only with the original bytes,
    /// else `EIO`. Panics on anything else.
    fn read(&self, file: &VerityFile, offset: u64, len: usize) -> bool {
        let mut buf = vec![0u8; len];
        match file.read_at(&mut buf, offset) {
            Ok(n) => {
                let end = (offset as usize + len).min(self.data.len());
                assert_eq!(n, end - offset as usize, "{}: {len} at {offset}", self.name);
                if buf[..n] != self.data[offset as usize..end] {
                    let forged = buf[..n] == self.forged_data[offset as usize..end];
                    panic!(
                        "{}: read of {len} at {offset} returned wrong bytes (forged: {forged})",
                        self.name
                    );
                }
                true
            }
            Err(e) => {
                assert_eq!(
                    e.errno(),
                    libc::EIO,
                    "{}: {len} at {offset}: {e}",
                    self.name
                );
                false
            }
        }
    }

    /// A random read, near a forged block more often than not.
    fn random_read(&self, rng: &mut Rng) -> (u64, usize) {
        let size = self.data.len() as u64;
        let bs = self.bs as u64;
        let near = self.forged_blocks[rng.u64(..self.forged_blocks.len() as u64) as usize];
        let offset = match rng.u64(..3) {
            0 => rng.u64(..size),
            _ => (near * bs + rng.u64(..2 * bs))
                .saturating_sub(bs)
                .min(size - 1),
        };
        let offset = if rng.u64(..2) == 0 {
            offset / bs * bs
        } else {
            offset
        };
        let len = match rng.u64(..5) {
            0 => rng.u64(..300 << 10) + (200 << 10),
            1 | 2 => rng.u64(..3 * bs) + 1,
            _ => bs * (rng.u64(..4) + 1),
        };
        (offset, len as usize)
    }
}

/// A verifier whose cache holds about one tree block per shard.
fn tiny_cache() -> Arc<Verifier> {
    Verifier::new(ReadOptions {
        merkle_readahead: true,
        cache_bytes: 0,
    })
}

/// Reads every block of `subject`, expecting each to succeed.
fn read_all(subject: &Subject, file: &VerityFile) {
    for offset in (0..subject.data.len()).step_by(subject.bs) {
        assert!(
            subject.read(file, offset as u64, subject.bs),
            "{}: {offset}",
            subject.name
        );
    }
}

#[test]
fn reloaded_tree_blocks_are_checked_again() {
    let dir = tempfile::tempdir().unwrap();
    for subject in subjects(dir.path()) {
        for keep_top in [true, false] {
            let verifiers = [tiny_cache(), Verifier::new(ReadOptions::default())];
            let files: Vec<_> = verifiers.iter().map(|v| subject.open(v)).collect();
            // Every tree block verified once, and most evicted again from
            // the tiny cache.
            files.iter().for_each(|file| read_all(&subject, file));
            subject.forge_all(true, keep_top);
            for file in &files {
                for &block in &subject.forged_blocks {
                    let pos = block * subject.bs as u64;
                    assert!(
                        !subject.read(file, pos, subject.bs),
                        "{}: forged block {block} read",
                        subject.name
                    );
                    assert!(!subject.read(file, pos + 1, 1), "{}", subject.name);
                }
                // Elsewhere: the original bytes or EIO.
                for offset in (0..subject.data.len()).step_by(subject.bs / 2 + 1) {
                    subject.read(file, offset as u64, subject.bs);
                }
            }
            subject.restore();
            read_all(&subject, &subject.open(&tiny_cache()));
        }
    }
}

#[test]
fn truncated_backing_files_fail_reads_without_stale_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for subject in subjects(dir.path()) {
        let bs = subject.bs as u64;
        let size = subject.data.len() as u64;
        let last = (size - 1) / bs * bs;
        let file = subject.open(&tiny_cache());
        // Fill this thread's buffer for unaligned reads with other bytes,
        // then cut the last data block short.
        assert!(subject.read(&file, 1, 64 << 10));
        subject.truncate(0, last + (size - last) / 2);
        assert!(!subject.read(&file, last + 1, 10), "{}", subject.name);
        assert!(!subject.read(&file, last, bs as usize), "{}", subject.name);
        assert!(
            !subject.read(&file, last - bs + 3, bs as usize),
            "{}",
            subject.name
        );
        // The failed reads left nothing behind that later reads return.
        subject.restore();
        assert!(subject.read(&file, 3, 100), "{}", subject.name);
        assert!(subject.read(&file, last + 1, 10), "{}", subject.name);
        // Cut the tree inside level 0 (the end of the stored tree), with
        // nothing cached yet.
        let file = subject.open(&tiny_cache());
        let which = subject.backing.len() - 1;
        let tree_end = subject.tree_pos + subject.tree.len() as u64;
        subject.truncate(which, tree_end - subject.tree.len() as u64 / 3);
        assert!(!subject.read(&file, last + 1, 10), "{}", subject.name);
        assert!(!subject.read(&file, last, 10), "{}", subject.name);
        subject.restore();
        read_all(&subject, &file);
    }
}

#[test]
fn failed_reads_leave_no_forged_bytes_in_the_buffer() {
    let dir = tempfile::tempdir().unwrap();
    for subject in subjects(dir.path()) {
        let file = subject.open(&Verifier::new(ReadOptions::default()));
        // Forged data under the genuine tree: the data blocks fail.
        for (part, range) in &subject.forged_regions {
            if *part == Part::Data {
                subject.write(*part, range.clone(), true);
            }
        }
        for &block in &subject.forged_blocks {
            let pos = block as usize * subject.bs;
            let end = (pos + subject.bs).min(subject.data.len());
            // Aligned reads go straight into the caller's buffer.
            let mut buf = vec![0xa5; end - pos];
            assert!(
                file.read_at(&mut buf, pos as u64).is_err(),
                "{}",
                subject.name
            );
            assert!(
                buf.iter().all(|&b| b == 0),
                "{}: block {block}: bytes left in the buffer of a failed read",
                subject.name
            );
        }
        subject.restore();
    }
}

#[test]
fn a_repaired_tree_reads_again_on_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    for subject in subjects(dir.path()) {
        let file = subject.open(&Verifier::new(ReadOptions::default()));
        // A forged tree under the genuine root hash: the blocks on the path
        // to a forged data block fail their checks.
        for (part, range) in &subject.forged_regions {
            if *part == Part::Tree {
                subject.write(*part, range.clone(), true);
            }
        }
        for &block in &subject.forged_blocks {
            let pos = block * subject.bs as u64;
            assert!(!subject.read(&file, pos, subject.bs), "{}", subject.name);
        }
        // Repaired storage: the same open file reads it all again.
        subject.restore();
        read_all(&subject, &file);
    }
}

/// How long each subject is attacked at least, and at most while too few
/// reads have succeeded or failed (on a busy machine).
const ATTACK: Duration = Duration::from_secs(3);
const MAX_ATTACK: Duration = Duration::from_secs(30);

/// Reads that must have succeeded, and failed, during an attack.
const ENOUGH_OK: u64 = 200;
const ENOUGH_FAILED: u64 = 20;

/// One attack: forges a random part of the file, restores it, or cuts a
/// backing file short for a moment.
fn attack_once(subject: &Subject, rng: &mut Rng) {
    let regions = &subject.forged_regions;
    match rng.u64(..5) {
        0 | 1 => {
            for (part, range) in regions {
                if rng.u64(..2) == 0 {
                    subject.write(*part, range.clone(), true);
                }
            }
        }
        2 | 3 => subject.forge_all(false, false),
        _ => {
            let which = rng.u64(..subject.backing.len() as u64) as usize;
            let len = subject.backing[which].1.len() as u64;
            subject.truncate(which, rng.u64(..len));
            std::thread::sleep(Duration::from_micros(rng.u64(..500)));
            subject.restore();
        }
    }
    std::thread::sleep(Duration::from_micros(rng.u64(..300)));
}

#[test]
fn concurrent_forgery_never_yields_forged_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for subject in subjects(dir.path()) {
        let file = subject.open(&tiny_cache());
        let stop = AtomicBool::new(false);
        let (ok, failed) = (AtomicU64::new(0), AtomicU64::new(0));
        let count = |good: bool| [&failed, &ok][good as usize].fetch_add(1, Relaxed);
        std::thread::scope(|s| {
            for t in 0..3 {
                let (subject, file, stop) = (&subject, &file, &stop);
                s.spawn(move || {
                    let mut rng = Rng::with_seed(t);
                    while !stop.load(Relaxed) {
                        let (offset, len) = subject.random_read(&mut rng);
                        count(subject.read(file, offset, len));
                    }
                });
            }
            // Reads on rayon's pool, whose threads also hash the large
            // reads: one may run another read while its own waits.
            let (subject, file, stop) = (&subject, &file, &stop);
            s.spawn(move || {
                let mut round = 0;
                while !stop.load(Relaxed) {
                    round += 1;
                    (0..32u64).into_par_iter().for_each(|i| {
                        let mut rng = Rng::with_seed(round << 8 | i);
                        let (offset, len) = subject.random_read(&mut rng);
                        count(subject.read(file, offset | 1, len.max(200 << 10)));
                    });
                }
            });
            let mut rng = Rng::with_seed(99);
            let start = Instant::now();
            let enough = || ok.load(Relaxed) >= ENOUGH_OK && failed.load(Relaxed) >= ENOUGH_FAILED;
            while start.elapsed() < ATTACK || (!enough() && start.elapsed() < MAX_ATTACK) {
                attack_once(subject, &mut rng);
            }
            stop.store(true, Relaxed);
        });
        subject.restore();
        let (ok, failed) = (ok.into_inner(), failed.into_inner());
        eprintln!(
            "{}: {ok} reads returned the original bytes, {failed} failed",
            subject.name
        );
        assert!(ok > 100, "{}: only {ok} reads succeeded", subject.name);
        assert!(
            failed > 10,
            "{}: the forgery was caught only {failed} times",
            subject.name
        );
        read_all(&subject, &subject.open(&tiny_cache()));
    }
}
