//! Stress on one mount, in the pattern of xfstests' generic/579: reader
//! threads read random ranges of several verity files and
//! check every byte against the contents kept in memory, while mutator
//! threads create, write, enable (raw ioctl, random parameters, sometimes
//! racing a second enable or watched by a reader of the file being
//! enabled), rename, link and delete other files, and a thread drops the
//! page cache every 200 ms so reads keep reaching the daemon.
//!
//! It runs for `VERITYFS_STRESS_SECS` seconds (default 15; seed
//! `VERITYFS_STRESS_SEED`) and fails on any wrong byte, any unexpected
//! error (reads of verity files never fail; an enable succeeds or gives a
//! documented errno: `EBUSY`/`EEXIST` when racing another, `ETXTBSY` with a
//! writer open), a thread making no progress for 30 s (deadlock), the
//! daemon's resident memory passing 200 MiB, or an unclean unmount (the
//! daemon must exit 0 within 5 s of `umount`).
//!
//! Needs what `mount.rs` needs (root, `/dev/fuse`, `fsverity`).

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fastrand::Rng;

use common::*;

/// Seconds of stress unless `VERITYFS_STRESS_SECS` says otherwise.
const DEFAULT_SECS: u64 = 15;
/// Seed unless `VERITYFS_STRESS_SEED` says otherwise.
const DEFAULT_SEED: u64 = 0x5772_e555_0579;
/// Threads reading the fixed verity files.
const READERS: usize = 4;
/// Threads changing other files.
const MUTATORS: usize = 3;
/// How often the page cache is dropped.
const DROP_CACHES_EVERY: Duration = Duration::from_millis(200);
/// The most resident memory the daemon may use.
const RSS_LIMIT_KIB: u64 = 200 << 10;
/// A thread that makes no progress this long is stuck.
const STALL_LIMIT: Duration = Duration::from_secs(30);
/// How long the daemon may take to exit after `umount`.
const UNMOUNT_LIMIT: Duration = Duration::from_secs(5);
/// Files a mutator keeps at most.
const MAX_FILES_PER_MUTATOR: usize = 12;

/// The verity files the readers read: size, algorithm, block size, salt.
const READ_FILES: &[(usize, u32, u32, &[u8])] = &[
    (1, 1, 4096, b""),
    (4096, 2, 1024, b"salt"),
    (100_000, 1, 1024, b"0123456789abcdef0123456789abcdef"),
    ((1 << 20) + 12_345, 1, 4096, b""),
    ((3 << 20) + 7, 2, 4096, b"pepper"),
    ((6 << 20) - 1, 1, 65536, b"x"),
];

// ---------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------

/// What the threads count.
#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    direct_reads: AtomicU64,
    measures: AtomicU64,
    creates: AtomicU64,
    writes: AtomicU64,
    enables: AtomicU64,
    watched_enables: AtomicU64,
    watched_reads: AtomicU64,
    enable_races: AtomicU64,
    refused: AtomicU64,
    renames: AtomicU64,
    links: AtomicU64,
    /// `ENOENT` from `link(2)` by the FUSE driver's link count (see
    /// `Mutator::hard_link`).
    kernel_nlink_races: AtomicU64,
    unlinks: AtomicU64,
    cache_drops: AtomicU64,
}

/// What all threads share.
struct Shared {
    mnt: PathBuf,
    stop: AtomicBool,
    failures: Mutex<Vec<String>>,
    counters: Counters,
    /// Enable results by errno name.
    enable_results: Mutex<BTreeMap<String, u64>>,
    /// Per worker: what it is doing and since when.
    status: Vec<Mutex<(String, Instant)>>,
}

impl Shared {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Records a failure and stops everyone.
    fn fail(&self, what: String) {
        let mut failures = self.failures.lock().unwrap();
        if failures.len() < 50 {
            failures.push(what);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Worker `id` starts doing `what`.
    fn doing(&self, id: usize, what: impl Into<String>) {
        *self.status[id].lock().unwrap() = (what.into(), Instant::now());
    }

    fn count(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn enable_result(&self, result: &io::Result<()>) {
        let key = match result {
            Ok(()) => "ok".to_owned(),
            Err(e) => errno_name(e),
        };
        *self.enable_results.lock().unwrap().entry(key).or_default() += 1;
    }
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EBUSY) => "EBUSY".into(),
        Some(libc::EEXIST) => "EEXIST".into(),
        Some(libc::ETXTBSY) => "ETXTBSY".into(),
        _ => e.to_string(),
    }
}

/// Verity parameters.
#[derive(Clone, Debug)]
struct Params {
    alg: u32,
    block_size: u32,
    salt: Vec<u8>,
}

impl Params {
    fn random(rng: &mut Rng) -> Params {
        let salt_len = rng.pick(&[0, 0, 1, 16, 32]);
        Params {
            alg: rng.pick(&[1, 1, 2]),
            block_size: rng.pick(&[1024, 4096, 4096, 65536]),
            salt: random_bytes(salt_len, rng.u64(..)),
        }
    }

    fn arg(&self) -> EnableArg {
        EnableArg {
            hash_algorithm: self.alg,
            block_size: self.block_size,
            salt: self.salt.clone(),
            ..EnableArg::default()
        }
    }

    fn digest(&self, data: &[u8]) -> String {
        digest_of(data, self.alg, self.block_size, &self.salt)
    }
}

/// `FS_IOC_ENABLE_VERITY` on `file` with `params`.
fn enable_fd(file: &File, params: &Params) -> io::Result<()> {
    verity_ioctl(file, VerityIoctl::Enable(&params.arg())).map(drop)
}

/// `FS_IOC_MEASURE_VERITY` on `file`: `ALG:HEX`.
fn measure_fd(file: &File) -> io::Result<String> {
    let out = verity_ioctl(file, VerityIoctl::Measure { digest_size: 64 })?;
    Ok(format_digest(&out).expect("a digest that fits"))
}

/// Reads up to `len` bytes at `offset` (until `len` or the end of file).
fn read_range(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Checks that a read of `len` bytes at `offset` of a file holding `data`
/// returned `got`; describes the first difference.
fn check_bytes(data: &[u8], offset: u64, len: usize, got: &[u8]) -> Result<(), String> {
    let start = (offset as usize).min(data.len());
    let end = (offset as usize).saturating_add(len).min(data.len());
    let expected = &data[start..end];
    if got == expected {
        return Ok(());
    }
    match got.iter().zip(expected).position(|(a, b)| a != b) {
        Some(i) => Err(format!(
            "wrong byte at offset {}: got {:#04x}, expected {:#04x} ({} bytes read of {len} at {offset})",
            start + i,
            got[i],
            expected[i],
            got.len()
        )),
        None => Err(format!(
            "{} bytes read of {len} at {offset}, expected {} (file of {} bytes)",
            got.len(),
            expected.len(),
            data.len()
        )),
    }
}

/// A random range of a file of `size` bytes: offsets past the end too,
/// lengths from one byte to a few MiB.
fn random_range(rng: &mut Rng, size: usize) -> (u64, usize) {
    let offset = match rng.u64(..10) {
        0 => 0,
        1 => size.saturating_sub(rng.usize(..5000)),
        2 => size + rng.usize(..10_000),
        3 => rng.usize(..=size / 4096) * 4096,
        _ => rng.usize(..=size),
    };
    let len = match rng.u64(..10) {
        0 => 1,
        1 => size + 1,
        2 => 4096,
        3 => 1 + rng.usize(..3 << 20),
        _ => 1 + rng.usize(..256 << 10),
    };
    (offset as u64, len)
}

// ---------------------------------------------------------------------------
// Readers
// ---------------------------------------------------------------------------

/// A verity file the readers read.
struct ReadFile {
    path: PathBuf,
    data: Vec<u8>,
    digest: String,
}

fn reader(shared: &Shared, id: usize, files: &[ReadFile], seed: u64) {
    let mut rng = Rng::with_seed(seed);
    // Long-lived descriptors, opened once, plus fresh ones per read.
    let kept: Vec<File> = files.iter().map(|f| File::open(&f.path).unwrap()).collect();
    while shared.running() {
        let i = rng.usize(..files.len());
        let f = &files[i];
        let (offset, len) = random_range(&mut rng, f.data.len());
        let how = rng.u64(..10);
        let what = format!(
            "reading {len} bytes at {offset} of {} ({})",
            f.path.display(),
            ["kept fd", "fresh fd", "O_DIRECT fd"][(how as usize).min(2)]
        );
        shared.doing(id, &what);
        let result = match how {
            0..=5 => read_range(&kept[i], offset, len),
            6..=8 => File::open(&f.path).and_then(|file| read_range(&file, offset, len)),
            _ => {
                Shared::count(&shared.counters.direct_reads, 1);
                OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&f.path)
                    .and_then(|file| read_range(&file, offset, len))
            }
        };
        match result {
            Ok(got) => {
                if let Err(e) = check_bytes(&f.data, offset, len, &got) {
                    shared.fail(format!("{what}: {e}"));
                }
                Shared::count(&shared.counters.reads, 1);
                Shared::count(&shared.counters.read_bytes, got.len() as u64);
            }
            Err(e) => shared.fail(format!("{what}: {e}")),
        }
        if rng.percent(3) {
            shared.doing(id, format!("measuring {}", f.path.display()));
            match measure_fd(&kept[i]) {
                Ok(d) if d == f.digest => Shared::count(&shared.counters.measures, 1),
                other => shared.fail(format!(
                    "measure of {}: {other:?}, expected {}",
                    f.path.display(),
                    f.digest
                )),
            }
            match fs::metadata(&f.path) {
                Ok(md) if md.len() == f.data.len() as u64 => {}
                other => shared.fail(format!("stat of {}: {other:?}", f.path.display())),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Mutators
// ---------------------------------------------------------------------------

/// A file a mutator owns.
struct Owned {
    name: String,
    data: Arc<Vec<u8>>,
    /// The digest, once verity.
    digest: Option<String>,
}

struct Mutator<'a> {
    shared: &'a Shared,
    id: usize,
    rng: Rng,
    files: Vec<Owned>,
    made: u64,
    /// The readers' files, to link to.
    read_files: &'a [ReadFile],
}

impl Mutator<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.shared.mnt.join(name)
    }

    fn fresh_name(&mut self) -> String {
        self.made += 1;
        format!("m{}-{}", self.id, self.made)
    }

    fn doing(&self, what: String) {
        self.shared.doing(self.id, what);
    }

    /// Fails the run on an unexpected error.
    fn check<T>(&self, what: &str, result: io::Result<T>) -> Option<T> {
        result
            .map_err(|e| {
                self.shared
                    .fail(format!("mutator {}: {what}: {e}", self.id))
            })
            .ok()
    }

    fn run(&mut self) {
        while self.shared.running() {
            let plain: Vec<usize> = (0..self.files.len())
                .filter(|&i| self.files[i].digest.is_none())
                .collect();
            let action = self.rng.u64(..100);
            match action {
                _ if self.files.len() < 2 => self.create(),
                0..=19 if self.files.len() < MAX_FILES_PER_MUTATOR => self.create(),
                0..=34 if !plain.is_empty() => {
                    let i = self.rng.pick(&plain);
                    self.enable(i)
                }
                35..=44 if !plain.is_empty() => {
                    let i = self.rng.pick(&plain);
                    self.write(i)
                }
                45..=59 => self.rename(),
                60..=69 => self.unlink(),
                70..=79 => self.link_a_read_file(),
                80..=89 => self.refused_writes(),
                _ => self.verify_one(),
            }
        }
    }

    /// Creates a file of random size, written in random chunks.
    fn create(&mut self) {
        let name = self.fresh_name();
        let size = match self.rng.u64(..10) {
            0 => 0,
            1..=5 => self.rng.usize(..64 << 10),
            6..=8 => self.rng.usize(..1 << 20),
            _ => self.rng.usize(..4 << 20),
        };
        let data = random_bytes(size, self.rng.u64(..));
        let path = self.path(&name);
        self.doing(format!("creating {name} ({size} bytes)"));
        let written = File::create(&path).and_then(|mut file| {
            let mut done = 0;
            while done < size {
                let chunk = (1 + self.rng.usize(..300_000)).min(size - done);
                file.write_all(&data[done..done + chunk])?;
                done += chunk;
            }
            if self.rng.percent(20) {
                file.sync_all()?;
            }
            Ok(())
        });
        if self.check(&format!("creating {name}"), written).is_some() {
            Shared::count(&self.shared.counters.creates, 1);
            self.files.push(Owned {
                name,
                data: Arc::new(data),
                digest: None,
            });
        }
    }

    /// Overwrites part of a plain file, or appends to it.
    fn write(&mut self, i: usize) {
        let name = self.files[i].name.clone();
        let mut data = self.files[i].data.as_ref().clone();
        let offset = self.rng.usize(..data.len() + 1);
        let len = 1 + self.rng.usize(..200_000);
        let new = random_bytes(len, self.rng.u64(..));
        if data.len() < offset + len {
            data.resize(offset + len, 0);
        }
        data[offset..offset + len].copy_from_slice(&new);
        self.doing(format!("writing {len} bytes at {offset} of {name}"));
        let path = self.path(&name);
        let result = OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|file| file.write_all_at(&new, offset as u64));
        if self.check(&format!("writing {name}"), result).is_some() {
            Shared::count(&self.shared.counters.writes, 1);
            let got = self.check(&format!("reading {name} back"), fs::read(&path));
            if got.is_some_and(|got| got != data) {
                self.shared
                    .fail(format!("{name}: wrong contents after a write"));
            }
            self.files[i].data = Arc::new(data);
        }
    }

    /// Enables verity on plain file `i`: plainly, racing a second enable,
    /// with a writer open first, or watched by a reader.
    fn enable(&mut self, i: usize) {
        let name = self.files[i].name.clone();
        let data = self.files[i].data.clone();
        let path = self.path(&name);
        let params = Params::random(&mut self.rng);
        let digest = params.digest(&data);
        let what = format!("enabling {name} ({} bytes, {params:?})", data.len());
        self.doing(what.clone());
        if self.rng.percent(15) {
            // A writer is open: ETXTBSY, and nothing changes.
            let writer = self.check(&what, OpenOptions::new().append(true).open(&path));
            let reader = self.check(&what, File::open(&path));
            let (Some(_writer), Some(reader)) = (writer, reader) else {
                return;
            };
            let result = enable_fd(&reader, &params);
            self.shared.enable_result(&result);
            match result {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {}
                other => {
                    return self.shared.fail(format!(
                        "{what} with a writer open: {other:?}, expected ETXTBSY"
                    ))
                }
            }
            match measure_fd(&reader) {
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                other => {
                    return self
                        .shared
                        .fail(format!("{what}: measure after ETXTBSY: {other:?}"))
                }
            }
        }
        let ok = match self.rng.u64(..10) {
            0..=2 => self.racing_enable(&path, &params, &what),
            3..=5 => self.watched_enable(&path, &params, &data, &digest, &what),
            _ => {
                let result = File::open(&path).and_then(|file| enable_fd(&file, &params));
                self.shared.enable_result(&result);
                self.check(&what, result).is_some()
            }
        };
        if !ok {
            return;
        }
        Shared::count(&self.shared.counters.enables, 1);
        self.files[i].digest = Some(digest.clone());
        match raw_measure(&path, 64) {
            Ok(d) if d == digest => {}
            other => {
                return self
                    .shared
                    .fail(format!("{what}: measure {other:?}, expected {digest}"))
            }
        }
        let got = self.check(&format!("{what}: reading back"), fs::read(&path));
        if got.is_some_and(|got| got != *data) {
            self.shared
                .fail(format!("{what}: wrong contents after enable"));
        }
    }

    /// Two enables of the same file at once: one succeeds, the other gives
    /// EBUSY (still running) or EEXIST (already done).
    fn racing_enable(&mut self, path: &Path, params: &Params, what: &str) -> bool {
        Shared::count(&self.shared.counters.enable_races, 1);
        let barrier = Barrier::new(2);
        let results: Vec<io::Result<()>> = thread::scope(|s| {
            let racers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let file = File::open(path)?;
                        barrier.wait();
                        enable_fd(&file, params)
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for r in &results {
            self.shared.enable_result(r);
        }
        let oks = results.iter().filter(|r| r.is_ok()).count();
        let documented = results.iter().all(|r| match r {
            Ok(()) => true,
            Err(e) => matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EEXIST)),
        });
        if oks != 1 || !documented {
            self.shared
                .fail(format!("{what}: two racing enables gave {results:?}"));
            return false;
        }
        true
    }

    /// The enable generic/579 watches: a reader with a descriptor opened
    /// before the enable (and fresh ones) reads random ranges all along,
    /// and measures: `ENODATA` until the enable returns, the digest after.
    fn watched_enable(
        &mut self,
        path: &Path,
        params: &Params,
        data: &[u8],
        digest: &str,
        what: &str,
    ) -> bool {
        Shared::count(&self.shared.counters.watched_enables, 1);
        let Some(early) = self.check(what, File::open(path)) else {
            return false;
        };
        let done = AtomicBool::new(false);
        let seed = self.rng.u64(..);
        let shared = self.shared;
        let result = thread::scope(|s| {
            s.spawn(|| {
                let mut rng = Rng::with_seed(seed);
                let mut reads_after = 0;
                while shared.running() && reads_after < 20 {
                    let finished = done.load(Ordering::SeqCst);
                    let (offset, len) = random_range(&mut rng, data.len());
                    let got = if rng.percent(50) {
                        read_range(&early, offset, len)
                    } else {
                        File::open(path).and_then(|f| read_range(&f, offset, len))
                    };
                    match got {
                        Ok(got) => {
                            if let Err(e) = check_bytes(data, offset, len, &got) {
                                shared.fail(format!("{what}: watcher (finished: {finished}): {e}"));
                            }
                        }
                        Err(e) => shared.fail(format!("{what}: watcher read: {e}")),
                    }
                    Shared::count(&shared.counters.watched_reads, 1);
                    match measure_fd(&early) {
                        Ok(d) if d == digest => {}
                        Err(e) if !finished && e.raw_os_error() == Some(libc::ENODATA) => {}
                        other => shared.fail(format!(
                            "{what}: watcher measure (finished: {finished}): {other:?}"
                        )),
                    }
                    if finished {
                        reads_after += 1;
                    }
                }
            });
            let result = File::open(path).and_then(|file| enable_fd(&file, params));
            done.store(true, Ordering::SeqCst);
            result
        });
        self.shared.enable_result(&result);
        self.check(what, result).is_some()
    }

    /// Renames one of the files, sometimes over another.
    fn rename(&mut self) {
        if self.files.is_empty() {
            return;
        }
        let i = self.rng.usize(..self.files.len());
        let over = self.files.len() > 1 && self.rng.percent(30);
        let new = if over {
            let j = (i + self.rng.usize(1..self.files.len())) % self.files.len();
            self.files[j].name.clone()
        } else {
            self.fresh_name()
        };
        let old = self.files[i].name.clone();
        self.doing(format!("renaming {old} to {new}"));
        let result = fs::rename(self.path(&old), self.path(&new));
        if self
            .check(&format!("renaming {old} to {new}"), result)
            .is_some()
        {
            Shared::count(&self.shared.counters.renames, 1);
            self.files.retain(|f| f.name != new);
            let f = self.files.iter_mut().find(|f| f.name == old).unwrap();
            f.name = new;
        }
    }

    /// Deletes one of the files.
    fn unlink(&mut self) {
        if self.files.len() < 3 {
            return;
        }
        let i = self.rng.usize(..self.files.len());
        let name = self.files[i].name.clone();
        self.doing(format!("deleting {name}"));
        if self
            .check(
                &format!("deleting {name}"),
                fs::remove_file(self.path(&name)),
            )
            .is_some()
        {
            Shared::count(&self.shared.counters.unlinks, 1);
            self.files.remove(i);
        }
    }

    /// Links one of the readers' verity files (each mutator its own ones),
    /// renames the link, reads through it, and deletes it (the readers'
    /// name stays).
    fn link_a_read_file(&mut self) {
        let mine: Vec<usize> = (0..self.read_files.len())
            .filter(|i| i % MUTATORS == self.id - READERS)
            .collect();
        let f = &self.read_files[self.rng.pick(&mine)];
        let (a, b) = (self.fresh_name(), self.fresh_name());
        self.doing(format!("linking {} as {a}, then {b}", f.path.display()));
        let what = format!("link {a}/{b} of {}", f.path.display());
        let result = self
            .hard_link(&f.path, &self.path(&a))
            .and_then(|()| fs::rename(self.path(&a), self.path(&b)))
            .and_then(|()| {
                let md = fs::metadata(self.path(&b))?;
                let file = File::open(self.path(&b))?;
                let (offset, len) = random_range(&mut self.rng, f.data.len());
                let got = read_range(&file, offset, len)?;
                if let Err(e) = check_bytes(&f.data, offset, len, &got) {
                    self.shared.fail(format!("{what}: {e}"));
                }
                if md.len() != f.data.len() as u64 {
                    self.shared.fail(format!("{what}: stat {md:?}"));
                }
                match measure_fd(&file) {
                    Ok(d) if d == f.digest => {}
                    other => self.shared.fail(format!("{what}: measure {other:?}")),
                }
                fs::remove_file(self.path(&b))
            });
        if self.check(&what, result).is_some() {
            Shared::count(&self.shared.counters.links, 1);
        }
    }

    /// `link(2)`, retried after a kernel link-count race.
    ///
    /// The kernel's FUSE driver keeps its own link count and lowers it
    /// itself when an unlink returns (`fuse_entry_unlinked()`); a reply that
    /// already carries the count after that unlink (a `GETATTR` or `LOOKUP`
    /// answered by another daemon thread) but is processed first makes it
    /// count the unlink twice. `vfs_link()` then refuses the inode, which it
    /// believes has no links left, with `ENOENT`, without asking the daemon.
    /// New attributes (past the daemon's 1 s attribute timeout) repair the
    /// count.
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut attempts = 0;
        loop {
            match fs::hard_link(from, to) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && attempts < 3 => {
                    attempts += 1;
                    Shared::count(&self.shared.counters.kernel_nlink_races, 1);
                    thread::sleep(Duration::from_millis(1100));
                    fs::metadata(from)?;
                }
                other => return other,
            }
        }
    }

    /// Verity files refuse writers and truncation (EPERM).
    fn refused_writes(&mut self) {
        let verity: Vec<usize> = (0..self.files.len())
            .filter(|&i| self.files[i].digest.is_some())
            .collect();
        if verity.is_empty() {
            return;
        }
        let name = self.files[self.rng.pick(&verity)].name.clone();
        self.doing(format!("opening verity file {name} for writing"));
        let path = self.path(&name);
        for (how, result) in [
            ("O_WRONLY", OpenOptions::new().write(true).open(&path)),
            ("O_APPEND", OpenOptions::new().append(true).open(&path)),
            (
                "O_TRUNC",
                OpenOptions::new().write(true).truncate(true).open(&path),
            ),
        ] {
            match result {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => self
                    .shared
                    .fail(format!("{how} open of verity file {name}: {other:?}")),
            }
        }
        Shared::count(&self.shared.counters.refused, 1);
    }

    /// Reads one whole file back; measures it.
    fn verify_one(&mut self) {
        if self.files.is_empty() {
            return;
        }
        let i = self.rng.usize(..self.files.len());
        self.verify(i);
    }

    fn verify(&self, i: usize) {
        let f = &self.files[i];
        let path = self.path(&f.name);
        self.doing(format!("verifying {}", f.name));
        match fs::read(&path) {
            Ok(got) if got == *f.data => {}
            Ok(got) => self.shared.fail(format!(
                "{}: {}",
                f.name,
                check_bytes(&f.data, 0, f.data.len() + 1, &got).unwrap_err()
            )),
            Err(e) => self.shared.fail(format!("reading {}: {e}", f.name)),
        }
        let measured = raw_measure(&path, 64);
        match (&f.digest, measured) {
            (Some(d), Ok(m)) if *d == m => {}
            (None, Err(e)) if e.raw_os_error() == Some(libc::ENODATA) => {}
            (expected, got) => self.shared.fail(format!(
                "measure of {}: {got:?}, expected {expected:?}",
                f.name
            )),
        }
    }
}

// ---------------------------------------------------------------------------
// The daemon
// ---------------------------------------------------------------------------

/// The daemon's resident memory, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The daemon's threads, their state and where they wait (for deadlock
/// reports).
fn daemon_threads(pid: u32) -> String {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return "(no /proc entry)".into();
    };
    let mut out = String::new();
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap_or_default();
        let stat = read("stat");
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').next())
            .unwrap_or("?")
            .to_owned();
        out += &format!(
            "  {} {} state {state} wchan {}\n",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan").trim()
        );
    }
    out
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={value}: {e}")))
}

#[test]
fn concurrent_reads_enables_renames_deletes_and_cache_drops() {
    let secs = env_number("VERITYFS_STRESS_SECS").unwrap_or(DEFAULT_SECS);
    let seed = env_number("VERITYFS_STRESS_SEED").unwrap_or(DEFAULT_SEED);
    eprintln!("stress: VERITYFS_STRESS_SECS={secs} VERITYFS_STRESS_SEED={seed:#x}");
    let mut m = Mount::new();
    let pid = m.daemon_pid().as_raw_nonzero().get() as u32;

    // The readers' verity files.
    let mut read_files = Vec::new();
    for (i, &(size, alg, block_size, salt)) in READ_FILES.iter().enumerate() {
        let data = random_bytes(size, seed ^ i as u64);
        let path = write_file(&m, &format!("r{i}"), &data);
        let params = Params {
            alg,
            block_size,
            salt: salt.to_vec(),
        };
        enable_fd(&File::open(&path).unwrap(), &params).unwrap();
        let digest = params.digest(&data);
        assert_eq!(raw_measure(&path, 64).unwrap(), digest);
        read_files.push(ReadFile { path, data, digest });
    }
    let read_files = Arc::new(read_files);

    let workers = READERS + MUTATORS;
    let shared = Arc::new(Shared {
        mnt: m.mnt.clone(),
        stop: AtomicBool::new(false),
        failures: Mutex::default(),
        counters: Counters::default(),
        enable_results: Mutex::default(),
        status: (0..workers)
            .map(|_| Mutex::new(("starting".into(), Instant::now())))
            .collect(),
    });
    let mut threads = Vec::new();
    for id in 0..workers {
        let (shared, read_files) = (shared.clone(), read_files.clone());
        let seed = seed.wrapping_add(1000 * (id as u64 + 1));
        threads.push(thread::spawn(move || {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if id < READERS {
                    reader(&shared, id, &read_files, seed);
                } else {
                    let mut mutator = Mutator {
                        shared: &shared,
                        id,
                        rng: Rng::with_seed(seed),
                        files: Vec::new(),
                        made: 0,
                        read_files: &read_files,
                    };
                    mutator.run();
                    // Everything it kept is intact.
                    for i in 0..mutator.files.len() {
                        mutator.verify(i);
                    }
                }
            }));
            if let Err(panic) = run {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                shared.fail(format!("worker {id} panicked: {text}"));
            }
            shared.doing(id, "done");
        }));
    }
    let dropper = {
        let shared = shared.clone();
        thread::spawn(move || {
            while shared.running() {
                thread::sleep(DROP_CACHES_EVERY);
                drop_caches();
                Shared::count(&shared.counters.cache_drops, 1);
            }
        })
    };

    // Watch: memory, progress, the clock.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut max_rss = 0;
    let stalled = |shared: &Shared| {
        shared.status.iter().enumerate().find_map(|(id, s)| {
            let (what, since) = &*s.lock().unwrap();
            (what != "done" && since.elapsed() > STALL_LIMIT)
                .then(|| format!("worker {id} stuck for {:?} {what}", since.elapsed()))
        })
    };
    while shared.running() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        let rss = rss_kib(pid).unwrap_or_else(|| panic!("the daemon is gone:\n{}", m.log()));
        max_rss = max_rss.max(rss);
        if rss > RSS_LIMIT_KIB {
            shared.fail(format!("daemon RSS {rss} KiB > {RSS_LIMIT_KIB} KiB"));
        }
        if let Some(stuck) = stalled(&shared) {
            panic!("{stuck}\ndaemon threads:\n{}", daemon_threads(pid));
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    let stop_at = Instant::now();
    while threads.iter().any(|t| !t.is_finished()) {
        if let Some(stuck) = stalled(&shared) {
            panic!(
                "{stuck} (after the stop)\ndaemon threads:\n{}",
                daemon_threads(pid)
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    for t in threads {
        t.join().unwrap();
    }
    dropper.join().unwrap();
    let wind_down = stop_at.elapsed();
    let ran = started.elapsed();

    let c = &shared.counters;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "stress: {ran:.1?} (wind-down {wind_down:.1?}): {} reads ({} MiB, {} O_DIRECT), {} measures, \
         {} creates, {} writes, {} enables ({} watched with {} reads, {} races), {} renames, \
         {} links ({} link retries after the FUSE driver's link-count race), {} deletes, \
         {} refused-write checks, {} cache drops; daemon max RSS {} MiB; enable results {:?}",
        n(&c.reads),
        n(&c.read_bytes) >> 20,
        n(&c.direct_reads),
        n(&c.measures),
        n(&c.creates),
        n(&c.writes),
        n(&c.enables),
        n(&c.watched_enables),
        n(&c.watched_reads),
        n(&c.enable_races),
        n(&c.renames),
        n(&c.links),
        n(&c.kernel_nlink_races),
        n(&c.unlinks),
        n(&c.refused),
        n(&c.cache_drops),
        max_rss >> 10,
        shared.enable_results.lock().unwrap(),
    );
    let failures = shared.failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} failures (seed {seed:#x}):\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every kind of operation ran, so none of them passed by never running
    // (the link-count races are the kernel's, and may not happen).
    for (what, count) in [
        ("reads", &c.reads),
        ("O_DIRECT reads", &c.direct_reads),
        ("measures", &c.measures),
        ("creates", &c.creates),
        ("writes", &c.writes),
        ("enables", &c.enables),
        ("watched enables", &c.watched_enables),
        ("reads during watched enables", &c.watched_reads),
        ("enable races", &c.enable_races),
        ("refused-write checks", &c.refused),
        ("renames", &c.renames),
        ("links", &c.links),
        ("deletes", &c.unlinks),
        ("cache drops", &c.cache_drops),
    ] {
        assert!(n(count) > 0, "no {what} in {ran:.1?} (seed {seed:#x})");
    }
    assert!(m.daemon_exited().is_none(), "the daemon died:\n{}", m.log());

    // A clean unmount, quickly.
    let unmounting = Instant::now();
    m.unmount();
    let took = unmounting.elapsed();
    eprintln!("stress: unmounted in {took:.2?}");
    assert!(took < UNMOUNT_LIMIT, "the unmount took {took:?}");
}
