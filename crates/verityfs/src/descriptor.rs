//! `struct fsverity_descriptor`, the file digest, and
//! `struct fsverity_formatted_digest`.
//!
//! The descriptor is 256 bytes, little endian. Its hash (with `sig_size`
//! zeroed) is the fs-verity file digest, the one value that authenticates the
//! whole file.

use crate::error::{Error, Result};
use crate::hash_algs::{Digest, HashAlgorithm, MAX_DIGEST_SIZE};
use crate::params::{MerkleTreeParams, MAX_SALT_SIZE};

/// Size of `struct fsverity_descriptor` without its signature.
pub const DESCRIPTOR_SIZE: usize = 256;

/// Largest stored descriptor, signature included (`FS_VERITY_MAX_DESCRIPTOR_SIZE`).
pub const MAX_DESCRIPTOR_SIZE: usize = 16384;

/// Largest built-in signature (`FS_VERITY_MAX_SIGNATURE_SIZE`).
pub const MAX_SIGNATURE_SIZE: usize = MAX_DESCRIPTOR_SIZE - DESCRIPTOR_SIZE;

const ROOT_HASH_OFFSET: usize = 16;
const SALT_OFFSET: usize = 80;
const RESERVED_OFFSET: usize = 112;

/// A parsed or built fs-verity descriptor: the tree parameters, the data
/// size and the root hash. Its hash is the fs-verity file digest.
///
/// # Example
///
/// Building one, storing it (the 256 bytes `fsverity digest
/// --out-descriptor` writes) and reading it back:
///
/// ```
/// use verityfs::{build_merkle_tree, Descriptor, DiscardTree, HashAlgorithm, MerkleTreeParams};
///
/// let data = b"lorem ipsum\n";
/// let params = MerkleTreeParams::default();
/// let (descriptor, _) =
///     build_merkle_tree(&params, data.len() as u64, &data[..], DiscardTree, &mut |_| Ok(()))?;
/// let stored: [u8; 256] = descriptor.to_unsigned_bytes();
///
/// let (parsed, signature) = Descriptor::parse(&stored)?;
/// assert!(signature.is_empty());
/// assert_eq!(parsed, descriptor);
/// assert_eq!(parsed.data_size(), 12);
/// assert_eq!(parsed.params().hash_algorithm(), HashAlgorithm::Sha256);
/// assert_eq!(
///     format!("{}:{}", parsed.params().hash_algorithm(), parsed.file_digest()),
///     "sha256:fda0e2d973b5c81e4a8ccc43a0bb13cbc9b5da8d83c4ff4416f6860ea20df0d6"
/// );
/// // What a built-in signature signs (`fsverity digest --for-builtin-sig`).
/// let to_sign = verityfs::formatted_digest(HashAlgorithm::Sha256, &parsed.file_digest());
/// assert_eq!(&to_sign[..8], b"FSVerity");
///
/// // The kernel's validation rules apply.
/// let mut bad = stored;
/// bad[0] = 2; // version
/// assert_eq!(Descriptor::parse(&bad).unwrap_err().errno(), libc::EINVAL);
/// # Ok::<(), verityfs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    params: MerkleTreeParams,
    data_size: u64,
    root_hash: Digest,
    sig_size: u32,
}

impl Descriptor {
    /// The descriptor of a tree with `params` over `data_size` bytes whose
    /// root hash is `root_hash`, without a signature.
    pub fn new(params: MerkleTreeParams, data_size: u64, root_hash: Digest) -> Self {
        debug_assert_eq!(root_hash.as_bytes().len(), params.digest_size());
        Descriptor {
            params,
            data_size,
            root_hash,
            sig_size: 0,
        }
    }

    /// The same descriptor, recording a signature of `sig_size` bytes stored
    /// right after it.
    pub(crate) fn with_sig_size(self, sig_size: u32) -> Result<Self> {
        if sig_size as usize > MAX_SIGNATURE_SIZE {
            return Err(Error::SignatureTooLarge(sig_size as usize));
        }
        Ok(Descriptor { sig_size, ..self })
    }

    /// The tree parameters (algorithm, block size, salt).
    pub fn params(&self) -> &MerkleTreeParams {
        &self.params
    }

    /// The size of the file the tree covers.
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// The Merkle tree's root hash.
    pub fn root_hash(&self) -> &Digest {
        &self.root_hash
    }

    /// Size of the signature stored after the descriptor (0 if none).
    pub fn sig_size(&self) -> u32 {
        self.sig_size
    }

    /// The 256 bytes of the descriptor, with `sig_size` as recorded.
    pub fn to_bytes(&self) -> [u8; DESCRIPTOR_SIZE] {
        let mut b = [0u8; DESCRIPTOR_SIZE];
        let salt = self.params.salt();
        b[0] = 1;
        b[1] = self.params.hash_algorithm().id();
        b[2] = self.params.log_block_size();
        b[3] = salt.as_bytes().len() as u8;
        b[4..8].copy_from_slice(&self.sig_size.to_le_bytes());
        b[8..16].copy_from_slice(&self.data_size.to_le_bytes());
        let root = self.root_hash.as_bytes();
        b[ROOT_HASH_OFFSET..ROOT_HASH_OFFSET + root.len()].copy_from_slice(root);
        b[SALT_OFFSET..SALT_OFFSET + MAX_SALT_SIZE].copy_from_slice(salt.field());
        b
    }

    /// The 256 bytes that are hashed into the file digest (`sig_size` 0), as
    /// `FS_IOC_READ_VERITY_METADATA` and `fsverity digest --out-descriptor`
    /// give them.
    pub fn to_unsigned_bytes(&self) -> [u8; DESCRIPTOR_SIZE] {
        Descriptor {
            sig_size: 0,
            ..*self
        }
        .to_bytes()
    }

    /// The fs-verity file digest: the plain hash of the unsigned descriptor.
    pub fn file_digest(&self) -> Digest {
        self.params.hash_algorithm().hash(&self.to_unsigned_bytes())
    }

    /// Parses a stored descriptor (256 bytes, then `sig_size` bytes of
    /// signature) with the kernel's rules (`validate_fsverity_descriptor()`),
    /// returning it and the signature.
    ///
    /// Like the kernel, this neither requires the unused tail of the root
    /// hash and salt fields to be zero nor checks `data_size` against a file:
    /// the caller compares [`Descriptor::data_size`] with the file's size. A
    /// non-zero tail would change the file digest, so it is rejected here
    /// (the kernel would compute another digest; we refuse to guess).
    pub fn parse(stored: &[u8]) -> Result<(Descriptor, &[u8])> {
        if stored.len() > MAX_DESCRIPTOR_SIZE {
            return Err(Error::DescriptorTooLarge(stored.len()));
        }
        let (b, rest) = stored
            .split_first_chunk::<DESCRIPTOR_SIZE>()
            .ok_or(Error::InvalidDescriptor("shorter than 256 bytes"))?;
        if b[0] != 1 {
            return Err(Error::InvalidDescriptor("unrecognized version"));
        }
        if b[RESERVED_OFFSET..].iter().any(|&x| x != 0) {
            return Err(Error::InvalidDescriptor("reserved bits set"));
        }
        let sig_size = u32::from_le_bytes(b[4..8].try_into().unwrap());
        if sig_size as usize > rest.len() {
            return Err(Error::InvalidDescriptor(
                "signature overflows the stored descriptor",
            ));
        }
        let descriptor = Self::parse_fields(b)?.with_sig_size(sig_size)?;
        Ok((descriptor, &rest[..sig_size as usize]))
    }

    fn parse_fields(b: &[u8; DESCRIPTOR_SIZE]) -> Result<Descriptor> {
        let alg = HashAlgorithm::from_id(b[1].into())?;
        let salt_size = b[3] as usize;
        if salt_size > MAX_SALT_SIZE {
            return Err(Error::InvalidDescriptor("invalid salt_size"));
        }
        let log_block_size = b[2];
        if log_block_size >= 32 {
            return Err(Error::InvalidDescriptor("invalid log_blocksize"));
        }
        let salt_field = &b[SALT_OFFSET..SALT_OFFSET + MAX_SALT_SIZE];
        let params = MerkleTreeParams::new(alg, 1 << log_block_size, &salt_field[..salt_size])?;
        let root_field = &b[ROOT_HASH_OFFSET..ROOT_HASH_OFFSET + MAX_DIGEST_SIZE];
        let root_hash = Digest::from_slice(&root_field[..alg.digest_size()]).unwrap();
        let data_size = u64::from_le_bytes(b[8..16].try_into().unwrap());
        let descriptor = Descriptor::new(params, data_size, root_hash);
        if descriptor.to_bytes()[ROOT_HASH_OFFSET..RESERVED_OFFSET]
            != b[ROOT_HASH_OFFSET..RESERVED_OFFSET]
        {
            return Err(Error::InvalidDescriptor(
                "unused root hash or salt bytes are not zero",
            ));
        }
        Ok(descriptor)
    }
}

/// `struct fsverity_formatted_digest`: the bytes a built-in signature signs
/// (`"FSVerity"`, le16 algorithm, le16 digest size, digest).
pub fn formatted_digest(alg: HashAlgorithm, digest: &Digest) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + digest.as_bytes().len());
    out.extend_from_slice(b"FSVerity");
    out.extend_from_slice(&u16::from(alg.id()).to_le_bytes());
    out.extend_from_slice(&(digest.as_bytes().len() as u16).to_le_bytes());
    out.extend_from_slice(digest.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_file_descriptor() -> Descriptor {
        Descriptor::new(
            MerkleTreeParams::default(),
            0,
            Digest::from_slice(&[0; 32]).unwrap(),
        )
    }

    #[test]
    fn empty_file_digest_and_formatted_digest() {
        let d = empty_file_descriptor();
        let digest = d.file_digest();
        assert_eq!(
            digest.to_hex(),
            "3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95"
        );
        assert_eq!(
            hex::encode(formatted_digest(HashAlgorithm::Sha256, &digest)),
            "4653566572697479010020003d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95"
        );
    }

    #[test]
    fn round_trip_with_signature() {
        let params = MerkleTreeParams::new(HashAlgorithm::Sha512, 1024, b"salty").unwrap();
        let d = Descriptor::new(params, 12345, Digest::from_slice(&[9; 64]).unwrap())
            .with_sig_size(3)
            .unwrap();
        let mut stored = d.to_bytes().to_vec();
        stored.extend_from_slice(b"sig");
        let (parsed, sig) = Descriptor::parse(&stored).unwrap();
        assert_eq!((parsed, sig), (d, &b"sig"[..]));
        assert_eq!(
            parsed.file_digest(),
            Descriptor { sig_size: 0, ..d }.file_digest()
        );
    }

    #[test]
    fn kernel_validation_rules() {
        let good = empty_file_descriptor().to_bytes();
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.to_vec();
            f(&mut b);
            Descriptor::parse(&b).unwrap_err().errno()
        };
        assert_eq!(bad(&|b| b.truncate(255)), libc::EINVAL);
        assert_eq!(bad(&|b| b[0] = 2), libc::EINVAL);
        assert_eq!(bad(&|b| b[1] = 3), libc::EINVAL);
        assert_eq!(bad(&|b| b[2] = 5), libc::EINVAL);
        assert_eq!(bad(&|b| b[3] = 33), libc::EINVAL);
        assert_eq!(bad(&|b| b[4] = 1), libc::EINVAL);
        assert_eq!(bad(&|b| b[200] = 1), libc::EINVAL);
        assert_eq!(bad(&|b| b[16 + 40] = 1), libc::EINVAL);
        assert_eq!(
            bad(&|b| b.resize(MAX_DESCRIPTOR_SIZE + 1, 0)),
            libc::EMSGSIZE
        );
    }
}
