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
//! (Linux's `fs/verity/enable.c`). The models are only a fast stand-in for
//! Linux: `kernel_oracle.rs` runs the same cases (`tests/hostile`) on ext4
//! under a real kernel and on a mount and compares the two, which is what
//! keeps them honest. A first pass sweeps the boundaries (each reserved
//! byte, each bad pointer, each size limit, each digest buffer size on each
//! kind of file); then a seeded random run (`VERITYFS_HOSTILE_SEED`,
//! `VERITYFS_HOSTILE_CALLS`, default 8000 calls) mixes them. Along the way
//! and at the end the mount must keep serving: verity files read and
//! measure right, failed enables leave no trace, a valid enable still
//! works, and the daemon unmounts cleanly.
//!
//! Needs what `mount.rs` needs (root, `/dev/fuse`, `fsverity`).

mod common;
mod hostile;

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fastrand::Rng;

use common::*;
use hostile::*;

/// Seed of the random run unless `VERITYFS_HOSTILE_SEED` says otherwise.
const DEFAULT_SEED: u64 = 0x686f_7374_696c_6506;
/// Calls of the random run unless `VERITYFS_HOSTILE_CALLS` says otherwise.
const DEFAULT_CALLS: usize = 8000;
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

/// The errno (or success) the kernel and the daemon together must give
/// for `case` (the caller is root, the fd read-only, the mount writable,
/// nothing append-only or open for writing, so the permission, `EBADF`,
/// `EROFS` and `ETXTBSY` checks pass).
fn expected_enable(case: &EnableCase, limits: &Limits) -> Result<(), i32> {
    // 1. The FUSE driver, before anything reaches the daemon.
    if let Some(errno) = fuse_layer_enable(case, limits) {
        return Err(errno);
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
    if let Some(errno) = fuse_layer_measure(case, limits) {
        return Err(errno);
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
    ammo: Ammo,
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
            ammo: Ammo::new(&limits, seed),
            limits,
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
        for (alg, block_size, salt) in VERITY_TARGETS {
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

    fn enable(&mut self, case: EnableCase, pick: u64) {
        let expected = expected_enable(&case, &self.limits);
        let target = self.target(case.target, pick);
        let what = format!("{case:?} on {target:?}");
        let file = target.file.try_clone().unwrap();
        let (got, raw) = self.ammo.enable(&file, &case);
        self.record("enable", case.target, &got);
        if got != expected {
            self.mismatch(format!(
                "enable: {what}: got {}, expected {}",
                show(&got),
                show(&expected)
            ));
        }
        if got.is_ok() && case.target == Kind::Plain {
            let salt = self.ammo.payload_bytes(raw.salt_ptr, case.salt_size);
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
        let (got, out) = match self.ammo.measure(&file, &case) {
            Ok(out) => (Ok(()), out),
            Err(e) => (Err(e), Vec::new()),
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
        let mut rng = Rng::with_seed(seed);
        for case in enables {
            attack.enable(case, rng.u64(..));
        }
        for case in measures {
            attack.measure(case, rng.u64(..));
        }
        attack.check_serving("after the sweep");
        for i in 1..=calls {
            if rng.percent(60) {
                let case = random_enable(&mut rng, &limits);
                attack.enable(case, rng.u64(..));
            } else {
                let case = random_measure(&mut rng);
                attack.measure(case, rng.u64(..));
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
