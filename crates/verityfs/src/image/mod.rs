//! Images: a directory tree published as content-addressed verity objects
//! and a manifest, read back from any [`Source`] with every byte verified
//! (format: `docs/IMAGE.md`).
//!
//! Trust flows from one digest: the manifest's fs-verity digest, which
//! [`publish`] returns. [`open_manifest`] checks the manifest object against
//! it, the manifest gives each regular file's digest, and [`open_object`]
//! checks the file's object against that digest before any byte is served.
//!
//! ```
//! use std::fs::File;
//! use std::sync::Arc;
//! use verityfs::image::{open_manifest, open_object, publish, EntryKind, ManifestTrust, MANIFEST_NAME};
//! use verityfs::{MerkleTreeParams, ReadOptions, Verifier};
//!
//! # let dir = tempfile::tempdir()?;
//! # let (src, dest) = (dir.path().join("src"), dir.path().join("image"));
//! # std::fs::create_dir_all(src.join("etc"))?;
//! std::fs::write(src.join("etc/motd"), b"hello\n")?;
//! let published = publish(&src, &dest, &MerkleTreeParams::default())?;
//! let trusted = ManifestTrust::Digest(format!("sha256:{}", published.digest).parse()?);
//!
//! let verifier = Verifier::new(ReadOptions::default());
//! let source = Arc::new(File::open(dest.join(MANIFEST_NAME))?);
//! let manifest = open_manifest(&verifier, source, &trusted)?;
//! let index = manifest.lookup(b"etc/motd").expect("published");
//! let EntryKind::Regular(object) = &manifest.entries()[index as usize].kind else { panic!() };
//! let source = Arc::new(File::open(dest.join(object.path(manifest.algorithm())))?);
//! let file = open_object(&verifier, manifest.algorithm(), object, source, "etc/motd".as_ref())?;
//! let mut buf = [0u8; 16];
//! let n = file.read_at(&mut buf, 0)?; // verified
//! assert_eq!(&buf[..n], b"hello\n");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod manifest;
mod publish;
mod store;

use std::path::Path;
use std::sync::Arc;

pub use manifest::{Entry, EntryKind, FileObject, Manifest, ManifestError};
pub use publish::{publish, publish_signed, ManifestSigner, Published};
pub use store::{DirStore, Store};

use crate::error::{Corruption, Error, Result};
use crate::expected::ExpectedDigest;
use crate::hash_algs::{Digest, HashAlgorithm};
use crate::layout::{Location, LOCATION_SIZE};
use crate::open::{Verifier, VerityFile};
use crate::source::Source;

/// The manifest object's name in an image.
pub const MANIFEST_NAME: &str = "manifest";
/// The directory of the file objects in an image.
pub const OBJECTS_DIR: &str = "objects";
/// The largest manifest [`open_manifest`] reads into memory.
pub const MAX_MANIFEST_SIZE: u64 = 1 << 30;

/// Where the object of contents with `digest` is, relative to the image:
/// `objects/ALG-HEX`.
pub fn object_path(alg: HashAlgorithm, digest: &Digest) -> String {
    format!("{OBJECTS_DIR}/{alg}-{digest}")
}

impl FileObject {
    /// Where this object is, relative to the image (see [`object_path`]).
    pub fn path(&self, alg: HashAlgorithm) -> String {
        object_path(alg, &self.digest)
    }
}

/// Opens the manifest object `source` (an image's [`MANIFEST_NAME`]),
/// checks that `trust` accepts it, and decodes it.
///
/// The object ends with its location record (untrusted, it only says where
/// to look); the descriptor it points to must hash to the trusted digest,
/// else [`Error::Corrupted`] ([`Error::DescriptorTampered`] if it is not
/// a valid descriptor at all), or carry a signature of its digest by a
/// trusted certificate, else [`Error::NoSignature`] or
/// [`Error::Signature`]; every byte of the manifest is then verified as it
/// is read. A manifest that verifies but breaks the encoding's rules is
/// [`Error::InvalidManifest`].
pub fn open_manifest(
    verifier: &Arc<Verifier>,
    source: Arc<dyn Source>,
    trust: &ManifestTrust,
) -> Result<Manifest> {
    // A size or record from a copy the source kept (a cache) may be stale
    // or damaged: dropped, and read once more.
    let location = match manifest_location(&*source) {
        Err((_, pos)) if source.invalidate(pos, LOCATION_SIZE as u64) => {
            manifest_location(&*source).map_err(|(e, _)| e)?
        }
        located => located.map_err(|(e, _)| e)?,
    };
    let name = Path::new(MANIFEST_NAME);
    let wanted = trust.wanted();
    let file = open_checked(verifier, source, location, name, wanted, |file| {
        trust.check(file)
    })?;
    if file.data_size() > MAX_MANIFEST_SIZE {
        return Err(Error::FileTooLarge(file.data_size()));
    }
    let mut bytes = vec![0u8; file.data_size() as usize];
    let mut done = 0;
    while done < bytes.len() {
        done += file.read_at(&mut bytes[done..], done as u64)?;
    }
    Ok(Manifest::decode(&bytes)?)
}

/// The location record at the end of the manifest object `source`; on
/// failure, also where the record was looked for.
fn manifest_location(source: &dyn Source) -> std::result::Result<Location, (Error, u64)> {
    let size = source.size().map_err(|e| (e.into(), 0))?;
    let trailer_pos = size.saturating_sub(LOCATION_SIZE as u64);
    let failed = |e: Error| (e, trailer_pos);
    if size < LOCATION_SIZE as u64 {
        return Err(failed(Error::MetadataTruncated));
    }
    let mut trailer = [0u8; LOCATION_SIZE];
    source
        .read_exact_at(&mut trailer, trailer_pos)
        .map_err(|e| failed(e.into()))?;
    let location = Location::decode(&trailer).map_err(failed)?;
    if location.end() != Some(trailer_pos) {
        return Err(failed(Error::InvalidLocation(
            "the manifest object has the wrong size",
        )));
    }
    Ok(location)
}

/// Opens the object of a regular file (read from `source`) as a verity
/// file named `name`, checking that its digest is the one the manifest
/// gives (else [`Error::Corrupted`], or [`Error::DescriptorTampered`] for
/// a descriptor that is not even valid: `EIO` either way, where a local
/// verity file's invalid descriptor is `EINVAL`): from then on, every byte
/// read is verified.
pub fn open_object(
    verifier: &Arc<Verifier>,
    alg: HashAlgorithm,
    object: &FileObject,
    source: Arc<dyn Source>,
    name: &Path,
) -> Result<VerityFile> {
    let wanted = Some(object.digest);
    open_checked(verifier, source, object.location, name, wanted, |file| {
        let ok =
            file.descriptor().params().hash_algorithm() == alg && *file.digest() == object.digest;
        ok.then_some(()).ok_or(Refusal::Wanted(object.digest))
    })
}

/// Why an object was not trusted.
#[cfg_attr(not(feature = "openssl"), allow(dead_code))]
enum Refusal {
    /// It does not have this digest.
    Wanted(Digest),
    /// This.
    Error(Error),
}

/// What makes an image's manifest trusted.
#[derive(Clone)]
pub enum ManifestTrust {
    /// Its fs-verity digest is this one.
    Digest(ExpectedDigest),
    /// It carries a built-in signature (as `verityfs sign` makes) of its
    /// digest by one of these certificates.
    #[cfg(feature = "openssl")]
    Signed(Vec<crate::signature::Certificate>),
}

impl ManifestTrust {
    /// The digest the manifest's descriptor must have, if one is given.
    fn wanted(&self) -> Option<Digest> {
        match self {
            ManifestTrust::Digest(expected) => Some(expected.digest()),
            #[cfg(feature = "openssl")]
            ManifestTrust::Signed(_) => None,
        }
    }

    /// Whether `file`, a manifest object, is trusted.
    fn check(&self, file: &VerityFile) -> std::result::Result<(), Refusal> {
        match self {
            ManifestTrust::Digest(expected) => file
                .matches(expected)
                .then_some(())
                .ok_or(Refusal::Wanted(expected.digest())),
            #[cfg(feature = "openssl")]
            ManifestTrust::Signed(certs) => {
                if file.signature().is_empty() {
                    return Err(Refusal::Error(Error::NoSignature));
                }
                let alg = file.descriptor().params().hash_algorithm();
                crate::signature::verify_signature(file.signature(), alg, file.digest(), certs)
                    .map_err(|e| Refusal::Error(e.into()))
            }
        }
    }
}

/// Opens a backing-format object whose metadata is at `location` and
/// accepts it if `trusted` does (a digest it wanted instead is reported as
/// a corrupted descriptor; another error as it is). If its descriptor must
/// have the digest `wanted`, one that is not even valid is
/// [`Error::DescriptorTampered`]: the bytes were changed.
fn open_checked(
    verifier: &Arc<Verifier>,
    source: Arc<dyn Source>,
    location: Location,
    name: &Path,
    wanted: Option<Digest>,
    trusted: impl Fn(&VerityFile) -> std::result::Result<(), Refusal>,
) -> Result<VerityFile> {
    // Before the descriptor is read, so that a remote source fetches it in
    // the same request as the rest (all of a small file, or the tree).
    if let Some((start, len)) = crate::open::open_prefetch(&location, &*source) {
        source.prefetch(start, len);
    }
    let open = || open_descriptor(verifier, &source, location, name, wanted, &trusted);
    // A descriptor refused may be a copy the source kept, fetched while
    // the storage was bad: it is dropped, so that the next open fetches
    // it again, and if there was one, read and checked once more now.
    let forget = |e: &Error| {
        !matches!(e, Error::Io(_) | Error::IoAt { .. })
            && source.invalidate(location.desc_pos, location.desc_size.into())
    };
    match open() {
        Err(e) if forget(&e) => open().inspect_err(|e| {
            forget(e);
        }),
        opened => opened,
    }
}

/// [`open_checked`] once: reads the descriptor at `location` and checks it.
fn open_descriptor(
    verifier: &Arc<Verifier>,
    source: &Arc<dyn Source>,
    location: Location,
    name: &Path,
    wanted: Option<Digest>,
    trusted: impl Fn(&VerityFile) -> std::result::Result<(), Refusal>,
) -> Result<VerityFile> {
    let mut descriptor = vec![0u8; location.desc_size as usize];
    source
        .read_exact_at(&mut descriptor, location.desc_pos)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::MetadataTruncated,
            _ => e.into(),
        })?;
    // open_checked prefetched already, before the descriptor was read.
    let file = VerityFile::from_sources(
        verifier,
        (source.clone(), source.clone()),
        location,
        &descriptor,
        name,
    )
    .map_err(|e| match e {
        Error::Io(_) | Error::IoAt { .. } => e,
        e if wanted.is_some() => Error::DescriptorTampered {
            file: name.to_owned(),
            source: Box::new(e),
        },
        e => e,
    })?;
    match trusted(&file) {
        Ok(()) => Ok(file),
        Err(Refusal::Error(e)) => Err(e),
        // The descriptor sits above the tree's top level: a mismatch is
        // reported at that level, at position 0.
        Err(Refusal::Wanted(want)) => Err(Error::Corrupted(Box::new(Corruption {
            file: name.to_owned(),
            pos: 0,
            level: file.geometry().num_levels() as i32,
            alg: file.descriptor().params().hash_algorithm(),
            want,
            real: *file.digest(),
        }))),
    }
}
