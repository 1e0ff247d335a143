//! The ioctls the kernel forwards to FUSE servers for fs-verity, decoded
//! and checked in the kernel's order (`fs/verity/enable.c`,
//! `fs/verity/measure.c`).

use fuser::Errno;
use verityfs::descriptor::MAX_SIGNATURE_SIZE;
use verityfs::{Digest, HashAlgorithm, MerkleTreeParams};

/// `FS_IOC_ENABLE_VERITY`: `_IOW('f', 133, struct fsverity_enable_arg)`.
pub const FS_IOC_ENABLE_VERITY: u32 = 0x4080_6685;
/// `FS_IOC_MEASURE_VERITY`: `_IOWR('f', 134, struct fsverity_digest)`.
pub const FS_IOC_MEASURE_VERITY: u32 = 0xc004_6686;
/// `FS_IOC_GETFLAGS` (LP64 encoding; the kernel sends a 4-byte value).
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC_SETFLAGS`.
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// `FS_IOC32_GETFLAGS`.
pub const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
/// `FS_IOC32_SETFLAGS`.
pub const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`. The kernel sends
/// it before every `FS_IOC_SETFLAGS` (`vfs_fileattr_set()` reads the old
/// attributes this way), so `chattr` needs it answered.
pub const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
pub const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// The inode flag of verity files, reported by `FS_IOC_GETFLAGS`.
pub const FS_VERITY_FL: u32 = 0x0010_0000;

/// Size of `struct fsxattr`.
const FSXATTR_SIZE: usize = 28;

/// Inode flags (`FS_*_FL`) and the `FS_XFLAG_*` flags `struct fsxattr`
/// shows them as (the kernel's `fileattr_fill_flags()`).
const XFLAGS: [(u32, u32); 7] = [
    (0x0000_0008, 0x0000_0020), // SYNC
    (0x0000_0010, 0x0000_0008), // IMMUTABLE
    (0x0000_0020, 0x0000_0010), // APPEND
    (0x0000_0040, 0x0000_0080), // NODUMP
    (0x0000_0080, 0x0000_0040), // NOATIME
    (0x0200_0000, 0x0000_8000), // DAX
    (0x2000_0000, 0x0000_0200), // PROJINHERIT
];

/// Size of `struct fsverity_enable_arg`.
const ENABLE_ARG_SIZE: usize = 128;

/// A decoded `FS_IOC_ENABLE_VERITY` request: the 128-byte argument, then
/// the salt and the signature the kernel appended.
#[derive(Debug, PartialEq, Eq)]
pub struct EnableArg {
    /// Hash algorithm number, unchecked.
    pub hash_algorithm: u32,
    /// Block size, a power of two.
    pub block_size: u32,
    /// The salt (at most 32 bytes).
    pub salt: Vec<u8>,
    /// The signature (possibly empty).
    pub signature: Vec<u8>,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl EnableArg {
    /// Decodes and checks the argument's own fields (checks 2–6 of the
    /// kernel: version, reserved fields, block size a power of two, salt
    /// and signature sizes).
    pub fn parse(input: &[u8]) -> Result<Self, Errno> {
        let arg = input.get(..ENABLE_ARG_SIZE).ok_or(Errno::EFAULT)?;
        let (version, hash_algorithm, block_size) = (le32(arg, 0), le32(arg, 4), le32(arg, 8));
        let (salt_size, sig_size) = (le32(arg, 12) as usize, le32(arg, 24) as usize);
        if version != 1 {
            return Err(Errno::EINVAL);
        }
        if le32(arg, 28) != 0 || arg[40..].iter().any(|&b| b != 0) {
            return Err(Errno::EINVAL);
        }
        if !block_size.is_power_of_two() {
            return Err(Errno::EINVAL);
        }
        if salt_size > verityfs::params::MAX_SALT_SIZE || sig_size > MAX_SIGNATURE_SIZE {
            return Err(Errno::from_i32(libc::EMSGSIZE));
        }
        let rest = &input[ENABLE_ARG_SIZE..];
        if rest.len() < salt_size + sig_size {
            return Err(Errno::EFAULT);
        }
        Ok(EnableArg {
            hash_algorithm,
            block_size,
            salt: rest[..salt_size].to_vec(),
            signature: rest[salt_size..salt_size + sig_size].to_vec(),
        })
    }

    /// The tree parameters, checked as the kernel checks them once the file
    /// is known (check 15–16: algorithm, block size range): `EINVAL`.
    pub fn params(&self) -> Result<MerkleTreeParams, Errno> {
        let invalid = |_| Errno::EINVAL;
        let alg = HashAlgorithm::from_id(self.hash_algorithm).map_err(invalid)?;
        let params =
            MerkleTreeParams::new(alg, self.block_size.into(), &self.salt).map_err(invalid)?;
        params.check_kernel_limits().map_err(invalid)?;
        Ok(params)
    }
}

/// The answer to `FS_IOC_MEASURE_VERITY` for a file with digest `digest`,
/// given the caller's `struct fsverity_digest` header (`EOVERFLOW` if its
/// buffer is too small).
pub fn measure_reply(input: &[u8], alg: HashAlgorithm, digest: &Digest) -> Result<Vec<u8>, Errno> {
    let capacity = input
        .get(2..4)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
    let d = digest.as_bytes();
    if (capacity as usize) < d.len() {
        return Err(Errno::from_i32(libc::EOVERFLOW));
    }
    let mut out = Vec::with_capacity(4 + d.len());
    out.extend_from_slice(&u16::from(alg.id()).to_le_bytes());
    out.extend_from_slice(&(d.len() as u16).to_le_bytes());
    out.extend_from_slice(d);
    Ok(out)
}

/// The `struct fsxattr` of a file with inode flags `flags`. The other
/// fields (extent size hints, project id) are not passed through: zero.
pub fn fsxattr_from_flags(flags: u32) -> Vec<u8> {
    let xflags = XFLAGS
        .iter()
        .filter(|&&(fl, _)| flags & fl != 0)
        .fold(0u32, |x, &(_, xfl)| x | xfl);
    let mut out = vec![0u8; FSXATTR_SIZE];
    out[..4].copy_from_slice(&xflags.to_le_bytes());
    out
}

/// The inode flags a `struct fsxattr` asks for, given the file's `current`
/// flags (those without an `FS_XFLAG_*` equivalent are kept). `EOPNOTSUPP`
/// for what cannot be passed through: other `FS_XFLAG_*` flags, extent
/// size hints, project ids.
pub fn flags_from_fsxattr(input: &[u8], current: u32) -> Result<u32, Errno> {
    let arg = input.get(..FSXATTR_SIZE).ok_or(Errno::EINVAL)?;
    let xflags = le32(arg, 0);
    let known = XFLAGS.iter().fold(0u32, |x, &(_, xfl)| x | xfl);
    // fsx_extsize, fsx_projid, fsx_cowextsize (fsx_nextents is output only).
    if xflags & !known != 0 || [4, 12, 16].iter().any(|&at| le32(arg, at) != 0) {
        return Err(Errno::from_i32(libc::EOPNOTSUPP));
    }
    Ok(XFLAGS.iter().fold(current, |flags, &(fl, xfl)| {
        if xflags & xfl != 0 {
            flags | fl
        } else {
            flags & !fl
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(f: impl Fn(&mut [u8; 128])) -> Vec<u8> {
        let mut a = [0u8; 128];
        a[0] = 1;
        a[4] = 1;
        a[8..12].copy_from_slice(&4096u32.to_le_bytes());
        f(&mut a);
        a.to_vec()
    }

    #[test]
    fn enable_arg_checks_in_kernel_order() {
        let e = |v: Vec<u8>| EnableArg::parse(&v).unwrap_err();
        assert_eq!(e(arg(|a| a[0] = 2)), Errno::EINVAL);
        assert_eq!(e(arg(|a| a[28] = 1)), Errno::EINVAL);
        assert_eq!(e(arg(|a| a[127] = 1)), Errno::EINVAL);
        assert_eq!(e(arg(|a| a[8] = 1)), Errno::EINVAL);
        assert_eq!(e(arg(|a| a[12] = 33)), Errno::from_i32(libc::EMSGSIZE));
        assert_eq!(
            e(arg(|a| a[24..28].copy_from_slice(&16129u32.to_le_bytes()))),
            Errno::from_i32(libc::EMSGSIZE)
        );
        // Salt promised but missing.
        assert_eq!(e(arg(|a| a[12] = 4)), Errno::EFAULT);
        let mut v = arg(|a| {
            a[12] = 2;
            a[24] = 3;
        });
        v.extend_from_slice(b"ssSIG");
        let parsed = EnableArg::parse(&v).unwrap();
        assert_eq!(
            (parsed.salt.as_slice(), parsed.signature.as_slice()),
            (&b"ss"[..], &b"SIG"[..])
        );
        assert!(parsed.params().is_ok());
        let bad_alg = EnableArg {
            hash_algorithm: 257,
            ..parsed
        };
        assert_eq!(bad_alg.params().unwrap_err(), Errno::EINVAL);
    }

    #[test]
    fn fsxattr_maps_the_common_flags() {
        // APPEND | IMMUTABLE | EXTENTS (no xflag) -> FS_XFLAG_APPEND | IMMUTABLE.
        let x = fsxattr_from_flags(0x20 | 0x10 | 0x8_0000);
        assert_eq!(x.len(), FSXATTR_SIZE);
        assert_eq!(le32(&x, 0), 0x10 | 0x08);
        // Round trip, keeping EXTENTS; clearing IMMUTABLE.
        assert_eq!(flags_from_fsxattr(&x, 0x8_0000), Ok(0x20 | 0x10 | 0x8_0000));
        let mut y = x.clone();
        y[0] = 0x10;
        assert_eq!(
            flags_from_fsxattr(&y, 0x20 | 0x10 | 0x8_0000),
            Ok(0x20 | 0x8_0000)
        );
        let mut projid = x.clone();
        projid[12] = 1;
        assert_eq!(
            flags_from_fsxattr(&projid, 0),
            Err(Errno::from_i32(libc::EOPNOTSUPP))
        );
        assert_eq!(flags_from_fsxattr(&x[..20], 0), Err(Errno::EINVAL));
    }

    #[test]
    fn measure_needs_room_for_the_digest() {
        let digest = Digest::from_slice(&[7; 32]).unwrap();
        let small = [0u8, 0, 31, 0];
        assert_eq!(
            measure_reply(&small, HashAlgorithm::Sha256, &digest).unwrap_err(),
            Errno::from_i32(libc::EOVERFLOW)
        );
        let out = measure_reply(&[0, 0, 64, 0], HashAlgorithm::Sha256, &digest).unwrap();
        assert_eq!(&out[..4], &[1, 0, 32, 0]);
        assert_eq!(&out[4..], &[7; 32]);
    }
}
