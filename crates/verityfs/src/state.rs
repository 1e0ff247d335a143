//! Whether a backing file is a verity file, an ordinary file, or an
//! interrupted enable; and undoing interrupted enables.

use std::fs::File;
use std::io;
use std::path::Path;

use rustix::fs::{fgetxattr, fremovexattr, getxattr};

use crate::error::{Error, Result};
use crate::layout::{
    EnablingRecord, Location, ENABLING_SIZE, ENABLING_XATTR, LOCATION_SIZE, LOCATION_XATTR,
};

/// What the extended attributes of a backing file say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileState {
    /// An ordinary file: its size is its data.
    Regular,
    /// A verity file with its metadata at this location.
    Verity(Location),
    /// An enable was started and did not finish (a crash or a kill): the
    /// file's data is the first `data_size` bytes and the rest is to be cut
    /// off by [`recover`].
    Enabling(EnablingRecord),
}

impl FileState {
    /// Reads the state of `file` from its extended attributes. A location
    /// record wins over an enabling record (the enable had reached its
    /// commit point). Malformed records are errors (`EINVAL`).
    pub fn read(file: &File) -> Result<FileState> {
        Self::read_with(|name, buf| fgetxattr(file, name, buf))
    }

    /// Like [`FileState::read`], for the file at `path` (following
    /// symbolic links, so `/proc/self/fd/N` of an `O_PATH` descriptor
    /// works).
    pub fn read_path(path: &Path) -> Result<FileState> {
        Self::read_with(|name, buf| getxattr(path, name, buf))
    }

    fn read_with(get: impl Fn(&str, &mut [u8]) -> rustix::io::Result<usize>) -> Result<FileState> {
        let mut buf = [0u8; LOCATION_SIZE + 1];
        if let Some(n) = absent_is_none(get(LOCATION_XATTR, &mut buf))? {
            return Ok(FileState::Verity(Location::decode(&buf[..n])?));
        }
        if let Some(n) = absent_is_none(get(ENABLING_XATTR, &mut buf[..ENABLING_SIZE + 1]))? {
            return Ok(FileState::Enabling(EnablingRecord::decode(&buf[..n])?));
        }
        Ok(FileState::Regular)
    }

    /// The file's size as its readers see it, given its backing size.
    pub fn logical_size(&self, backing_size: u64) -> u64 {
        match self {
            FileState::Regular => backing_size,
            FileState::Verity(location) => location.data_size,
            FileState::Enabling(record) => record.data_size.min(backing_size),
        }
    }

    /// True for a verity file.
    pub fn is_verity(&self) -> bool {
        matches!(self, FileState::Verity(_))
    }
}

/// The length of an extended attribute read, or `None` if it does not
/// exist. The buffers are one byte longer than any valid record, so a value
/// that does not fit (`ERANGE`) is a malformed record (`EINVAL`).
fn absent_is_none(read: rustix::io::Result<usize>) -> Result<Option<usize>> {
    match read {
        Ok(n) => Ok(Some(n)),
        Err(rustix::io::Errno::NODATA) => Ok(None),
        Err(rustix::io::Errno::RANGE) => Err(Error::InvalidLocation("record too long")),
        Err(e) => Err(Error::Io(e.into())),
    }
}

/// Removes extended attribute `name` if present.
pub(crate) fn remove_xattr(file: &File, name: &str) -> io::Result<()> {
    match fremovexattr(file, name) {
        Ok(()) | Err(rustix::io::Errno::NODATA) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Finishes what a killed enable left behind, so that the file is again
/// either fully verity or exactly as it was before the enable: with a
/// location record, a leftover enabling record is removed; without one, the
/// appended metadata is cut off and the enabling record removed. `file` must
/// be open for writing. Returns the state after recovery.
pub fn recover(file: &File) -> Result<FileState> {
    match FileState::read(file)? {
        FileState::Enabling(record) => {
            rollback(file, record.data_size)?;
            Ok(FileState::Regular)
        }
        FileState::Verity(location) => {
            remove_xattr(file, ENABLING_XATTR)?;
            Ok(FileState::Verity(location))
        }
        FileState::Regular => Ok(FileState::Regular),
    }
}

/// Cuts the file back to `data_size` bytes, makes that durable, then drops
/// the enabling record: the order guarantees a crash here is recovered the
/// same way next time.
pub(crate) fn rollback(file: &File, data_size: u64) -> io::Result<()> {
    if file.metadata()?.len() > data_size {
        file.set_len(data_size)?;
    }
    file.sync_all()?;
    remove_xattr(file, ENABLING_XATTR)
}
