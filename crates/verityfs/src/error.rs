//! Typed errors, each mapping to the errno the Linux kernel returns for it.

use std::io;
use std::path::PathBuf;

use crate::hash_algs::{Digest, HashAlgorithm};
use crate::image::ManifestError;

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in fs-verity's format and tree code.
///
/// The `Display` texts follow libfsverity's messages where it has one, so a
/// command line tool can print them after `ERROR: ` and match fsverity-utils.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A hash algorithm number other than 1 (SHA-256) or 2 (SHA-512).
    #[error("unknown hash algorithm: {0}")]
    UnknownHashAlgorithm(u32),
    /// A Merkle tree block size that is not a power of two.
    #[error("unsupported block size ({0})")]
    BlockSizeNotPowerOfTwo(u64),
    /// A block size that cannot hold two digests of the algorithm.
    #[error("block size ({block_size}) too small for hash algorithm {alg}")]
    BlockSizeTooSmall {
        /// The requested block size.
        block_size: u64,
        /// The algorithm's name.
        alg: &'static str,
    },
    /// A block size outside what the kernel accepts for a verity file
    /// (1 KiB to 64 KiB).
    #[error("block size ({0}) not supported for verity files (must be 1024 to 65536)")]
    BlockSizeUnsupported(u64),
    /// A salt longer than the descriptor's 32-byte field.
    #[error("unsupported salt size ({0})")]
    SaltTooLong(usize),
    /// The tree would need more levels than allowed.
    #[error("too many levels in Merkle tree ({levels} > {max})")]
    TooManyLevels {
        /// Levels the file would need.
        levels: usize,
        /// The limit that applies.
        max: usize,
    },
    /// A descriptor that breaks the kernel's validation rules.
    #[error("invalid fs-verity descriptor: {0}")]
    InvalidDescriptor(&'static str),
    /// A stored descriptor (with signature) larger than 16384 bytes.
    #[error("fs-verity descriptor too large ({0} bytes)")]
    DescriptorTooLarge(usize),
    /// A signature larger than the kernel's 16128-byte limit.
    #[error("signature too large ({0} bytes)")]
    SignatureTooLarge(usize),
    /// The data ended before the size the tree was built for.
    #[error("file is shorter than expected (got {got} of {expected} bytes)")]
    UnexpectedEof {
        /// Bytes actually read.
        got: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// A file too large for its metadata to fit after it.
    #[error("file too large to enable verity on ({0} bytes)")]
    FileTooLarge(u64),
    /// A location record (or enabling record) that is malformed or
    /// inconsistent.
    #[error("invalid verity location record: {0}")]
    InvalidLocation(&'static str),
    /// The file is already a verity file.
    #[error("file is already a verity file")]
    AlreadyVerity,
    /// The file is not a verity file.
    #[error("file is not a verity file")]
    NotVerity,
    /// A verity file without a built-in signature was asked for one.
    #[error("file has no built-in signature")]
    NoSignature,
    /// An argument the kernel would refuse with `EINVAL`.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The work was cancelled; nothing was changed.
    #[error("interrupted")]
    Interrupted,
    /// Data or a tree block does not match the hash it must have.
    #[error("{0}")]
    Corrupted(Box<Corruption>),
    /// A descriptor that must hash to a trusted digest (an image's object,
    /// or its manifest trusted by digest) but is not even a valid
    /// descriptor, or does not agree with the sizes trusted for it: its
    /// bytes were changed, which reads fail with `EIO` like any other
    /// tampered byte.
    #[error("{}: fs-verity descriptor tampered with (it must have a trusted digest): {source}", file.display())]
    DescriptorTampered {
        /// The file (as named when it was opened).
        file: PathBuf,
        /// What is wrong with it.
        source: Box<Error>,
    },
    /// The backing file ends before the metadata its location record names.
    #[error("verity metadata is truncated")]
    MetadataTruncated,
    /// A built-in signature that the kernel's rules refuse.
    #[error("{0}")]
    Signature(#[from] SignatureError),
    /// An image manifest that breaks the encoding's rules.
    #[error("invalid image manifest: {0}")]
    InvalidManifest(#[from] ManifestError),
    /// An I/O error from the data source or the tree sink.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// An I/O error on a named file.
    #[error("{}: {source}", path.display())]
    IoAt {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl Error {
    /// The errno the kernel gives for this condition (`EINVAL`, `EMSGSIZE`,
    /// `EFBIG`, `EIO`, ...), for callers that must answer with an errno.
    pub fn errno(&self) -> i32 {
        match self {
            Error::UnknownHashAlgorithm(_)
            | Error::BlockSizeNotPowerOfTwo(_)
            | Error::BlockSizeTooSmall { .. }
            | Error::BlockSizeUnsupported(_)
            | Error::InvalidDescriptor(_)
            | Error::InvalidLocation(_)
            | Error::InvalidManifest(_)
            | Error::InvalidArgument(_) => libc::EINVAL,
            Error::SaltTooLong(_) | Error::DescriptorTooLarge(_) | Error::SignatureTooLarge(_) => {
                libc::EMSGSIZE
            }
            Error::TooManyLevels { .. } | Error::FileTooLarge(_) => libc::EFBIG,
            Error::UnexpectedEof { .. }
            | Error::Corrupted(_)
            | Error::DescriptorTampered { .. }
            | Error::MetadataTruncated => libc::EIO,
            Error::AlreadyVerity => libc::EEXIST,
            Error::NotVerity | Error::NoSignature => libc::ENODATA,
            Error::Interrupted => libc::EINTR,
            Error::Signature(e) => e.errno(),
            Error::Io(e) | Error::IoAt { source: e, .. } => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// Why a built-in signature (PKCS#7 over the formatted digest) is refused,
/// following the kernel's `fsverity_verify_signature()`.
///
/// The texts are the kernel's log messages for each case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// Not a well-formed PKCS#7 SignedData message (`EBADMSG`).
    #[error("Malformed file signature")]
    Malformed,
    /// No trusted certificate matches the signer, or nothing is trusted at
    /// all (`ENOKEY`).
    #[error("File's signing cert isn't trusted")]
    KeyNotTrusted,
    /// The signer is trusted but the signature does not verify: it was made
    /// over another file digest, with another key, or is corrupted
    /// (`EKEYREJECTED`).
    #[error("Incorrect file signature")]
    Rejected,
    /// Signatures are required and the file has none (`EPERM`, as with
    /// `fs.verity.require_signatures=1`).
    #[error("require_signatures=1, rejecting unsigned file!")]
    Missing,
}

impl SignatureError {
    /// The errno the kernel returns from `FS_IOC_ENABLE_VERITY` (or `open()`)
    /// for this refusal.
    pub fn errno(&self) -> i32 {
        match self {
            SignatureError::Malformed => libc::EBADMSG,
            SignatureError::KeyNotTrusted => libc::ENOKEY,
            SignatureError::Rejected => libc::EKEYREJECTED,
            SignatureError::Missing => libc::EPERM,
        }
    }
}

/// A hash mismatch found while reading a verity file, with what the kernel
/// logs for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// The file (as named when it was opened).
    pub file: PathBuf,
    /// Byte position of the data block being verified.
    pub pos: u64,
    /// The level of the block whose hash did not match: -1 for the data
    /// block itself, 0 and up for tree levels.
    pub level: i32,
    /// The hash algorithm.
    pub alg: HashAlgorithm,
    /// The hash the parent (or the root hash) says the block has.
    pub want: Digest,
    /// The hash the block actually has.
    pub real: Digest,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: FILE CORRUPTED! pos={}, level={}, want_hash={alg}:{}, real_hash={alg}:{}",
            self.file.display(),
            self.pos,
            self.level,
            self.want,
            self.real,
            alg = self.alg
        )
    }
}
