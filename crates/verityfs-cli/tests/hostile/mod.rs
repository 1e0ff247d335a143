//! The hostile fs-verity ioctl calls shared by `hostile_ioctl.rs` (which
//! checks them on a mount against a model) and the kernel oracle (which
//! runs a seeded batch under Linux and on a mount and compares): the cases,
//! their boundary sweep and random generator, what the kernel's FUSE layer
//! answers before a daemon sees a call, and [`Ammo`], which fires them.

#![allow(dead_code)]

use std::fs::{self, File};
use std::io;

use fastrand::Rng;

use crate::common::*;

/// `FUSE_VERITY_ENABLE_ARG_MAX_PAGES` (`fs/fuse/ioctl.c`): the FUSE driver
/// refuses a salt or a signature of more pages than this with `ENOMEM`.
pub const FUSE_VERITY_ENABLE_ARG_MAX_PAGES: usize = 256;
/// `FUSE_MAX_MAX_PAGES`, the default of `/proc/sys/fs/fuse/max_pages_limit`.
pub const FUSE_MAX_MAX_PAGES: usize = 256;
/// The request size `verityfs mount` negotiates (its `max_write` and
/// `max_readahead`: 1 MiB), from which fuser asks for `max_pages`.
pub const DAEMON_MAX_REQUEST: usize = 1 << 20;
/// The largest salt fs-verity takes (`sizeof(fsverity_descriptor.salt)`).
pub const MAX_SALT_SIZE: u32 = 32;
/// Bytes of reserved fields in `struct fsverity_enable_arg`:
/// `__reserved1` (4 bytes at 28) and `__reserved2` (88 bytes at 40).
pub const RESERVED_BYTES: usize = 4 + 88;

/// The verity files each run enables before attacking them: (hash
/// algorithm, block size, salt): SHA-256 unsalted and SHA-512 salted.
pub const VERITY_TARGETS: [(u32, u32, &[u8]); 2] = [(1, 4096, b""), (2, 1024, b"pepper")];

/// The limits of the running kernel's FUSE driver for this mount.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub page: usize,
    /// `fc->max_pages`: what the daemon asked for, capped by the sysctl.
    pub max_pages: usize,
}

impl Limits {
    pub fn of_this_kernel() -> Limits {
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
    pub fn max_enable_buffer(&self) -> u64 {
        (FUSE_VERITY_ENABLE_ARG_MAX_PAGES * self.page) as u64
    }

    /// Whether a request of `in_size` input bytes (and at most that much
    /// output) fits `fc->max_pages` (`fuse_do_ioctl()`).
    pub fn request_fits(&self, in_size: u64) -> bool {
        in_size.max(self.page as u64).div_ceil(self.page as u64) <= self.max_pages as u64
    }
}

/// What a file handle the ioctl goes to refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Plain,
    Verity,
    Dir,
}

/// Where an argument structure is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgAt {
    /// A whole structure in ordinary memory.
    Whole,
    /// Only its first `n` bytes readable, then a guard page.
    Short(usize),
    /// Nowhere the kernel can read.
    Bad(BadAddress),
}

/// Where a salt or signature pointer points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ptr {
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
pub struct EnableCase {
    pub target: Kind,
    pub version: u32,
    pub hash_algorithm: u32,
    pub block_size: u32,
    pub salt_size: u32,
    pub salt_ptr: Ptr,
    pub sig_size: u32,
    pub sig_ptr: Ptr,
    /// A reserved byte (0..92: `__reserved1` then `__reserved2`) set to a
    /// nonzero value.
    pub reserved: Option<(usize, u8)>,
    pub arg: ArgAt,
}

impl EnableCase {
    /// A valid enable of `target` with default parameters.
    pub fn valid(target: Kind) -> EnableCase {
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
pub struct MeasureCase {
    pub target: Kind,
    pub digest_size: u16,
    /// Readable (and writable) bytes from the start of the structure, or
    /// an argument pointer nowhere.
    pub avail: Result<usize, BadAddress>,
    /// Whether the kernel may write the answer back.
    pub writable: bool,
}

/// Readable bytes at `ptr` given `size` wanted.
pub fn readable(ptr: Ptr, size: u32) -> u64 {
    match ptr {
        Ptr::Valid => u64::from(size),
        Ptr::Bad(_) | Ptr::Guard => 0,
        Ptr::Straddle(n) => n as u64,
    }
}

/// What the kernel's FUSE driver answers for an enable `case` before the
/// daemon sees it, if anything: `fuse_setup_enable_verity()` copies the
/// structure (EFAULT) and refuses salts and signatures of more than 256
/// pages (ENOMEM); `fuse_do_ioctl()` refuses requests beyond
/// `fc->max_pages` (ENOMEM) and copies the structure, the salt and the
/// signature in (EFAULT), all before any of fs-verity's checks.
pub fn fuse_layer_enable(case: &EnableCase, limits: &Limits) -> Option<i32> {
    if case.arg != ArgAt::Whole {
        return Some(libc::EFAULT);
    }
    let (salt, sig) = (u64::from(case.salt_size), u64::from(case.sig_size));
    if salt > limits.max_enable_buffer() || sig > limits.max_enable_buffer() {
        return Some(libc::ENOMEM);
    }
    if !limits.request_fits(128 + salt + sig) {
        return Some(libc::ENOMEM);
    }
    if salt > readable(case.salt_ptr, case.salt_size) || sig > readable(case.sig_ptr, case.sig_size)
    {
        return Some(libc::EFAULT);
    }
    None
}

/// What the kernel's FUSE driver answers for a measure `case` before the
/// daemon sees it, if anything: `fuse_setup_measure_verity()` reads
/// `digest_size`, then `fuse_do_ioctl()` copies in one buffer of header
/// plus `digest_size` bytes (ENOMEM beyond `fc->max_pages`, EFAULT if
/// unreadable).
pub fn fuse_layer_measure(case: &MeasureCase, limits: &Limits) -> Option<i32> {
    let Ok(avail) = case.avail else {
        return Some(libc::EFAULT);
    };
    if avail < DIGEST_HEADER_SIZE {
        return Some(libc::EFAULT);
    }
    let size = DIGEST_HEADER_SIZE + usize::from(case.digest_size);
    if !limits.request_fits(size as u64) {
        return Some(libc::ENOMEM);
    }
    (avail < size).then_some(libc::EFAULT)
}

/// The memory hostile calls point into, and the calls themselves.
pub struct Ammo {
    /// Readable memory for salts and signatures (random bytes; a pointer
    /// to `n` bytes points at its last `n` bytes, before its guard page).
    payload: GuardedBuf,
    /// Where argument structures that must end early are put.
    args: GuardedBuf,
}

impl Ammo {
    pub fn new(limits: &Limits, seed: u64) -> Ammo {
        let mut payload = GuardedBuf::new(limits.max_enable_buffer() as usize + limits.page);
        let len = payload.len();
        payload
            .as_mut_slice()
            .copy_from_slice(&random_bytes(len, seed ^ 0x5a17));
        Ammo {
            payload,
            args: GuardedBuf::new(128 << 10),
        }
    }

    /// The address a salt or signature pointer gives.
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
    pub fn payload_bytes(&mut self, addr: u64, size: u32) -> Vec<u8> {
        if size == 0 {
            return Vec::new();
        }
        let start = (addr - self.payload.tail_addr(self.payload.len())) as usize;
        self.payload.as_mut_slice()[start..start + size as usize].to_vec()
    }

    /// Issues the enable `case` on `file`; returns its result and the
    /// structure it passed.
    pub fn enable(&mut self, file: &File, case: &EnableCase) -> (Result<(), i32>, RawEnableArg) {
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
        let result = match case.arg {
            ArgAt::Whole => enable_ioctl(file, &raw),
            ArgAt::Bad(bad) => verity_ioctl_at(file, FS_IOC_ENABLE_VERITY, bad),
            ArgAt::Short(n) => self.args.enable_ioctl(file, n, &raw),
        };
        (errno_of(result), raw)
    }

    /// Issues the measure `case` on `file`; returns the bytes of the
    /// argument as the kernel left them, or the errno.
    pub fn measure(&mut self, file: &File, case: &MeasureCase) -> Result<Vec<u8>, i32> {
        let result = match case.avail {
            Ok(avail) => self
                .args
                .measure_ioctl(file, avail, case.digest_size, case.writable),
            Err(bad) => verity_ioctl_at(file, FS_IOC_MEASURE_VERITY, bad).map(|()| Vec::new()),
        };
        result.map_err(|e| {
            e.raw_os_error()
                .unwrap_or_else(|| panic!("not an errno: {e}"))
        })
    }
}

/// Sets reserved byte `i` (0..92: `__reserved1`, then `__reserved2`) of
/// `raw` to `value`.
pub fn set_reserved_byte(raw: &mut RawEnableArg, i: usize, value: u8) {
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

pub fn errno_of<T>(result: io::Result<T>) -> Result<(), i32> {
    result.map(drop).map_err(|e| {
        e.raw_os_error()
            .unwrap_or_else(|| panic!("not an errno: {e}"))
    })
}

// ---------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------

pub const KINDS: [Kind; 3] = [Kind::Plain, Kind::Verity, Kind::Dir];
pub const DIGEST_SIZES: [u16; 6] = [0, 1, 31, 32, 64, 65535];

/// The boundaries, each on each kind of file.
pub fn sweep(limits: &Limits) -> (Vec<EnableCase>, Vec<MeasureCase>) {
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
pub fn random_size(rng: &mut Rng, limits: &Limits, typical_max: u32, limit: u32) -> u32 {
    let max = limits.max_enable_buffer() as u32;
    let fits = (limits.max_pages * limits.page - 128) as u32;
    match rng.u64(..20) {
        0..=7 => 0,
        8..=11 => 1 + rng.u32(..typical_max),
        12 => limit,
        13 => limit + 1,
        14 => limit + 1 + rng.u32(..8192),
        15 => rng.pick(&[fits - 1, fits, fits + 1, max - 1, max, max + 1]),
        16 => rng.pick(&[u32::MAX, u32::MAX - 1, 1 << 31, 1 << 24]),
        17 => rng.u32(..),
        _ => rng.u32(..2 << 20),
    }
}

pub fn random_ptr(rng: &mut Rng, size: u32) -> Ptr {
    match rng.u64(..20) {
        0 => Ptr::Bad(rng.pick(&BadAddress::ALL)),
        1 => Ptr::Guard,
        2 | 3 if size > 0 => Ptr::Straddle(rng.usize(..size.min(1 << 20) as usize)),
        _ => Ptr::Valid,
    }
}

pub fn random_enable(rng: &mut Rng, limits: &Limits) -> EnableCase {
    let target = rng.pick(&[Kind::Plain, Kind::Plain, Kind::Verity, Kind::Dir]);
    let version = if rng.percent(85) {
        1
    } else {
        let any = rng.u32(..);
        rng.pick(&[0, 2, 3, 0x100, u32::MAX, any])
    };
    let hash_algorithm = if rng.percent(80) {
        rng.pick(&[1, 2])
    } else {
        let any = rng.u32(..);
        rng.pick(&[0, 3, 4, 255, 256, 257, u32::MAX, any])
    };
    let any = rng.u32(..) | 3;
    let block_size = match rng.u64(..20) {
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
    let reserved = rng
        .percent(10)
        .then(|| (rng.usize(..RESERVED_BYTES), rng.u8(1..)));
    let arg = match rng.u64(..50) {
        0 => ArgAt::Bad(rng.pick(&BadAddress::ALL)),
        1 => ArgAt::Short(rng.usize(..128)),
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

pub fn random_measure(rng: &mut Rng) -> MeasureCase {
    let target = rng.pick(&[Kind::Plain, Kind::Verity, Kind::Verity, Kind::Dir]);
    let digest_size = match rng.u64(..4) {
        0 => rng.u16(..),
        _ => rng.pick(&[0, 1, 31, 32, 33, 63, 64, 65, 255, 4096, 65535]),
    };
    let exact = DIGEST_HEADER_SIZE + usize::from(digest_size);
    let avail = match rng.u64(..20) {
        0 => Err(rng.pick(&BadAddress::ALL)),
        1 | 2 => Ok(rng.usize(..exact)),
        3 | 4 => Ok(exact + rng.usize(..256)),
        _ => Ok(exact),
    };
    MeasureCase {
        target,
        digest_size,
        avail,
        writable: !rng.percent(5),
    }
}
