//! Hostile `FS_IOC_ENABLE_VERITY` and `FS_IOC_MEASURE_VERITY` arguments
//! through a real mount: bad versions, reserved bytes, huge or lying salt
//! and signature sizes, null, unmapped and half-mapped pointers, tiny and
//! huge digest buffers, on plain files, verity files and directories.
//!
//! Every call's errno is checked against [`expected_enable`] and
//! [`expected_measure`], small reference models of what the kernel's FUSE
//! driver (`fs/fuse/ioctl.c`: `fuse_setup_enable_verity()`,
//! `fuse_setup_measure_verity()`, `fuse_do_ioctl()`) and then the daemon
//! must answer, the daemon following `fsverity_ioctl_enable()`'s order
//! (Linux's `fs/verity/enable.c`). A first pass sweeps the boundaries (each
//! reserved byte, each bad pointer, each size limit, each digest buffer
//! size on each kind of file); then a seeded random run (`VERITYFS_HOSTILE_SEED`,
//! `VERITYFS_HOSTILE_CALLS`, default 8000 calls) mixes them. Along the way
//! and at the end the mount must keep serving: verity files read and
//! measure right, failed enables leave no trace, a valid enable still
//! works, and the daemon unmounts cleanly.
//!
//! Needs what `mount.rs` needs (root, `/dev/fuse`, `fsverity`).

mod common;

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

/// Seed of the random run unless `VERITYFS_HOSTILE_SEED` says otherwise.
const DEFAULT_SEED: u64 = 0x686f_7374_696c_6506;
/// Calls of the random run unless `VERITYFS_HOSTILE_CALLS` says otherwise.
const DEFAULT_CALLS: usize = 8000;
/// `FUSE_VERITY_ENABLE_ARG_MAX_PAGES` (`fs/fuse/ioctl.c`): the FUSE driver
/// refuses a salt or a signature of more pages than this with `ENOMEM`.
const FUSE_VERITY_ENABLE_ARG_MAX_PAGES: usize = 256;
/// `FUSE_MAX_MAX_PAGES`, the default of `/proc/sys/fs/fuse/max_pages_limit`.
const FUSE_MAX_MAX_PAGES: usize = 256;
/// The request size `verityfs mount` negotiates (its `max_write` and
/// `max_readahead`: 1 MiB), from which fuser asks for `max_pages`.
const DAEMON_MAX_REQUEST: usize = 1 << 20;
/// The largest salt fs-verity takes (`sizeof(fsverity_descriptor.salt)`).
const MAX_SALT_SIZE: u32 = 32;
/// Bytes of reserved fields in `struct fsverity_enable_arg`:
/// `__reserved1` (4 bytes at 28) and `__reserved2` (88 bytes at 40).
const RESERVED_BYTES: usize = 4 + 88;
/// How often the random run checks that the mount still serves.
const CHECK_EVERY: usize = 500;

// ---------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------

/// An environment variable parsed as a number (decimal or 0x hex).
fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={value}: {e}")))
}

// ---------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------

/// The limits of the running kernel's FUSE driver for this mount.
#[derive(Clone, Copy, Debug)]
struct Limits {
    page: usize,
    /// `fc->max_pages`: what the daemon asked for, capped by the sysctl.
    max_pages: usize,
}

impl Limits {
    fn of_this_kernel() -> Limits {
        let page = page_size();
        let sysctl = fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(FUSE_MAX_MAX_PAGES);
        Limits {
            page,
            max_pages: DAEMON_MAX_REQUEST.div_ceil(page).min(sysctl),
        }
    }

    /// The most salt or signature bytes the FUSE driver passes on.
    fn max_enable_buffer(&self) -> u64 {
        (FUSE_VERITY_ENABLE_ARG_MAX_PAGES * self.page) as u64
    }

    /// Whether a request of `in_size` input bytes (and at most that much
    /// output) fits `fc->max_pages` (`fuse_do_ioctl()`).
    fn request_fits(&self, in_size: u64) -> bool {
        in_size.max(self.page as u64).div_ceil(self.page as u64) <= self.max_pages as u64
    }
}

/// What a file handle the ioctl goes to refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Plain,
    Verity,
    Dir,
}

/// Where an argument structure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ArgAt {
    /// A whole structure in ordinary memory.
    Whole,
    /// Only its first `n` bytes readable, then a guard page.
    Short(usize),
    /// Nowhere the kernel can read.
    Bad(BadAddress),
}

/// Where a salt or signature pointer points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ptr {
    /// Readable memory, as long as the size says (up to the readable
    /// buffer's length, more than any size the FUSE driver passes on).
    Valid,
    /// Nowhere the kernel can read.
    Bad(BadAddress),
    /// The guard page: mapped but inaccessible.
    Guard,
    /// `n` readable bytes, then the guard page.
    Straddle(usize),
}

/// A hostile `FS_IOC_ENABLE_VERITY`.
#[derive(Clone, Copy, Debug)]
struct EnableCase {
    target: Kind,
    version: u32,
    hash_algorithm: u32,
    block_size: u32,
    salt_size: u32,
    salt_ptr: Ptr,
    sig_size: u32,
    sig_ptr: Ptr,
    /// A reserved byte (0..92: `__reserved1` then `__reserved2`) set to a
    /// nonzero value.
    reserved: Option<(usize, u8)>,
    arg: ArgAt,
}

impl EnableCase {
    /// A valid enable of `target` with default parameters.
    fn valid(target: Kind) -> EnableCase {
        EnableCase {
            target,
            version: 1,
            hash_algorithm: 1,
            block_size: 4096,
            salt_size: 0,
            salt_ptr: Ptr::Valid,
            sig_size: 0,
            sig_ptr: Ptr::Valid,
            reserved: None,
            arg: ArgAt::Whole,
        }
    }
}

/// A hostile `FS_IOC_MEASURE_VERITY`.
#[derive(Clone, Copy, Debug)]
struct MeasureCase {
    target: Kind,
    digest_size: u16,
    /// Readable (and writable) bytes from the start of the structure, or
    /// an argument pointer nowhere.
    avail: Result<usize, BadAddress>,
    /// Whether the kernel may write the answer back.
    writable: bool,
}

/// Readable bytes at `ptr` given `size` wanted.
fn readable(ptr: Ptr, size: u32) -> u64 {
    match ptr {
        Ptr::Valid => u64::from(size),
        Ptr::Bad(_) | Ptr::Guard => 0,
        Ptr::Straddle(n) => n as u64,
    }
}

/// The errno (or success) the kernel and the daemon together must give
/// for `case` (the caller is root, the fd read-only, the mount writable,
/// nothing append-only or open for writing, so the permission, `EBADF`,
/// `EROFS` and `ETXTBSY` checks pass).
fn expected_enable(case: &EnableCase, limits: &Limits) -> Result<(), i32> {
    // 1. The FUSE driver, before anything reaches the daemon:
    //    fuse_setup_enable_verity() copies the structure (EFAULT) and
    //    refuses salts and signatures of more than 256 pages (ENOMEM);
    //    fuse_do_ioctl() refuses requests beyond fc->max_pages (ENOMEM) and
    //    copies the structure, the salt and the signature in (EFAULT).
    if case.arg != ArgAt::Whole {
        return Err(libc::EFAULT);
    }
    let (salt, sig) = (u64::from(case.salt_size), u64::from(case.sig_size));
    if salt > limits.max_enable_buffer() || sig > limits.max_enable_buffer() {
        return Err(libc::ENOMEM);
    }
    if !limits.request_fits(128 + salt + sig) {
        return Err(libc::ENOMEM);
    }
    if salt > readable(case.salt_ptr, case.salt_size) || sig > readable(case.sig_ptr, case.sig_size)
    {
        return Err(libc::EFAULT);
    }
    // 2. The daemon, in fsverity_ioctl_enable()'s order: the argument...
    if case.version != 1 || case.reserved.is_some() {
        return Err(libc::EINVAL);
    }
    if !case.block_size.is_power_of_two() {
        return Err(libc::EINVAL);
    }
    if case.salt_size > MAX_SALT_SIZE || case.sig_size as usize > MAX_SIGNATURE_SIZE {
        return Err(libc::EMSGSIZE);
    }
    // ...the file type (permission, EBADF, append-only pass)...
    if case.target == Kind::Dir {
        return Err(libc::EISDIR);
    }
    // ...EROFS and ETXTBSY pass; the tree parameters
    // (fsverity_init_merkle_tree_params(): algorithm, block size from
    // 1 KiB to 64 KiB, as the daemon allows)...
    if !matches!(case.hash_algorithm, 1 | 2) || !(1024..=65536).contains(&case.block_size) {
        return Err(libc::EINVAL);
    }
    // ...and already verity. A signature is stored, not checked (as by a
    // kernel without CONFIG_FS_VERITY_BUILTIN_SIGNATURES).
    if case.target == Kind::Verity {
        return Err(libc::EEXIST);
    }
    Ok(())
}

/// The errno the kernel and the daemon together must give for `case`, or
/// `Ok` with the digest size written back, for a file whose digest has
/// `digest_len` bytes if verity.
fn expected_measure(case: &MeasureCase, digest_len: usize, limits: &Limits) -> Result<(), i32> {
    let avail = case.avail.map_err(|_| libc::EFAULT)?;
    // fuse_setup_measure_verity() reads digest_size (bytes 2..4).
    if avail < DIGEST_HEADER_SIZE {
        return Err(libc::EFAULT);
    }
    // fuse_do_ioctl(): one buffer of header + digest_size, in and out.
    let size = DIGEST_HEADER_SIZE + usize::from(case.digest_size);
    if !limits.request_fits(size as u64) {
        return Err(libc::ENOMEM);
    }
    if avail < size {
        return Err(libc::EFAULT);
    }
    // The daemon (fs/verity/measure.c's order).
    if case.target != Kind::Verity {
        return Err(libc::ENODATA);
    }
    if usize::from(case.digest_size) < digest_len {
        return Err(libc::EOVERFLOW);
    }
    // The answer is copied back.
    if !case.writable {
        return Err(libc::EFAULT);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The files under attack
// ---------------------------------------------------------------------------

/// A file (or directory) in the mount, kept open read-only.
struct Target {
    name: String,
    path: PathBuf,
    file: File,
    data: Vec<u8>,
    /// `ALG:HEX` and the digest's length in bytes, if verity.
    digest: Option<(String, usize)>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} bytes)", self.name, self.data.len())
    }
}

/// The attack: the mount's files, the buffers the pointers point into,
/// what happened.
struct Attack {
    mnt: PathBuf,
    backing: PathBuf,
    limits: Limits,
    /// Readable memory for salts and signatures (random bytes; a pointer
    /// to `n` bytes points at its last `n` bytes, before its guard page).
    payload: GuardedBuf,
    /// Where argument structures that must end early are put.
    args: GuardedBuf,
    plain: Target,
    verity: Vec<Target>,
    dir: Target,
    files_made: u64,
    /// Calls by ioctl and result.
    results: BTreeMap<(&'static str, Kind, String), u64>,
    enabled: u64,
    mismatches: Vec<String>,
}

impl Attack {
    fn new(mnt: PathBuf, backing: PathBuf, seed: u64) -> Attack {
        let limits = Limits::of_this_kernel();
        let mut payload = GuardedBuf::new(limits.max_enable_buffer() as usize + limits.page);
        let len = payload.len();
        payload
            .as_mut_slice()
            .copy_from_slice(&random_bytes(len, seed ^ 0x5a17));
        let dir_path = mnt.join("dir");
        fs::create_dir(&dir_path).unwrap();
        fs::write(dir_path.join("inside"), b"inside").unwrap();
        let dir = Target {
            name: "dir".into(),
            file: File::open(&dir_path).unwrap(),
            path: dir_path,
            data: Vec::new(),
            digest: None,
        };
        let mut attack = Attack {
            limits,
            payload,
            args: GuardedBuf::new(128 << 10),
            plain: placeholder(&mnt),
            verity: Vec::new(),
            dir,
            files_made: 0,
            results: BTreeMap::new(),
            enabled: 0,
            mismatches: Vec::new(),
            mnt,
            backing,
        };
        attack.plain = attack.new_plain(seed);
        // Verity files made outside the attack: SHA-256 and SHA-512, salted.
        for (alg, block_size, salt) in [(1, 4096, &b""[..]), (2, 1024, &b"pepper"[..])] {
            let mut target = attack.new_plain(seed ^ u64::from(alg));
            let arg = EnableArg {
                hash_algorithm: alg,
                block_size,
                salt: salt.to_vec(),
                ..EnableArg::default()
            };
            verity_ioctl(&target.file, VerityIoctl::Enable(&arg)).unwrap();
            let digest = digest_of(&target.data, alg, block_size, salt);
            target.digest = Some((digest, if alg == 1 { 32 } else { 64 }));
            attack.verity.push(target);
        }
        attack
    }

    /// A fresh plain file of random size and contents.
    fn new_plain(&mut self, seed: u64) -> Target {
        self.files_made += 1;
        let name = format!("f{}", self.files_made);
        let sizes = [0, 1, 4096, 4097, 10_000, 65_536, 100_000];
        let size = sizes[(seed % sizes.len() as u64) as usize];
        let data = random_bytes(size, seed);
        let path = self.mnt.join(&name);
        fs::write(&path, &data).unwrap();
        Target {
            name,
            file: File::open(&path).unwrap(),
            path,
            data,
            digest: None,
        }
    }

    fn target(&self, kind: Kind, pick: u64) -> &Target {
        match kind {
            Kind::Plain => &self.plain,
            Kind::Verity => &self.verity[(pick % self.verity.len() as u64) as usize],
            Kind::Dir => &self.dir,
        }
    }

    fn record(&mut self, ioctl: &'static str, kind: Kind, got: &Result<(), i32>) {
        let key = match got {
            Ok(()) => "ok".to_owned(),
            Err(e) => errno_name(*e),
        };
        *self.results.entry((ioctl, kind, key)).or_default() += 1;
    }

    /// The address and the bytes a salt or signature pointer gives.
    fn resolve(&self, ptr: Ptr, size: u32) -> u64 {
        let len = self.payload.len();
        match ptr {
            Ptr::Valid => self.payload.tail_addr((size as usize).min(len)),
            Ptr::Bad(bad) => bad.addr(),
            Ptr::Guard => self.payload.guard_addr(),
            Ptr::Straddle(n) => self.payload.tail_addr(n.min(len)),
        }
    }

    /// The `size` bytes of the payload at `addr` (empty if none).
    fn payload_bytes(&mut self, addr: u64, size: u32) -> Vec<u8> {
        if size == 0 {
            return Vec::new();
        }
        let start = (addr - self.payload.tail_addr(self.payload.len())) as usize;
        self.payload.as_mut_slice()[start..start + size as usize].to_vec()
    }

    fn enable(&mut self, case: EnableCase, pick: u64) {
        let mut raw = RawEnableArg {
            version: case.version,
            hash_algorithm: case.hash_algorithm,
            block_size: case.block_size,
            salt_size: case.salt_size,
            salt_ptr: self.resolve(case.salt_ptr, case.salt_size),
            sig_size: case.sig_size,
            sig_ptr: self.resolve(case.sig_ptr, case.sig_size),
            ..RawEnableArg::default()
        };
        if let Some((i, value)) = case.reserved {
            set_reserved_byte(&mut raw, i, value);
        }
        let expected = expected_enable(&case, &self.limits);
        let target = self.target(case.target, pick);
        let what = format!("{case:?} on {target:?}");
        let result = match case.arg {
            ArgAt::Whole => enable_ioctl(&target.file, &raw),
            ArgAt::Bad(bad) => verity_ioctl_at(&target.file, FS_IOC_ENABLE_VERITY, bad),
            ArgAt::Short(n) => {
                let file = target.file.try_clone().unwrap();
                self.args.enable_ioctl(&file, n, &raw)
            }
        };
        let got = errno_of(result);
        self.record("enable", case.target, &got);
        if got != expected {
            self.mismatch(format!(
                "enable: {what}: got {}, expected {}",
                show(&got),
                show(&expected)
            ));
        }
        if got.is_ok() && case.target == Kind::Plain {
            let salt = self.payload_bytes(raw.salt_ptr, case.salt_size);
            self.enabled_plain(&case, &salt);
        }
    }

    /// The plain target was enabled with `case`'s parameters: check its
    /// digest and contents, make it a verity target, and make a new plain
    /// target.
    fn enabled_plain(&mut self, case: &EnableCase, salt: &[u8]) {
        self.enabled += 1;
        let digest = digest_of(&self.plain.data, case.hash_algorithm, case.block_size, salt);
        let digest_len = if case.hash_algorithm == 1 { 32 } else { 64 };
        match raw_measure(&self.plain.path, 64) {
            Ok(measured) if measured == digest => {}
            other => self.mismatch(format!(
                "after enable {case:?} of {:?}: measure gave {other:?}, expected {digest}",
                self.plain
            )),
        }
        let seed = self.enabled ^ 0xe7ab1e;
        let mut plain = self.new_plain(seed);
        std::mem::swap(&mut plain, &mut self.plain);
        plain.digest = Some((digest, digest_len));
        // Keep the list short: a few verity targets are enough.
        if self.verity.len() >= 8 {
            self.verity.remove(2);
        }
        self.verity.push(plain);
    }

    fn measure(&mut self, case: MeasureCase, pick: u64) {
        let target = self.target(case.target, pick);
        let what = format!("{case:?} on {target:?}");
        let (digest, digest_len) = target.digest.clone().unwrap_or_else(|| (String::new(), 32));
        let expected = expected_measure(&case, digest_len, &self.limits);
        let file = target.file.try_clone().unwrap();
        let result = match case.avail {
            Ok(avail) => self
                .args
                .measure_ioctl(&file, avail, case.digest_size, case.writable),
            Err(bad) => verity_ioctl_at(&file, FS_IOC_MEASURE_VERITY, bad).map(|()| Vec::new()),
        };
        let (got, out) = match result {
            Ok(out) => (Ok(()), out),
            Err(e) => (errno_of::<()>(Err(e)), Vec::new()),
        };
        self.record("measure", case.target, &got);
        if got != expected {
            self.mismatch(format!(
                "measure: {what}: got {}, expected {}",
                show(&got),
                show(&expected)
            ));
            return;
        }
        if got.is_ok() {
            // The digest, and not a byte written past it.
            let written = DIGEST_HEADER_SIZE + digest_len;
            let untouched = out[written..].iter().all(|&b| b == GuardedBuf::FILL);
            if format_digest(&out).as_deref() != Some(digest.as_str()) || !untouched {
                self.mismatch(format!(
                    "measure: {what}: wrong answer {:02x?} (expected {digest})",
                    &out[..written.min(out.len())]
                ));
            }
        }
    }

    fn mismatch(&mut self, text: String) {
        if self.mismatches.len() < 1000 {
            self.mismatches.push(text);
        }
    }

    /// The mount still serves: verity files read and measure right, the
    /// plain target is untouched by all the failed enables.
    fn check_serving(&mut self, when: &str) {
        for target in self.verity.iter().chain([&self.plain]) {
            let what = format!("{when}: {target:?}");
            let data = fs::read(&target.path).unwrap_or_else(|e| panic!("{what}: read: {e}"));
            assert!(data == target.data, "{what}: wrong contents");
            match &target.digest {
                Some((digest, _)) => {
                    assert_eq!(&raw_measure(&target.path, 64).unwrap(), digest, "{what}")
                }
                None => {
                    assert_errno(raw_measure(&target.path, 64), libc::ENODATA, &what);
                    // No tree, descriptor or record left by failed enables.
                    let backing = self.backing.join(&target.name);
                    let len = fs::metadata(&backing).unwrap().len();
                    assert_eq!(len, target.data.len() as u64, "{what}: backing size");
                    let names = xattr_names(&backing).unwrap();
                    assert!(
                        !names.iter().any(|n| n.starts_with("user.verityfs")),
                        "{what}: {names:?}"
                    );
                }
            }
        }
        let entries = fs::read_dir(&self.dir.path).unwrap().count();
        assert_eq!(entries, 1, "{when}: the directory changed");
    }
}

/// A placeholder target (the mount's root), replaced before use.
fn placeholder(mnt: &std::path::Path) -> Target {
    Target {
        name: String::new(),
        path: mnt.to_owned(),
        file: File::open(mnt).unwrap(),
        data: Vec::new(),
        digest: None,
    }
}

/// Sets reserved byte `i` (0..92: `__reserved1`, then `__reserved2`) of
/// `raw` to `value`.
fn set_reserved_byte(raw: &mut RawEnableArg, i: usize, value: u8) {
    if i < 4 {
        let mut bytes = raw.reserved1.to_le_bytes();
        bytes[i] = value;
        raw.reserved1 = u32::from_le_bytes(bytes);
    } else {
        let (word, byte) = ((i - 4) / 8, (i - 4) % 8);
        let mut bytes = raw.reserved2[word].to_le_bytes();
        bytes[byte] = value;
        raw.reserved2[word] = u64::from_le_bytes(bytes);
    }
}

fn errno_of<T>(result: io::Result<T>) -> Result<(), i32> {
    result.map(drop).map_err(|e| {
        e.raw_os_error()
            .unwrap_or_else(|| panic!("not an errno: {e}"))
    })
}

fn errno_name(errno: i32) -> String {
    let names = [
        (libc::EINVAL, "EINVAL"),
        (libc::EMSGSIZE, "EMSGSIZE"),
        (libc::ENOMEM, "ENOMEM"),
        (libc::EFAULT, "EFAULT"),
        (libc::EISDIR, "EISDIR"),
        (libc::EEXIST, "EEXIST"),
        (libc::ENODATA, "ENODATA"),
        (libc::EOVERFLOW, "EOVERFLOW"),
    ];
    names.iter().find(|(e, _)| *e == errno).map_or_else(
        || format!("errno {errno} ({})", strerror(errno)),
        |(_, n)| (*n).to_owned(),
    )
}

fn show(result: &Result<(), i32>) -> String {
    match result {
        Ok(()) => "success".into(),
        Err(e) => errno_name(*e),
    }
}

// ---------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------

const KINDS: [Kind; 3] = [Kind::Plain, Kind::Verity, Kind::Dir];
const DIGEST_SIZES: [u16; 6] = [0, 1, 31, 32, 64, 65535];

/// The boundaries, each on each kind of file.
fn sweep(limits: &Limits) -> (Vec<EnableCase>, Vec<MeasureCase>) {
    let mut enables = Vec::new();
    let max = limits.max_enable_buffer() as u32;
    // The largest salt that fits one request with the structure.
    let fits = (limits.max_pages * limits.page - 128) as u32;
    for target in KINDS {
        let valid = EnableCase::valid(target);
        let mut with = |change: &dyn Fn(&mut EnableCase)| {
            let mut case = valid;
            change(&mut case);
            enables.push(case);
        };
        for i in 0..RESERVED_BYTES {
            with(&|c| c.reserved = Some((i, 0x80)));
        }
        for version in [0, 2, u32::MAX] {
            with(&|c| c.version = version);
        }
        for block_size in [0, 3, 4095, 4097, u32::MAX, 1, 512, 1 << 17, 1 << 31] {
            with(&|c| c.block_size = block_size);
        }
        for alg in [0, 3, 257, u32::MAX] {
            with(&|c| c.hash_algorithm = alg);
        }
        for size in [33, 500, fits, fits + 1, max, max + 1, u32::MAX] {
            with(&|c| c.salt_size = size);
            with(&|c| c.sig_size = size);
        }
        with(&|c| c.sig_size = MAX_SIGNATURE_SIZE as u32 + 1);
        with(&|c| {
            c.salt_size = fits / 2;
            c.sig_size = fits / 2 + 1;
        });
        for ptr in BadAddress::ALL.map(Ptr::Bad).into_iter().chain([
            Ptr::Guard,
            Ptr::Straddle(0),
            Ptr::Straddle(7),
        ]) {
            for size in [1, 8, 32, 33, u32::MAX] {
                with(&|c| {
                    c.salt_size = size;
                    c.salt_ptr = ptr;
                });
                with(&|c| {
                    c.sig_size = size;
                    c.sig_ptr = ptr;
                });
            }
            // A size of 0 never reads the pointer.
            with(&|c| c.salt_ptr = ptr);
            // Bad pointer, bad version: the FUSE driver's EFAULT first.
            with(&|c| {
                c.version = 2;
                c.sig_size = 100;
                c.sig_ptr = ptr;
            });
        }
        for arg in BadAddress::ALL.map(ArgAt::Bad).into_iter().chain([
            ArgAt::Short(0),
            ArgAt::Short(64),
            ArgAt::Short(127),
        ]) {
            with(&|c| c.arg = arg);
        }
        // Orders: version before sizes, sizes before the file type and the
        // algorithm, the algorithm before EEXIST.
        with(&|c| {
            c.version = 2;
            c.salt_size = 33;
        });
        with(&|c| {
            c.salt_size = 33;
            c.hash_algorithm = 257;
        });
        with(&|c| {
            c.block_size = 3;
            c.sig_size = MAX_SIGNATURE_SIZE as u32 + 1;
        });
        with(&|c| c.hash_algorithm = 257);
    }
    let mut measures = Vec::new();
    for target in KINDS {
        for digest_size in DIGEST_SIZES {
            let exact = DIGEST_HEADER_SIZE + usize::from(digest_size);
            for (avail, writable) in [
                (Ok(exact), true),
                (Ok(exact + 100), true),
                (Ok(exact - 1), true),
                (Ok(exact), false),
            ] {
                measures.push(MeasureCase {
                    target,
                    digest_size,
                    avail,
                    writable,
                });
            }
        }
        for avail in BadAddress::ALL.map(Err).into_iter().chain([Ok(0), Ok(3)]) {
            measures.push(MeasureCase {
                target,
                digest_size: 64,
                avail,
                writable: true,
            });
        }
    }
    (enables, measures)
}

/// A salt or signature size: mostly plausible, often just past a limit,
/// sometimes absurd.
fn random_size(rng: &mut Rng, limits: &Limits, typical_max: u32, limit: u32) -> u32 {
    let max = limits.max_enable_buffer() as u32;
    let fits = (limits.max_pages * limits.page - 128) as u32;
    match rng.below(20) {
        0..=7 => 0,
        8..=11 => 1 + rng.below(u64::from(typical_max)) as u32,
        12 => limit,
        13 => limit + 1,
        14 => limit + 1 + rng.below(8192) as u32,
        15 => rng.pick(&[fits - 1, fits, fits + 1, max - 1, max, max + 1]),
        16 => rng.pick(&[u32::MAX, u32::MAX - 1, 1 << 31, 1 << 24]),
        17 => rng.u32(),
        _ => rng.below(2 << 20) as u32,
    }
}

fn random_ptr(rng: &mut Rng, size: u32) -> Ptr {
    match rng.below(20) {
        0 => Ptr::Bad(rng.pick(&BadAddress::ALL)),
        1 => Ptr::Guard,
        2 | 3 if size > 0 => Ptr::Straddle(rng.below(u64::from(size).min(1 << 20)) as usize),
        _ => Ptr::Valid,
    }
}

fn random_enable(rng: &mut Rng, limits: &Limits) -> EnableCase {
    let target = rng.pick(&[Kind::Plain, Kind::Plain, Kind::Verity, Kind::Dir]);
    let version = if rng.percent(85) {
        1
    } else {
        let any = rng.u32();
        rng.pick(&[0, 2, 3, 0x100, u32::MAX, any])
    };
    let hash_algorithm = if rng.percent(80) {
        rng.pick(&[1, 2])
    } else {
        let any = rng.u32();
        rng.pick(&[0, 3, 4, 255, 256, 257, u32::MAX, any])
    };
    let any = rng.u32() | 3;
    let block_size = match rng.below(20) {
        0 | 1 => rng.pick(&[0, 3, 4095, 4097, 0x8000_0001, any]),
        2 | 3 => rng.pick(&[1, 2, 512, 1 << 17, 1 << 20, 1 << 31]),
        _ => rng.pick(&[1024, 2048, 4096, 8192, 65536]),
    };
    let salt_size = random_size(rng, limits, MAX_SALT_SIZE, MAX_SALT_SIZE);
    let sig_size = random_size(
        rng,
        limits,
        MAX_SIGNATURE_SIZE as u32,
        MAX_SIGNATURE_SIZE as u32,
    );
    let reserved = rng.percent(10).then(|| {
        (
            rng.below(RESERVED_BYTES as u64) as usize,
            1 + rng.below(255) as u8,
        )
    });
    let arg = match rng.below(50) {
        0 => ArgAt::Bad(rng.pick(&BadAddress::ALL)),
        1 => ArgAt::Short(rng.below(128) as usize),
        _ => ArgAt::Whole,
    };
    EnableCase {
        target,
        version,
        hash_algorithm,
        block_size,
        salt_size,
        salt_ptr: random_ptr(rng, salt_size),
        sig_size,
        sig_ptr: random_ptr(rng, sig_size),
        reserved,
        arg,
    }
}

fn random_measure(rng: &mut Rng) -> MeasureCase {
    let target = rng.pick(&[Kind::Plain, Kind::Verity, Kind::Verity, Kind::Dir]);
    let digest_size = match rng.below(4) {
        0 => rng.next() as u16,
        _ => rng.pick(&[0, 1, 31, 32, 33, 63, 64, 65, 255, 4096, 65535]),
    };
    let exact = DIGEST_HEADER_SIZE + usize::from(digest_size);
    let avail = match rng.below(20) {
        0 => Err(rng.pick(&BadAddress::ALL)),
        1 | 2 => Ok(rng.below(exact as u64) as usize),
        3 | 4 => Ok(exact + rng.below(256) as usize),
        _ => Ok(exact),
    };
    MeasureCase {
        target,
        digest_size,
        avail,
        writable: !rng.percent(5),
    }
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[test]
fn hostile_verity_ioctls_get_the_kernels_errnos_and_the_mount_keeps_serving() {
    let seed = env_number("VERITYFS_HOSTILE_SEED").unwrap_or(DEFAULT_SEED);
    let calls = env_number("VERITYFS_HOSTILE_CALLS").map_or(DEFAULT_CALLS, |n| n as usize);
    eprintln!("hostile ioctls: VERITYFS_HOSTILE_SEED={seed:#x} VERITYFS_HOSTILE_CALLS={calls}");
    let mut m = Mount::new();
    let (mnt, backing) = (m.mnt.clone(), m.backing.clone());
    let started = Instant::now();
    let mut attack = with_watchdog("hostile ioctls", Duration::from_secs(600), move || {
        let mut attack = Attack::new(mnt, backing, seed);
        let limits = attack.limits;
        let (enables, measures) = sweep(&limits);
        let mut rng = Rng(seed);
        for case in enables {
            attack.enable(case, rng.next());
        }
        for case in measures {
            attack.measure(case, rng.next());
        }
        attack.check_serving("after the sweep");
        for i in 1..=calls {
            if rng.percent(60) {
                let case = random_enable(&mut rng, &limits);
                attack.enable(case, rng.next());
            } else {
                let case = random_measure(&mut rng);
                attack.measure(case, rng.next());
            }
            if i % CHECK_EVERY == 0 {
                attack.check_serving(&format!("after {i} random calls"));
            }
        }
        attack.check_serving("at the end");
        attack
    });
    assert!(m.daemon_exited().is_none(), "the daemon died:\n{}", m.log());
    let total: u64 = attack.results.values().sum();
    eprintln!(
        "{total} hostile calls in {:.1?}, {} successful enables, results:",
        started.elapsed(),
        attack.enabled
    );
    for ((ioctl, kind, result), n) in &attack.results {
        eprintln!("  {ioctl:7} {kind:?}: {result}: {n}");
    }
    let mismatches = std::mem::take(&mut attack.mismatches);
    let enabled = attack.enabled;
    let measured = attack
        .results
        .get(&("measure", Kind::Verity, "ok".to_owned()));
    let measured = measured.copied().unwrap_or(0);
    // Close every file before unmounting.
    drop(attack);
    if !mismatches.is_empty() {
        panic!(
            "{} of {total} calls gave the wrong result (seed {seed:#x}); the first ones:\n{}",
            mismatches.len(),
            mismatches[..mismatches.len().min(40)].join("\n")
        );
    }
    // The calls reached the success paths too, not only the refusals.
    assert!(
        enabled > 0 && measured > 0,
        "{enabled} enables and {measured} measures succeeded (seed {seed:#x})"
    );

    // A valid enable still works afterwards, and measures as fsverity says.
    let data = random_bytes(300_000, seed);
    let path = write_file(&m, "after", &data);
    let salt = random_bytes(32, seed ^ 1);
    let arg = EnableArg {
        hash_algorithm: 2,
        block_size: 1024,
        salt: salt.clone(),
        ..EnableArg::default()
    };
    raw_enable(&path, &arg).unwrap();
    let expected = digest_of(&data, 2, 1024, &salt);
    assert_eq!(raw_measure(&path, 64).unwrap(), expected);
    assert_eq!(measure(&path), expected);
    assert!(fs::read(&path).unwrap() == data);
    m.unmount();
}
