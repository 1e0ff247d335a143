//! The ioctls the kernel forwards to FUSE servers for fs-verity, decoded
//! and checked in the kernel's order (`fs/verity/enable.c`,
//! `fs/verity/measure.c`).

use fuser::Errno;
use verityfs::uapi::{self, ArgError, FsverityDigest, Fsxattr, ENABLE_ARG_SIZE};
use verityfs::MerkleTreeParams;

/// Inode flags (`FS_*_FL`) and the `FS_XFLAG_*` flags `struct fsxattr`
/// shows them as (the kernel's `fileattr_fill_flags()`).
const XFLAGS: [(u32, u32); 7] = [
    (uapi::FS_SYNC_FL, uapi::FS_XFLAG_SYNC),
    (uapi::FS_IMMUTABLE_FL, uapi::FS_XFLAG_IMMUTABLE),
    (uapi::FS_APPEND_FL, uapi::FS_XFLAG_APPEND),
    (uapi::FS_NODUMP_FL, uapi::FS_XFLAG_NODUMP),
    (uapi::FS_NOATIME_FL, uapi::FS_XFLAG_NOATIME),
    (uapi::FS_DAX_FL, uapi::FS_XFLAG_DAX),
    (uapi::FS_PROJINHERIT_FL, uapi::FS_XFLAG_PROJINHERIT),
];

/// The kernel's errno for a bad argument.
fn arg_errno(e: ArgError) -> Errno {
    Errno::from_i32(e.errno())
}

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

impl EnableArg {
    /// Decodes `struct fsverity_enable_arg` with the kernel's checks of it
    /// (checks 2–6 of the kernel: version, reserved fields, block size a
    /// power of two, salt and signature sizes), then the salt and the
    /// signature after it (`EFAULT` if the kernel sent less).
    pub fn parse(input: &[u8]) -> Result<Self, Errno> {
        let arg = uapi::EnableArg::decode(input).map_err(arg_errno)?;
        let (salt_size, sig_size) = (arg.salt_size as usize, arg.sig_size as usize);
        let rest = &input[ENABLE_ARG_SIZE..];
        if rest.len() < salt_size + sig_size {
            return Err(Errno::EFAULT);
        }
        Ok(EnableArg {
            hash_algorithm: arg.hash_algorithm,
            block_size: arg.block_size,
            salt: rest[..salt_size].to_vec(),
            signature: rest[salt_size..salt_size + sig_size].to_vec(),
        })
    }

    /// The tree parameters, checked as the kernel checks them once the file
    /// is known (check 15–16: algorithm, block size range): `EINVAL`.
    pub fn params(&self) -> Result<MerkleTreeParams, Errno> {
        let invalid = |_| Errno::EINVAL;
        let alg = verityfs::HashAlgorithm::from_id(self.hash_algorithm).map_err(invalid)?;
        let params =
            MerkleTreeParams::new(alg, self.block_size.into(), &self.salt).map_err(invalid)?;
        params.check_kernel_limits().map_err(invalid)?;
        Ok(params)
    }
}

/// The answer to `FS_IOC_MEASURE_VERITY` for a file measuring `digest`,
/// given the caller's `struct fsverity_digest` header (`EOVERFLOW` if its
/// buffer is too small; a header the kernel did not send offers no room).
pub fn measure_reply(input: &[u8], digest: &FsverityDigest) -> Result<Vec<u8>, Errno> {
    let capacity = FsverityDigest::capacity(input).unwrap_or(0);
    digest.reply(capacity).map_err(arg_errno)
}

/// The `struct fsxattr` of a file with inode flags `flags`. The other
/// fields (extent size hints, project id) are not passed through: zero.
pub fn fsxattr_from_flags(flags: u32) -> Vec<u8> {
    let xflags = XFLAGS
        .iter()
        .filter(|&&(fl, _)| flags & fl != 0)
        .fold(0u32, |x, &(_, xfl)| x | xfl);
    Fsxattr {
        xflags,
        ..Fsxattr::default()
    }
    .encode()
    .to_vec()
}

/// The inode flags a `struct fsxattr` asks for, given the file's `current`
/// flags (those without an `FS_XFLAG_*` equivalent are kept). `EINVAL` if
/// it is truncated, `EOPNOTSUPP` for what cannot be passed through: other
/// `FS_XFLAG_*` flags, extent size hints, project ids.
pub fn flags_from_fsxattr(input: &[u8], current: u32) -> Result<u32, Errno> {
    let arg = Fsxattr::decode(input).map_err(|_| Errno::EINVAL)?;
    let known = XFLAGS.iter().fold(0u32, |x, &(_, xfl)| x | xfl);
    // fsx_nextents is output only.
    if arg.xflags & !known != 0 || [arg.extsize, arg.projid, arg.cowextsize] != [0; 3] {
        return Err(Errno::from_i32(libc::EOPNOTSUPP));
    }
    Ok(XFLAGS.iter().fold(current, |flags, &(fl, xfl)| {
        if arg.xflags & xfl != 0 {
            flags | fl
        } else {
            flags & !fl
        }
    }))
}

/// The inode flags of `FS_IOC_SETFLAGS` (`EINVAL` if truncated).
pub fn flags_from_setflags(input: &[u8]) -> Result<u32, Errno> {
    uapi::decode_flags(input).map_err(|_| Errno::EINVAL)
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
        assert_eq!(x.len(), uapi::FSXATTR_SIZE);
        assert_eq!(Fsxattr::decode(&x).unwrap().xflags, 0x10 | 0x08);
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
        let digest = FsverityDigest {
            algorithm: 1,
            digest: vec![7; 32],
        };
        let overflow = Err(Errno::from_i32(libc::EOVERFLOW));
        assert_eq!(
            measure_reply(&FsverityDigest::request(31)[..4], &digest),
            overflow
        );
        assert_eq!(measure_reply(&[0, 0], &digest), overflow);
        let out = measure_reply(&FsverityDigest::request(64)[..4], &digest).unwrap();
        assert_eq!(FsverityDigest::decode(&out), Ok(digest));
    }

    #[test]
    fn setflags_needs_four_bytes() {
        assert_eq!(flags_from_setflags(&uapi::encode_flags(0x10)), Ok(0x10));
        assert_eq!(flags_from_setflags(&[0x10]), Err(Errno::EINVAL));
    }
}
