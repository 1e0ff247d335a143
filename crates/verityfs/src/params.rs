//! Merkle tree parameters: hash algorithm, block size and salt.

use std::fmt;

use crate::error::{Error, Result};
use crate::hash_algs::{HashAlgorithm, SaltedHasher};

/// The largest salt the descriptor can hold, in bytes.
pub const MAX_SALT_SIZE: usize = 32;

/// The default Merkle tree block size of fsverity-utils and the kernel.
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;

/// Smallest block size the kernel accepts for a verity file.
const MIN_KERNEL_BLOCK_SIZE: u32 = 1024;

/// Largest block size the kernel accepts (with 64 KiB pages and blocks).
const MAX_KERNEL_BLOCK_SIZE: u32 = 65536;

/// A salt of 0 to 32 bytes, prepended (padded) to every hashed block.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Salt {
    len: u8,
    bytes: [u8; MAX_SALT_SIZE],
}

impl Salt {
    /// A salt holding `bytes`, or [`Error::SaltTooLong`] past 32 bytes.
    pub fn new(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_SALT_SIZE {
            return Err(Error::SaltTooLong(bytes.len()));
        }
        let mut salt = Salt {
            len: bytes.len() as u8,
            bytes: [0; MAX_SALT_SIZE],
        };
        salt.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(salt)
    }

    /// The salt's bytes (empty for no salt).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The descriptor's 32-byte salt field: the salt, then zeroes.
    pub(crate) fn field(&self) -> &[u8; MAX_SALT_SIZE] {
        &self.bytes
    }
}

impl fmt::Debug for Salt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Salt({})", crate::hash_algs::to_hex(self.as_bytes()))
    }
}

/// Validated parameters of a Merkle tree: every value of this type describes
/// a tree that fsverity-utils can compute.
///
/// Block sizes are powers of two of at least twice the digest size (so each
/// tree block holds at least two hashes), as libfsverity requires; use
/// [`MerkleTreeParams::check_kernel_limits`] for the narrower range the kernel
/// accepts for verity files.
///
/// # Example
///
/// ```
/// use verityfs::{HashAlgorithm, MerkleTreeParams};
///
/// // fsverity's defaults: SHA-256, 4096-byte blocks, no salt.
/// let default = MerkleTreeParams::default();
/// assert_eq!((default.hash_algorithm(), default.block_size()), (HashAlgorithm::Sha256, 4096));
///
/// // `--hash-alg=sha512 --block-size=1024 --salt=c0ffee`
/// let params = MerkleTreeParams::new(HashAlgorithm::Sha512, 1024, &[0xc0, 0xff, 0xee])?;
/// assert_eq!(params.salt().as_bytes(), [0xc0, 0xff, 0xee]);
/// assert_eq!(params.log_arity(), 4); // 16 hashes of 64 bytes per block
/// params.check_kernel_limits()?;
///
/// // Refused as fsverity refuses them.
/// assert!(MerkleTreeParams::new(HashAlgorithm::Sha256, 3000, b"").is_err()); // not a power of 2
/// assert!(MerkleTreeParams::new(HashAlgorithm::Sha256, 4096, &[0; 33]).is_err()); // salt too long
/// // Valid for a digest, but not for a verity file.
/// let small = MerkleTreeParams::new(HashAlgorithm::Sha256, 512, b"")?;
/// assert_eq!(small.check_kernel_limits().unwrap_err().errno(), libc::EINVAL);
/// # Ok::<(), verityfs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MerkleTreeParams {
    alg: HashAlgorithm,
    log_block_size: u8,
    salt: Salt,
}

impl Default for MerkleTreeParams {
    /// SHA-256, 4096-byte blocks, no salt: fsverity-utils' defaults.
    fn default() -> Self {
        MerkleTreeParams {
            alg: HashAlgorithm::Sha256,
            log_block_size: 12,
            salt: Salt::default(),
        }
    }
}

impl MerkleTreeParams {
    /// Parameters for `alg`, `block_size` and `salt`, checked as libfsverity
    /// checks them.
    pub fn new(alg: HashAlgorithm, block_size: u64, salt: &[u8]) -> Result<Self> {
        if !block_size.is_power_of_two() || block_size > 1 << 31 {
            return Err(Error::BlockSizeNotPowerOfTwo(block_size));
        }
        if block_size < 2 * alg.digest_size() as u64 {
            return Err(Error::BlockSizeTooSmall {
                block_size,
                alg: alg.name(),
            });
        }
        let log_block_size = block_size.trailing_zeros() as u8;
        Ok(MerkleTreeParams {
            alg,
            log_block_size,
            salt: Salt::new(salt)?,
        })
    }

    /// Fails unless the kernel would accept these parameters for a verity
    /// file: block size from 1 KiB to 64 KiB.
    pub fn check_kernel_limits(&self) -> Result<()> {
        let bs = self.block_size() as u32;
        if !(MIN_KERNEL_BLOCK_SIZE..=MAX_KERNEL_BLOCK_SIZE).contains(&bs) {
            return Err(Error::BlockSizeUnsupported(bs.into()));
        }
        Ok(())
    }

    /// The hash algorithm.
    pub fn hash_algorithm(&self) -> HashAlgorithm {
        self.alg
    }

    /// The block size (of data blocks and tree blocks alike), in bytes.
    pub fn block_size(&self) -> usize {
        1 << self.log_block_size
    }

    /// log2 of the block size, as stored in the descriptor.
    pub fn log_block_size(&self) -> u8 {
        self.log_block_size
    }

    /// The salt.
    pub fn salt(&self) -> &Salt {
        &self.salt
    }

    /// Digest size of the hash algorithm.
    pub fn digest_size(&self) -> usize {
        self.alg.digest_size()
    }

    /// log2 of the number of hashes a tree block holds (the tree's arity).
    pub fn log_arity(&self) -> u32 {
        self.log_block_size as u32 - self.digest_size().trailing_zeros()
    }

    /// A hasher with this algorithm and salt.
    pub fn hasher(&self) -> SaltedHasher {
        SaltedHasher::new(self.alg, self.salt.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_rules() {
        let sha256 = HashAlgorithm::Sha256;
        assert!(MerkleTreeParams::new(sha256, 64, b"").is_ok());
        assert!(matches!(
            MerkleTreeParams::new(sha256, 32, b""),
            Err(Error::BlockSizeTooSmall { block_size: 32, .. })
        ));
        assert!(matches!(
            MerkleTreeParams::new(HashAlgorithm::Sha512, 64, b""),
            Err(Error::BlockSizeTooSmall { .. })
        ));
        assert!(matches!(
            MerkleTreeParams::new(sha256, 4095, b""),
            Err(Error::BlockSizeNotPowerOfTwo(4095))
        ));
        assert!(matches!(
            MerkleTreeParams::new(sha256, 0, b""),
            Err(Error::BlockSizeNotPowerOfTwo(0))
        ));
        let p = MerkleTreeParams::new(sha256, 4096, b"").unwrap();
        assert_eq!(
            (p.block_size(), p.log_block_size(), p.log_arity()),
            (4096, 12, 7)
        );
        assert!(p.check_kernel_limits().is_ok());
        let p = MerkleTreeParams::new(sha256, 512, b"").unwrap();
        assert_eq!(p.check_kernel_limits().unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn salt_limits() {
        assert!(Salt::new(&[7; 32]).is_ok());
        let e = Salt::new(&[7; 33]).unwrap_err();
        assert_eq!(e.errno(), libc::EMSGSIZE);
        assert_eq!(e.to_string(), "unsupported salt size (33)");
    }
}
