//! Turning an ordinary backing file into a verity file, crash-safely
//! (kernel: `fs/verity/enable.c`; ext4's orphan-list scheme, with extended
//! attributes as the journal), and measuring one ([`measure_verity`], as
//! `fs/verity/measure.c` does).
//!
//! The steps, each durable before the next:
//! 1. record the file's size in [`ENABLING_XATTR`];
//! 2. build the Merkle tree from the data and write it past the data, then
//!    the descriptor and signature after it;
//! 3. write the location record ([`LOCATION_XATTR`]): the commit point;
//! 4. remove the enabling record.
//!
//! Killed before step 3, the file still starts with its untouched data and
//! [`recover`](crate::state::recover) cuts the rest off; killed after, it is
//! a complete verity file. The data itself is never written.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::{fsetxattr, XattrFlags};

use crate::build::{build_merkle_tree, TreeSink};
use crate::descriptor::{Descriptor, DESCRIPTOR_SIZE, MAX_SIGNATURE_SIZE};
use crate::error::{Error, Result};
use crate::geometry::TreeGeometry;
use crate::layout::{EnablingRecord, Location, ENABLING_XATTR, LOCATION_XATTR};
use crate::open::{ReadOptions, Verifier, VerityFile};
use crate::params::MerkleTreeParams;
use crate::state::{rollback, FileState};
use crate::uapi::FsverityDigest;

/// What enabling verity needs besides the file.
pub struct EnableRequest<'a> {
    /// Tree parameters.
    pub params: MerkleTreeParams,
    /// A built-in signature to store with the descriptor, if any.
    pub signature: Option<&'a [u8]>,
    /// Called with the bytes hashed so far; returning `false` cancels the
    /// enable (`EINTR`), leaving the file as it was.
    pub progress: &'a mut dyn FnMut(u64) -> bool,
}

/// Enables verity on `file`, which must be open for reading and writing and
/// must not be written by anyone until this returns (the caller enforces
/// that, as the kernel does with `ETXTBSY`). Returns the descriptor.
///
/// Errors: `EEXIST` if already verity, `EINVAL`/`EMSGSIZE`/`EFBIG` for
/// parameters the kernel would refuse, `EINTR` if cancelled, the I/O error
/// otherwise. On any error the file is left as it was.
///
/// The file's filesystem must support `user.` extended attributes (ext4,
/// xfs, btrfs, tmpfs since Linux 6.6...): the location record lives there.
///
/// The blocks of the appended metadata lie where the filesystem puts them,
/// on ext4 away from the data; a caller that has a writable directory on
/// the same filesystem should then call [`place_together`](crate::place_together), as the mount
/// does, so that a small file read whole costs one device request.
///
/// # Example
///
/// ```
/// use std::fs::OpenOptions;
/// use verityfs::{enable_verity, EnableRequest, MerkleTreeParams, ReadOptions, Verifier, VerityFile};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("file");
/// std::fs::write(&path, b"lorem ipsum\n")?;
///
/// let file = OpenOptions::new().read(true).write(true).open(&path)?;
/// let descriptor = enable_verity(
///     &file,
///     EnableRequest {
///         params: MerkleTreeParams::default(),
///         signature: None,
///         progress: &mut |_bytes_hashed| true, // false cancels
///     },
/// )?;
/// // What `fsverity measure` reports for the file once enabled.
/// assert_eq!(
///     descriptor.file_digest().to_hex(),
///     "fda0e2d973b5c81e4a8ccc43a0bb13cbc9b5da8d83c4ff4416f6860ea20df0d6"
/// );
/// // Enabling twice: EEXIST.
/// let again = EnableRequest {
///     params: MerkleTreeParams::default(),
///     signature: None,
///     progress: &mut |_| true,
/// };
/// assert_eq!(enable_verity(&file, again).unwrap_err().errno(), libc::EEXIST);
///
/// // The backing file now also holds the tree and descriptor; opened as a
/// // verity file, it reads back as the original data.
/// let verifier = Verifier::new(ReadOptions::default());
/// let verity = VerityFile::open(&verifier, std::fs::File::open(&path)?, &path)?;
/// assert_eq!(verity.data_size(), 12);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn enable_verity(file: &File, request: EnableRequest) -> Result<Descriptor> {
    enable_verity_checked(file, request, &|_, _| Ok(()))
}

/// Like [`enable_verity`], with `check` called on the new descriptor and the
/// signature once the tree is built and before anything is committed: an
/// error from it (a signature policy refusing the file, as the kernel's
/// `fsverity_verify_signature()` does at this point) undoes the enable and
/// is returned.
pub fn enable_verity_checked(
    file: &File,
    request: EnableRequest,
    check: &dyn Fn(&Descriptor, &[u8]) -> Result<()>,
) -> Result<Descriptor> {
    let params = request.params;
    params.check_kernel_limits()?;
    let sig = request.signature.unwrap_or_default();
    if sig.len() > MAX_SIGNATURE_SIZE {
        return Err(Error::SignatureTooLarge(sig.len()));
    }
    match crate::state::recover(file)? {
        FileState::Verity(_) => return Err(Error::AlreadyVerity),
        FileState::Regular | FileState::Enabling(_) => {}
    }
    let data_size = file.metadata()?.len();
    let geometry = TreeGeometry::new(&params, data_size);
    geometry.check_kernel_limits()?;
    let desc_size = (DESCRIPTOR_SIZE + sig.len()) as u32;
    let location = Location::new(data_size, geometry.tree_size(), desc_size)?;

    set_xattr(file, ENABLING_XATTR, &EnablingRecord { data_size }.encode())?;
    file.sync_all()?;
    let result = write_metadata(file, &location, &params, sig, request.progress, check)
        .and_then(|descriptor| commit(file, &location).map(|()| descriptor));
    match result {
        Ok(descriptor) => {
            // Past the commit point: a leftover enabling record is harmless.
            let _ = crate::state::remove_xattr(file, ENABLING_XATTR);
            Ok(descriptor)
        }
        Err(e) => {
            rollback(file, data_size)?;
            Err(e)
        }
    }
}

/// Measures the stored verity file `file` (a backing file of the verityfs
/// layout, as [`enable_verity`] leaves it): what `FS_IOC_MEASURE_VERITY`
/// returns for it, its hash algorithm number and file digest.
///
/// Errors: `ENODATA` if it is not a verity file, and those of
/// [`VerityFile::open`] for metadata the kernel would refuse.
///
/// # Example
///
/// ```
/// use std::fs::{File, OpenOptions};
/// use verityfs::{enable_verity, measure_verity, EnableRequest, MerkleTreeParams};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("file");
/// std::fs::write(&path, b"lorem ipsum\n")?;
/// let plain = File::open(&path)?;
/// assert_eq!(measure_verity(&plain).unwrap_err().errno(), libc::ENODATA);
///
/// let file = OpenOptions::new().read(true).write(true).open(&path)?;
/// let request = EnableRequest {
///     params: MerkleTreeParams::default(),
///     signature: None,
///     progress: &mut |_| true,
/// };
/// enable_verity(&file, request)?;
/// let measured = measure_verity(&File::open(&path)?)?;
/// assert_eq!(measured.algorithm, 1); // FS_VERITY_HASH_ALG_SHA256
/// assert_eq!(
///     verityfs::hash_algs::to_hex(&measured.digest),
///     "fda0e2d973b5c81e4a8ccc43a0bb13cbc9b5da8d83c4ff4416f6860ea20df0d6"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn measure_verity(file: &File) -> Result<FsverityDigest> {
    let verifier = Verifier::new(ReadOptions::default());
    let verity = VerityFile::open(&verifier, file.try_clone()?, Path::new(""))?;
    Ok(measure(&verity))
}

/// What `FS_IOC_MEASURE_VERITY` returns for the open verity file `verity`.
pub fn measure(verity: &VerityFile) -> FsverityDigest {
    FsverityDigest {
        algorithm: verity.descriptor().params().hash_algorithm().id().into(),
        digest: verity.digest().as_bytes().to_vec(),
    }
}

/// Step 2: tree, descriptor and signature, made durable.
fn write_metadata(
    file: &File,
    location: &Location,
    params: &MerkleTreeParams,
    sig: &[u8],
    progress: &mut dyn FnMut(u64) -> bool,
    check: &dyn Fn(&Descriptor, &[u8]) -> Result<()>,
) -> Result<Descriptor> {
    let data = PositionedReader { file, pos: 0 };
    let sink = TreeWriter {
        file,
        base: location.tree_pos,
    };
    let mut on_progress = |done| {
        if progress(done) {
            Ok(())
        } else {
            Err(Error::Interrupted)
        }
    };
    let (descriptor, _) =
        build_merkle_tree(params, location.data_size, data, sink, &mut on_progress)?;
    let descriptor = descriptor.with_sig_size(sig.len() as u32)?;
    check(&descriptor, sig)?;
    let mut stored = descriptor.to_bytes().to_vec();
    stored.extend_from_slice(sig);
    file.write_all_at(&stored, location.desc_pos)?;
    file.sync_all()?;
    Ok(descriptor)
}

/// Step 3: the location record, made durable. Creating (not replacing) it
/// makes a concurrent second enable fail with `EEXIST`.
fn commit(file: &File, location: &Location) -> Result<()> {
    match fsetxattr(file, LOCATION_XATTR, &location.encode(), XattrFlags::CREATE) {
        Err(rustix::io::Errno::EXIST) => return Err(Error::AlreadyVerity),
        other => other.map_err(io::Error::from)?,
    }
    file.sync_all()?;
    Ok(())
}

fn set_xattr(file: &File, name: &str, value: &[u8]) -> io::Result<()> {
    Ok(fsetxattr(file, name, value, XattrFlags::empty())?)
}

/// Reads a file from a position with `pread`, leaving the file offset alone.
pub(crate) struct PositionedReader<'a> {
    pub(crate) file: &'a File,
    pub(crate) pos: u64,
}

impl Read for PositionedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Writes tree blocks at their place past the data.
struct TreeWriter<'a> {
    file: &'a File,
    base: u64,
}

impl TreeSink for TreeWriter<'_> {
    fn write_tree_block(&mut self, pos: u64, block: &[u8]) -> io::Result<()> {
        self.file.write_all_at(block, self.base + pos)
    }
}
