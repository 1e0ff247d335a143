//! Where a mount just made is, held so that no name above it matters.
//!
//! Once mounted, a mount point can be neither renamed nor removed (`EBUSY`),
//! so its name in its parent directory is fixed for as long as the mount is
//! there. A descriptor of that parent, taken right after mounting, and the
//! name then lead to the mount whatever happens to the directories above:
//! a user who owns one of them may rename it, or swap it for a symbolic
//! link to somewhere else, but `/proc/self/fd/P/NAME` still walks from the
//! very parent the mount was made in. Actions on the mount by name (the
//! unmount, a look at the mount table, by the place's mount ID) go through
//! this place.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags, CWD};

use crate::mountinfo::{mount_of_id, MountEntry};

/// A mount point: its parent directory, held open, and its name there.
pub(crate) struct MountPoint {
    parent: OwnedFd,
    name: OsString,
}

impl MountPoint {
    /// The place of the mount just made on the directory `dir` (the
    /// descriptor mounted on, or that `fusermount3` was told the path of).
    pub(crate) fn of(dir: &OwnedFd) -> io::Result<MountPoint> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let parent = rustix::fs::openat(dir, "..", flags, Mode::empty())?;
        let path = std::fs::read_link(proc_fd(dir))?;
        let name = path.file_name().ok_or_else(|| {
            let why = format!("'{}' has no parent directory", path.display());
            io::Error::new(io::ErrorKind::InvalidInput, why)
        })?;
        Ok(MountPoint {
            parent,
            name: name.to_owned(),
        })
    }

    /// The path that leads to it without any name above its own: for
    /// system calls that take a path (a final symbolic link at the name
    /// is still for the call to refuse).
    pub(crate) fn fixed(&self) -> PathBuf {
        proc_fd(&self.parent).join(&self.name)
    }

    /// Its path as the mount table shows it now: the parent's path now
    /// (it follows renames) and the name.
    pub(crate) fn path(&self) -> io::Result<PathBuf> {
        Ok(std::fs::read_link(proc_fd(&self.parent))?.join(&self.name))
    }

    /// The mount on it now (the last one, which hides the others), found
    /// by the mount ID the kernel gives the place, not by its path: renames
    /// above it while the mount table is read cannot hide it. Nothing is
    /// asked of the filesystem mounted there (`AT_STATX_DONT_SYNC`, the
    /// mount ID only), so a hung server cannot hang this.
    pub(crate) fn mount(&self) -> io::Result<Option<MountEntry>> {
        let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_DONT_SYNC;
        let place = rustix::fs::statx(CWD, self.fixed(), flags, StatxFlags::MNT_ID)?;
        mount_of_id(place.stx_mnt_id)
    }
}

/// `/proc/self/fd/N` of `fd`.
fn proc_fd(fd: &OwnedFd) -> PathBuf {
    Path::new("/proc/self/fd").join(fd.as_raw_fd().to_string())
}
