//! The fs-verity ioctls: enable, measure, and the inode flags, with every
//! rule the kernel would apply itself (the kernel applies none of them to
//! FUSE files).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{Errno, FileHandle, FileType};
use rustix::fs::{IFlags, OFlags};
use verityfs::uapi::FS_VERITY_FL;
use verityfs::{enable_verity_checked, EnableRequest, TreeGeometry};

use crate::caller::Caller;
use crate::fs::{lib_errno, VerityFs};
use crate::handles::Handle;
use crate::inodes::{errno, Inode};
use crate::ioctl::{
    flags_from_fsxattr, flags_from_setflags, fsxattr_from_flags, measure_reply, EnableArg,
};

/// How often a long enable looks whether its caller was killed.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(20);

/// How long an enable waits for the releases of writers just closed before
/// giving `ETXTBSY` (see `begin_enable`).
const RELEASE_GRACE: Duration = Duration::from_millis(200);
/// How often it looks meanwhile.
const RELEASE_POLL: Duration = Duration::from_millis(1);

impl VerityFs {
    /// `FS_IOC_ENABLE_VERITY`, checked in the kernel's order: the argument;
    /// `file_permission(MAY_WRITE)` (`inode_permission()`: read-only
    /// filesystem `EROFS`, immutable `EPERM`, then the mode bits `EACCES`);
    /// an fd that cannot read `EBADF`; append-only `EPERM`; the file type
    /// `EISDIR`/`EINVAL`; then the inode-locked checks of `begin_enable`.
    pub(crate) fn enable(&self, caller: Caller, fh: FileHandle, input: &[u8]) -> Result<(), Errno> {
        let arg = EnableArg::parse(input)?;
        let handle = self.handles.get(fh)?;
        let inode = handle.inode().clone();
        // sb_permission() refuses regular files, directories and symlinks;
        // anything else gets EINVAL below, before mnt_want_write_file()
        // could say EROFS.
        let writable_kind = matches!(
            inode.kind,
            FileType::RegularFile | FileType::Directory | FileType::Symlink
        );
        // A `mount -o remount,ro` is not told to FUSE daemons: the
        // mount's flags say it.
        if writable_kind && (self.options.read_only || self.mount.read_only()) {
            return Err(Errno::from_i32(libc::EROFS));
        }
        let flags = self.backing_flags(&inode)?;
        if flags.contains(IFlags::IMMUTABLE) {
            return Err(Errno::EPERM);
        }
        let st = inode.stat()?;
        if !caller.may_write(st.st_mode, st.st_uid, st.st_gid) {
            return Err(Errno::EACCES);
        }
        if let Handle::Plain { read: false, .. } = &*handle {
            return Err(Errno::EBADF);
        }
        if flags.contains(IFlags::APPEND) {
            return Err(Errno::EPERM);
        }
        match &*handle {
            Handle::Dir { .. } => return Err(Errno::EISDIR),
            _ if inode.kind != FileType::RegularFile => return Err(Errno::EINVAL),
            _ => {}
        }
        self.begin_enable(&inode, &arg)?;
        let result = self.as_caller(&caller, || self.run_enable(caller, &inode, arg));
        let mut verity = inode.verity();
        verity.enabling = false;
        if result.is_ok() {
            // Verity from now on for every handle, and nothing cached before
            // survives. A failure here shows at the next open.
            let _ = self.verity_file(&inode, &mut verity);
        }
        result
    }

    /// The checks that need the inode's lock, then marks the enable as
    /// running (new writers get `ETXTBSY`, a second enable `EBUSY`).
    fn begin_enable(&self, inode: &Arc<Inode>, arg: &EnableArg) -> Result<(), Errno> {
        // The kernel sends FUSE_RELEASE in the background once close(2)
        // has returned, so a writer closed just before this enable may
        // still be counted: give such releases a moment to arrive before
        // answering ETXTBSY (the kernel's own count drops before close(2)
        // returns).
        let deadline = Instant::now() + RELEASE_GRACE;
        let mut verity = inode.verity();
        while verity.writers > 0 {
            if Instant::now() >= deadline {
                return Err(Errno::ETXTBSY);
            }
            drop(verity);
            std::thread::sleep(RELEASE_POLL);
            verity = inode.verity();
        }
        let params = arg.params()?;
        let size = inode.stat()?.st_size as u64;
        TreeGeometry::new(&params, size)
            .check_kernel_limits()
            .map_err(lib_errno)?;
        self.state(inode, &mut verity)?;
        if self.verity_file(inode, &mut verity)?.is_some() {
            return Err(Errno::EEXIST);
        }
        if verity.enabling {
            return Err(Errno::EBUSY);
        }
        verity.enabling = true;
        Ok(())
    }

    /// Builds and stores the tree; gives up with `EINTR` if the caller is
    /// killed meanwhile, leaving the file unchanged.
    fn run_enable(&self, caller: Caller, inode: &Inode, arg: EnableArg) -> Result<(), Errno> {
        let params = arg.params()?;
        let file = self.open_backing(inode, OFlags::RDWR)?;
        let mut last_check = Instant::now();
        let mut progress = |_| {
            if last_check.elapsed() < SIGNAL_CHECK_INTERVAL {
                return true;
            }
            last_check = Instant::now();
            !caller.fatal_signal_pending()
        };
        let signature = (!arg.signature.is_empty()).then_some(&arg.signature[..]);
        let request = EnableRequest {
            params,
            signature,
            progress: &mut progress,
        };
        let policy = &self.options.signatures;
        let check = |d: &verityfs::Descriptor, sig: &[u8]| Ok(policy.check(d, sig)?);
        let descriptor = enable_verity_checked(&file, request, &check).map_err(lib_errno)?;
        tracing::debug!(digest = %descriptor.file_digest(), "enabled verity on inode {}", inode.ino.0);
        // The scratch copy goes in the backing directory, the one directory
        // known to be ours; for a caller who cannot write there, or a file
        // on another filesystem, the blocks stay where they are.
        let root = self.inode(fuser::INodeNo::ROOT)?;
        if let Err(e) = verityfs::place_together(&file, &root.fd) {
            tracing::debug!("inode {}: blocks not moved together: {e}", inode.ino.0);
        }
        Ok(())
    }

    /// `FS_IOC_MEASURE_VERITY`: `ENODATA` unless verity.
    pub(crate) fn measure(&self, fh: FileHandle, input: &[u8]) -> Result<Vec<u8>, Errno> {
        let file = self.verity_file_of(fh)?;
        measure_reply(input, &verityfs::measure(&file))
    }

    fn verity_file_of(&self, fh: FileHandle) -> Result<Arc<verityfs::VerityFile>, Errno> {
        let handle = self.handles.get(fh)?;
        let inode = handle.inode();
        if inode.kind != FileType::RegularFile {
            return Err(Errno::from_i32(libc::ENODATA));
        }
        let mut verity = inode.verity();
        self.verity_file(inode, &mut verity)?
            .ok_or(Errno::from_i32(libc::ENODATA))
    }

    /// `FS_IOC_GETFLAGS`: the backing file's flags, plus `FS_VERITY_FL`.
    pub(crate) fn get_flags(&self, fh: FileHandle) -> Result<u32, Errno> {
        let handle = self.handles.get(fh)?;
        let inode = handle.inode();
        let mut flags = self.backing_flags(inode)?.bits();
        if inode.kind == FileType::RegularFile {
            let mut verity = inode.verity();
            if self.verity_file(inode, &mut verity)?.is_some() {
                flags |= FS_VERITY_FL;
            }
        }
        Ok(flags)
    }

    /// `FS_IOC_SETFLAGS` (`chattr`): passed to the backing file; the verity
    /// flag cannot be set or cleared this way.
    pub(crate) fn set_flags(
        &self,
        caller: Caller,
        fh: FileHandle,
        input: &[u8],
    ) -> Result<(), Errno> {
        let flags = flags_from_setflags(input)?;
        self.set_backing_flags(caller, self.handles.get(fh)?.inode(), flags)
    }

    /// `FS_IOC_FSGETXATTR`: the backing file's flags as a `struct fsxattr`
    /// (the kernel asks for it before each `FS_IOC_SETFLAGS`).
    pub(crate) fn get_fsxattr(&self, fh: FileHandle) -> Result<Vec<u8>, Errno> {
        let handle = self.handles.get(fh)?;
        Ok(fsxattr_from_flags(
            self.backing_flags(handle.inode())?.bits(),
        ))
    }

    /// `FS_IOC_FSSETXATTR`: the flags of a `struct fsxattr`, passed to the
    /// backing file as inode flags.
    pub(crate) fn set_fsxattr(
        &self,
        caller: Caller,
        fh: FileHandle,
        input: &[u8],
    ) -> Result<(), Errno> {
        let handle = self.handles.get(fh)?;
        let inode = handle.inode();
        let flags = flags_from_fsxattr(input, self.backing_flags(inode)?.bits())?;
        self.set_backing_flags(caller, inode, flags)
    }

    /// Sets inode flags as the caller: only a caller with
    /// `CAP_LINUX_IMMUTABLE` may set or clear immutable and append-only.
    fn set_backing_flags(&self, caller: Caller, inode: &Inode, flags: u32) -> Result<(), Errno> {
        let flags = IFlags::from_bits_retain(flags & !FS_VERITY_FL);
        self.as_caller(&caller, || {
            let file = self.open_backing(inode, OFlags::RDONLY)?;
            rustix::fs::ioctl_setflags(&file, flags).map_err(errno)
        })?;
        self.mount.attributes_changed(inode.ino);
        Ok(())
    }

    fn backing_flags(&self, inode: &Inode) -> Result<IFlags, Errno> {
        let file = self.open_backing(inode, OFlags::RDONLY)?;
        match rustix::fs::ioctl_getflags(&file) {
            Ok(flags) => Ok(flags),
            // Filesystems without inode flags (tmpfs before 6.0...) have none set.
            Err(rustix::io::Errno::NOTTY | rustix::io::Errno::NOTSUP) => Ok(IFlags::empty()),
            Err(e) => Err(errno(e)),
        }
    }
}
