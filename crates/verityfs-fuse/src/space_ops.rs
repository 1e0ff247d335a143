//! `fallocate` and `lseek(SEEK_DATA/SEEK_HOLE)`, passed to the backing
//! file (without them the kernel answers `EOPNOTSUPP` and sees every file
//! as data without holes).

use fuser::{Errno, FileHandle};
use rustix::fs::{FallocateFlags, OFlags, SeekFrom};

use crate::fs::VerityFs;
use crate::handles::Handle;
use crate::inodes::errno;

impl VerityFs {
    /// `fallocate` with the kernel's `mode` flags, on a handle open for
    /// writing (verity files never are).
    pub(crate) fn allocate(
        &self,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        match &*self.handles.get(fh)? {
            // Opened before the file became verity: as for writes.
            Handle::Plain {
                write: true, inode, ..
            } if inode.verity().file.is_some() => Err(Errno::EPERM),
            Handle::Plain {
                file, write: true, ..
            } => {
                let flags = FallocateFlags::from_bits_retain(mode as u32);
                rustix::fs::fallocate(file, flags, offset, length).map_err(errno)
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (the kernel handles the
    /// others). A verity file's data ends at its data size: its tree after
    /// it is no data of the file.
    pub(crate) fn seek_data(&self, fh: FileHandle, offset: i64, whence: i32) -> Result<i64, Errno> {
        let from = u64::try_from(offset).map_err(|_| Errno::from_i32(libc::ENXIO))?;
        let seek = match whence {
            libc::SEEK_DATA => SeekFrom::Data(from),
            libc::SEEK_HOLE => SeekFrom::Hole(from),
            _ => return Err(Errno::EINVAL),
        };
        let handle = self.handles.get(fh)?;
        let (file, end) = match &*handle {
            Handle::Verity { file, inode } => (
                self.open_backing(inode, OFlags::RDONLY)?,
                Some(file.data_size()),
            ),
            Handle::Plain { file, .. } => (file.try_clone().map_err(Errno::from)?, None),
            Handle::Dir { .. } => return Err(Errno::EISDIR),
        };
        let Some(end) = end else {
            return rustix::fs::seek(&file, seek)
                .map(|p| p as i64)
                .map_err(errno);
        };
        let nxio = Errno::from_i32(libc::ENXIO);
        if from >= end {
            return Err(nxio);
        }
        let found = rustix::fs::seek(&file, seek).map_err(errno)?;
        match whence {
            libc::SEEK_DATA if found >= end => Err(nxio),
            _ => Ok(found.min(end) as i64),
        }
    }
}
