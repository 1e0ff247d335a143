//! Opening, reading, writing and truncating files.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, OpenFlags};
use rustix::fs::{Mode, OFlags};
use verityfs::{FileState, VerityFile};

use crate::caller::Caller;
use crate::creds::Creds;
use crate::fs::{lib_errno, VerityFs};
use crate::handles::Handle;
use crate::inodes::{errno, Inode, VerityState};

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

/// The open flag of a handle that cannot write: writes go straight to the
/// backing file, so its close has nothing to flush, and with
/// `FOPEN_NOFLUSH` the kernel sends no `FLUSH`, a round trip less per file
/// read.
pub(crate) const READ_ONLY: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

impl VerityFs {
    /// `open` of a regular file: verity files only for reading (`EPERM`
    /// otherwise, as `__fsverity_file_open()`), other files not for writing
    /// while an enable runs (`ETXTBSY`). `ESTALE` for an inode retired when
    /// its file became verity with writers open: the kernel looks the name
    /// up again and opens the fresh inode, whose cache they never touched.
    pub(crate) fn open_file(
        &self,
        caller: Caller,
        inode: &Arc<Inode>,
        flags: OpenFlags,
    ) -> Result<(FileHandle, FopenFlags), Errno> {
        let creds = Creds::of(&caller);
        let write = wants_write(flags);
        // The caller's access first (ACLs and all), as the kernel checks
        // permission before fs-verity's rules; a verity file is then read
        // through the daemon's own descriptor.
        let oflags = OFlags::from_bits_retain((flags.0 & !CREATE_ONLY & !NOT_FOR_BACKING) as u32);
        let file = self.with_creds(&creds, || self.open_backing(inode, oflags))?;
        let mut verity = inode.verity();
        if write {
            self.state(inode, &mut verity)?;
        }
        let verity_file = self.verity_file(inode, &mut verity)?;
        if inode.is_retired() {
            return Err(Errno::from_i32(libc::ESTALE));
        }
        if let Some(verity_file) = verity_file {
            if write {
                return Err(Errno::EPERM);
            }
            return Ok(self.verity_handle(inode, &mut verity, verity_file));
        }
        if write && verity.enabling {
            return Err(Errno::ETXTBSY);
        }
        let fh = self.plain_handle(inode, &mut verity, file, flags, creds);
        Ok((
            fh,
            if write {
                FopenFlags::empty()
            } else {
                READ_ONLY
            },
        ))
    }

    fn verity_handle(
        &self,
        inode: &Arc<Inode>,
        verity: &mut VerityState,
        file: Arc<VerityFile>,
    ) -> (FileHandle, FopenFlags) {
        let handle = Handle::Verity {
            file,
            inode: inode.clone(),
        };
        // Verified pages may stay in the kernel's cache: the file cannot
        // change. But pages cached before it became verity were never
        // verified: until their drop is done, each open drops them (an
        // open without FOPEN_KEEP_CACHE does, before it returns).
        let flags = if verity.cache_verified {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        (self.handles.insert(handle), flags | READ_ONLY)
    }

    fn plain_handle(
        &self,
        inode: &Arc<Inode>,
        verity: &mut VerityState,
        file: File,
        flags: OpenFlags,
        creds: Creds,
    ) -> FileHandle {
        let write = wants_write(flags);
        if write {
            verity.writers += 1;
        }
        verity.shown_plain = true;
        self.handles.insert(Handle::Plain {
            file,
            read: wants_read(flags),
            write,
            inode: inode.clone(),
            creds,
        })
    }

    /// `create`: opens the name as the caller, creating the file if it is
    /// not there. Without `O_EXCL` a renamer may have put any file there
    /// meanwhile: the file actually opened (never another one looked up by
    /// name) gets the checks of `open` before it is truncated or written.
    pub(crate) fn create_file(
        &self,
        caller: Caller,
        parent: &Inode,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, FileHandle), Errno> {
        let creds = Creds::of(&caller);
        let oflags = (flags | libc::O_CREAT) & !(libc::O_NOCTTY | libc::O_TRUNC | NOT_FOR_BACKING);
        let oflags = OFlags::from_bits_retain(oflags as u32)
            | OFlags::CLOEXEC
            | OFlags::NOFOLLOW
            | crate::fs::NEVER_WAIT;
        let mode = Mode::from_raw_mode(mode & !umask);
        let fd = self.with_creds(&creds, || {
            rustix::fs::openat(&parent.fd, name, oflags, mode).map_err(errno)
        })?;
        let st = rustix::fs::fstat(&fd).map_err(errno)?;
        // Something else put there since the lookup (a FIFO, a socket): the
        // kernel takes only a regular file from `create`, and would refuse
        // the reply without releasing what it names.
        if crate::inodes::file_type(&st) != FileType::RegularFile {
            return Err(Errno::from_i32(libc::ENXIO));
        }
        let path_fd = rustix::io::fcntl_dupfd_cloexec(&fd, 0).map_err(errno)?;
        let inode = self.inodes.insert(path_fd, &st);
        let opened = self.open_created(&inode, fd.into(), OpenFlags(flags), creds);
        let attr = opened.and_then(|fh| match self.attr(&inode) {
            Ok(attr) => Ok((attr, fh)),
            Err(e) => {
                // No reply names the handle: nothing would release it.
                self.release_file(fh);
                Err(e)
            }
        });
        if attr.is_err() {
            // The kernel gets no entry: it holds no reference to forget.
            self.inodes.forget(inode.ino, 1);
        }
        attr
    }

    fn open_created(
        &self,
        inode: &Arc<Inode>,
        file: File,
        flags: OpenFlags,
        creds: Creds,
    ) -> Result<FileHandle, Errno> {
        let mut verity = inode.verity();
        if wants_write(flags) {
            self.state(inode, &mut verity)?;
            if self.verity_file(inode, &mut verity)?.is_some() {
                return Err(Errno::EPERM);
            }
            if verity.enabling {
                return Err(Errno::ETXTBSY);
            }
        }
        // Truncated once counted as a writer, and unlocked (see
        // `VerityState`), through a second descriptor of the file.
        let truncating = match flags.0 & libc::O_TRUNC {
            0 => None,
            _ => Some(file.try_clone().map_err(Errno::from)?),
        };
        let fh = self.plain_handle(inode, &mut verity, file, flags, creds.clone());
        drop(verity);
        let Some(file) = truncating else {
            return Ok(fh);
        };
        if let Err(e) = self.with_creds(&creds, || file.set_len(0).map_err(Errno::from)) {
            self.release_file(fh);
            return Err(e);
        }
        Ok(fh)
    }

    /// `release`: forgets the handle and its write access.
    pub(crate) fn release_file(&self, fh: FileHandle) {
        if let Some(handle) = self.handles.remove(fh) {
            if let Handle::Plain {
                write: true, inode, ..
            } = &*handle
            {
                self.end_write(inode);
            }
        }
    }

    /// Ends one writer's access to `inode` (a handle's, or a truncation's).
    fn end_write(&self, inode: &Arc<Inode>) {
        let mut verity = inode.verity();
        verity.writers -= 1;
        // The last writer of an inode retired at a switch: what it put in
        // the kernel's cache can go now, and stays gone.
        if verity.writers == 0 && inode.is_retired() {
            self.invalidator.invalidate(inode.clone(), &mut verity);
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
            Handle::Plain {
                file,
                read: true,
                inode,
                ..
            } => self.read_plain(inode, file, buf, offset),
            Handle::Plain { .. } => Err(Errno::EBADF),
            Handle::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    /// A read through a handle opened while the file was ordinary. Its
    /// bytes are served as read only if the file is still not verity once
    /// they are in the buffer: verity belongs to the inode, as in the
    /// kernel, so if the file became verity meanwhile (through the mount or
    /// in the backing store), the read is done again, verified.
    fn read_plain(
        &self,
        inode: &Arc<Inode>,
        file: &File,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<usize, Errno> {
        let n = read_full_at(file, buf, offset)?;
        let mut verity = inode.verity();
        // The common case costs two `fgetxattr`s on the open descriptor.
        if verity.file.is_none() && matches!(FileState::read(file), Ok(FileState::Regular)) {
            return Ok(n);
        }
        let file = self.verity_file(inode, &mut verity)?;
        drop(verity);
        match file {
            Some(file) => read_verified(&file, buf, offset),
            None => Ok(n),
        }
    }

    /// `write`: ordinary files only (verity files are never open for
    /// writing), with the credentials of whoever opened the handle (the
    /// kernel sends the writeback of shared mappings as root), so that the
    /// backing filesystem's quotas and reserved blocks apply to them.
    pub(crate) fn write_file(
        &self,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<u32, Errno> {
        match &*self.handles.get(fh)? {
            // Opened before the file became verity: verity files are
            // read-only, whoever holds a descriptor.
            Handle::Plain {
                write: true, inode, ..
            } if inode.verity().file.is_some() => Err(Errno::EPERM),
            Handle::Plain {
                file,
                write: true,
                creds,
                ..
            } => self.with_creds(creds, || {
                file.write_all_at(data, offset).map_err(Errno::from)?;
                Ok(data.len() as u32)
            }),
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
        caller: Caller,
        inode: &Arc<Inode>,
        fh: Option<FileHandle>,
        size: u64,
    ) -> Result<(), Errno> {
        let mut verity = inode.verity();
        self.state(inode, &mut verity)?;
        if self.verity_file(inode, &mut verity)?.is_some() {
            return Err(Errno::EPERM);
        }
        if verity.enabling {
            return Err(Errno::ETXTBSY);
        }
        // A writer while it runs, as the kernel's truncation takes write
        // access to the inode: no enable starts meanwhile. Unlocked: see
        // `VerityState`.
        verity.writers += 1;
        drop(verity);
        let handle = fh.map(|fh| self.handles.get(fh)).transpose();
        let result = handle.and_then(|handle| {
            self.as_caller(&caller, || {
                match handle.as_deref() {
                    Some(Handle::Plain {
                        file, write: true, ..
                    }) => file.set_len(size),
                    _ => self.open_backing(inode, OFlags::WRONLY)?.set_len(size),
                }
                .map_err(Errno::from)
            })
        });
        self.end_write(inode);
        result
    }
}

/// A verified read; corruption is logged and answered with `EIO`.
pub(crate) fn read_verified(
    file: &verityfs::VerityFile,
    buf: &mut [u8],
    offset: u64,
) -> Result<usize, Errno> {
    file.read_at(buf, offset).map_err(verified_read_error)
}

/// The errno of a failed verified read; corruption is logged.
pub(crate) fn verified_read_error(e: verityfs::Error) -> Errno {
    if let verityfs::Error::Corrupted(c) = &e {
        log_corruption(c);
    }
    lib_errno(e)
}

/// `pread` until `buf` is full or the file ends.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
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
