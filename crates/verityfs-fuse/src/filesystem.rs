//! The adapter between fuser's `Filesystem` trait and [`VerityFs`]: each
//! method fetches its inodes, calls one operation, and replies. Nothing
//! else in the crate knows fuser's request and reply types, so a change of
//! FUSE crate touches this file (and `mount.rs`) only.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use verityfs::uapi::{
    encode_flags, FS_IOC32_GETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_ENABLE_VERITY, FS_IOC_FSGETXATTR,
    FS_IOC_FSSETXATTR, FS_IOC_GETFLAGS, FS_IOC_MEASURE_VERITY, FS_IOC_READ_VERITY_METADATA,
    FS_IOC_SETFLAGS,
};
use verityfs::VerityFile;

use crate::attr::TTL;
use crate::caller::Caller;
use crate::file_ops::{read_verified, verified_read_error};
use crate::fs::VerityFs;
use crate::image_fs::{ImageFs, Opening, IMAGE_TTL};
use crate::readers::Job;
use crate::spare::{Charge, Spare};

thread_local! {
    /// Each worker thread's read buffer, reused for every request.
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The largest read or write request we ask the kernel for.
const MAX_IO: u32 = 1 << 20;

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn to_timespec(t: Option<TimeOrNow>) -> rustix::fs::Timespec {
    match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => rustix::fs::Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: d.subsec_nanos().into(),
            },
            // fuser 0.18 makes the kernel's (-S, N) (N ns after -S s) the
            // time S s + N ns before the epoch: undo exactly that.
            Err(before) => rustix::fs::Timespec {
                tv_sec: -(before.duration().as_secs() as i64),
                tv_nsec: before.duration().subsec_nanos().into(),
            },
        },
    }
}

/// The changes of a `setattr` besides the size.
struct AttrChange {
    mode: Option<u32>,
    owner: (Option<u32>, Option<u32>),
    times: (Option<TimeOrNow>, Option<TimeOrNow>),
}

/// Changes the mode, owner and times of `inode` through its own descriptor
/// (never by name).
fn change_inode(inode: &crate::inodes::Inode, change: AttrChange) -> Result<(), Errno> {
    if let Some(mode) = change.mode {
        let mode = rustix::fs::Mode::from_raw_mode(mode & 0o7777);
        rustix::fs::chmodat(
            rustix::fs::CWD,
            inode.proc_path(),
            mode,
            rustix::fs::AtFlags::empty(),
        )
        .map_err(crate::inodes::errno)?;
    }
    if change.owner.0.is_some() || change.owner.1.is_some() {
        let uid = change.owner.0.map(rustix::fs::Uid::from_raw);
        let gid = change.owner.1.map(rustix::fs::Gid::from_raw);
        let flags = rustix::fs::AtFlags::EMPTY_PATH | rustix::fs::AtFlags::SYMLINK_NOFOLLOW;
        rustix::fs::chownat(&inode.fd, "", uid, gid, flags).map_err(crate::inodes::errno)?;
    }
    if change.times.0.is_some() || change.times.1.is_some() {
        let stamps = rustix::fs::Timestamps {
            last_access: to_timespec(change.times.0),
            last_modification: to_timespec(change.times.1),
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            inode.proc_path(),
            &stamps,
            rustix::fs::AtFlags::empty(),
        )
        .map_err(crate::inodes::errno)?;
    }
    Ok(())
}

impl VerityFs {
    fn set_attr(
        &self,
        caller: Caller,
        ino: INodeNo,
        size: Option<u64>,
        fh: Option<FileHandle>,
        change: AttrChange,
    ) -> Result<fuser::FileAttr, Errno> {
        let inode = self.inode(ino)?;
        if let Some(size) = size {
            self.truncate(caller, &inode, fh, size)?;
        }
        self.as_caller(&caller, || change_inode(&inode, change))?;
        self.attr(&inode)
    }

    fn ioctl_op(
        &self,
        caller: Caller,
        fh: FileHandle,
        cmd: u32,
        input: &[u8],
    ) -> Result<Vec<u8>, Errno> {
        match cmd {
            FS_IOC_ENABLE_VERITY => self.enable(caller, fh, input).map(|()| Vec::new()),
            FS_IOC_MEASURE_VERITY => self.measure(fh, input),
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => Ok(encode_flags(self.get_flags(fh)?).to_vec()),
            FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => {
                self.set_flags(caller, fh, input).map(|()| Vec::new())
            }
            FS_IOC_FSGETXATTR => self.get_fsxattr(fh),
            FS_IOC_FSSETXATTR => self.set_fsxattr(caller, fh, input).map(|()| Vec::new()),
            // The kernel forwards it but gives us no way to write the
            // caller's buffer.
            FS_IOC_READ_VERITY_METADATA => Err(Errno::ENOTTY),
            _ => Err(Errno::ENOTTY),
        }
    }
}

macro_rules! reply_with {
    ($reply:expr, $result:expr, |$ok:pat_param| $body:expr) => {
        match $result {
            Ok($ok) => $body,
            Err(e) => $reply.error(e),
        }
    };
}

/// A directory mount as fuser serves it: the filesystem, shared with the
/// workers requests are handed to when fuser's threads are all but one
/// busy (see `spare`).
pub(crate) struct Served {
    fs: Arc<VerityFs>,
    spare: Spare,
}

impl Served {
    pub(crate) fn new(fs: VerityFs) -> Self {
        let spare = Spare::new(fs.options.threads);
        Served {
            fs: Arc::new(fs),
            spare,
        }
    }
}

impl std::ops::Deref for Served {
    type Target = VerityFs;

    fn deref(&self) -> &VerityFs {
        &self.fs
    }
}

/// A request of `req`'s user charged to `object` (see `spare`).
fn charge(req: &Request, object: u64) -> Charge {
    Charge::new(req.uid(), object)
}

/// Serves a request with `$fs` (the filesystem) and `$buf` (a buffer for
/// reads) running `$body`: on this fuser thread, or handed to a worker
/// (see `spare`), charged to `$charge`, with its borrowed arguments `$arg`
/// copied (the body takes them as `&arg` either way).
macro_rules! serve {
    ($self:ident, $charge:expr, [$($arg:ident),*], |$fs:ident, $buf:ident| $body:block) => {{
        if let Some(_serving) = $self.spare.serve_here() {
            let $fs: &VerityFs = &$self.fs;
            // Here `&arg` borrows a borrow.
            #[allow(clippy::needless_borrow)]
            let () = READ_BUFFER.with_borrow_mut(|$buf| $body);
        } else {
            $(let $arg = $arg.to_owned();)*
            let fs = $self.fs.clone();
            $self.spare.hand_over($charge, move |$buf| {
                let $fs: &VerityFs = &fs;
                $body
            });
        }
    }};
}

impl Filesystem for Served {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Large requests: fewer round trips per byte and larger verified
        // batches. The kernel clamps both to what it allows.
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        // Cached reads revalidate stale attributes with a getattr, which
        // notices a file made verity in the backing store; kernels without
        // it still get the explicit invalidation at the next request.
        let _ = config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA);
        // Lookups and listings of one directory run at once, as on a local
        // filesystem: without it the kernel takes them one at a time, and
        // one waiting in the backing store would hold up every user's.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn destroy(&mut self) {
        self.mount.release();
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        serve!(self, charge(req, parent.0), [name], |fs, _buf| {
            let result = fs.inode(parent).and_then(|p| fs.lookup_child(&p, &name));
            reply_with!(reply, result, |(_, attr)| reply.entry(
                &TTL,
                &attr,
                Generation(0)
            ));
        })
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            let result = fs.inode(ino).and_then(|i| fs.attr(&i));
            reply_with!(reply, result, |attr| reply.attr(&TTL, &attr));
        })
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = AttrChange {
            mode,
            owner: (uid, gid),
            times: (atime, mtime),
        };
        let caller = caller(req);
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            let result = fs.set_attr(caller, ino, size, fh, change);
            reply_with!(reply, result, |attr| reply.attr(&TTL, &attr));
        })
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            let result = fs.inode(ino).and_then(|i| fs.read_link(&i));
            reply_with!(reply, result, |target| reply.data(&target));
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let caller = caller(req);
        serve!(self, charge(req, parent.0), [name], |fs, _buf| {
            let result = fs
                .inode(parent)
                .and_then(|p| fs.make_node(caller, &p, &name, mode, rdev));
            reply_with!(reply, result, |attr| reply.entry(
                &TTL,
                &attr,
                Generation(0)
            ));
        })
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let caller = caller(req);
        serve!(self, charge(req, parent.0), [name], |fs, _buf| {
            let result = fs
                .inode(parent)
                .and_then(|p| fs.make_dir(caller, &p, &name, mode));
            reply_with!(reply, result, |attr| reply.entry(
                &TTL,
                &attr,
                Generation(0)
            ));
        })
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let caller = caller(req);
        let on = charge(req, parent.0).holding_more();
        serve!(self, on, [name], |fs, _buf| {
            let result = fs
                .inode(parent)
                .and_then(|p| fs.remove(caller, &p, &name, false));
            reply_with!(reply, result, |()| reply.ok());
        })
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let caller = caller(req);
        let on = charge(req, parent.0).holding_more();
        serve!(self, on, [name], |fs, _buf| {
            let result = fs
                .inode(parent)
                .and_then(|p| fs.remove(caller, &p, &name, true));
            reply_with!(reply, result, |()| reply.ok());
        })
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let caller = caller(req);
        let on = charge(req, parent.0);
        serve!(self, on, [link_name, target], |fs, _buf| {
            let result = fs
                .inode(parent)
                .and_then(|p| fs.make_symlink(caller, &p, &link_name, &target));
            reply_with!(reply, result, |attr| reply.entry(
                &TTL,
                &attr,
                Generation(0)
            ));
        })
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let caller = caller(req);
        let on = charge(req, parent.0).holding_more();
        serve!(self, on, [name, newname], |fs, _buf| {
            let result = fs
                .inode(parent)
                .and_then(|p| Ok((p, fs.inode(newparent)?)))
                .and_then(|(p, np)| fs.rename(caller, &p, &name, &np, &newname, flags));
            reply_with!(reply, result, |()| reply.ok());
        })
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let caller = caller(req);
        let on = charge(req, newparent.0).holding_more();
        serve!(self, on, [newname], |fs, _buf| {
            let result = fs
                .inode(ino)
                .and_then(|i| Ok((i, fs.inode(newparent)?)))
                .and_then(|(i, np)| fs.make_link(caller, &i, &np, &newname));
            reply_with!(reply, result, |attr| reply.entry(
                &TTL,
                &attr,
                Generation(0)
            ));
        })
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let caller = caller(req);
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            let result = fs.inode(ino).and_then(|i| fs.open_file(caller, &i, flags));
            reply_with!(reply, result, |(fh, fopen)| reply.opened(fh, fopen));
        })
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        serve!(self, charge(req, ino.0), [], |fs, buf| {
            reply_with!(reply, fs.read_file(fh, offset, size, buf), |n| reply
                .data(&buf[..n]))
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wflags: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        serve!(self, charge(req, ino.0), [data], |fs, _buf| {
            reply_with!(reply, fs.write_file(fh, offset, &data), |n| {
                reply.written(n)
            });
        })
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.release_file(fh);
        reply.ok();
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            reply_with!(reply, fs.fsync_file(fh, datasync), |()| reply.ok());
        })
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let caller = caller(req);
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            let result = fs.inode(ino).and_then(|i| fs.open_dir(caller, &i));
            reply_with!(reply, result, |fh| reply.opened(fh, FopenFlags::empty()));
        })
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            let result = fs.read_dir(fh, offset, |ino, next, kind, name| {
                reply.add(INodeNo(ino), next, kind, name)
            });
            reply_with!(reply, result, |()| reply.ok());
        })
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles.remove(fh);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            let result = fs.inode(ino).and_then(|i| fs.sync_dir(&i, datasync));
            reply_with!(reply, result, |()| reply.ok());
        })
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            reply_with!(reply, fs.stat_fs(), |s| reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ));
        })
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let caller = caller(req);
        serve!(self, charge(req, ino.0), [name, value], |fs, _buf| {
            let result = fs
                .inode(ino)
                .and_then(|i| fs.set_xattr(caller, &i, &name, &value, flags));
            reply_with!(reply, result, |()| reply.ok());
        })
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let caller = caller(req);
        serve!(self, charge(req, ino.0), [name], |fs, _buf| {
            let result = fs
                .inode(ino)
                .and_then(|i| fs.get_xattr(caller, &i, &name, size));
            reply_with!(reply, result, |value| xattr_reply(reply, size, &value));
        })
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let caller = caller(req);
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            let result = fs.inode(ino).and_then(|i| fs.list_xattr(caller, &i));
            reply_with!(reply, result, |names| xattr_reply(reply, size, &names));
        })
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let caller = caller(req);
        serve!(self, charge(req, ino.0), [name], |fs, _buf| {
            let result = fs
                .inode(ino)
                .and_then(|i| fs.remove_xattr(caller, &i, &name));
            reply_with!(reply, result, |()| reply.ok());
        })
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Mounted with default_permissions: the kernel checks access.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let caller = caller(req);
        serve!(self, charge(req, parent.0), [name], |fs, _buf| {
            let result = fs
                .inode(parent)
                .and_then(|p| fs.create_file(caller, &p, &name, mode, umask, flags));
            reply_with!(reply, result, |(attr, fh)| reply.created(
                &TTL,
                &attr,
                Generation(0),
                fh,
                FopenFlags::empty()
            ));
        })
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            reply_with!(reply, fs.allocate(fh, offset, length, mode), |()| reply
                .ok());
        })
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        serve!(self, charge(req, ino.0), [], |fs, _buf| {
            reply_with!(reply, fs.seek_data(fh, offset, whence), |at| reply
                .offset(at));
        })
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let caller = caller(req);
        serve!(self, charge(req, ino.0), [in_data], |fs, _buf| {
            let result = fs.ioctl_op(caller, fh, cmd, &in_data);
            // A measure, or the flags, say what the file holds: not while a
            // mapping may still show what it held before.
            fs.reply_when_verified(fh, result, move |result| {
                reply_with!(reply, result, |out| reply.ioctl(0, &out))
            });
        })
    }
}

/// Answers a size query (`size` 0) or sends `value` if it fits (`ERANGE`
/// otherwise).
fn xattr_reply(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() <= size as usize {
        reply.data(value);
    } else {
        reply.error(Errno::from_i32(libc::ERANGE));
    }
}

/// What an image's read workers (`readers`) do, with its reply: each
/// may wait for the network.
pub(crate) enum ImageJob {
    /// A read of an open file.
    Read {
        file: Arc<VerityFile>,
        offset: u64,
        size: u32,
        reply: ReplyData,
    },
    /// A file's first open, which fetches its object's tree.
    Open {
        opening: Box<Opening>,
        reply: ReplyOpen,
    },
}

impl Job for ImageJob {
    /// A read goes into `buf`, grown to the request's size if smaller
    /// (never shrunk: no zeroing again for reads of sizes it has held).
    fn run(self, buf: &mut Vec<u8>) {
        match self {
            ImageJob::Read {
                file,
                offset,
                size,
                reply,
            } => {
                // Bytes the source holds in memory are verified and sent
                // from there; others are read into the worker's buffer.
                let size = size as usize;
                match file.read_lent(offset, size) {
                    Ok(Some(lent)) => return reply.data(&lent),
                    Ok(None) => {}
                    Err(e) => return reply.error(verified_read_error(e)),
                }
                if buf.len() < size {
                    buf.resize(size, 0);
                }
                let buf = &mut buf[..size];
                reply_with!(reply, read_verified(&file, buf, offset), |n| reply
                    .data(&buf[..n]));
            }
            ImageJob::Open { opening, reply } => {
                reply_with!(reply, opening.finish(), |()| opened(reply));
            }
        }
    }
}

/// Replies to an open of an image's file.
fn opened(reply: ReplyOpen) {
    // The contents never change: the page cache outlives a close, which
    // has nothing to flush.
    let flags = FopenFlags::FOPEN_KEEP_CACHE | crate::file_ops::READ_ONLY;
    reply.opened(FileHandle(0), flags);
}

impl ImageFs {
    /// Hands `job`, on file `ino`, to the read workers: it may wait for the
    /// network, which must not hold up the requests the manifest answers.
    /// Run here only if no worker can take it.
    fn hand_over(&self, ino: INodeNo, job: ImageJob) {
        if let Err(job) = self.readers.submit(ino.0, job) {
            READ_BUFFER.with_borrow_mut(|buf| job.run(buf));
        }
    }
}

/// The reply to every request that would change an image.
fn read_only() -> Errno {
    Errno::from_i32(libc::EROFS)
}

/// An image: read-only, its tree from the manifest (see `image_fs`).
impl Filesystem for ImageFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_readahead(MAX_IO);
        // A listing with each entry's attributes: `ls -l` of a directory
        // costs no lookup per entry (a kernel without it lists as before).
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        Ok(())
    }

    fn destroy(&mut self) {
        self.mount.release();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = ImageFs::lookup(self, parent, name.as_bytes());
        reply_with!(reply, result, |attr| reply.entry(
            &IMAGE_TTL,
            &attr,
            Generation(0)
        ));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply_with!(reply, self.attr(ino), |attr| reply.attr(&IMAGE_TTL, &attr));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        reply_with!(reply, self.read_link(ino), |target| reply.data(target));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(ino, flags.0) {
            Ok(None) => opened(reply),
            Ok(Some(opening)) => {
                let opening = Box::new(opening);
                self.hand_over(ino, ImageJob::Open { opening, reply });
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.open_file_of(ino) {
            Ok(file) => self.hand_over(
                ino,
                ImageJob::Read {
                    file,
                    offset,
                    size,
                    reply,
                },
            ),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.release_file(ino);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Listings never change either: the kernel may cache them.
        let cached = FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE;
        reply_with!(reply, self.dir(ino), |_| reply
            .opened(FileHandle(0), cached));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.read_dir(ino, offset, |ino, next, kind, name| {
            reply.add(INodeNo(ino), next, kind, OsStr::from_bytes(name))
        });
        reply_with!(reply, result, |()| reply.ok());
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let result = self.read_dir(ino, offset, |ino, next, _, name| {
            // Every index the manifest gives has attributes: a failure
            // would end the listing here, never skip an entry.
            self.attr(INodeNo(ino)).map_or(true, |attr| {
                let name = OsStr::from_bytes(name);
                reply.add(INodeNo(ino), next, name, &IMAGE_TTL, &attr, Generation(0))
            })
        });
        reply_with!(reply, result, |()| reply.ok());
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply_with!(reply, ImageFs::ioctl(self, ino, cmd, in_data), |out| reply
            .ioctl(0, &out));
    }

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(read_only());
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(read_only());
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(read_only());
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(read_only());
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(read_only());
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(read_only());
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(read_only());
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(read_only());
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(read_only());
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let result = self.get_xattr(ino, name);
        reply_with!(reply, result, |value| xattr_reply(reply, size, &value));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr_reply(reply, size, &[]);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(read_only());
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(read_only());
    }
}
