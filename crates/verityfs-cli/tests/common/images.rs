//! What the image suites share (`image_mount.rs`, `remote_mount.rs`,
//! `remote_s3.rs`): the test tree, `verityfs publish` of it, an [`Image`]
//! published in a directory, a listing to compare a mount with its source,
//! and the mount's counters.

use std::ffi::OsStr;
use std::fs::{self, File, FileTimes, Permissions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use super::{digest, prerequisites, random_bytes, run_ok, Mount, VERITYFS};

/// A name that is not ASCII.
pub const UNICODE_NAME: &str = "ünïcødé 名前.txt";

/// Nested directories, an empty file, symlinks (relative, absolute,
/// dangling), a non-ASCII name, a file named `big` of `big_size` bytes, a
/// private file and an executable, with times down to the nanosecond.
pub fn make_tree(src: &Path, big_size: usize) {
    fs::create_dir_all(src.join("a/b/c")).unwrap();
    fs::create_dir(src.join("empty dir")).unwrap();
    let files: &[(&str, Vec<u8>, u32)] = &[
        ("big", random_bytes(big_size, 7), 0o644),
        ("empty", Vec::new(), 0o644),
        ("a/b/c/deep", b"deep\n".to_vec(), 0o444),
        ("a/run.sh", b"#!/bin/sh\necho hi\n".to_vec(), 0o755),
        ("a/private", b"secret\n".to_vec(), 0o600),
        ("a/dup", b"deep\n".to_vec(), 0o640),
        (UNICODE_NAME, "unicode ✓\n".as_bytes().to_vec(), 0o644),
    ];
    for (i, (name, data, mode)) in files.iter().enumerate() {
        let path = src.join(name);
        fs::write(&path, data).unwrap();
        fs::set_permissions(&path, Permissions::from_mode(*mode)).unwrap();
        let mtime = SystemTime::UNIX_EPOCH + Duration::new(1_600_000_000 + i as u64, 123_456_789);
        let file = File::options().write(true).open(&path).unwrap();
        file.set_times(FileTimes::new().set_modified(mtime))
            .unwrap();
    }
    std::os::unix::fs::symlink("b/c/deep", src.join("a/link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", src.join("absolute")).unwrap();
    std::os::unix::fs::symlink("nowhere", src.join("dangling")).unwrap();
    fs::set_permissions(src.join("a/b"), Permissions::from_mode(0o750)).unwrap();
}

/// Runs `verityfs publish SRC DEST` with the environment variables `env`,
/// which must succeed; returns the one digest it prints (`sha256:HEX`).
pub fn publish(src: &Path, dest: &OsStr, env: &[(&str, String)]) -> String {
    let out = run_ok(
        Command::new(VERITYFS)
            .arg("publish")
            .arg(src)
            .arg(dest)
            .envs(env.iter().map(|(k, v)| (k, v))),
    );
    let digest = out.strip_suffix('\n').expect("one line").to_owned();
    let hex = digest.strip_prefix("sha256:").expect("sha256:HEX");
    assert!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{out:?}"
    );
    digest
}

/// What the listing compares of one path: name, kind, mode, size (not of
/// directories, whose sizes are the filesystem's), mtime, symlink target.
#[derive(Debug, PartialEq)]
pub struct Listed {
    pub path: PathBuf,
    pub kind: &'static str,
    pub mode: u32,
    pub size: Option<u64>,
    pub mtime: (i64, i64),
    pub target: Option<PathBuf>,
}

/// Every path under `root`, sorted, without following symlinks.
pub fn listing(root: &Path) -> Vec<Listed> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            let kind = match m.file_type() {
                t if t.is_dir() => "dir",
                t if t.is_file() => "file",
                t if t.is_symlink() => "symlink",
                _ => "other",
            };
            if m.is_dir() {
                dirs.push(path.clone());
            }
            out.push(Listed {
                path: path.strip_prefix(root).unwrap().to_path_buf(),
                kind,
                mode: m.mode() & 0o7777,
                size: (!m.is_dir()).then_some(m.len()),
                mtime: (m.mtime(), m.mtime_nsec()),
                target: m.is_symlink().then(|| fs::read_link(&path).unwrap()),
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The regular files of a listing.
pub fn regular_files(listed: &[Listed]) -> impl Iterator<Item = &Path> {
    listed
        .iter()
        .filter(|l| l.kind == "file")
        .map(|l| l.path.as_path())
}

/// A counter of `verityfs stats MNT`.
pub fn counter(mnt: &Path, name: &str) -> u64 {
    let stats = run_ok(Command::new(VERITYFS).arg("stats").arg(mnt));
    let key = format!("\"{name}\": ");
    let at = stats.find(&key).unwrap_or_else(|| panic!("{stats}")) + key.len();
    let digits: String = stats[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// A source tree, its image and a mount point, in one temporary directory.
pub struct Image {
    _dir: tempfile::TempDir,
    pub src: PathBuf,
    pub image: PathBuf,
    /// The digest `verityfs publish` printed.
    pub digest: String,
}

impl Image {
    /// Publishes the test tree ([`make_tree`]) with a file `big` of
    /// `big_size` random bytes.
    pub fn publish(big_size: usize) -> Image {
        prerequisites();
        let dir = tempfile::Builder::new()
            .prefix("verityfs-image-test")
            .tempdir()
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let (src, image) = (base.join("src"), base.join("image"));
        make_tree(&src, big_size);
        let digest = publish(&src, image.as_os_str(), &[]);
        Image {
            _dir: dir,
            src,
            image,
            digest,
        }
    }

    /// Mounts the image's directory with its digest and `args`.
    pub fn mount(&self, args: &[&str]) -> Mount {
        self.mount_from(&self.image, args)
    }

    /// Mounts the image at `source` (its directory or a URL) with its
    /// digest and `args`.
    pub fn mount_from(&self, source: &Path, args: &[&str]) -> Mount {
        let digest = format!("--digest={}", self.digest);
        let args: Vec<&str> = [&digest[..]]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        Mount::of_backing(source, &args)
    }

    /// The fs-verity digest's hex of source file `name`: its object's name
    /// is `sha256-HEX`.
    pub fn object_hex(&self, name: &str) -> String {
        let digest = digest(&self.src.join(name), &[]);
        digest.strip_prefix("sha256:").unwrap().to_owned()
    }

    /// The object holding the contents of source file `name`.
    pub fn object_of(&self, name: &str) -> PathBuf {
        let hex = self.object_hex(name);
        self.image.join("objects").join(format!("sha256-{hex}"))
    }
}

/// Reads of the mounted image `mount` of the test tree whose file `big`
/// (source `src`) is damaged at byte `damaged`: the block with the damage
/// and a whole read fail with `EIO`, reported in the log and counted;
/// the first block, the block before the damage and other files read.
pub fn assert_damaged_block_only(mount: &Mount, src: &Path, damaged: u64) {
    use std::io::Read;
    use std::os::unix::fs::FileExt;
    let big = File::open(mount.path("big")).unwrap();
    let original = fs::read(src.join("big")).unwrap();
    let mut block = vec![0u8; 4096];
    big.read_exact_at(&mut block, 0).unwrap();
    assert!(block == original[..4096], "the first block verifies");
    let block_start = damaged / 4096 * 4096;
    big.read_exact_at(&mut block, block_start - 4096).unwrap();
    assert!(
        block[..] == original[block_start as usize - 4096..block_start as usize],
        "the block before verifies"
    );
    let eio = |result: std::io::Result<usize>, what: &str| {
        let e = result.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}");
    };
    eio(big.read_at(&mut block, block_start), "the damaged block");
    let mut all = Vec::new();
    eio(
        File::open(mount.path("big")).unwrap().read_to_end(&mut all),
        "all",
    );
    let deep = fs::read(mount.path("a/b/c/deep")).unwrap();
    assert_eq!(deep, b"deep\n", "other files are fine");
    assert!(mount.log().contains("FILE CORRUPTED!"), "{}", mount.log());
    assert!(counter(&mount.mnt, "verification_failures") >= 1);
}
