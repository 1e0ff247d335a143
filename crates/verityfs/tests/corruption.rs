//! Damaged verity files. For SHA-256 and SHA-512, 1 KiB, 4 KiB and 64 KiB
//! blocks, and files of every shape, each kind of damage to the backing
//! file (data blocks, each tree level, the descriptor, the location record,
//! truncation, swapped blocks, a foreign tree, appended bytes) must make
//! exactly the reads that depend on the damaged bytes fail with `EIO`, or
//! the open fail with the errno the kernel would give; every other read
//! must return the original bytes, and no read may ever return anything
//! else. A randomized test flips bits anywhere and checks that last rule.
//!
//! Each case damages the file in place, checks it with a fresh
//! [`Verifier`] (whose tree block cache holds nothing verified yet), and
//! undoes the damage.

mod common;

use std::collections::BTreeSet;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::{build, enable, open_rw, random_bytes};
use rustix::fs::{fremovexattr, fsetxattr, XattrFlags};
use verityfs::check::check_file;
use verityfs::layout::{Location, LOCATION_XATTR};
use verityfs::{HashAlgorithm, MerkleTreeParams, ReadOptions, TreeGeometry, Verifier, VerityFile};

const EIO: i32 = libc::EIO;
const EINVAL: i32 = libc::EINVAL;

/// Files up to this size are also read whole and scrubbed with
/// [`check_file`] in every case.
const WHOLE_FILE_CHECKS_UP_TO: usize = 4 << 20;

/// An enabled verity file and the bytes it must read as.
struct Subject {
    name: String,
    path: PathBuf,
    data: Vec<u8>,
    params: MerkleTreeParams,
    location: Location,
    geometry: TreeGeometry,
}

/// One change to a backing file.
enum Edit {
    /// XORs the byte at this position with 0x10.
    Flip(u64),
    /// Writes bytes at a position (past the end, the file grows).
    Write(u64, Vec<u8>),
    /// Truncates or extends the file.
    SetLen(u64),
    /// Replaces (or, with `None`, removes) the location record.
    Record(Option<Vec<u8>>),
}

/// What a damaged file must do.
enum Expect {
    /// Opening it fails with this errno.
    OpenFails(i32),
    /// It opens; reads touching these data blocks fail with `EIO`, all
    /// other reads return the original bytes.
    BadBlocks(BTreeSet<u64>),
}

use Edit::*;
use Expect::*;

fn none() -> Expect {
    BadBlocks(BTreeSet::new())
}

impl Subject {
    /// Writes a file of `size` bytes (only some blocks of it if `sparse`,
    /// the rest holes) and enables verity on it.
    fn new(dir: &Path, params: MerkleTreeParams, shape: &str, size: u64, sparse: bool) -> Self {
        let alg = params.hash_algorithm();
        let bs = params.block_size() as u64;
        let name = format!("{alg}-{bs}-{shape}");
        let path = dir.join(&name);
        let mut data = random_bytes(size as usize, size ^ bs);
        let file = File::create(&path).unwrap();
        if sparse {
            // Data in blocks 0, A + 1 and the last one, holes elsewhere.
            let a = 1u64 << params.log_arity();
            let keep = [0, (a + 1) * bs, (size - 1) / bs * bs];
            let kept: Vec<Range<usize>> = keep
                .map(|p| p as usize..((p + bs).min(size)) as usize)
                .to_vec();
            for (i, byte) in data.iter_mut().enumerate() {
                if !kept.iter().any(|r| r.contains(&i)) {
                    *byte = 0;
                }
            }
            file.set_len(size).unwrap();
            for r in kept {
                file.write_all_at(&data[r.clone()], r.start as u64).unwrap();
            }
        } else {
            file.write_all_at(&data, 0).unwrap();
        }
        drop(file);
        enable(&path, params).unwrap();
        let location = *open_fresh(&path, true).unwrap().location();
        Subject {
            name,
            path,
            geometry: TreeGeometry::new(&params, size),
            data,
            params,
            location,
        }
    }

    fn bs(&self) -> u64 {
        self.geometry.block_size() as u64
    }

    /// Number of data blocks.
    fn blocks(&self) -> u64 {
        self.geometry.data_blocks()
    }

    fn all_blocks(&self) -> BTreeSet<u64> {
        (0..self.blocks()).collect()
    }

    /// Byte range of data block `b`.
    fn block_range(&self, b: u64) -> Range<u64> {
        b * self.bs()..((b + 1) * self.bs()).min(self.data.len() as u64)
    }

    /// The data blocks whose verification goes through tree block `index`
    /// of `level`.
    fn covered(&self, level: usize, index: u64) -> BTreeSet<u64> {
        let shift = self.geometry.log_arity() * (level as u32 + 1);
        (index << shift..((index + 1) << shift).min(self.blocks())).collect()
    }

    /// Applies `edits`, checks that the file does what `expect` says (with
    /// and without Merkle tree readahead), and undoes the edits.
    fn case(&self, what: &str, edits: &[Edit], expect: Expect) {
        let undo = self.apply(edits);
        let what = format!("{}: {what}", self.name);
        for readahead in [true, false] {
            match (&expect, open_fresh(&self.path, readahead)) {
                (OpenFails(errno), Err(e)) => assert_eq!(e.errno(), *errno, "{what}: {e}"),
                (OpenFails(errno), Ok(_)) => panic!("{what}: opened; expected errno {errno}"),
                (BadBlocks(_), Err(e)) => panic!("{what}: open failed: {e}"),
                (BadBlocks(bad), Ok(file)) => self.check_reads(&file, bad, &what),
            }
        }
        undo.restore(&self.path);
    }

    /// Opens the file, then truncates the backing file to `len`: reads must
    /// fail with `EIO` or return the original bytes, and those of blocks
    /// cut off must fail.
    fn truncate_while_open(&self, len: u64) {
        let file = open_fresh(&self.path, true).unwrap();
        let undo = self.apply(&[SetLen(len)]);
        let what = format!("{}: truncated to {len} while open", self.name);
        for b in self.probes(&BTreeSet::new()) {
            let range = self.block_range(b);
            let result = self.read(&file, range.start, self.bs() as usize, &what);
            assert!(result.is_ok() || result == Err(EIO), "{what}: {result:?}");
            if range.end > len {
                assert_eq!(result, Err(EIO), "{what}: block {b}");
            }
        }
        undo.restore(&self.path);
    }

    /// Reads `len` bytes at `pos`: on success checks that the bytes are the
    /// original ones, and returns the errno of a failure.
    fn read(&self, file: &VerityFile, pos: u64, len: usize, what: &str) -> Result<(), i32> {
        let mut buf = vec![0xa5; len];
        let n = file.read_at(&mut buf, pos).map_err(|e| e.errno())?;
        let start = (pos as usize).min(self.data.len());
        let want = &self.data[start..(start + len).min(self.data.len())];
        assert!(
            buf[..n] == *want,
            "{what}: read of {len} at {pos} returned wrong bytes"
        );
        Ok(())
    }

    /// Data blocks to read in each case: all of them in small files; else
    /// the first and last, those at level-0 and level-1 boundaries, the
    /// middle one, and the neighbours of the first and last bad blocks.
    fn probes(&self, bad: &BTreeSet<u64>) -> BTreeSet<u64> {
        let n = self.blocks();
        let a = 1 << self.geometry.log_arity();
        let mut probes: BTreeSet<u64> = if n <= 64 {
            (0..n).collect()
        } else {
            [0, 1, a - 1, a, a + 1, a * a - 1, a * a, n / 2, n - 2, n - 1].into()
        };
        for &b in bad.iter().take(2).chain(bad.iter().rev().take(2)) {
            probes.extend([b.saturating_sub(1), b, b + 1]);
        }
        probes.retain(|&b| b < n);
        probes
    }

    /// Reads around every probe block: the block, one byte in it, and the
    /// block with its neighbours. A read fails with `EIO` if and only if it
    /// touches a bad block. Small files are also read whole and scrubbed.
    fn check_reads(&self, file: &VerityFile, bad: &BTreeSet<u64>, what: &str) {
        let bs = self.bs();
        let expect = |blocks: Range<u64>| {
            if bad.range(blocks).next().is_some() {
                Err(EIO)
            } else {
                Ok(())
            }
        };
        for b in self.probes(bad) {
            let r = self.block_range(b);
            let mid = (r.start + r.end) / 2;
            let around = b.saturating_sub(1)..b.saturating_sub(1) + 3;
            for (pos, len, blocks) in [
                (r.start, bs as usize, b..b + 1),
                (mid, 1, b..b + 1),
                (around.start * bs, 3 * bs as usize, around),
            ] {
                let got = self.read(file, pos, len, what);
                assert_eq!(got, expect(blocks), "{what}: read of {len} at {pos}");
            }
        }
        let size = self.data.len();
        if size <= WHOLE_FILE_CHECKS_UP_TO {
            let got = self.read(file, 0, size + 1, what);
            assert_eq!(got, expect(0..self.blocks()), "{what}: whole file");
            self.scrub(bad, what);
        }
    }

    /// [`check_file`] on a fresh open reports exactly the bad blocks.
    fn scrub(&self, bad: &BTreeSet<u64>, what: &str) {
        let file = open_fresh(&self.path, true).unwrap();
        let mut found = Vec::new();
        let summary = check_file(&file, &mut |_| {}, &mut |c| found.push(c.pos)).unwrap();
        let want: Vec<u64> = bad.iter().map(|b| b * self.bs()).collect();
        assert_eq!(found, want, "{what}: check_file");
        assert_eq!(summary.corrupted_blocks, bad.len() as u64, "{what}");
        assert_eq!(summary.data_blocks, self.blocks(), "{what}");
    }

    fn apply(&self, edits: &[Edit]) -> Undo {
        let file = open_rw(&self.path);
        let mut undo = Undo {
            len: file.metadata().unwrap().len(),
            location: self.location.encode().to_vec(),
            saved: Vec::new(),
        };
        let mut save = |pos: u64, len: u64| {
            let mut old = vec![0u8; len as usize];
            let n = file.read_at(&mut old, pos).unwrap();
            old.truncate(n);
            undo.saved.push((pos, old));
        };
        for edit in edits {
            match edit {
                Flip(pos) => save(*pos, 1),
                Write(pos, bytes) => save(*pos, bytes.len() as u64),
                SetLen(len) => {
                    let current = file.metadata().unwrap().len();
                    save(*len, current.saturating_sub(*len));
                }
                Record(_) => {}
            }
            match edit {
                Flip(pos) => {
                    let mut b = [0u8];
                    file.read_exact_at(&mut b, *pos).unwrap();
                    file.write_all_at(&[b[0] ^ 0x10], *pos).unwrap();
                }
                Write(pos, bytes) => file.write_all_at(bytes, *pos).unwrap(),
                SetLen(len) => file.set_len(*len).unwrap(),
                Record(Some(record)) => {
                    fsetxattr(&file, LOCATION_XATTR, record, XattrFlags::REPLACE).unwrap()
                }
                Record(None) => fremovexattr(&file, LOCATION_XATTR).unwrap(),
            }
        }
        undo
    }

    /// Every kind of damage, with what it must do.
    fn run_all_cases(&self) {
        let bs = self.bs();
        let n = self.blocks();
        let (size, loc) = (self.data.len() as u64, self.location);
        let end = loc.end().unwrap();
        self.case("intact", &[], none());

        // Data blocks, including holes of sparse files.
        for b in sample(n) {
            let r = self.block_range(b);
            let pos = r.start + (b * 131) % (r.end - r.start);
            self.case(
                &format!("data block {b}"),
                &[Flip(pos)],
                BadBlocks([b].into()),
            );
        }

        // Every level of the tree.
        for (level, info) in self.geometry.levels().iter().enumerate() {
            for index in sample(info.num_blocks) {
                let pos = loc.tree_pos
                    + (info.start_block + index) * bs
                    + (index * 97 + level as u64 * 41) % bs;
                let what = format!("tree level {level} block {index}");
                self.case(&what, &[Flip(pos)], BadBlocks(self.covered(level, index)));
            }
        }

        // The descriptor: the root hash and the salt (when there is one)
        // are only caught by reads; any other field fails the open.
        let d = self.params.digest_size() as u64;
        self.case(
            "root hash",
            &[Flip(loc.desc_pos + 16 + d - 1)],
            BadBlocks(self.all_blocks()),
        );
        let salted = !self.params.salt().as_bytes().is_empty();
        let salt = if salted {
            BadBlocks(self.all_blocks())
        } else {
            OpenFails(EINVAL)
        };
        self.case("descriptor salt", &[Flip(loc.desc_pos + 80)], salt);
        let mut fields = vec![
            ("version", 0),
            ("hash algorithm", 1),
            ("log_blocksize", 2),
            ("sig_size", 4),
            ("data_size", 8),
            ("reserved", 200),
        ];
        if d < 64 {
            fields.push(("root hash padding", 16 + d));
        }
        for (field, offset) in fields {
            let what = format!("descriptor {field}");
            self.case(&what, &[Flip(loc.desc_pos + offset)], OpenFails(EINVAL));
        }

        // The location record.
        let record = |offset: usize| {
            let mut r = loc.encode().to_vec();
            r[offset] ^= 0x10;
            Record(Some(r))
        };
        for (field, offset, errno) in [
            ("magic", 0, EINVAL),
            ("version", 4, EINVAL),
            ("data_size", 8, EINVAL),
            ("tree_pos", 16, EINVAL),
            ("tree_size", 24, EINVAL),
            ("desc_pos", 32, EINVAL),
            // 16 bytes more descriptor than the file holds.
            ("desc_size", 40, EIO),
            ("reserved", 46, EINVAL),
        ] {
            self.case(
                &format!("location {field}"),
                &[record(offset)],
                OpenFails(errno),
            );
        }
        let short = Record(Some(loc.encode()[..47].to_vec()));
        self.case("short location record", &[short], OpenFails(EINVAL));
        self.case(
            "no location record",
            &[Record(None)],
            OpenFails(libc::ENODATA),
        );

        // Truncation, found at open or, for an open file, by the reads.
        let mut cuts = vec![loc.tree_pos, loc.desc_pos + 128, end - 1];
        if size > 0 {
            cuts.push(size / 2);
        }
        if loc.tree_size > 0 {
            cuts.push(loc.tree_pos + loc.tree_size / 2);
        }
        for len in cuts {
            self.case(
                &format!("truncated to {len}"),
                &[SetLen(len)],
                OpenFails(EIO),
            );
            self.truncate_while_open(len);
        }

        // Two data blocks swapped (in one level-0 block, and across two).
        let full_blocks = size / bs;
        for (x, y) in [(0, 1), (0, 1 << self.geometry.log_arity())] {
            if y >= full_blocks {
                continue;
            }
            let block =
                |b: u64| self.data[self.block_range(b).start as usize..][..bs as usize].to_vec();
            assert_ne!(
                block(x),
                block(y),
                "{}: blocks {x} and {y} differ",
                self.name
            );
            let edits = [Write(x * bs, block(y)), Write(y * bs, block(x))];
            self.case(
                &format!("blocks {x} and {y} swapped"),
                &edits,
                BadBlocks([x, y].into()),
            );
        }

        // Another file's tree (same size and parameters, other data).
        if loc.tree_size > 0 {
            let other: Vec<u8> = self.data.iter().map(|b| !b).collect();
            let (_, tree) = build(&other, &self.params);
            let edits = [Write(loc.tree_pos, tree)];
            self.case("another file's tree", &edits, BadBlocks(self.all_blocks()));
        }

        // Bytes that belong to nothing: after the data and after the descriptor.
        if loc.tree_pos > size {
            self.case(
                "padding after the data",
                &[Flip(size), Flip(loc.tree_pos - 1)],
                none(),
            );
        }
        self.case(
            "appended bytes",
            &[Write(end, b"trailing garbage".to_vec())],
            none(),
        );
        self.case("appended hole", &[SetLen(end + (1 << 20))], none());

        // Every edit was undone.
        self.scrub(&BTreeSet::new(), &format!("{}: after all cases", self.name));
    }
}

/// How to put a backing file back as it was.
struct Undo {
    len: u64,
    location: Vec<u8>,
    /// Bytes overwritten or cut off, in the order they were saved.
    saved: Vec<(u64, Vec<u8>)>,
}

impl Undo {
    fn restore(self, path: &Path) {
        let file = open_rw(path);
        file.set_len(self.len).unwrap();
        for (pos, bytes) in self.saved.iter().rev() {
            file.write_all_at(bytes, *pos).unwrap();
        }
        fsetxattr(&file, LOCATION_XATTR, &self.location, XattrFlags::empty()).unwrap();
    }
}

/// Opens `path` with a verifier of its own.
fn open_fresh(path: &Path, merkle_readahead: bool) -> verityfs::Result<VerityFile> {
    let verifier = Verifier::new(ReadOptions {
        merkle_readahead,
        ..Default::default()
    });
    VerityFile::open(&verifier, File::open(path).unwrap(), path)
}

/// Up to about ten of `0..n`: all of a few, else both ends and some between.
fn sample(n: u64) -> BTreeSet<u64> {
    if n <= 10 {
        return (0..n).collect();
    }
    [0, 1, 2, n / 3, n / 2, n - 3, n - 2, n - 1].into()
}

/// Every shape of file, enabled, with every kind of damage.
fn all_shapes(alg: HashAlgorithm, bs: u64) {
    let dir = tempfile::tempdir().unwrap();
    // SHA-512 files get a salt, so that both kinds of descriptor are tried.
    let salt: &[u8] = if alg == HashAlgorithm::Sha512 {
        b"pepper"
    } else {
        b""
    };
    let params = MerkleTreeParams::new(alg, bs, salt).unwrap();
    let a = 1u64 << params.log_arity();
    let mut shapes = vec![
        ("empty", 0, false),
        ("one-block", bs, false),
        ("two-blocks", 2 * bs, false),
        ("three-blocks", 3 * bs, false),
        ("four-blocks", 4 * bs, false),
        ("partial-last-block", 2 * bs + bs / 3, false),
        ("two-levels", (a + 1) * bs + bs / 2, false),
        ("sparse", (2 * a + 5) * bs - 7, true),
    ];
    if (a * a + 1) * bs <= 2 << 20 {
        shapes.push(("three-levels", (a * a + 1) * bs + 1, false));
    }
    for (shape, size, sparse) in shapes {
        let subject = Subject::new(dir.path(), params, shape, size, sparse);
        let levels = subject.geometry.num_levels();
        assert!(
            shape != "two-levels" || levels == 2,
            "{shape}: {levels} levels"
        );
        assert!(
            shape != "three-levels" || levels == 3,
            "{shape}: {levels} levels"
        );
        subject.run_all_cases();
    }
}

#[test]
fn sha256_1k() {
    all_shapes(HashAlgorithm::Sha256, 1024);
}

#[test]
fn sha256_4k() {
    all_shapes(HashAlgorithm::Sha256, 4096);
}

#[test]
fn sha256_64k() {
    all_shapes(HashAlgorithm::Sha256, 65536);
}

#[test]
fn sha512_1k() {
    all_shapes(HashAlgorithm::Sha512, 1024);
}

#[test]
fn sha512_4k() {
    all_shapes(HashAlgorithm::Sha512, 4096);
}

#[test]
fn sha512_64k() {
    all_shapes(HashAlgorithm::Sha512, 65536);
}

/// Flips random bits anywhere in the backing file or its location record,
/// each time on a fresh copy: every read either fails with `EIO` or returns
/// exactly the original bytes, and a failed open fails with an errno the
/// kernel would give.
#[test]
fn random_bit_flips_never_yield_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = fastrand::Rng::with_seed(0x5eed_f11e);
    let subjects = [
        (HashAlgorithm::Sha256, 1024, &b""[..], 40_000, false),
        (HashAlgorithm::Sha512, 1024, b"salt", 300_000, false),
        (HashAlgorithm::Sha256, 4096, b"", 600_000, true),
    ];
    for (alg, bs, salt, size, sparse) in subjects {
        let params = MerkleTreeParams::new(alg, bs, salt).unwrap();
        let subject = Subject::new(dir.path(), params, "random", size, sparse);
        let backing = std::fs::read(&subject.path).unwrap();
        let record = subject.location.encode();
        let copy = dir.path().join("copy");
        let mut outcomes = [0u32; 3]; // open failed, some read failed, all reads good
                                      // Flips that leave every read good (all in unused bytes) are rare,
                                      // a few in a hundred: 240 tries see each outcome under most seeds.
        for iteration in 0..240 {
            let mut bytes = backing.clone();
            let mut rec = record;
            let mut flips = Vec::new();
            for _ in 0..rng.u32(1..=3) {
                let bit = 1u8 << rng.u32(..8);
                if rng.u32(..20) == 0 {
                    let i = rng.usize(..rec.len());
                    rec[i] ^= bit;
                    flips.push(format!("record[{i}]^{bit:#x}"));
                } else {
                    let i = rng.usize(..bytes.len());
                    bytes[i] ^= bit;
                    flips.push(format!("[{i}]^{bit:#x}"));
                }
            }
            std::fs::write(&copy, &bytes).unwrap();
            let file = File::open(&copy).unwrap();
            fsetxattr(&file, LOCATION_XATTR, &rec, XattrFlags::empty()).unwrap();
            let what = format!("{}: iteration {iteration}, flips {flips:?}", subject.name);
            let file = match VerityFile::open(&Verifier::new(ReadOptions::default()), file, &copy) {
                Ok(file) => file,
                Err(e) => {
                    assert!([EINVAL, EIO].contains(&e.errno()), "{what}: open: {e}");
                    outcomes[0] += 1;
                    continue;
                }
            };
            let mut failed = false;
            let mut reads = vec![(0, size as usize + 1)];
            for _ in 0..20 {
                reads.push((rng.u64(..size + 10), rng.usize(1..=3 * bs as usize)));
            }
            for (pos, len) in reads {
                let got = subject.read(&file, pos, len, &what);
                assert!(got.is_ok() || got == Err(EIO), "{what}: {got:?}");
                failed |= got.is_err();
            }
            outcomes[1 + usize::from(!failed)] += 1;
        }
        // The flips hit all three outcomes.
        assert!(
            outcomes.iter().all(|&n| n > 0),
            "{}: {outcomes:?}",
            subject.name
        );
    }
}
