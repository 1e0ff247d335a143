//! The scenarios the kernel oracle runs twice, on ext4 under a real kernel
//! and on a verityfs mount: where they run ([`Backend`]), what they record
//! ([`Records`]) and the table of differences FUSE makes unavoidable
//! ([`known`]).

pub mod hostile;
pub mod known;
pub mod read_only;
pub mod scenarios;
pub mod signatures;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{run, run_ok, Mount};

/// The ext4 block size of the oracle's scratch disk
/// (`scripts/kernel-oracle.sh` makes it with `mkfs.ext4 -b 4096`).
const EXT4_BLOCK: u64 = 4096;

/// Where the scenarios run.
pub enum Backend {
    /// A directory of an ext4 filesystem on `device`, under the kernel's
    /// own fs-verity.
    Ext4 { dir: PathBuf, device: PathBuf },
    /// A verityfs mount.
    Verityfs(Mount),
}

impl Backend {
    /// The directory the scenarios work in.
    pub fn dir(&self) -> &Path {
        match self {
            Backend::Ext4 { dir, .. } => dir,
            Backend::Verityfs(m) => &m.mnt,
        }
    }

    /// Flips the byte at `pos` of what the filesystem stores for `path`
    /// (the data, or the Merkle tree from `round_up(size, 65536)` on, where
    /// both ext4 and verityfs keep it), behind fs-verity's back. The pages
    /// the kernel already cached stay as they were until caches are
    /// dropped.
    pub fn corrupt(&self, path: &Path, pos: u64) {
        match self {
            Backend::Verityfs(m) => {
                let rel = path.strip_prefix(&m.mnt).expect("a path in the mount");
                crate::common::flip_byte(&m.backing.join(rel), pos);
            }
            Backend::Ext4 { device, .. } => {
                run_ok(&mut Command::new("sync"));
                let ino = fs::metadata(path).unwrap().ino();
                let block = pos / EXT4_BLOCK;
                let request = format!("bmap <{ino}> {block}");
                let out = run_ok(Command::new("debugfs").arg("-R").arg(&request).arg(device));
                let physical: u64 = out
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("debugfs {request}: {out:?}"));
                assert!(physical > 0, "{path:?}: block {block} is not allocated");
                crate::common::flip_byte(device, physical * EXT4_BLOCK + pos % EXT4_BLOCK);
            }
        }
    }
}

/// What each scenario gave: its name and a one-line result (an errno name,
/// `ok`, a digest...), comparable between runs.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Records(pub BTreeMap<String, String>);

impl Records {
    /// Records `value` for the scenario `name` (each name once).
    pub fn add(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let name = name.into();
        let value = value.into().replace('\n', "\\n");
        assert!(
            !name.contains('\t') && !name.contains('\n'),
            "bad name {name:?}"
        );
        if let Some(old) = self.0.insert(name.clone(), value) {
            panic!("scenario {name} recorded twice (first: {old})");
        }
    }

    /// Adds all of `other`'s records.
    pub fn merge(&mut self, other: Records) {
        for (name, value) in other.0 {
            self.add(name, value);
        }
    }

    /// One `NAME<TAB>VALUE` line per scenario.
    pub fn to_text(&self) -> String {
        self.0.iter().map(|(k, v)| format!("{k}\t{v}\n")).collect()
    }

    pub fn parse(text: &str) -> Records {
        let mut records = Records::default();
        for line in text.lines() {
            let (k, v) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("bad record {line:?}"));
            records.add(k, v);
        }
        records
    }
}

/// The names of the errnos fs-verity and FUSE give.
const ERRNO_NAMES: &[(i32, &str)] = &[
    (libc::EPERM, "EPERM"),
    (libc::ENOENT, "ENOENT"),
    (libc::EINTR, "EINTR"),
    (libc::EIO, "EIO"),
    (libc::EBADF, "EBADF"),
    (libc::ENOMEM, "ENOMEM"),
    (libc::EACCES, "EACCES"),
    (libc::EFAULT, "EFAULT"),
    (libc::EBUSY, "EBUSY"),
    (libc::EEXIST, "EEXIST"),
    (libc::EISDIR, "EISDIR"),
    (libc::EINVAL, "EINVAL"),
    (libc::ETXTBSY, "ETXTBSY"),
    (libc::EFBIG, "EFBIG"),
    (libc::EROFS, "EROFS"),
    (libc::ENOTTY, "ENOTTY"),
    (libc::EMSGSIZE, "EMSGSIZE"),
    (libc::EOVERFLOW, "EOVERFLOW"),
    (libc::ENODATA, "ENODATA"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::EBADMSG, "EBADMSG"),
    (libc::ENOKEY, "ENOKEY"),
    (libc::EKEYREJECTED, "EKEYREJECTED"),
    (libc::ENOPKG, "ENOPKG"),
    (libc::ENOSYS, "ENOSYS"),
    (libc::E2BIG, "E2BIG"),
];

pub fn errno_name(errno: i32) -> String {
    ERRNO_NAMES
        .iter()
        .find(|(e, _)| *e == errno)
        .map_or_else(|| format!("errno {errno}"), |(_, n)| (*n).to_owned())
}

/// `ok` or the errno's name.
pub fn outcome<T>(result: io::Result<T>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => e.raw_os_error().map_or_else(|| e.to_string(), errno_name),
    }
}

/// A short digest of `bytes`, to record contents without listing them.
pub fn fingerprint(bytes: &[u8]) -> String {
    let alg = verityfs::HashAlgorithm::from_id(1).unwrap();
    let hex = alg.hash(bytes).to_hex();
    format!("{} bytes, sha256 {}", bytes.len(), &hex[..16])
}

/// The result of reading `len` bytes at `offset` of `path`: `ok` and a
/// fingerprint, or the errno.
pub fn read_at(path: &Path, offset: u64, len: usize) -> String {
    let read = || -> io::Result<Vec<u8>> {
        let file = File::open(path)?;
        let mut buf = vec![0u8; len];
        let n = file.read_at(&mut buf, offset)?;
        buf.truncate(n);
        Ok(buf)
    };
    match read() {
        Ok(data) => format!("ok {}", fingerprint(&data)),
        Err(e) => outcome::<()>(Err(e)),
    }
}

/// `path`'s whole contents' fingerprint, or the errno of reading it.
pub fn read_all(path: &Path) -> String {
    match fs::read(path) {
        Ok(data) => format!("ok {}", fingerprint(&data)),
        Err(e) => outcome::<()>(Err(e)),
    }
}

/// Opens `path` with `options` and reports `ok` or the errno.
pub fn open_outcome(path: &Path, options: &OpenOptions) -> String {
    outcome(options.open(path))
}

/// A command's outcome as one line: its exit status and its messages,
/// with `path` written as `FILE` (the paths differ between runs).
pub fn command_outcome(cmd: &mut Command, path: &Path) -> String {
    let out = run(cmd);
    let text = format!(
        "{} {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.replace(path.to_str().unwrap(), "FILE")
        .trim_end()
        .to_owned()
}
