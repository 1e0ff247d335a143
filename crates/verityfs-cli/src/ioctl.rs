//! The fs-verity ioctls `enable` and `measure` issue, on any file system
//! with fs-verity (ext4, f2fs, btrfs, a `verityfs mount`), with arguments
//! the library encodes ([`verityfs::uapi`]). The command line tool's only
//! `unsafe` code: the `ioctl(2)` calls.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use verityfs::uapi::{self, FsverityDigest, MAX_DIGEST_SIZE};

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
    let arg = uapi::EnableArg {
        hash_algorithm: params.hash_algorithm,
        block_size: params.block_size,
        salt_size: size_of(params.salt),
        salt_ptr: ptr_of(params.salt),
        sig_size: size_of(params.signature),
        sig_ptr: ptr_of(params.signature),
    }
    .encode();
    // SAFETY: FS_IOC_ENABLE_VERITY only reads `arg` (its 128 bytes, the
    // size in the request number) and the salt and signature buffers it
    // points to, each of at most the length given beside it; all of them
    // live until the call returns.
    let ret = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            uapi::FS_IOC_ENABLE_VERITY as libc::Ioctl,
            arg.as_ptr(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Measures the verity file `file`: its hash algorithm number and its
/// digest, with room for the largest digest, as fsverity-utils gives.
pub fn measure_verity(file: &File) -> io::Result<FsverityDigest> {
    let mut arg = FsverityDigest::request(MAX_DIGEST_SIZE);
    // SAFETY: the kernel reads the 4-byte header, then writes the header
    // and at most `digest_size` (the 64 bytes `arg` holds after the header)
    // digest bytes; `arg` outlives the call.
    let ret = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            uapi::FS_IOC_MEASURE_VERITY as libc::Ioctl,
            arg.as_mut_ptr(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    FsverityDigest::decode(&arg).map_err(|e| io::Error::from_raw_os_error(e.errno()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
