//! Arbitrary bytes as the payload of `FS_IOC_ENABLE_VERITY` (the 128-byte
//! `struct fsverity_enable_arg`, then salt and signature) and as the
//! `struct fsverity_digest` header of `FS_IOC_MEASURE_VERITY`: no panic, the
//! errno the kernel's checks give in the kernel's order, salt and signature
//! within their limits, and allocations bounded by those limits.

#![no_main]

mod common;

use common::le32;
use libfuzzer_sys::fuzz_target;
use verityfs::uapi::FsverityDigest;
use verityfs::{Digest, HashAlgorithm};
use verityfs_fuse::ioctl::{measure_reply, EnableArg};

const ARG_SIZE: usize = 128;
const MAX_SALT: usize = 32;
const MAX_SIGNATURE: usize = 16128;

/// The kernel's checks of the argument itself (`fsverity_ioctl_enable()`),
/// with `EFAULT` for bytes the caller promised but did not send.
fn expected(data: &[u8]) -> Result<(usize, usize), i32> {
    if data.len() < ARG_SIZE {
        return Err(libc::EFAULT);
    }
    if le32(data, 0) != 1 {
        return Err(libc::EINVAL);
    }
    if le32(data, 28) != 0 || data[40..ARG_SIZE].iter().any(|&b| b != 0) {
        return Err(libc::EINVAL);
    }
    if !le32(data, 8).is_power_of_two() {
        return Err(libc::EINVAL);
    }
    let (salt_size, sig_size) = (le32(data, 12) as usize, le32(data, 24) as usize);
    if salt_size > MAX_SALT || sig_size > MAX_SIGNATURE {
        return Err(libc::EMSGSIZE);
    }
    if data.len() - ARG_SIZE < salt_size + sig_size {
        return Err(libc::EFAULT);
    }
    Ok((salt_size, sig_size))
}

fuzz_target!(|data: &[u8]| {
    let (parsed, allocated) = common::allocated_by(|| EnableArg::parse(data));
    match (parsed, expected(data)) {
        (Ok(arg), Ok((salt_size, sig_size))) => {
            assert!(arg.salt.len() <= MAX_SALT);
            assert!(arg.signature.len() <= MAX_SIGNATURE);
            assert!(allocated <= (MAX_SALT + MAX_SIGNATURE) as u64);
            assert_eq!(arg.hash_algorithm, le32(data, 4));
            assert_eq!(arg.block_size, le32(data, 8));
            assert_eq!(arg.salt, &data[ARG_SIZE..ARG_SIZE + salt_size]);
            let sig_at = ARG_SIZE + salt_size;
            assert_eq!(arg.signature, &data[sig_at..sig_at + sig_size]);
            check_params(&arg);
        }
        (Err(errno), Err(want)) => assert_eq!(errno.code(), want, "wrong errno"),
        (got, want) => panic!("parse gave {got:?}, the kernel's rules {want:?}"),
    }

    // FS_IOC_MEASURE_VERITY: the reply to this header, for either algorithm.
    let capacity = data
        .get(2..4)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
    for alg in HashAlgorithm::ALL {
        let size = common::digest_size(alg);
        let digest = Digest::from_slice(data.get(..size).unwrap_or(&[0xa5; 64][..size])).unwrap();
        let measured = FsverityDigest {
            algorithm: alg.id().into(),
            digest: digest.as_bytes().to_vec(),
        };
        match measure_reply(data, &measured) {
            Ok(reply) => {
                assert!(usize::from(capacity) >= size);
                assert_eq!(reply[..2], u16::from(alg.id()).to_le_bytes());
                assert_eq!(reply[2..4], (size as u16).to_le_bytes());
                assert_eq!(&reply[4..], digest.as_bytes());
            }
            Err(errno) => {
                assert_eq!(errno.code(), libc::EOVERFLOW);
                assert!(usize::from(capacity) < size);
            }
        }
    }
});

/// `EnableArg::params`: `EINVAL` unless the algorithm is known, the block
/// size from 1 KiB to 64 KiB; the parameters are those asked for.
fn check_params(arg: &EnableArg) {
    let (params, allocated) = common::allocated_by(|| arg.params());
    assert_eq!(allocated, 0, "params() allocated");
    let alg = HashAlgorithm::from_id(arg.hash_algorithm).ok();
    let ok_size = (1024..=65536).contains(&arg.block_size);
    match params {
        Ok(p) => {
            assert!(ok_size, "block size {} accepted", arg.block_size);
            assert_eq!(Some(p.hash_algorithm()), alg);
            assert_eq!(p.block_size(), arg.block_size as usize);
            assert_eq!(p.salt().as_bytes(), &arg.salt[..]);
            assert!(p.check_kernel_limits().is_ok());
        }
        Err(errno) => {
            assert_eq!(errno.code(), libc::EINVAL);
            assert!(alg.is_none() || !ok_size, "valid parameters refused");
        }
    }
}
