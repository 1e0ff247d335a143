//! The fs-verity ioctls `enable` and `measure` issue, on any file system
//! with fs-verity (ext4, f2fs, btrfs, a `verityfs mount`). This is the
//! command line tool's only `unsafe` code.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `struct fsverity_enable_arg` (`include/uapi/linux/fsverity.h`).
#[repr(C)]
struct EnableArg {
    version: u32,
    hash_algorithm: u32,
    block_size: u32,
    salt_size: u32,
    salt_ptr: u64,
    sig_size: u32,
    reserved1: u32,
    sig_ptr: u64,
    reserved2: [u64; 11],
}

/// `struct fsverity_digest` with room for the largest digest, as
/// fsverity-utils allocates it (`FS_VERITY_MAX_DIGEST_SIZE` = 64).
#[repr(C)]
struct MeasureArg {
    digest_algorithm: u16,
    digest_size: u16,
    digest: [u8; MAX_DIGEST_SIZE],
}

/// The header of `struct fsverity_digest`, whose size is encoded in the
/// ioctl number.
#[repr(C)]
struct DigestHeader {
    _digest_algorithm: u16,
    _digest_size: u16,
}

const MAX_DIGEST_SIZE: usize = 64;

/// `FS_IOC_ENABLE_VERITY`: `_IOW('f', 133, struct fsverity_enable_arg)`.
const FS_IOC_ENABLE_VERITY: libc::Ioctl = libc::_IOW::<EnableArg>(b'f' as u32, 133);
/// `FS_IOC_MEASURE_VERITY`: `_IOWR('f', 134, struct fsverity_digest)`.
const FS_IOC_MEASURE_VERITY: libc::Ioctl = libc::_IOWR::<DigestHeader>(b'f' as u32, 134);

/// The arguments of `FS_IOC_ENABLE_VERITY`, passed to the kernel unchecked
/// (as `fsverity enable` does: the kernel, or the FUSE daemon, judges them).
pub struct EnableParams<'a> {
    /// Hash algorithm number.
    pub hash_algorithm: u32,
    /// Merkle tree block size.
    pub block_size: u32,
    /// Salt, of any length.
    pub salt: &'a [u8],
    /// Built-in signature (empty for none).
    pub signature: &'a [u8],
}

/// Enables fs-verity on `file` (opened for reading).
pub fn enable_verity(file: &File, params: &EnableParams<'_>) -> io::Result<()> {
    let ptr_of = |bytes: &[u8]| match bytes.is_empty() {
        true => 0,
        false => bytes.as_ptr() as u64,
    };
    let size_of = |bytes: &[u8]| u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    let arg = EnableArg {
        version: 1,
        hash_algorithm: params.hash_algorithm,
        block_size: params.block_size,
        salt_size: size_of(params.salt),
        salt_ptr: ptr_of(params.salt),
        sig_size: size_of(params.signature),
        reserved1: 0,
        sig_ptr: ptr_of(params.signature),
        reserved2: [0; 11],
    };
    // SAFETY: FS_IOC_ENABLE_VERITY only reads `arg` and the salt and
    // signature buffers it points to, each of the length given beside it;
    // all of them live until the call returns.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_ENABLE_VERITY, &arg) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Measures the verity file `file`: its hash algorithm number and its
/// digest.
pub fn measure_verity(file: &File) -> io::Result<(u16, Vec<u8>)> {
    let mut arg = MeasureArg {
        digest_algorithm: 0,
        digest_size: MAX_DIGEST_SIZE as u16,
        digest: [0; MAX_DIGEST_SIZE],
    };
    // SAFETY: the kernel writes at most `digest_size` (64) bytes after the
    // 4-byte header, which is what `arg` holds; `arg` outlives the call.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_MEASURE_VERITY, &mut arg) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = usize::from(arg.digest_size).min(MAX_DIGEST_SIZE);
    Ok((arg.digest_algorithm, arg.digest[..len].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_uapi() {
        assert_eq!(std::mem::size_of::<EnableArg>(), 128);
        assert_eq!(std::mem::size_of::<DigestHeader>(), 4);
        assert_eq!(std::mem::size_of::<MeasureArg>(), 4 + MAX_DIGEST_SIZE);
    }

    /// The numbers in the uapi header, for the asm-generic encoding.
    #[test]
    #[cfg(all(
        target_env = "gnu",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    ))]
    fn ioctl_numbers_match_the_uapi() {
        assert_eq!(FS_IOC_ENABLE_VERITY, 0x4080_6685);
        assert_eq!(FS_IOC_MEASURE_VERITY, 0xc004_6686);
    }

    /// A file that is not verity: `ENODATA` where the file system has
    /// fs-verity, `EOPNOTSUPP` where the kernel lacks it, `ENOTTY` where the
    /// file system has no such ioctl. Anything else (`EFAULT`, `EINVAL`)
    /// would mean a wrong request number or argument.
    #[test]
    fn measure_on_a_plain_file_fails() {
        let file = File::open("/proc/self/exe").unwrap();
        let err = measure_verity(&file).unwrap_err();
        let not_verity = [libc::ENODATA, libc::EOPNOTSUPP, libc::ENOTTY];
        assert!(not_verity.contains(&err.raw_os_error().unwrap()), "{err}");
    }
}
