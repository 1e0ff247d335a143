//! What the integration suites on real mounts share (`mount.rs`,
//! `hostile_ioctl.rs`, `stress.rs`): the [`Mount`] guard (spawns `verityfs
//! mount`, waits for the mount in `/proc/self/mountinfo`, always unmounts
//! and reaps the daemon when dropped), bounded waiting and commands, the
//! `fsverity` program, raw fs-verity ioctls (all of the suites' `unsafe`
//! code is here) and small file helpers; [`images`], what the image suites
//! share.
//!
//! Each suite includes it with `mod common;` and uses a different part of
//! it, hence the `dead_code` allowance.

#![allow(dead_code)]

pub mod images;

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::Pid;

/// The program under test.
pub const VERITYFS: &str = env!("CARGO_BIN_EXE_verityfs");
/// The reference `fsverity` program.
pub const FSVERITY: &str = "/usr/bin/fsverity";
/// The unprivileged user (and group) of the permission tests: `nobody`.
pub const NOBODY: u32 = 65534;

/// A command run as `nobody`, without supplementary groups.
pub fn as_nobody(program: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg(program);
    cmd
}

/// How long a mount may take to appear.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the daemon may take to exit once unmounted or signalled.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long any helper command may run.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The kernel's limit on built-in signature sizes.
pub const MAX_SIGNATURE_SIZE: usize = 16128;

// ---------------------------------------------------------------------------
// Prerequisites and commands
// ---------------------------------------------------------------------------

/// Fails (once per process, but in every test) unless everything the tests
/// need is there.
pub fn prerequisites() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        if !rustix::process::geteuid().is_root() {
            return Err("these tests must run as root".into());
        }
        match fs::metadata("/dev/fuse") {
            Ok(m) if m.file_type().is_char_device() => {}
            Ok(_) => return Err("/dev/fuse is not a character device".into()),
            Err(e) => return Err(format!("/dev/fuse: {e}")),
        }
        for (program, arg) in [
            (FSVERITY, "--version"),
            ("chattr", "-V"),
            ("lsattr", "-V"),
            ("setpriv", "--version"),
            ("python3", "--version"),
        ] {
            match Command::new(program).arg(arg).output() {
                Ok(_) => {}
                Err(e) => return Err(format!("cannot run {program}: {e}")),
            }
        }
        Ok(())
    });
    if let Err(e) = checked {
        panic!("missing prerequisite: {e} (needs root, /dev/fuse, fsverity-utils, e2fsprogs, util-linux, python3)");
    }
}

/// Waits for `child` up to `timeout`.
pub fn wait_for(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Where each thread of process `pid` waits in the kernel: the report of a
/// hang, read from `/proc` (as root).
pub fn kernel_stacks(pid: Pid) -> String {
    let tasks = format!("/proc/{}/task", pid.as_raw_nonzero());
    let Ok(entries) = fs::read_dir(&tasks) else {
        return format!("{tasks}: gone\n");
    };
    let mut report = String::new();
    for task in entries.flatten() {
        let path = task.path();
        let read = |name: &str| fs::read_to_string(path.join(name)).unwrap_or_default();
        report += &format!(
            "{} ({}): {}\n{}",
            path.display(),
            read("comm").trim(),
            read("wchan"),
            read("stack")
        );
    }
    report
}

/// The backtraces of the threads of process `pid`, by gdb: the report of a
/// hang.
pub fn thread_backtraces(pid: Pid) -> String {
    let out = Command::new("gdb")
        .args(["-p", &pid.as_raw_nonzero().to_string(), "-batch", "-nx"])
        .args(["-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => format!("gdb: {e}\n"),
    }
}

/// Runs `cmd` to completion (bounded: a hung mount fails the test instead
/// of hanging it) and returns its output.
pub fn run(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(COMMAND_TIMEOUT) {
        Ok(output) => output.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => panic!("{what} did not finish within {COMMAND_TIMEOUT:?}"),
    }
}

/// Runs `cmd`, which must succeed; returns its stdout.
#[track_caller]
pub fn run_ok(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The message `strerror(errno)` gives, as fsverity prints it.
pub fn strerror(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    match text.find(" (os error") {
        Some(end) => text[..end].to_owned(),
        None => text,
    }
}

/// Asserts that `result` failed with `errno`.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(result: io::Result<T>, errno: i32, what: &str) {
    match result {
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected {}", strerror(errno)),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(errno),
            "{what}: got {e}, expected {}",
            strerror(errno)
        ),
    }
}

/// Empties the kernel's page cache, so that the next reads reach the daemon.
pub fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", "3").expect("dropping caches");
}

/// Flips every bit of the byte at `pos` of the (backing) file `path`.
pub fn flip_byte(path: &Path, pos: u64) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, pos).unwrap();
    file.write_all_at(&[!b[0]], pos).unwrap();
    file.sync_all().unwrap();
}

/// `len` random bytes from a generator seeded with `seed`.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0; len];
    fastrand::Rng::with_seed(seed).fill(&mut bytes);
    bytes
}

/// The page size.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// Runs `f` on a thread of its own and returns what it returns, failing
/// (with its panic, or with a deadlock message if it takes longer than
/// `limit`). Whatever owns a [`Mount`] stays with the caller, so the
/// guard's `Drop` unmounts and kills the daemon even when `f` hangs in a
/// request the daemon never answers.
pub fn with_watchdog<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = thread::Builder::new()
        .name(what.to_owned())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(result);
        })
        .expect("spawning a thread");
    match rx.recv_timeout(limit) {
        Ok(Ok(value)) => {
            let _ = worker.join();
            value
        }
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{what} did not finish within {limit:?}: deadlock or hung request"),
    }
}

/// The names of the extended attributes of `path`.
pub fn xattr_names(path: &Path) -> io::Result<Vec<String>> {
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::fs::listxattr(path, &mut buf[..])?;
    Ok(buf[..n]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// The value of extended attribute `name` of `path`.
pub fn get_xattr(path: &Path, name: &str) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::fs::getxattr(path, name, &mut buf[..])?;
    buf.truncate(n);
    Ok(buf)
}

// ---------------------------------------------------------------------------
// The fsverity program
// ---------------------------------------------------------------------------

/// Runs `fsverity ARGS...`.
pub fn fsverity<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    run(Command::new(FSVERITY).args(args))
}

/// `fsverity enable PATH PARAMS...`, which must succeed silently.
#[track_caller]
pub fn enable(path: &Path, params: &[&str]) {
    let out = run_ok(Command::new(FSVERITY).arg("enable").arg(path).args(params));
    assert_eq!(out, "", "fsverity enable printed something");
}

/// Asserts that `fsverity enable PATH PARAMS...` fails with `errno`, with
/// fsverity's exact message.
#[track_caller]
pub fn assert_enable_fails(path: &Path, params: &[&str], errno: i32) {
    assert_fsverity_fails(
        Command::new(FSVERITY).arg("enable").arg(path).args(params),
        "FS_IOC_ENABLE_VERITY",
        path,
        errno,
    );
}

/// Asserts that `cmd` (an `fsverity` run on `path`) fails with `ioctl`
/// failing with `errno`.
#[track_caller]
pub fn assert_fsverity_fails(cmd: &mut Command, ioctl: &str, path: &Path, errno: i32) {
    let what = format!("{cmd:?}");
    let out = run(cmd);
    let expected = format!(
        "ERROR: {ioctl} failed on '{}': {}\n",
        path.display(),
        strerror(errno)
    );
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).as_ref()
        ),
        (Some(1), expected.as_str()),
        "{what}"
    );
}

/// `fsverity measure PATH`: the `ALG:HEX` it prints.
#[track_caller]
pub fn measure(path: &Path) -> String {
    measure_with(Command::new(FSVERITY).arg("measure").arg(path), path)
}

/// The `ALG:HEX` a `fsverity measure PATH` command prints.
#[track_caller]
pub fn measure_with(cmd: &mut Command, path: &Path) -> String {
    let out = run_ok(cmd);
    let (digest, name) = out
        .trim_end()
        .split_once(' ')
        .unwrap_or_else(|| panic!("odd measure output {out:?}"));
    assert_eq!(name, path.to_str().unwrap(), "measure output {out:?}");
    digest.to_owned()
}

/// `fsverity digest PATH PARAMS...`: the `ALG:HEX` it prints.
#[track_caller]
pub fn digest(path: &Path, params: &[&str]) -> String {
    let out = run_ok(Command::new(FSVERITY).arg("digest").arg(path).args(params));
    out.split_whitespace().next().unwrap_or_default().to_owned()
}

// ---------------------------------------------------------------------------
// Raw fs-verity ioctls
// ---------------------------------------------------------------------------

// The request numbers and sizes of the kernel's ABI (the library checks
// them against the kernel's values). The argument bytes are encoded here,
// not by the library: they may be as hostile as a test wants. (Not every
// suite uses every one.)
#[allow(unused_imports)]
pub use verityfs::uapi::{
    DIGEST_HEADER_SIZE, ENABLE_ARG_SIZE, FS_IOC_ENABLE_VERITY, FS_IOC_MEASURE_VERITY,
    FS_IOC_READ_VERITY_METADATA, FS_VERITY_FL,
};

/// A `struct fsverity_enable_arg`, with the salt and signature it points
/// to. The sizes are always those of the buffers, so that the kernel never
/// reads past them; every other field may be hostile (see [`RawEnableArg`]
/// for hostile sizes and pointers).
#[derive(Clone)]
pub struct EnableArg {
    pub version: u32,
    pub hash_algorithm: u32,
    pub block_size: u32,
    pub salt: Vec<u8>,
    pub sig: Vec<u8>,
    pub reserved1: u32,
    pub reserved2: [u64; 11],
}

impl Default for EnableArg {
    fn default() -> Self {
        EnableArg {
            version: 1,
            hash_algorithm: 1,
            block_size: 4096,
            salt: Vec::new(),
            sig: Vec::new(),
            reserved1: 0,
            reserved2: [0; 11],
        }
    }
}

impl EnableArg {
    /// The raw structure, pointing at this argument's salt and signature
    /// (valid while `self` is neither dropped nor changed).
    pub fn raw(&self) -> RawEnableArg {
        RawEnableArg {
            version: self.version,
            hash_algorithm: self.hash_algorithm,
            block_size: self.block_size,
            salt_size: self.salt.len() as u32,
            salt_ptr: self.salt.as_ptr() as u64,
            sig_size: self.sig.len() as u32,
            reserved1: self.reserved1,
            sig_ptr: self.sig.as_ptr() as u64,
            reserved2: self.reserved2,
        }
    }
}

/// Every field of a `struct fsverity_enable_arg` exactly as a caller may
/// set it: sizes and pointers need not match any buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawEnableArg {
    pub version: u32,
    pub hash_algorithm: u32,
    pub block_size: u32,
    pub salt_size: u32,
    pub salt_ptr: u64,
    pub sig_size: u32,
    pub reserved1: u32,
    pub sig_ptr: u64,
    pub reserved2: [u64; 11],
}

impl RawEnableArg {
    /// The structure's 128 bytes, as the kernel reads them.
    pub fn to_bytes(self) -> [u8; ENABLE_ARG_SIZE] {
        let mut a = [0u8; ENABLE_ARG_SIZE];
        a[0..4].copy_from_slice(&self.version.to_le_bytes());
        a[4..8].copy_from_slice(&self.hash_algorithm.to_le_bytes());
        a[8..12].copy_from_slice(&self.block_size.to_le_bytes());
        a[12..16].copy_from_slice(&self.salt_size.to_le_bytes());
        a[16..24].copy_from_slice(&self.salt_ptr.to_le_bytes());
        a[24..28].copy_from_slice(&self.sig_size.to_le_bytes());
        a[28..32].copy_from_slice(&self.reserved1.to_le_bytes());
        a[32..40].copy_from_slice(&self.sig_ptr.to_le_bytes());
        for (i, r) in self.reserved2.iter().enumerate() {
            a[40 + 8 * i..48 + 8 * i].copy_from_slice(&r.to_le_bytes());
        }
        a
    }
}

/// A raw fs-verity ioctl.
pub enum VerityIoctl<'a> {
    /// `FS_IOC_ENABLE_VERITY`.
    Enable(&'a EnableArg),
    /// `FS_IOC_MEASURE_VERITY` with room for `digest_size` bytes.
    Measure { digest_size: u16 },
    /// `FS_IOC_READ_VERITY_METADATA` of the Merkle tree's first 4096 bytes.
    ReadMerkleTree,
}

/// `ioctl(file, cmd, arg)`.
///
/// # Safety
///
/// Whatever the kernel may write for `cmd` through `arg`, or through the
/// pointers the structure at `arg` holds, must be memory the caller owns
/// and no live reference points to, or memory the kernel cannot access
/// (then the ioctl fails with `EFAULT` and nothing is written).
unsafe fn ioctl(file: &File, cmd: u32, arg: *mut u8) -> io::Result<()> {
    // SAFETY: passed on to the caller (above); `file` is an open
    // descriptor for the whole call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), cmd as libc::Ioctl, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Issues `request` on `file`; returns the argument buffer as the kernel
/// left it (for a measure: the `struct fsverity_digest`).
pub fn verity_ioctl(file: &File, request: VerityIoctl) -> io::Result<Vec<u8>> {
    // Buffers the argument points to; they outlive the call.
    let mut tree_buf = vec![0u8; 4096];
    let (cmd, mut arg) = match request {
        VerityIoctl::Enable(e) => (FS_IOC_ENABLE_VERITY, e.raw().to_bytes().to_vec()),
        VerityIoctl::Measure { digest_size } => {
            let mut a = vec![0u8; DIGEST_HEADER_SIZE + usize::from(digest_size)];
            a[2..4].copy_from_slice(&digest_size.to_le_bytes());
            (FS_IOC_MEASURE_VERITY, a)
        }
        VerityIoctl::ReadMerkleTree => {
            let mut a = vec![0u8; 40];
            a[0..8].copy_from_slice(&1u64.to_le_bytes());
            a[16..24].copy_from_slice(&(tree_buf.len() as u64).to_le_bytes());
            a[24..32].copy_from_slice(&(tree_buf.as_mut_ptr() as u64).to_le_bytes());
            (FS_IOC_READ_VERITY_METADATA, a)
        }
    };
    // SAFETY: `arg` is the argument structure `cmd` takes, at least as
    // large as the kernel reads or writes (`_IOC_SIZE(cmd)`, or for
    // MEASURE the header plus the `digest_size` it announces), and each
    // pointer inside it refers to a live buffer (`EnableArg`'s salt and
    // signature, `tree_buf`) at least as long as the length stored beside
    // it; all of them outlive the call, and only `arg` and `tree_buf` are
    // written (ENABLE writes nothing).
    unsafe { ioctl(file, cmd, arg.as_mut_ptr()) }?;
    drop(tree_buf);
    Ok(arg)
}

/// `FS_IOC_READ_VERITY_METADATA` of `metadata_type` (1: Merkle tree,
/// 2: descriptor, 3: signature) from `offset` into `buf`, with `reserved`
/// as the structure's `__reserved` flags word; returns the bytes read.
pub fn read_verity_metadata(
    file: &File,
    metadata_type: u64,
    offset: u64,
    buf: &mut [u8],
    reserved: u64,
) -> io::Result<usize> {
    let mut arg = [0u8; 40];
    arg[0..8].copy_from_slice(&metadata_type.to_le_bytes());
    arg[8..16].copy_from_slice(&offset.to_le_bytes());
    arg[16..24].copy_from_slice(&(buf.len() as u64).to_le_bytes());
    arg[24..32].copy_from_slice(&(buf.as_mut_ptr() as u64).to_le_bytes());
    arg[32..40].copy_from_slice(&reserved.to_le_bytes());
    // SAFETY: `arg` is the 40-byte `struct fsverity_read_metadata_arg`
    // the kernel reads; the only memory it writes is `buf`, whose address
    // and length the structure gives, borrowed mutably for the call.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            FS_IOC_READ_VERITY_METADATA as libc::Ioctl,
            arg.as_mut_ptr(),
        )
    };
    usize::try_from(rc).map_err(|_| io::Error::last_os_error())
}

/// Raw `FS_IOC_ENABLE_VERITY` on `path` opened read-only.
pub fn raw_enable(path: &Path, arg: &EnableArg) -> io::Result<()> {
    verity_ioctl(&File::open(path)?, VerityIoctl::Enable(arg)).map(drop)
}

/// Raw `FS_IOC_MEASURE_VERITY` on `path`: `ALG:HEX` as fsverity prints it.
pub fn raw_measure(path: &Path, digest_size: u16) -> io::Result<String> {
    let out = verity_ioctl(&File::open(path)?, VerityIoctl::Measure { digest_size })?;
    Ok(format_digest(&out).unwrap_or_else(|| {
        panic!("the digest does not fit the {digest_size}-byte buffer: {out:?}")
    }))
}

/// A `struct fsverity_digest` as `fsverity measure` prints it (`ALG:HEX`);
/// `None` if its `digest_size` runs past the buffer.
pub fn format_digest(out: &[u8]) -> Option<String> {
    let alg = match u16::from_le_bytes([out[0], out[1]]) {
        1 => "sha256".to_owned(),
        2 => "sha512".to_owned(),
        n => format!("ALG_{n}"),
    };
    let size = usize::from(u16::from_le_bytes([out[2], out[3]]));
    let digest = out.get(DIGEST_HEADER_SIZE..DIGEST_HEADER_SIZE + size)?;
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{alg}:{hex}"))
}

// ---------------------------------------------------------------------------
// Hostile fs-verity ioctls: any sizes, any pointers
// ---------------------------------------------------------------------------

/// `FS_IOC_ENABLE_VERITY` with `arg` exactly as given: its sizes and
/// pointers may be anything (null, unmapped, too short, huge).
pub fn enable_ioctl(file: &File, arg: &RawEnableArg) -> io::Result<()> {
    let mut bytes = arg.to_bytes();
    // SAFETY: FS_IOC_ENABLE_VERITY is `_IOW`: the kernel only reads from
    // the caller. It reads the 128 bytes of `bytes` (a live local array)
    // and, for `salt_size`/`sig_size` bytes, whatever `salt_ptr`/`sig_ptr`
    // point to, with `copy_from_user()`, which fails with EFAULT on memory
    // it cannot read. It writes nothing back (the FUSE driver sets up no
    // output buffer for `_IOW` ioctls and fails a reply that carries data
    // with EIO), so no memory of this process changes, whatever the
    // pointers are.
    unsafe { ioctl(file, FS_IOC_ENABLE_VERITY, bytes.as_mut_ptr()) }
}

/// Addresses where the kernel cannot access this process' memory: ioctls
/// given them fail with `EFAULT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadAddress {
    /// The null pointer.
    Null,
    /// A low page below `vm.mmap_min_addr`: never mapped.
    Low,
    /// A kernel address (`access_ok()` refuses it).
    Kernel,
    /// A non-canonical address.
    NonCanonical,
}

impl BadAddress {
    /// All of them.
    pub const ALL: [BadAddress; 4] = [
        BadAddress::Null,
        BadAddress::Low,
        BadAddress::Kernel,
        BadAddress::NonCanonical,
    ];

    /// The address.
    pub fn addr(self) -> u64 {
        match self {
            BadAddress::Null => 0,
            BadAddress::Low => 0x1000,
            BadAddress::Kernel => 0xffff_ffff_8100_0000,
            BadAddress::NonCanonical => 0x8000_0000_0000_0000,
        }
    }
}

/// `FS_IOC_ENABLE_VERITY` or `FS_IOC_MEASURE_VERITY` (`cmd`) with an
/// argument pointer the kernel cannot use.
pub fn verity_ioctl_at(file: &File, cmd: u32, arg: BadAddress) -> io::Result<()> {
    assert!(
        cmd == FS_IOC_ENABLE_VERITY || cmd == FS_IOC_MEASURE_VERITY,
        "not an fs-verity ioctl: {cmd:#x}"
    );
    // SAFETY: nothing of this process is mapped at `arg` (see
    // `BadAddress`), so the kernel's first `copy_from_user()` of the
    // argument fails with EFAULT, before any request reaches the daemon
    // and before anything could be written.
    unsafe { ioctl(file, cmd, arg.addr() as *mut u8) }
}

/// Anonymous memory of whole pages followed by an inaccessible guard page:
/// whatever the kernel reads or writes past the end faults (EFAULT) rather
/// than reaching other memory. Hostile ioctls point into its last bytes.
pub struct GuardedBuf {
    /// The start of the mapping (accessible pages, then the guard page).
    base: *mut u8,
    /// Bytes of accessible memory.
    len: usize,
    /// The page size.
    page: usize,
}

impl GuardedBuf {
    /// At least `len` accessible bytes (whole pages), zeroed.
    pub fn new(len: usize) -> GuardedBuf {
        let page = page_size();
        let len = len.max(1).next_multiple_of(page);
        // SAFETY: a fresh private anonymous mapping at an address of the
        // kernel's choosing: it overlaps nothing that exists.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            base != libc::MAP_FAILED,
            "mmap: {}",
            io::Error::last_os_error()
        );
        let base = base.cast::<u8>();
        // SAFETY: the last page of the mapping just made, which nothing
        // else refers to.
        let rc = unsafe { libc::mprotect(base.add(len).cast(), page, libc::PROT_NONE) };
        assert_eq!(rc, 0, "mprotect: {}", io::Error::last_os_error());
        GuardedBuf { base, len, page }
    }

    /// What [`measure_ioctl`](Self::measure_ioctl) puts after the header.
    pub const FILL: u8 = 0xa5;

    /// Bytes of accessible memory.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The address of the guard page (inaccessible).
    pub fn guard_addr(&self) -> u64 {
        self.base as u64 + self.len as u64
    }

    /// The address of the last `n` accessible bytes (`n` at most
    /// [`len`](Self::len)): `n` bytes can be read there, the next one is
    /// the guard page's.
    pub fn tail_addr(&self, n: usize) -> u64 {
        assert!(n <= self.len, "{n} bytes do not fit in {}", self.len);
        self.guard_addr() - n as u64
    }

    /// The accessible memory.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` readable and writable bytes from `base`, owned by
        // `self` and borrowed mutably with it.
        unsafe { std::slice::from_raw_parts_mut(self.base, self.len) }
    }

    /// `FS_IOC_ENABLE_VERITY` with the first `avail` bytes of `arg` placed
    /// in the last `avail` bytes before the guard page: with fewer than 128
    /// the kernel cannot read the whole structure.
    pub fn enable_ioctl(
        &mut self,
        file: &File,
        avail: usize,
        arg: &RawEnableArg,
    ) -> io::Result<()> {
        let start = self.len - avail;
        let n = avail.min(ENABLE_ARG_SIZE);
        self.as_mut_slice()[start..start + n].copy_from_slice(&arg.to_bytes()[..n]);
        let at = self.tail_addr(avail) as *mut u8;
        // SAFETY: as in `enable_ioctl()`, the kernel only reads for
        // FS_IOC_ENABLE_VERITY; here it reads from `at`, `avail` bytes of
        // this mapping then the guard page, where it faults (EFAULT).
        unsafe { ioctl(file, FS_IOC_ENABLE_VERITY, at) }
    }

    /// `FS_IOC_MEASURE_VERITY` with its `struct fsverity_digest` placed in
    /// the last `avail` bytes before the guard page (the header's first
    /// `avail` bytes if fewer than 4; the bytes after the header are set to
    /// [`FILL`](Self::FILL)), announcing room for `digest_size` bytes;
    /// read-only memory if not `writable`. Returns those `avail` bytes as
    /// the kernel left them.
    pub fn measure_ioctl(
        &mut self,
        file: &File,
        avail: usize,
        digest_size: u16,
        writable: bool,
    ) -> io::Result<Vec<u8>> {
        let mut header = [0u8; DIGEST_HEADER_SIZE];
        header[2..4].copy_from_slice(&digest_size.to_le_bytes());
        let start = self.len - avail;
        let n = avail.min(DIGEST_HEADER_SIZE);
        let region = &mut self.as_mut_slice()[start..];
        region[..n].copy_from_slice(&header[..n]);
        region[n..].fill(Self::FILL);
        let arg = self.tail_addr(avail) as *mut u8;
        if !writable {
            self.protect(libc::PROT_READ);
        }
        // SAFETY: from `arg`, `avail` bytes of this mapping, borrowed
        // mutably with `self` (no reference to them lives during the call),
        // then the guard page. The kernel reads and then writes at most the
        // header plus `digest_size` bytes from `arg` onwards, in order, with
        // `copy_from_user()`/`copy_to_user()`: an access past `avail` bytes
        // (or any write to read-only pages) faults on the guard page and
        // ends the ioctl with EFAULT before reaching anything else.
        let result = unsafe { ioctl(file, FS_IOC_MEASURE_VERITY, arg) };
        if !writable {
            self.protect(libc::PROT_READ | libc::PROT_WRITE);
        }
        result.map(|()| self.as_mut_slice()[start..].to_vec())
    }

    fn protect(&mut self, prot: libc::c_int) {
        // SAFETY: the accessible pages of this mapping, owned by `self`
        // and borrowed mutably, so no reference to them is alive.
        let rc = unsafe { libc::mprotect(self.base.cast(), self.len, prot) };
        assert_eq!(rc, 0, "mprotect: {}", io::Error::last_os_error());
    }
}

// SAFETY: a `GuardedBuf` owns its mapping outright (like a `Vec` owns its
// heap block) and hands out references only through `&mut self`, so moving
// it to another thread cannot create shared access.
unsafe impl Send for GuardedBuf {}

impl Drop for GuardedBuf {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `new`, which no reference
        // outlives (they all borrow `self`).
        unsafe { libc::munmap(self.base.cast(), self.len + self.page) };
    }
}

// ---------------------------------------------------------------------------
// Mounts
// ---------------------------------------------------------------------------

/// A `verityfs mount` of a fresh backing directory, run as a child process.
/// Dropping it unmounts (lazily if busy), reaps the daemon (killing it if it
/// does not exit, or first if it no longer answers and `umount` hangs),
/// clears `chattr +a/+i` flags and removes the directory; every step is
/// bounded, so a deadlocked daemon fails a test instead of hanging it.
pub struct Mount {
    /// Holds the directories; removed last.
    _root: tempfile::TempDir,
    /// The backing directory.
    pub backing: PathBuf,
    /// The mount point.
    pub mnt: PathBuf,
    /// Files kept outside the mount (originals to compare with).
    pub scratch: PathBuf,
    /// The daemon's stdout and stderr.
    pub log: PathBuf,
    /// Environment variables the daemon is started with (by [`Mount::start`]).
    pub env: Vec<(String, String)>,
    /// The `verityfs` program run as the daemon.
    program: PathBuf,
    /// How long the mount may take to appear.
    mount_timeout: Duration,
    daemon: Option<Child>,
}

impl Mount {
    /// A default mount.
    pub fn new() -> Mount {
        Mount::with_args(&[])
    }

    /// A mount with extra `verityfs mount` arguments (`-o allow_other`...).
    pub fn with_args(args: &[&str]) -> Mount {
        Mount::build(None, Path::new(VERITYFS), MOUNT_TIMEOUT, args)
    }

    /// A mount of the existing directory `backing` (left where it is when
    /// the guard is dropped).
    pub fn of_backing(backing: &Path, args: &[&str]) -> Mount {
        Mount::build(Some(backing), Path::new(VERITYFS), MOUNT_TIMEOUT, args)
    }

    /// A mount of the existing image or directory `source` (also a URL),
    /// its daemon started with the environment variables `env` (an S3
    /// store's settings).
    pub fn with_env(source: &Path, env: &[(&str, String)], args: &[&str]) -> Mount {
        let mut mount = Mount::prepare(Some(source), Path::new(VERITYFS), MOUNT_TIMEOUT);
        mount.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        mount.start(args);
        mount
    }

    /// A mount of the existing directory `backing` by the `verityfs`
    /// program at `program` (a copy of the one under test), which may take
    /// `mount_timeout` to appear (longer under emulation).
    pub fn over(backing: &Path, program: &Path, mount_timeout: Duration, args: &[&str]) -> Mount {
        Mount::build(Some(backing), program, mount_timeout, args)
    }

    fn build(
        backing: Option<&Path>,
        program: &Path,
        mount_timeout: Duration,
        args: &[&str],
    ) -> Mount {
        let mut mount = Mount::prepare(backing, program, mount_timeout);
        mount.start(args);
        mount
    }

    /// The directories of a mount, not started yet.
    fn prepare(backing: Option<&Path>, program: &Path, mount_timeout: Duration) -> Mount {
        prerequisites();
        let root = tempfile::Builder::new()
            .prefix("verityfs-mount-test")
            .tempdir()
            .expect("creating a temporary directory");
        // Other users must reach the mount point (permission tests).
        fs::set_permissions(root.path(), Permissions::from_mode(0o755)).unwrap();
        let base = root.path().canonicalize().unwrap();
        let mount = Mount {
            backing: backing.map_or_else(|| base.join("backing"), Path::to_path_buf),
            mnt: base.join("mnt"),
            scratch: base.join("scratch"),
            log: base.join("daemon.log"),
            env: Vec::new(),
            program: program.to_path_buf(),
            mount_timeout,
            _root: root,
            daemon: None,
        };
        for dir in [&mount.mnt, &mount.scratch] {
            fs::create_dir(dir).unwrap();
            fs::set_permissions(dir, Permissions::from_mode(0o755)).unwrap();
        }
        if backing.is_none() {
            fs::create_dir(&mount.backing).unwrap();
            fs::set_permissions(&mount.backing, Permissions::from_mode(0o755)).unwrap();
        }
        mount
    }

    /// `name` in the mount.
    pub fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    /// `name` in the backing directory.
    pub fn backing(&self, name: &str) -> PathBuf {
        self.backing.join(name)
    }

    /// `name` in the scratch directory (outside the mount).
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.scratch.join(name)
    }

    /// What the daemon printed.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Starts the daemon and waits until the mount is there; fails with the
    /// daemon's output if it exits or takes too long.
    pub fn start(&mut self, args: &[&str]) {
        assert!(self.daemon.is_none(), "already mounted");
        let log = File::create(&self.log).unwrap();
        let child = Command::new(&self.program)
            .arg("mount")
            .arg(&self.backing)
            .arg(&self.mnt)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting verityfs mount");
        let daemon = self.daemon.insert(child);
        let deadline = Instant::now() + self.mount_timeout;
        while !is_mounted(&self.mnt) {
            if let Some(status) = daemon.try_wait().unwrap() {
                self.daemon = None;
                panic!(
                    "verityfs mount {args:?} exited ({status}) without mounting:\n{}",
                    self.log()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "verityfs mount {args:?} did not mount within {:?}:\n{}",
                    self.mount_timeout,
                    self.log()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The daemon's process id.
    pub fn daemon_pid(&self) -> Pid {
        Pid::from_child(self.daemon.as_ref().expect("mounted"))
    }

    /// The daemon's exit status if it has exited (crashed), without
    /// waiting.
    pub fn daemon_exited(&mut self) -> Option<ExitStatus> {
        let daemon = self.daemon.as_mut().expect("mounted");
        daemon.try_wait().expect("waiting for the daemon")
    }

    /// Waits for the daemon to exit by itself (bounded) and checks that the
    /// mount is gone; returns its exit status.
    #[track_caller]
    pub fn wait_daemon(&mut self) -> ExitStatus {
        let daemon = self.daemon.as_mut().expect("mounted");
        let status = wait_for(daemon, EXIT_TIMEOUT).unwrap_or_else(|| {
            panic!(
                "the daemon did not exit within {EXIT_TIMEOUT:?}:\n{}",
                self.log()
            )
        });
        self.daemon = None;
        assert!(
            !is_mounted(&self.mnt),
            "still mounted after the daemon exited"
        );
        status
    }

    /// Unmounts with `umount`, as a user would, and checks that the daemon
    /// exits with status 0.
    #[track_caller]
    pub fn unmount(&mut self) {
        run_ok(Command::new("umount").arg(&self.mnt));
        let status = self.wait_daemon();
        assert_eq!(
            status.code(),
            Some(0),
            "daemon exit: {status}:\n{}",
            self.log()
        );
    }

    /// Kills the daemon with SIGKILL (a crash) and removes the dead mount.
    pub fn kill_daemon(&mut self) {
        let mut daemon = self.daemon.take().expect("mounted");
        daemon.kill().unwrap();
        daemon.wait().unwrap();
        run_ok(Command::new("umount").arg("-l").arg(&self.mnt));
        assert!(!is_mounted(&self.mnt));
    }

    /// Unmounts cleanly and mounts the same backing directory again with
    /// `args`.
    #[track_caller]
    pub fn remount(&mut self, args: &[&str]) {
        self.unmount();
        self.start(args);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            // An `umount` stuck on a daemon that no longer answers.
            let mut stuck = None;
            if is_mounted(&self.mnt) {
                match umount_bounded(&self.mnt, false) {
                    Umount::Done => {}
                    Umount::Failed => {
                        umount_bounded(&self.mnt, true);
                    }
                    Umount::Hung(umount) => {
                        // A hung daemon (deadlock): killing it fails its
                        // requests (ENOTCONN), which frees the `umount`.
                        let _ = daemon.kill();
                        stuck = Some(umount);
                    }
                }
            }
            if wait_for(&mut daemon, EXIT_TIMEOUT).is_none() {
                let _ = daemon.kill();
                let _ = wait_for(&mut daemon, EXIT_TIMEOUT);
            }
            if let Some(mut umount) = stuck {
                let _ = wait_for(&mut umount, EXIT_TIMEOUT);
            }
            if is_mounted(&self.mnt) {
                umount_bounded(&self.mnt, true);
            }
        }
        // Append-only and immutable files could not be removed.
        let _ = Command::new("chattr")
            .args(["-R", "-f", "-ai"])
            .arg(&self.backing)
            .stderr(Stdio::null())
            .status();
        // Never walk into a mount that is still there (it could hang).
        if is_mounted(&self.mnt) {
            self._root.disable_cleanup(true);
        }
    }
}

/// How a cleanup `umount` went.
enum Umount {
    Done,
    Failed,
    /// Still running after [`UMOUNT_TIMEOUT`]: waiting for the daemon.
    Hung(Child),
}

/// How long a cleanup `umount` may take before the daemon is presumed
/// hung.
const UMOUNT_TIMEOUT: Duration = Duration::from_secs(5);

/// `umount -c [-l] MNT`, bounded. `-c`: no canonicalization of the path,
/// which would stat the mount point and hang with the daemon.
fn umount_bounded(mnt: &Path, lazy: bool) -> Umount {
    let mut cmd = Command::new("umount");
    cmd.arg("-c");
    if lazy {
        cmd.arg("-l");
    }
    let spawned = cmd
        .arg(mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut umount) = spawned else {
        return Umount::Failed;
    };
    match wait_for(&mut umount, UMOUNT_TIMEOUT) {
        Some(status) if status.success() => Umount::Done,
        Some(_) => Umount::Failed,
        None => Umount::Hung(umount),
    }
}

/// Whether `path` is a mount point (of this process' namespace).
pub fn is_mounted(path: &Path) -> bool {
    let escaped = path
        .to_str()
        .expect("UTF-8 path")
        .replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012");
    fs::read_to_string("/proc/self/mountinfo")
        .expect("reading /proc/self/mountinfo")
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(escaped.as_str()))
}

/// A child process killed (and reaped, if it goes) when dropped.
pub struct Spawned(pub Child);

impl Spawned {
    pub fn new(cmd: &mut Command) -> Spawned {
        Spawned(cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}")))
    }

    pub fn pid(&self) -> Pid {
        Pid::from_child(&self.0)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        // Bounded: a process stuck in a hung mount is freed when the
        // mount's guard kills the daemon.
        let _ = wait_for(&mut self.0, EXIT_TIMEOUT);
    }
}

/// Writes `data` to `name` through the mount and keeps a copy in scratch.
pub fn write_file(m: &Mount, name: &str, data: &[u8]) -> PathBuf {
    fs::write(m.scratch(name), data).unwrap();
    fs::write(m.path(name), data).unwrap();
    m.path(name)
}

/// A verity file `name` of `size` random bytes, enabled with default
/// parameters; returns its data.
pub fn verity_file(m: &Mount, name: &str, size: usize) -> Vec<u8> {
    let data = random_bytes(size, size as u64 ^ 0x5eed);
    enable(&write_file(m, name, &data), &[]);
    data
}

/// The fs-verity digest (`ALG:HEX`, as `fsverity measure` prints it) of
/// `data` with hash algorithm number `alg`, `block_size` and `salt`,
/// computed by the library.
pub fn digest_of(data: &[u8], alg: u32, block_size: u32, salt: &[u8]) -> String {
    let alg = verityfs::HashAlgorithm::from_id(alg).expect("a known hash algorithm");
    let params = verityfs::MerkleTreeParams::new(alg, block_size.into(), salt)
        .expect("valid tree parameters");
    let (descriptor, _) = verityfs::build_merkle_tree(
        &params,
        data.len() as u64,
        data,
        verityfs::DiscardTree,
        &mut |_| Ok(()),
    )
    .expect("building the tree in memory");
    format!("{}:{}", alg.name(), descriptor.file_digest().to_hex())
}

/// The draws the randomized tests make most, on the seeded generator.
pub trait Draw {
    /// One of `items`, each equally likely.
    fn pick<T: Copy>(&mut self, items: &[T]) -> T;
    /// True with probability `percent`/100.
    fn percent(&mut self, percent: u32) -> bool;
}

impl Draw for fastrand::Rng {
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.usize(..items.len())]
    }

    fn percent(&mut self, percent: u32) -> bool {
        self.u32(..100) < percent
    }
}
