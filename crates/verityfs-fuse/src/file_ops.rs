//! Opening, reading, writing and truncating files.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use fuser::{Errno, FileAttr, FileHandle, FopenFlags, OpenFlags};
use rustix::fs::{Mode, OFlags};

use crate::caller::Caller;
use crate::fs::{lib_errno, VerityFs};
use crate::handles::Handle;
use crate::inodes::{errno, Inode};

/// Flags that only make sense when creating, or that `/proc/self/fd`
/// reopening cannot honour.
const CREATE_ONLY: i32 = libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NOFOLLOW;

/// Flags of the caller's open that the daemon's backing file must not have:
/// `O_DIRECT`, because the kernel hands us the caller's data in its own
/// buffers, unaligned, which the backing file would refuse (`EINVAL`); the
/// kernel already bypasses its page cache of the FUSE file for such opens.
const NOT_FOR_BACKING: i32 = libc::O_DIRECT;

/// Whether an open with `flags` reads: `O_RDONLY` or `O_RDWR`, not the
/// nonstandard access mode 3 ("ioctls only", which fuser's `acc_mode()`
/// reports as `O_RDONLY`): `FS_IOC_ENABLE_VERITY` gives `EBADF` for it.
fn wants_read(flags: OpenFlags) -> bool {
    matches!(flags.0 & libc::O_ACCMODE, libc::O_RDONLY | libc::O_RDWR)
}

/// Whether an open with `flags` writes (the kernel's `FMODE_WRITE`, which
/// access mode 3 does not give), or truncates.
fn wants_write(flags: OpenFlags) -> bool {
    matches!(flags.0 & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
        || flags.0 & libc::O_TRUNC != 0
}

impl VerityFs {
    /// `open` of a regular file: verity files only for reading (`EPERM`
    /// otherwise, as `__fsverity_file_open()`), other files not for writing
    /// while an enable runs (`ETXTBSY`).
    pub(crate) fn open_file(
        &self,
        inode: &Arc<Inode>,
        flags: OpenFlags,
    ) -> Result<(FileHandle, FopenFlags), Errno> {
        let write = wants_write(flags);
        let mut verity = inode.verity();
        if let Some(file) = self.verity_file(inode, &mut verity)? {
            if write {
                return Err(Errno::EPERM);
            }
            let handle = Handle::Verity {
                file,
                inode: inode.clone(),
            };
            // Verified pages may stay in the kernel's cache: the file
            // cannot change. But pages cached before it became verity (or
            // before this daemon started) were never verified: the first
            // open drops them (an open without FOPEN_KEEP_CACHE does).
            let keep = std::mem::replace(&mut verity.cache_verified, true);
            let flags = if keep {
                FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            };
            return Ok((self.handles.insert(handle), flags));
        }
        if write && verity.enabling {
            return Err(Errno::ETXTBSY);
        }
        let oflags = OFlags::from_bits_retain((flags.0 & !CREATE_ONLY & !NOT_FOR_BACKING) as u32);
        let file = self.open_backing(inode, oflags)?;
        if write {
            verity.writers += 1;
        }
        let read = wants_read(flags);
        let handle = Handle::Plain {
            file,
            read,
            write,
            inode: inode.clone(),
        };
        Ok((self.handles.insert(handle), FopenFlags::empty()))
    }

    /// `create`: makes the file as the caller, then opens it.
    pub(crate) fn create_file(
        &self,
        caller: Caller,
        parent: &Inode,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, FileHandle), Errno> {
        let oflags =
            OFlags::from_bits_retain((flags | libc::O_CREAT) as u32 & !(libc::O_NOCTTY as u32))
                .difference(OFlags::from_bits_retain(NOT_FOR_BACKING as u32))
                | OFlags::CLOEXEC
                | OFlags::NOFOLLOW;
        let fd = rustix::fs::openat(&parent.fd, name, oflags, Mode::from_raw_mode(mode & !umask))
            .map_err(errno)?;
        self.chown_new(&fd, caller.uid, caller.gid)?;
        let (inode, attr) = self.lookup_child(parent, name)?;
        let write = wants_write(OpenFlags(flags));
        if write {
            inode.verity().writers += 1;
        }
        let read = wants_read(OpenFlags(flags));
        let handle = Handle::Plain {
            file: fd.into(),
            read,
            write,
            inode,
        };
        Ok((attr, self.handles.insert(handle)))
    }

    /// `release`: forgets the handle and its write access.
    pub(crate) fn release_file(&self, fh: FileHandle) {
        if let Some(handle) = self.handles.remove(fh) {
            if let Handle::Plain {
                write: true, inode, ..
            } = &*handle
            {
                inode.verity().writers -= 1;
            }
        }
    }

    /// `read`: verified for verity files.
    pub(crate) fn read_file(
        &self,
        fh: FileHandle,
        offset: u64,
        size: u32,
        buf: &mut Vec<u8>,
    ) -> Result<usize, Errno> {
        let handle = self.handles.get(fh)?;
        // Reused between requests: growing it zero-fills once, not per read.
        buf.resize(size as usize, 0);
        match &*handle {
            Handle::Verity { file, .. } => read_verified(file, buf, offset),
            // Opened before the file became verity: from now on its reads
            // are verified too, as in the kernel (verity is per inode).
            Handle::Plain {
                read: true, inode, ..
            } if inode
                .became_verity
                .load(std::sync::atomic::Ordering::Acquire) =>
            {
                let file = self.verity_file(inode, &mut inode.verity())?;
                read_verified(&*file.ok_or(Errno::EIO)?, buf, offset)
            }
            Handle::Plain {
                file, read: true, ..
            } => read_full_at(file, buf, offset),
            Handle::Plain { .. } => Err(Errno::EBADF),
            Handle::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    /// `write`: ordinary files only (verity files are never open for
    /// writing).
    pub(crate) fn write_file(
        &self,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<u32, Errno> {
        match &*self.handles.get(fh)? {
            Handle::Plain {
                file, write: true, ..
            } => {
                file.write_all_at(data, offset).map_err(Errno::from)?;
                Ok(data.len() as u32)
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// `fsync`.
    pub(crate) fn fsync_file(&self, fh: FileHandle, datasync: bool) -> Result<(), Errno> {
        match &*self.handles.get(fh)? {
            Handle::Plain { file, .. } if datasync => file.sync_data().map_err(Errno::from),
            Handle::Plain { file, .. } => file.sync_all().map_err(Errno::from),
            _ => Ok(()),
        }
    }

    /// Truncation: refused for verity files (`EPERM`, as
    /// `__fsverity_prepare_setattr()`) and during an enable (`ETXTBSY`).
    pub(crate) fn truncate(
        &self,
        inode: &Inode,
        fh: Option<FileHandle>,
        size: u64,
    ) -> Result<(), Errno> {
        let mut verity = inode.verity();
        if self.verity_file(inode, &mut verity)?.is_some() {
            return Err(Errno::EPERM);
        }
        if verity.enabling {
            return Err(Errno::ETXTBSY);
        }
        let handle = fh.map(|fh| self.handles.get(fh)).transpose()?;
        match handle.as_deref() {
            Some(Handle::Plain {
                file, write: true, ..
            }) => file.set_len(size),
            _ => self.open_backing(inode, OFlags::WRONLY)?.set_len(size),
        }
        .map_err(Errno::from)
    }
}

/// A verified read; corruption is logged and answered with `EIO`.
fn read_verified(file: &verityfs::VerityFile, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    file.read_at(buf, offset).map_err(|e| {
        if let verityfs::Error::Corrupted(c) = &e {
            log_corruption(c);
        }
        lib_errno(e)
    })
}

/// `pread` until `buf` is full or the file ends.
fn read_full_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Corruption reports logged per second at most: a scan of a damaged file
/// must not flood the log.
const CORRUPTION_LOGS_PER_SECOND: u64 = 10;

/// Logs one line per corruption (the kernel's "FILE CORRUPTED!" line) at
/// warn level, rate-limited, with a count of what was suppressed.
fn log_corruption(c: &verityfs::Corruption) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static SECOND: AtomicU64 = AtomicU64::new(0);
    static COUNT: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    let now = std::time::UNIX_EPOCH.elapsed().map_or(0, |d| d.as_secs());
    if SECOND.swap(now, Relaxed) != now {
        COUNT.store(0, Relaxed);
        let suppressed = SUPPRESSED.swap(0, Relaxed);
        if suppressed > 0 {
            tracing::warn!("{suppressed} more corruption reports suppressed");
        }
    }
    if COUNT.fetch_add(1, Relaxed) < CORRUPTION_LOGS_PER_SECOND {
        tracing::warn!("{c}");
    } else {
        SUPPRESSED.fetch_add(1, Relaxed);
    }
}
