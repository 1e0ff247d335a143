//! fs-verity in user space, bit for bit compatible with the Linux kernel and
//! fsverity-utils.
//!
//! This crate holds the format: hash algorithms and salted block hashing
//! ([`hash_algs`]), validated tree parameters ([`params`]), level geometry
//! ([`geometry`]), the descriptor and file digest ([`descriptor`]) and
//! streaming tree construction ([`build_merkle_tree`]); and verity files
//! stored in any directory: the on-disk layout ([`Location`],
//! [`FileState`]), crash-safe enabling ([`enable_verity`]), and the verified
//! read path with its tree block cache, Merkle tree readahead and counters
//! ([`Verifier`], [`VerityFile`], [`Counters`],
//! [`VerityFile::read_metadata`]), and built-in signatures made and checked as
//! fsverity-utils and the kernel do (`signature`, with the default `openssl`
//! feature). It has no FUSE or command line code, so any program
//! can embed it.
//!
//! # Entry points
//!
//! | to | use |
//! |---|---|
//! | compute a file's fs-verity digest, tree and descriptor (`fsverity digest`) | [`build_merkle_tree`] with [`MerkleTreeParams`], giving a [`Descriptor`] |
//! | parse a descriptor file, get the digest to trust or sign | [`Descriptor::parse`], [`Descriptor::file_digest`], [`formatted_digest`] |
//! | compare a file with a trusted digest (`sha256:HEX` or `HEX`) | [`ExpectedDigest`], [`VerityFile::matches`] |
//! | turn a file into a verity file in place (`fsverity enable`) | [`enable_verity`] |
//! | measure a stored verity file (`fsverity measure`) | [`measure_verity`] |
//! | read a verity file with every byte checked | [`VerityFile::open`], [`VerityFile::read_at`] |
//! | check data shipped with a separate tree and descriptor (downloads) | [`VerityFile::open_detached`] |
//! | read verified data from any [`Source`] of byte ranges (a remote object) | [`VerityFile::open_sources`] |
//! | publish a directory tree as an image, read it back verified from one trusted digest | [`image::publish`], [`image::open_manifest`], [`image::open_object`] |
//! | consume verified data as a stream (`io::copy`, parsers) | [`VerifiedReader`] (`Read + Seek`) |
//! | scrub a verity file for every bad block | [`check::check_file`] |
//! | recognise and repair a backing file copied without its extended attributes | [`stripped::find_stripped`], [`stripped::reattach`] |
//!
//! Errors are [`Error`]s; [`Error::errno`] gives the errno the kernel
//! would return, and a failed verification is [`Error::Corrupted`] with a
//! [`Corruption`] report in the kernel's words (`FILE CORRUPTED! pos=...`).
//! The `verify_download` example (`crates/verityfs/examples/`) is a complete
//! program verifying a download against the files `fsverity digest
//! --out-merkle-tree --out-descriptor` writes.
//!
//! ```
//! use verityfs::{build_merkle_tree, DiscardTree, MerkleTreeParams};
//!
//! let data = b"lorem ipsum\n";
//! let params = MerkleTreeParams::default(); // SHA-256, 4096-byte blocks
//! let (descriptor, _) =
//!     build_merkle_tree(&params, data.len() as u64, &data[..], DiscardTree, &mut |_| Ok(()))?;
//! assert_eq!(
//!     descriptor.file_digest().to_hex(),
//!     "fda0e2d973b5c81e4a8ccc43a0bb13cbc9b5da8d83c4ff4416f6860ea20df0d6"
//! );
//! # Ok::<(), verityfs::Error>(())
//! ```

// Unsafe code is refused except where it cannot be avoided: the SHA-NI
// intrinsics of the multi-buffer SHA-256, the OpenSSL calls of built-in
// signatures and ext4's extent-swapping ioctl (`placement`). Every unsafe block says why it is sound (the workspace
// denies `clippy::undocumented_unsafe_blocks`).
#![deny(unsafe_code)]

mod access;
mod build;
mod cache;
pub mod check;
pub mod descriptor;
mod enable;
mod error;
mod expected;
pub mod geometry;
pub mod hash_algs;
pub mod image;
// Public for the fuzz targets and tests of the on-disk format only; the
// types embedders meet are re-exported below.
#[doc(hidden)]
pub mod layout;
pub mod mountinfo;
mod open;
pub mod params;
#[allow(unsafe_code)]
mod placement;
mod read_metadata;
mod reader;
// Public for its benchmark (`benches/sha256_mb.rs`) only.
pub mod safe_dir;
#[doc(hidden)]
#[allow(unsafe_code)]
pub mod sha256_mb;
#[cfg(feature = "openssl")]
#[allow(unsafe_code)]
pub mod signature;
pub mod source;
mod state;
mod stats;
pub mod stripped;
pub mod uapi;
mod verify;

pub use build::{build_merkle_tree, DiscardTree, TreeSink};
pub use descriptor::{formatted_digest, Descriptor};
pub use enable::{enable_verity, enable_verity_checked, measure, measure_verity, EnableRequest};
pub use error::{Corruption, Error, Result, SignatureError};
pub use expected::ExpectedDigest;
pub use geometry::TreeGeometry;
pub use hash_algs::{Digest, HashAlgorithm, SaltedHasher};
pub use layout::{EnablingRecord, Location, XATTR_PREFIX};
pub use open::{ReadOptions, Verifier, VerityFile};
pub use params::{MerkleTreeParams, Salt};
pub use placement::place_together;
pub use read_metadata::MetadataType;
pub use reader::{corruption, VerifiedReader};
pub use source::{Lent, Source};
pub use state::{recover, FileState};
pub use stats::{Counters, Snapshot};

/// The README's Rust example, compiled and run as a doctest so that it
/// keeps matching the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;
