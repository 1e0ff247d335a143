//! The fs-verity ioctl ABI, as the kernel defines it in
//! `include/uapi/linux/fsverity.h` (and, for the inode flags verity files
//! show, `include/uapi/linux/fs.h`): the request numbers, and the argument
//! structures as typed values encoded to and decoded from the native-endian
//! bytes the kernel passes.
//!
//! Both sides of the ABI use this module: a FUSE server decodes what the
//! kernel forwards to it, and a program encodes what it hands to `ioctl(2)`
//! on any file system with fs-verity. Decoding makes the checks the kernel
//! makes of the argument itself, in the kernel's order
//! (`fsverity_ioctl_enable()`, `fsverity_ioctl_measure()`), so that a
//! server answers with the kernel's errnos ([`ArgError::errno`]).
//!
//! ```
//! use verityfs::uapi::{EnableArg, FS_IOC_ENABLE_VERITY};
//!
//! let arg = EnableArg { hash_algorithm: 1, block_size: 4096, ..EnableArg::default() };
//! let bytes = arg.encode(); // what the ioctl's argument pointer points to
//! assert_eq!(EnableArg::decode(&bytes), Ok(arg));
//! // The request number the kernel expects for those bytes.
//! assert_eq!(FS_IOC_ENABLE_VERITY >> 16 & 0x3fff, bytes.len() as u32);
//! ```

use crate::descriptor::MAX_SIGNATURE_SIZE;
use crate::params::MAX_SALT_SIZE;

/// The `_IOC` encoding of the architectures with their own
/// (`arch/{powerpc,mips,sparc}/include/uapi/asm/ioctl.h`).
#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "mips32r6",
    target_arch = "mips64r6",
    target_arch = "sparc",
    target_arch = "sparc64"
))]
mod ioc {
    pub const SIZE_BITS: u32 = 13;
    pub const WRITE: u32 = 4;
    pub const READ: u32 = 2;
}

/// The `_IOC` encoding of `include/uapi/asm-generic/ioctl.h` (x86, arm,
/// arm64, riscv, s390, loongarch...).
#[cfg(not(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "mips32r6",
    target_arch = "mips64r6",
    target_arch = "sparc",
    target_arch = "sparc64"
)))]
mod ioc {
    pub const SIZE_BITS: u32 = 14;
    pub const WRITE: u32 = 1;
    pub const READ: u32 = 2;
}

/// `_IOC(dir, type, nr, size)`: the direction bits above the size, above
/// the type byte, above the number.
const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    // A compile-time error for a structure too large to encode.
    assert!(size < 1 << ioc::SIZE_BITS, "ioctl argument too large");
    (dir << (16 + ioc::SIZE_BITS)) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}

/// `_IOR(type, nr, T)` for a `T` of `size` bytes: the kernel writes it.
pub const fn ior(ty: u8, nr: u8, size: usize) -> u32 {
    ioc(ioc::READ, ty, nr, size)
}

/// `_IOW(type, nr, T)` for a `T` of `size` bytes: the kernel reads it.
pub const fn iow(ty: u8, nr: u8, size: usize) -> u32 {
    ioc(ioc::WRITE, ty, nr, size)
}

/// `_IOWR(type, nr, T)` for a `T` of `size` bytes: read, then written.
pub const fn iowr(ty: u8, nr: u8, size: usize) -> u32 {
    ioc(ioc::READ | ioc::WRITE, ty, nr, size)
}

/// Size of `struct fsverity_enable_arg`.
pub const ENABLE_ARG_SIZE: usize = 128;
/// Size of the header of `struct fsverity_digest` (the ioctl number counts
/// only it: the digest array after it is the caller's to size).
pub const DIGEST_HEADER_SIZE: usize = 4;
/// Size of `struct fsverity_read_metadata_arg`.
pub const READ_METADATA_ARG_SIZE: usize = 40;
/// Size of `struct fsxattr`.
pub const FSXATTR_SIZE: usize = 28;
/// Largest digest of any algorithm (`FS_VERITY_MAX_DIGEST_SIZE`): the room
/// fsverity-utils gives `FS_IOC_MEASURE_VERITY`.
pub const MAX_DIGEST_SIZE: u16 = 64;

/// `FS_IOC_ENABLE_VERITY`: `_IOW('f', 133, struct fsverity_enable_arg)`.
pub const FS_IOC_ENABLE_VERITY: u32 = iow(b'f', 133, ENABLE_ARG_SIZE);
/// `FS_IOC_MEASURE_VERITY`: `_IOWR('f', 134, struct fsverity_digest)`.
pub const FS_IOC_MEASURE_VERITY: u32 = iowr(b'f', 134, DIGEST_HEADER_SIZE);
/// `FS_IOC_READ_VERITY_METADATA`: `_IOWR('f', 135, struct
/// fsverity_read_metadata_arg)`.
pub const FS_IOC_READ_VERITY_METADATA: u32 = iowr(b'f', 135, READ_METADATA_ARG_SIZE);
/// `FS_IOC_GETFLAGS`: `_IOR('f', 1, long)`, though the value passed is a
/// 4-byte `int`.
pub const FS_IOC_GETFLAGS: u32 = ior(b'f', 1, size_of::<core::ffi::c_long>());
/// `FS_IOC_SETFLAGS`: `_IOW('f', 2, long)`, of a 4-byte `int`.
pub const FS_IOC_SETFLAGS: u32 = iow(b'f', 2, size_of::<core::ffi::c_long>());
/// `FS_IOC32_GETFLAGS`: `_IOR('f', 1, int)`, from 32-bit programs.
pub const FS_IOC32_GETFLAGS: u32 = ior(b'f', 1, 4);
/// `FS_IOC32_SETFLAGS`: `_IOW('f', 2, int)`.
pub const FS_IOC32_SETFLAGS: u32 = iow(b'f', 2, 4);
/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`.
pub const FS_IOC_FSGETXATTR: u32 = ior(b'X', 31, FSXATTR_SIZE);
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
pub const FS_IOC_FSSETXATTR: u32 = iow(b'X', 32, FSXATTR_SIZE);

/// `FS_SYNC_FL`: synchronous updates.
pub const FS_SYNC_FL: u32 = 0x0000_0008;
/// `FS_IMMUTABLE_FL`.
pub const FS_IMMUTABLE_FL: u32 = 0x0000_0010;
/// `FS_APPEND_FL`: writes only append.
pub const FS_APPEND_FL: u32 = 0x0000_0020;
/// `FS_NODUMP_FL`.
pub const FS_NODUMP_FL: u32 = 0x0000_0040;
/// `FS_NOATIME_FL`.
pub const FS_NOATIME_FL: u32 = 0x0000_0080;
/// `FS_VERITY_FL`: the inode flag of verity files.
pub const FS_VERITY_FL: u32 = 0x0010_0000;
/// `FS_DAX_FL`.
pub const FS_DAX_FL: u32 = 0x0200_0000;
/// `FS_PROJINHERIT_FL`.
pub const FS_PROJINHERIT_FL: u32 = 0x2000_0000;

/// `FS_XFLAG_IMMUTABLE`: [`FS_IMMUTABLE_FL`] in a `struct fsxattr`.
pub const FS_XFLAG_IMMUTABLE: u32 = 0x0000_0008;
/// `FS_XFLAG_APPEND`.
pub const FS_XFLAG_APPEND: u32 = 0x0000_0010;
/// `FS_XFLAG_SYNC`.
pub const FS_XFLAG_SYNC: u32 = 0x0000_0020;
/// `FS_XFLAG_NOATIME`.
pub const FS_XFLAG_NOATIME: u32 = 0x0000_0040;
/// `FS_XFLAG_NODUMP`.
pub const FS_XFLAG_NODUMP: u32 = 0x0000_0080;
/// `FS_XFLAG_PROJINHERIT`.
pub const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
/// `FS_XFLAG_DAX`.
pub const FS_XFLAG_DAX: u32 = 0x0000_8000;

/// What the kernel refuses in an ioctl argument, before looking at the
/// file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// Fewer bytes than the structure (the kernel's `copy_from_user()`
    /// failing): `EFAULT`.
    #[error("argument truncated")]
    Truncated,
    /// `version` other than 1: `EINVAL`.
    #[error("unsupported argument version")]
    Version,
    /// A reserved field not zero: `EINVAL`.
    #[error("reserved field not zero")]
    Reserved,
    /// A block size that is not a power of two: `EINVAL`.
    #[error("block size not a power of two")]
    BlockSize,
    /// A salt over 32 bytes: `EMSGSIZE`.
    #[error("salt too large")]
    SaltTooLarge,
    /// A signature over `FS_VERITY_MAX_SIGNATURE_SIZE`: `EMSGSIZE`.
    #[error("signature too large")]
    SignatureTooLarge,
    /// No room for the digest: `EOVERFLOW`.
    #[error("digest buffer too small")]
    Overflow,
}

impl ArgError {
    /// The errno the kernel gives.
    pub fn errno(self) -> i32 {
        match self {
            ArgError::Truncated => libc::EFAULT,
            ArgError::Version | ArgError::Reserved | ArgError::BlockSize => libc::EINVAL,
            ArgError::SaltTooLarge | ArgError::SignatureTooLarge => libc::EMSGSIZE,
            ArgError::Overflow => libc::EOVERFLOW,
        }
    }
}

/// The first `N` bytes of `bytes`, or `Truncated`.
fn prefix<const N: usize>(bytes: &[u8]) -> Result<&[u8; N], ArgError> {
    bytes.first_chunk::<N>().ok_or(ArgError::Truncated)
}

/// Reads the native-endian fields of a structure in order.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (field, rest) = self.0.split_first_chunk::<N>().expect("field in bounds");
        self.0 = rest;
        *field
    }

    fn u16(&mut self) -> u16 {
        u16::from_ne_bytes(self.take())
    }

    fn u32(&mut self) -> u32 {
        u32::from_ne_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_ne_bytes(self.take())
    }
}

/// `struct fsverity_enable_arg`, the argument of `FS_IOC_ENABLE_VERITY`
/// (`version` is always 1 and the reserved fields zero, so they are not
/// kept). The salt and the signature are in the caller's memory, at the
/// addresses given: the kernel copies them in itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnableArg {
    /// `FS_VERITY_HASH_ALG_*` number.
    pub hash_algorithm: u32,
    /// Merkle tree block size.
    pub block_size: u32,
    /// Salt size in bytes.
    pub salt_size: u32,
    /// Address of the salt.
    pub salt_ptr: u64,
    /// Built-in signature size in bytes (0 for none).
    pub sig_size: u32,
    /// Address of the signature.
    pub sig_ptr: u64,
}

impl EnableArg {
    /// The structure's bytes.
    pub fn encode(&self) -> [u8; ENABLE_ARG_SIZE] {
        let fields: [&[u8]; 8] = [
            &1u32.to_ne_bytes(), // version
            &self.hash_algorithm.to_ne_bytes(),
            &self.block_size.to_ne_bytes(),
            &self.salt_size.to_ne_bytes(),
            &self.salt_ptr.to_ne_bytes(),
            &self.sig_size.to_ne_bytes(),
            &0u32.to_ne_bytes(), // __reserved1
            &self.sig_ptr.to_ne_bytes(),
        ];
        let mut out = [0; ENABLE_ARG_SIZE]; // __reserved2 stays zero
        let mut at = 0;
        for field in fields {
            out[at..at + field.len()].copy_from_slice(field);
            at += field.len();
        }
        out
    }

    /// Decodes the structure at the start of `bytes`, with the kernel's
    /// checks of it in the kernel's order: the size (`EFAULT`), the
    /// version, the reserved fields, the block size a power of two
    /// (`EINVAL`), the salt and signature sizes (`EMSGSIZE`).
    pub fn decode(bytes: &[u8]) -> Result<Self, ArgError> {
        let mut f = Fields(prefix::<ENABLE_ARG_SIZE>(bytes)?);
        let version = f.u32();
        let (hash_algorithm, block_size, salt_size) = (f.u32(), f.u32(), f.u32());
        let salt_ptr = f.u64();
        let (sig_size, reserved1, sig_ptr) = (f.u32(), f.u32(), f.u64());
        let reserved2 = f.0;
        if version != 1 {
            return Err(ArgError::Version);
        }
        if reserved1 != 0 || reserved2.iter().any(|&b| b != 0) {
            return Err(ArgError::Reserved);
        }
        if !block_size.is_power_of_two() {
            return Err(ArgError::BlockSize);
        }
        if salt_size as usize > MAX_SALT_SIZE {
            return Err(ArgError::SaltTooLarge);
        }
        if sig_size as usize > MAX_SIGNATURE_SIZE {
            return Err(ArgError::SignatureTooLarge);
        }
        Ok(EnableArg {
            hash_algorithm,
            block_size,
            salt_size,
            salt_ptr,
            sig_size,
            sig_ptr,
        })
    }
}

/// `struct fsverity_digest`: what `FS_IOC_MEASURE_VERITY` returns, a
/// verity file's digest and its algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsverityDigest {
    /// `FS_VERITY_HASH_ALG_*` number.
    pub algorithm: u16,
    /// The file digest (at most `u16::MAX` bytes are encoded).
    pub digest: Vec<u8>,
}

impl FsverityDigest {
    /// A request for `FS_IOC_MEASURE_VERITY`: a header offering room for
    /// `capacity` bytes, and that room.
    pub fn request(capacity: u16) -> Vec<u8> {
        let mut out = vec![0; DIGEST_HEADER_SIZE + usize::from(capacity)];
        out[2..4].copy_from_slice(&capacity.to_ne_bytes());
        out
    }

    /// The room a request's header offers for the digest (its
    /// `digest_size`).
    pub fn capacity(request: &[u8]) -> Result<u16, ArgError> {
        let mut f = Fields(prefix::<DIGEST_HEADER_SIZE>(request)?);
        let _algorithm = f.u16();
        Ok(f.u16())
    }

    /// The structure's bytes: header, then digest.
    pub fn encode(&self) -> Vec<u8> {
        let digest = &self.digest[..self.digest.len().min(u16::MAX.into())];
        let mut out = Vec::with_capacity(DIGEST_HEADER_SIZE + digest.len());
        out.extend_from_slice(&self.algorithm.to_ne_bytes());
        out.extend_from_slice(&(digest.len() as u16).to_ne_bytes());
        out.extend_from_slice(digest);
        out
    }

    /// The reply to a request offering `capacity` bytes: `Overflow`
    /// (`EOVERFLOW`) if the digest does not fit, as the kernel checks.
    pub fn reply(&self, capacity: u16) -> Result<Vec<u8>, ArgError> {
        if usize::from(capacity) < self.digest.len() {
            return Err(ArgError::Overflow);
        }
        Ok(self.encode())
    }

    /// Decodes a reply: the header, then as many digest bytes as it says.
    pub fn decode(bytes: &[u8]) -> Result<Self, ArgError> {
        let mut f = Fields(prefix::<DIGEST_HEADER_SIZE>(bytes)?);
        let (algorithm, size) = (f.u16(), usize::from(f.u16()));
        let digest = bytes[DIGEST_HEADER_SIZE..]
            .get(..size)
            .ok_or(ArgError::Truncated)?;
        Ok(FsverityDigest {
            algorithm,
            digest: digest.to_vec(),
        })
    }
}

/// The inode flags (`FS_*_FL`) `FS_IOC_GETFLAGS` and `FS_IOC_SETFLAGS`
/// pass, as a 4-byte `int` whatever the ioctl number says.
pub fn encode_flags(flags: u32) -> [u8; 4] {
    flags.to_ne_bytes()
}

/// Decodes the inode flags at the start of `bytes`.
pub fn decode_flags(bytes: &[u8]) -> Result<u32, ArgError> {
    Ok(u32::from_ne_bytes(*prefix(bytes)?))
}

/// `struct fsxattr`, the argument of `FS_IOC_FSGETXATTR` and
/// `FS_IOC_FSSETXATTR` (its padding is not kept: zero when encoded,
/// ignored when decoded, as by the kernel).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fsxattr {
    /// `FS_XFLAG_*` flags.
    pub xflags: u32,
    /// Extent size hint.
    pub extsize: u32,
    /// Number of extents (output only).
    pub nextents: u32,
    /// Project id.
    pub projid: u32,
    /// Copy-on-write extent size hint.
    pub cowextsize: u32,
}

impl Fsxattr {
    /// The structure's bytes.
    pub fn encode(&self) -> [u8; FSXATTR_SIZE] {
        let mut out = [0; FSXATTR_SIZE];
        let fields = [
            self.xflags,
            self.extsize,
            self.nextents,
            self.projid,
            self.cowextsize,
        ];
        for (chunk, field) in out.chunks_exact_mut(4).zip(fields) {
            chunk.copy_from_slice(&field.to_ne_bytes());
        }
        out
    }

    /// Decodes the structure at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ArgError> {
        let mut f = Fields(prefix::<FSXATTR_SIZE>(bytes)?);
        Ok(Fsxattr {
            xflags: f.u32(),
            extsize: f.u32(),
            nextents: f.u32(),
            projid: f.u32(),
            cowextsize: f.u32(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers in the kernel's headers, as `strace` and the headers'
    /// expansion on these architectures show them.
    #[test]
    #[cfg(all(
        target_pointer_width = "64",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64",
            target_arch = "s390x",
            target_arch = "loongarch64"
        )
    ))]
    fn ioctl_numbers_are_the_kernels() {
        assert_eq!(FS_IOC_ENABLE_VERITY, 0x4080_6685);
        assert_eq!(FS_IOC_MEASURE_VERITY, 0xc004_6686);
        assert_eq!(FS_IOC_READ_VERITY_METADATA, 0xc028_6687);
        assert_eq!(FS_IOC_GETFLAGS, 0x8008_6601);
        assert_eq!(FS_IOC_SETFLAGS, 0x4008_6602);
        assert_eq!(FS_IOC32_GETFLAGS, 0x8004_6601);
        assert_eq!(FS_IOC32_SETFLAGS, 0x4004_6602);
        assert_eq!(FS_IOC_FSGETXATTR, 0x801c_581f);
        assert_eq!(FS_IOC_FSSETXATTR, 0x401c_5820);
    }

    /// The same numbers from libc's own `_IOC` macros, for whatever
    /// architecture this is.
    #[test]
    fn ioctl_numbers_match_libc() {
        let libc = |n: libc::Ioctl| n as u32;
        assert_eq!(
            FS_IOC_ENABLE_VERITY,
            libc(libc::_IOW::<[u8; 128]>(0x66, 133))
        );
        assert_eq!(
            FS_IOC_MEASURE_VERITY,
            libc(libc::_IOWR::<[u16; 2]>(0x66, 134))
        );
        assert_eq!(FS_IOC_GETFLAGS, libc(libc::FS_IOC_GETFLAGS));
        assert_eq!(FS_IOC_SETFLAGS, libc(libc::FS_IOC_SETFLAGS));
        assert_eq!(FS_IOC32_GETFLAGS, libc(libc::FS_IOC32_GETFLAGS));
        assert_eq!(FS_IOC32_SETFLAGS, libc(libc::FS_IOC32_SETFLAGS));
    }

    fn sample_enable() -> EnableArg {
        EnableArg {
            hash_algorithm: 2,
            block_size: 1024,
            salt_size: 32,
            salt_ptr: 0x7fff_0000_1000,
            sig_size: MAX_SIGNATURE_SIZE as u32,
            sig_ptr: 0x7fff_0000_2000,
        }
    }

    #[test]
    fn enable_arg_round_trips() {
        let arg = sample_enable();
        let bytes = arg.encode();
        assert_eq!(EnableArg::decode(&bytes), Ok(arg));
        // Bytes after the structure (the salt and signature a FUSE server
        // gets) are not its business.
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(b"salt");
        assert_eq!(EnableArg::decode(&longer), Ok(arg));
    }

    /// `struct fsverity_enable_arg` as the kernel lays it out, written by
    /// hand: version, hash_algorithm, block_size, salt_size, salt_ptr,
    /// sig_size, __reserved1, sig_ptr, __reserved2[11].
    #[test]
    #[cfg(target_endian = "little")]
    fn enable_arg_decodes_the_kernels_layout() {
        let mut bytes = [0u8; ENABLE_ARG_SIZE];
        bytes[..40].copy_from_slice(&[
            1, 0, 0, 0, // version
            2, 0, 0, 0, // hash_algorithm
            0, 4, 0, 0, // block_size 1024
            32, 0, 0, 0, // salt_size
            0, 0x10, 0, 0, 0xff, 0x7f, 0, 0, // salt_ptr
            0, 0x3f, 0, 0, // sig_size 16128
            0, 0, 0, 0, // __reserved1
            0, 0x20, 0, 0, 0xff, 0x7f, 0, 0, // sig_ptr
        ]);
        assert_eq!(EnableArg::decode(&bytes), Ok(sample_enable()));
        assert_eq!(sample_enable().encode(), bytes);
    }

    #[test]
    fn enable_arg_checks_in_the_kernels_order() {
        let valid = EnableArg {
            hash_algorithm: 1,
            block_size: 4096,
            ..EnableArg::default()
        }
        .encode();
        let with = |at: usize, value: u32| {
            let mut b = valid;
            b[at..at + 4].copy_from_slice(&value.to_ne_bytes());
            EnableArg::decode(&b).unwrap_err()
        };
        assert_eq!(EnableArg::decode(&valid[..127]), Err(ArgError::Truncated));
        assert_eq!(with(0, 2), ArgError::Version);
        // The version first, however bad the rest.
        let mut all_bad = [0xff; ENABLE_ARG_SIZE];
        all_bad[..4].copy_from_slice(&0u32.to_ne_bytes());
        assert_eq!(EnableArg::decode(&all_bad), Err(ArgError::Version));
        assert_eq!(with(28, 1), ArgError::Reserved);
        assert_eq!(with(124, 1 << 24), ArgError::Reserved);
        assert_eq!(with(8, 4097), ArgError::BlockSize);
        assert_eq!(with(8, 0), ArgError::BlockSize);
        assert_eq!(with(12, 33), ArgError::SaltTooLarge);
        assert_eq!(with(24, 16129), ArgError::SignatureTooLarge);
        let errnos = [with(0, 2), with(12, 33), with(0, 0)].map(ArgError::errno);
        assert_eq!(errnos, [libc::EINVAL, libc::EMSGSIZE, libc::EINVAL]);
    }

    #[test]
    fn digest_round_trips() {
        let digest = FsverityDigest {
            algorithm: 1,
            digest: (0..32).collect(),
        };
        assert_eq!(FsverityDigest::decode(&digest.encode()), Ok(digest.clone()));
        let reply = digest.reply(MAX_DIGEST_SIZE).unwrap();
        assert_eq!(FsverityDigest::decode(&reply), Ok(digest.clone()));
        assert_eq!(digest.reply(31), Err(ArgError::Overflow));
        assert_eq!(digest.reply(32).map(|r| r.len()), Ok(36));
        let request = FsverityDigest::request(MAX_DIGEST_SIZE);
        assert_eq!(request.len(), 68);
        assert_eq!(FsverityDigest::capacity(&request), Ok(64));
        assert_eq!(
            FsverityDigest::capacity(&request[..3]),
            Err(ArgError::Truncated)
        );
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn digest_decodes_the_kernels_layout() {
        // digest_algorithm 2 (SHA-512), digest_size 3, then the digest.
        let bytes = [2, 0, 3, 0, 0xaa, 0xbb, 0xcc, 0xdd];
        let want = FsverityDigest {
            algorithm: 2,
            digest: vec![0xaa, 0xbb, 0xcc],
        };
        assert_eq!(FsverityDigest::decode(&bytes), Ok(want));
        assert_eq!(FsverityDigest::capacity(&bytes), Ok(3));
        assert_eq!(
            FsverityDigest::decode(&bytes[..6]),
            Err(ArgError::Truncated)
        );
    }

    #[test]
    fn fsxattr_round_trips() {
        let x = Fsxattr {
            xflags: FS_XFLAG_APPEND | FS_XFLAG_IMMUTABLE,
            extsize: 2,
            nextents: 3,
            projid: 4,
            cowextsize: 5,
        };
        assert_eq!(Fsxattr::decode(&x.encode()), Ok(x));
        assert_eq!(Fsxattr::decode(&x.encode()[..27]), Err(ArgError::Truncated));
        assert_eq!(decode_flags(&encode_flags(FS_VERITY_FL)), Ok(FS_VERITY_FL));
        assert_eq!(decode_flags(&[0; 3]), Err(ArgError::Truncated));
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn fsxattr_decodes_the_kernels_layout() {
        // fsx_xflags, fsx_extsize, fsx_nextents, fsx_projid, fsx_cowextsize,
        // fsx_pad[8] (ignored).
        let mut bytes = [0u8; FSXATTR_SIZE];
        bytes[..20].copy_from_slice(&[
            0x18, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0,
        ]);
        bytes[27] = 0xff;
        let x = Fsxattr::decode(&bytes).unwrap();
        assert_eq!(
            (x.xflags, x.extsize, x.projid, x.cowextsize),
            (0x18, 1, 3, 4)
        );
        assert_eq!(x.nextents, 2);
    }
}
