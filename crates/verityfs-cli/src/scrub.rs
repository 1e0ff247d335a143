//! Checking one file for `verityfs verify`: open its stored form (the
//! backing file, also for paths through a mount), compare its digest with
//! an expected one if given, and check every data block against the tree.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;

use verityfs::check::check_file;
use verityfs::stripped::find_stripped;
use verityfs::{
    build_merkle_tree, Corruption, Digest, DiscardTree, Error, ExpectedDigest, HashAlgorithm,
    MerkleTreeParams, Verifier, VerityFile,
};

use crate::output::strerror;
use crate::progress::bytes_bar;

/// What checking a file found.
#[derive(Debug)]
pub enum Outcome {
    /// Every block verified (and the digest was the expected one).
    Ok { blocks: u64 },
    /// Every byte read through the mount, which verified it (the backing
    /// file could not be opened), and the digest was the expected one.
    OkThroughMount { bytes: u64 },
    /// Some blocks did not verify.
    Corrupted { blocks: u64, corrupted_blocks: u64 },
    /// An ordinary file.
    NotVerity,
    /// An ordinary file ending with verity metadata: a backing file copied
    /// without its extended attributes.
    Stripped,
    /// A verity file whose metadata is unusable.
    Invalid(String),
    /// The file's digest is not the expected one.
    WrongDigest,
    /// The file could not be opened or read to the end.
    Failed(String),
}

/// The finding for one file.
pub struct FileReport {
    /// The file's digest (`ALG:HEX`), once known.
    pub digest: Option<String>,
    /// Where a path through a mount is stored.
    pub backing: Option<std::path::PathBuf>,
    /// The verdict.
    pub outcome: Outcome,
    /// Each bad block, in file order.
    pub corruptions: Vec<Corruption>,
}

impl FileReport {
    fn new(outcome: Outcome) -> Self {
        FileReport {
            digest: None,
            backing: None,
            outcome,
            corruptions: Vec::new(),
        }
    }
}

/// Checks the file at `path` (a backing file or a path through a mount).
/// An ordinary file is compared with `expected` by computing its digest
/// with the default tree parameters. `on_corruption` sees each bad block
/// as it is found.
pub fn check_path(
    verifier: &Arc<Verifier>,
    path: &Path,
    expected: Option<&ExpectedDigest>,
    on_corruption: &mut dyn FnMut(&Corruption),
) -> FileReport {
    let located = match crate::locate::open(path) {
        Ok(located) => located,
        Err(_) if crate::locate::backing_path(path).is_some() => {
            return through_mount(path, expected)
        }
        Err(e) => return FileReport::new(Outcome::Failed(format!("can't open: {}", strerror(&e)))),
    };
    let probe = located.file.try_clone();
    let mut report = match VerityFile::open(verifier, located.file, path) {
        Ok(file) => check_verity(&file, expected, on_corruption),
        Err(Error::NotVerity) => not_verity(probe, expected),
        // No extended attributes here, so no verity files either.
        Err(Error::Io(e)) if e.kind() == io::ErrorKind::Unsupported => not_verity(probe, expected),
        Err(e) => FileReport::new(Outcome::Invalid(e.to_string())),
    };
    report.backing = located.backing;
    report
}

/// Checks a file on a mount whose backing file this user cannot open (a
/// private backing directory, another mount namespace): its digest from
/// `FS_IOC_MEASURE_VERITY`, then every byte read through the mount, which
/// verifies what it serves (and logs each bad block). Cached pages are
/// dropped first, so that the reads reach the daemon.
fn through_mount(path: &Path, expected: Option<&ExpectedDigest>) -> FileReport {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) => return FileReport::new(Outcome::Failed(format!("can't open: {}", strerror(&e)))),
    };
    let measured = match crate::ioctl::measure_verity(&file) {
        Ok(measured) => measured,
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => return not_verity(Ok(file), expected),
        Err(e) => return FileReport::new(Outcome::Failed(strerror(&e))),
    };
    let (Ok(alg), Some(digest)) = (
        HashAlgorithm::from_id(measured.algorithm.into()),
        Digest::from_slice(&measured.digest),
    ) else {
        return FileReport::new(Outcome::Failed("unknown digest algorithm".into()));
    };
    let mut report = FileReport::new(Outcome::WrongDigest);
    report.digest = Some(format!("{alg}:{digest}"));
    if expected.is_some_and(|e| !e.matches(alg, &digest)) {
        return report;
    }
    let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
    report.outcome = match read_all(&file) {
        Ok(bytes) => Outcome::OkThroughMount { bytes },
        Err((pos, e)) => Outcome::Failed(format!(
            "reading through the mount failed at byte {pos}: {} (its backing file is not \
             readable here)",
            strerror(&e)
        )),
    };
    report
}

/// Reads `file` to its end: the bytes read, or where and why it failed.
fn read_all(mut file: &File) -> Result<u64, (u64, io::Error)> {
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(pos),
            Ok(n) => pos += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((pos, e)),
        }
    }
}

/// Checks data against a separate tree and descriptor.
pub fn check_detached(
    verifier: &Arc<Verifier>,
    data: &Path,
    tree: &Path,
    descriptor: &Path,
    expected: Option<&ExpectedDigest>,
    on_corruption: &mut dyn FnMut(&Corruption),
) -> FileReport {
    let opened = (|| -> Result<VerityFile, String> {
        let open =
            |p: &Path| File::open(p).map_err(|e| format!("{}: {}", p.display(), strerror(&e)));
        let stored = std::fs::read(descriptor)
            .map_err(|e| format!("{}: {}", descriptor.display(), strerror(&e)))?;
        VerityFile::open_detached(verifier, open(data)?, open(tree)?, &stored, data)
            .map_err(|e| e.to_string())
    })();
    match opened {
        Ok(file) => check_verity(&file, expected, on_corruption),
        Err(e) => FileReport::new(Outcome::Invalid(e)),
    }
}

/// Compares the digest, then checks every block.
fn check_verity(
    file: &VerityFile,
    expected: Option<&ExpectedDigest>,
    on_corruption: &mut dyn FnMut(&Corruption),
) -> FileReport {
    let alg = file.descriptor().params().hash_algorithm();
    let mut report = FileReport::new(Outcome::WrongDigest);
    report.digest = Some(format!("{alg}:{}", file.digest()));
    if expected.is_some_and(|e| !file.matches(e)) {
        return report;
    }
    let bar = bytes_bar(file.data_size(), &file.name().to_string_lossy());
    let corruptions = &mut report.corruptions;
    let result = check_file(file, &mut |done| bar.set_position(done), &mut |c| {
        bar.suspend(|| on_corruption(c));
        corruptions.push(c.clone());
    });
    bar.finish_and_clear();
    report.outcome = match result {
        Ok(s) if s.is_ok() => Outcome::Ok {
            blocks: s.data_blocks,
        },
        Ok(s) => Outcome::Corrupted {
            blocks: s.data_blocks,
            corrupted_blocks: s.corrupted_blocks,
        },
        Err(e) => Outcome::Failed(format!("reading failed: {e}")),
    };
    report
}

/// An ordinary file: stripped verity metadata, a match for the expected
/// digest, or just not verity.
fn not_verity(file: io::Result<File>, expected: Option<&ExpectedDigest>) -> FileReport {
    let file = match file {
        Ok(file) => file,
        Err(e) => return FileReport::new(Outcome::Failed(strerror(&e))),
    };
    match find_stripped(&file) {
        Ok(Some(_)) => return FileReport::new(Outcome::Stripped),
        Ok(None) => {}
        Err(e) => return FileReport::new(Outcome::Failed(e.to_string())),
    }
    match expected {
        Some(expected) => plain_digest(&file, expected),
        None => FileReport::new(Outcome::NotVerity),
    }
}

/// The digest of an ordinary file with the default tree parameters and
/// the expected digest's algorithm, compared with it.
fn plain_digest(file: &File, expected: &ExpectedDigest) -> FileReport {
    let alg = expected.algorithm().unwrap_or_default();
    let params = MerkleTreeParams::new(alg, 4096, b"").expect("default parameters are valid");
    let computed = file.metadata().map_err(Error::from).and_then(|m| {
        build_merkle_tree(
            &params,
            m.len(),
            io::BufReader::new(file),
            DiscardTree,
            &mut |_| Ok(()),
        )
    });
    match computed {
        Ok((descriptor, _)) => {
            let digest = descriptor.file_digest();
            let mut report = FileReport::new(match expected.matches(alg, &digest) {
                true => Outcome::Ok {
                    blocks: descriptor.data_size().div_ceil(4096),
                },
                false => Outcome::WrongDigest,
            });
            report.digest = Some(format!("{alg}:{digest}"));
            report
        }
        Err(e) => FileReport::new(Outcome::Failed(format!("reading failed: {e}"))),
    }
}
