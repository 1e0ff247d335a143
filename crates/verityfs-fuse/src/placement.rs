//! Where a mount may go. The daemon reaches backing objects through
//! descriptors opened under the backing directory; if the mount point is
//! reachable that way, a lookup of it is a request to the daemon's own
//! mount, and `ls B/mnt/mnt/mnt...` ties up every worker waiting for
//! itself. Such layouts are refused before mounting, comparing directories
//! by device and inode (so that symbolic links, `..`, bind mounts and mounts
//! inside the backing directory all count), never by name.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags, CWD};

use crate::mountinfo::{mount_on, mounts};

/// The filesystem type our mounts show in `/proc/mounts`.
pub const FSTYPE: &str = "fuse.verityfs";

/// Checks that the directory `dir`, whose canonical path is `mountpoint`,
/// can take a mount of the directory `backing_fd`, whose canonical path is
/// `backing`: it is neither the backing directory nor inside it, and not
/// already a verityfs mount.
pub fn check(
    backing_fd: &OwnedFd,
    backing: &Path,
    mountpoint: &Path,
    dir: &OwnedFd,
) -> io::Result<()> {
    // First, from the mount table only: a hung mount there must not hang
    // us too.
    if let Some(mount) = mount_on(mountpoint)? {
        if mount.fstype.starts_with(FSTYPE) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "'{}' is already a verityfs mount: unmount it first",
                    mountpoint.display()
                ),
            ));
        }
    }
    let reachable = reachable_roots(backing_fd, backing)?;
    for key in ancestry(dir)? {
        if reachable.contains(&key) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "'{}' is inside the backing directory '{}' (or is it): the daemon's \
                     lookups would reach its own mount; choose a mount point outside it",
                    mountpoint.display(),
                    backing.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Device (major, minor) and inode of a directory.
type Key = (u32, u32, u64);

/// The key of `fd`, from the attributes the kernel has cached: a hung FUSE
/// or network filesystem on the way must not hang the check.
fn key(fd: &OwnedFd) -> io::Result<Key> {
    let flags = AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC;
    let st = rustix::fs::statx(fd, "", flags, StatxFlags::INO)?;
    Ok((st.stx_dev_major, st.stx_dev_minor, st.stx_ino))
}

fn open_dir(at: Option<&OwnedFd>, path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(match at {
        Some(fd) => rustix::fs::openat(fd, path, flags, Mode::empty())?,
        None => rustix::fs::openat(CWD, path, flags, Mode::empty())?,
    })
}

/// The directories whose subtrees the daemon reaches from the backing
/// directory `backing_fd`, whose path is `backing`: itself and the roots
/// of the mounts under it.
fn reachable_roots(backing_fd: &OwnedFd, backing: &Path) -> io::Result<Vec<Key>> {
    let mut roots = vec![key(backing_fd)?];
    let under: Vec<PathBuf> = mounts()?
        .into_iter()
        .map(|m| m.point)
        .filter(|p| p != backing && p.starts_with(backing))
        .collect();
    for point in under {
        // A mount that cannot be examined (hung, gone) reaches nothing we
        // could compare with.
        if let Ok(fd) = open_dir(None, &point) {
            roots.push(key(&fd)?);
        }
    }
    Ok(roots)
}

/// `dir` and every directory above it, following `..` (which crosses mount
/// points as lookups do) up to the root.
fn ancestry(dir: &OwnedFd) -> io::Result<Vec<Key>> {
    let mut keys = vec![key(dir)?];
    let mut fd = open_dir(Some(dir), Path::new(".."))?;
    loop {
        let fd_key = key(&fd)?;
        if keys.last() == Some(&fd_key) {
            return Ok(keys);
        }
        keys.push(fd_key);
        fd = open_dir(Some(&fd), Path::new(".."))?;
    }
}
