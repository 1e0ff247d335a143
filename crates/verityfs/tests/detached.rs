//! Data, Merkle tree and descriptor in separate files, as the real
//! `fsverity digest --out-merkle-tree --out-descriptor` (fsverity-utils)
//! writes them: [`VerityFile::open_detached`], [`VerifiedReader`] and the
//! `verify_download` example program. Intact files read back as written;
//! damaged data, tree or descriptor stop the stream at the first bad block.
//!
//! Needs `/usr/bin/fsverity` (`apt-get install fsverity`). The example's
//! source is compiled into this test and its `verify_download` function
//! (the whole program but for the real stdout, stderr and exit) is called
//! in-process.

mod common;

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;

use verityfs::{Error, ReadOptions, VerifiedReader, Verifier, VerityFile};

const FSVERITY: &str = "/usr/bin/fsverity";

/// A file and what `fsverity digest` made of it.
struct Shipped {
    _dir: tempfile::TempDir,
    data: PathBuf,
    tree: PathBuf,
    descriptor: PathBuf,
    /// `sha256:HEX` as `fsverity digest` printed it.
    digest: String,
    bytes: Vec<u8>,
}

/// Writes `bytes` and runs `fsverity digest` with `params` on it.
fn ship(bytes: Vec<u8>, params: &[&str]) -> Shipped {
    let dir = tempfile::tempdir().unwrap();
    let data = common::write_file(dir.path(), "data", &bytes);
    let tree = dir.path().join("data.tree");
    let descriptor = dir.path().join("data.desc");
    let out = Command::new(FSVERITY)
        .arg("digest")
        .arg(&data)
        .arg(format!("--out-merkle-tree={}", tree.display()))
        .arg(format!("--out-descriptor={}", descriptor.display()))
        .args(params)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {FSVERITY} (apt-get install fsverity): {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    let digest = line.split(' ').next().unwrap().to_owned();
    Shipped {
        _dir: dir,
        data,
        tree,
        descriptor,
        digest,
        bytes,
    }
}

impl Shipped {
    /// Opens the three files with a verifier of its own.
    fn open(&self) -> verityfs::Result<VerityFile> {
        VerityFile::open_detached(
            &Verifier::new(ReadOptions::default()),
            File::open(&self.data).unwrap(),
            File::open(&self.tree).unwrap(),
            &fs::read(&self.descriptor).unwrap(),
            &self.data,
        )
    }

    /// Everything a [`VerifiedReader`] gives before its first error, and
    /// that error.
    fn read_all(&self) -> (Vec<u8>, Option<io::Error>) {
        let mut reader = VerifiedReader::new(self.open().unwrap());
        let mut got = Vec::new();
        let err = reader.read_to_end(&mut got).err();
        (got, err)
    }
}

fn sizes_and_params() -> Vec<(usize, Vec<&'static str>)> {
    vec![
        (0, vec![]),
        (1, vec![]),
        (4096, vec![]),
        (1_000_000, vec![]),
        (
            3_000_000,
            vec!["--hash-alg=sha512", "--block-size=1024", "--salt=c0ffee"],
        ),
        (70_000, vec!["--block-size=65536"]),
        (
            600_000,
            vec![
                "--block-size=2048",
                "--salt=00112233445566778899aabbccddeeff",
            ],
        ),
    ]
}

#[test]
fn intact_files_read_back_with_fsverity_digest() {
    for (size, params) in sizes_and_params() {
        let s = ship(common::random_bytes(size, size as u64), &params);
        let file = s.open().unwrap();
        let alg = file.descriptor().params().hash_algorithm();
        assert_eq!(
            format!("{alg}:{}", file.digest()),
            s.digest,
            "{size} {params:?}"
        );
        assert_eq!(file.data_size(), size as u64);
        let (got, err) = s.read_all();
        assert!(err.is_none(), "{size} {params:?}: {err:?}");
        assert!(got == s.bytes, "{size} {params:?}: data differs");
        // The tree reads back as fsverity wrote it.
        let tree = fs::read(&s.tree).unwrap();
        let meta = file
            .read_metadata(verityfs::MetadataType::MerkleTree, 0, tree.len() + 1)
            .unwrap();
        assert!(meta == tree);
        // Random access.
        let mut reader = VerifiedReader::with_buffer_size(&file, 1);
        for pos in [size / 2, size.saturating_sub(1), 0, size / 3, size] {
            reader.seek(SeekFrom::Start(pos as u64)).unwrap();
            let mut buf = vec![0u8; 5000];
            let n = reader.read(&mut buf).unwrap();
            assert!(n > 0 || pos == size, "{size} {params:?} at {pos}");
            assert!(buf[..n] == s.bytes[pos..pos + n]);
        }
    }
}

#[test]
fn corrupted_data_fails_at_the_first_bad_block() {
    for (size, params) in sizes_and_params().into_iter().filter(|(s, _)| *s > 0) {
        let s = ship(common::random_bytes(size, 7), &params);
        let bs = s.open().unwrap().geometry().block_size() as u64;
        for bad in [size as u64 - 1, size as u64 / 2, 0] {
            common::flip(&s.data, bad);
            let (got, err) = s.read_all();
            let err = err.unwrap_or_else(|| panic!("{size} {params:?}: byte {bad} not caught"));
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            let c = verityfs::corruption(&err).unwrap();
            let block = bad / bs * bs;
            assert_eq!(
                (c.pos, c.level),
                (block, -1),
                "{size} {params:?} byte {bad}"
            );
            assert_eq!(c.file, s.data);
            assert_eq!(got.len() as u64, block);
            assert!(got == s.bytes[..block as usize]);
            let inner = err.get_ref().unwrap().downcast_ref::<Error>().unwrap();
            assert_eq!(inner.errno(), libc::EIO);
            assert!(err.to_string().contains("FILE CORRUPTED! pos="), "{err}");
            common::flip(&s.data, bad);
        }
    }
}

#[test]
fn corrupted_tree_fails_at_the_first_block_it_covers() {
    for (size, params) in [
        (1_000_000, vec![]),
        (3_000_000, vec!["--hash-alg=sha512", "--block-size=1024"]),
    ] {
        let s = ship(common::random_bytes(size, 9), &params);
        let file = s.open().unwrap();
        let g = file.geometry();
        let bs = g.block_size() as u64;
        let log_arity = g.log_arity();
        assert!(g.num_levels() >= 2);
        for level in 0..g.num_levels() {
            let info = g.levels()[level];
            // The last block of the level: the first data block it covers.
            let index = info.num_blocks - 1;
            let tree_pos = (info.start_block + index) * bs + 3;
            let first_data_block = index << (log_arity * (level as u32 + 1));
            common::flip(&s.tree, tree_pos);
            let (got, err) = s.read_all();
            let err = err.expect("tree damage not caught");
            let c = verityfs::corruption(&err).unwrap();
            assert_eq!(
                (c.pos, c.level),
                (first_data_block * bs, level as i32),
                "{params:?} level {level}"
            );
            assert_eq!(got.len() as u64, first_data_block * bs);
            assert!(got == s.bytes[..got.len()]);
            common::flip(&s.tree, tree_pos);
        }
    }
}

#[test]
fn wrong_descriptor_or_sizes_are_refused_or_caught() {
    let s = ship(common::random_bytes(200_000, 3), &[]);
    let descriptor = fs::read(&s.descriptor).unwrap();
    // A changed root hash: another digest, and nothing verifies.
    let mut other = descriptor.clone();
    other[16] ^= 1;
    let file = VerityFile::open_detached(
        &Verifier::new(ReadOptions::default()),
        File::open(&s.data).unwrap(),
        File::open(&s.tree).unwrap(),
        &other,
        &s.data,
    )
    .unwrap();
    assert_ne!(format!("sha256:{}", file.digest()), s.digest);
    let top = file.geometry().num_levels() as i32 - 1;
    let err = VerifiedReader::new(file).read(&mut [0; 10]).unwrap_err();
    assert_eq!(verityfs::corruption(&err).unwrap().level, top);

    let open_with = |data: &Path, tree: &Path, desc: &[u8]| {
        VerityFile::open_detached(
            &Verifier::new(ReadOptions::default()),
            File::open(data).unwrap(),
            File::open(tree).unwrap(),
            desc,
            data,
        )
    };
    // A truncated download, an over-long one, a tree of the wrong size,
    // a malformed descriptor.
    let short = s._dir.path().join("short");
    fs::write(&short, &s.bytes[..199_999]).unwrap();
    let long = s._dir.path().join("long");
    fs::write(&long, [&s.bytes[..], b"x"].concat()).unwrap();
    for (data, tree, desc) in [
        (&short, &s.tree, &descriptor[..]),
        (&long, &s.tree, &descriptor[..]),
        (&s.data, &long, &descriptor[..]),
        (&s.data, &s.tree, &descriptor[..255]),
    ] {
        let e = open_with(data, tree, desc).err().expect("refused");
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        assert!(matches!(e, Error::InvalidDescriptor(_)), "{e}");
    }
}

// ---------------------------------------------------------------------------
// The example program
// ---------------------------------------------------------------------------

#[allow(dead_code)] // its `main`
#[path = "../examples/verify_download.rs"]
mod example;

/// What the `verify_download` example printed and returned.
struct Output {
    status: u8,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs the `verify_download` example (compiled into this test, so that
/// it is always the current source) on `args`.
fn run_example(args: &[&Path], expected: Option<&str>) -> Output {
    let mut argv: Vec<String> = args.iter().map(|p| p.display().to_string()).collect();
    argv.extend(expected.map(str::to_owned));
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let status = example::verify_download(&argv, &mut stdout, &mut stderr);
    Output {
        status,
        stdout,
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

fn verify_download(s: &Shipped, expected: Option<&str>) -> Output {
    run_example(&[&s.data, &s.tree, &s.descriptor], expected)
}

#[test]
fn example_streams_verified_data_and_checks_the_digest() {
    let s = ship(common::random_bytes(2_500_000, 11), &["--hash-alg=sha512"]);
    let compact = s.digest.split_once(':').unwrap().1.to_owned();
    for expected in [None, Some(s.digest.as_str()), Some(compact.as_str())] {
        let out = verify_download(&s, expected);
        assert_eq!(out.status, 0, "{}", out.stderr);
        assert!(out.stdout == s.bytes);
        assert_eq!(out.stderr, "");
    }
    let wrong = format!("sha512:{}", "0".repeat(128));
    let out = verify_download(&s, Some(&wrong));
    assert_eq!(out.status, 1);
    assert!(out.stdout.is_empty());
    assert!(out.stderr.contains("digest mismatch"), "{}", out.stderr);

    let out = run_example(&[Path::new("x")], None);
    assert_eq!(out.status, 2);
    assert!(out
        .stderr
        .starts_with("Usage: verify_download DATA TREE DESCRIPTOR"));
}

#[test]
fn example_stops_at_corruption() {
    let s = ship(common::random_bytes(2_500_000, 12), &[]);
    common::flip(&s.data, 1_234_567);
    let out = verify_download(&s, Some(&s.digest));
    assert_eq!(out.status, 1);
    let bad_block = 1_234_567 / 4096 * 4096;
    assert_eq!(out.stdout.len(), bad_block);
    assert!(out.stdout == s.bytes[..bad_block]);
    let stderr = &out.stderr;
    let want = format!(
        "verify_download: ERROR: {}: FILE CORRUPTED! pos={bad_block}, level=-1, want_hash=sha256:",
        s.data.display()
    );
    assert!(stderr.starts_with(&want), "{stderr}");

    // A missing file names the file and the reason.
    fs::remove_file(&s.tree).unwrap();
    let out = verify_download(&s, None);
    assert_eq!(out.status, 1);
    let stderr = &out.stderr;
    assert!(
        stderr.contains(&format!("can't open '{}': No such file", s.tree.display())),
        "{stderr}"
    );
}
