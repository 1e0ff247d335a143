//! Turning an ordinary backing file into a verity file, crash-safely
//! (kernel: `fs/verity/enable.c`; ext4's orphan-list scheme, with extended
//! attributes as the journal).
//!
//! The steps, each durable before the next:
//! 1. record the file's size in [`ENABLING_XATTR`](crate::layout::ENABLING_XATTR);
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

use rustix::fs::{fsetxattr, XattrFlags};

use crate::build::{build_merkle_tree, TreeSink};
use crate::descriptor::{Descriptor, DESCRIPTOR_SIZE, MAX_SIGNATURE_SIZE};
use crate::error::{Error, Result};
use crate::geometry::TreeGeometry;
use crate::layout::{EnablingRecord, Location, ENABLING_XATTR, LOCATION_XATTR};
use crate::params::MerkleTreeParams;
use crate::state::{rollback, FileState};

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
pub fn enable_verity(file: &File, request: EnableRequest) -> Result<Descriptor> {
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
    let result = write_metadata(file, &location, &params, sig, request.progress)
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

/// Step 2: tree, descriptor and signature, made durable.
fn write_metadata(
    file: &File,
    location: &Location,
    params: &MerkleTreeParams,
    sig: &[u8],
    progress: &mut dyn FnMut(u64) -> bool,
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
