//! Directory and name operations, passed through to the backing directory
//! with `*at()` calls relative to the parent's `O_PATH` descriptor.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use fuser::{Errno, FileAttr, FileHandle, FileType, RenameFlags};
use rustix::fs::{AtFlags, Dir, Mode, OFlags, CWD};

use crate::caller::Caller;
use crate::fs::VerityFs;
use crate::handles::Handle;
use crate::inodes::{errno, Inode};

impl VerityFs {
    /// `mkdir`, as the caller.
    pub(crate) fn make_dir(
        &self,
        caller: Caller,
        parent: &Inode,
        name: &OsStr,
        mode: u32,
    ) -> Result<FileAttr, Errno> {
        self.as_caller(&caller, || {
            rustix::fs::mkdirat(&parent.fd, name, Mode::from_raw_mode(mode)).map_err(errno)
        })?;
        self.finish_create(parent, name)
    }

    /// `mknod`, as the caller.
    pub(crate) fn make_node(
        &self,
        caller: Caller,
        parent: &Inode,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<FileAttr, Errno> {
        let kind = rustix::fs::FileType::from_raw_mode(mode);
        let perm = Mode::from_raw_mode(mode);
        self.as_caller(&caller, || {
            rustix::fs::mknodat(&parent.fd, name, kind, perm, rdev.into()).map_err(errno)
        })?;
        self.finish_create(parent, name)
    }

    /// `symlink`, as the caller.
    pub(crate) fn make_symlink(
        &self,
        caller: Caller,
        parent: &Inode,
        name: &OsStr,
        target: &Path,
    ) -> Result<FileAttr, Errno> {
        self.as_caller(&caller, || {
            rustix::fs::symlinkat(target, &parent.fd, name).map_err(errno)
        })?;
        self.finish_create(parent, name)
    }

    /// The entry of an object just created as the caller. Nothing is done
    /// to what the name now refers to: created as the caller, it needs no
    /// change of owner, and if a renamer put another object there, the
    /// entry is simply that object's, as a lookup would give.
    fn finish_create(&self, parent: &Inode, name: &OsStr) -> Result<FileAttr, Errno> {
        Ok(self.lookup_child(parent, name)?.1)
    }

    /// `link`: another name for `inode` (verity files stay verity: the
    /// metadata belongs to the inode).
    pub(crate) fn make_link(
        &self,
        caller: Caller,
        inode: &Inode,
        parent: &Inode,
        name: &OsStr,
    ) -> Result<FileAttr, Errno> {
        self.as_caller(&caller, || {
            let flags = AtFlags::SYMLINK_FOLLOW;
            rustix::fs::linkat(CWD, inode.proc_path(), &parent.fd, name, flags).map_err(errno)
        })?;
        Ok(self.lookup_child(parent, name)?.1)
    }

    /// `unlink` and `rmdir`.
    pub(crate) fn remove(
        &self,
        caller: Caller,
        parent: &Inode,
        name: &OsStr,
        dir: bool,
    ) -> Result<(), Errno> {
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        self.as_caller(&caller, || {
            rustix::fs::unlinkat(&parent.fd, name, flags).map_err(errno)
        })
    }

    /// `rename`, with `renameat2` flags.
    pub(crate) fn rename(
        &self,
        caller: Caller,
        parent: &Inode,
        name: &OsStr,
        new_parent: &Inode,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let flags = rustix::fs::RenameFlags::from_bits_retain(flags.bits());
        self.as_caller(&caller, || {
            rustix::fs::renameat_with(&parent.fd, name, &new_parent.fd, new_name, flags)
                .map_err(errno)
        })
    }

    /// `readlink`.
    pub(crate) fn read_link(&self, inode: &Inode) -> Result<Vec<u8>, Errno> {
        let target = rustix::fs::readlinkat(&inode.fd, "", Vec::new()).map_err(errno)?;
        Ok(target.into_bytes())
    }

    /// `opendir`: a directory stream on the backing directory, which
    /// `readdir` reads on demand.
    pub(crate) fn open_dir(&self, caller: Caller, inode: &Arc<Inode>) -> Result<FileHandle, Errno> {
        // As the caller: listing needs their read permission (ACLs and all).
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = self.as_caller(&caller, || {
            rustix::fs::openat(&inode.fd, ".", flags, Mode::empty()).map_err(errno)
        })?;
        let dev = rustix::fs::fstat(&fd).map_err(errno)?.st_dev;
        let stream = DirStream {
            dir: Dir::new(fd).map_err(errno)?,
            position: Some(0),
            dev,
        };
        Ok(self.handles.insert(Handle::Dir {
            stream: Mutex::new(stream),
            inode: inode.clone(),
        }))
    }

    /// `readdir` from `offset` (0, or an offset this handle gave): passes
    /// each entry to `add` (inode number, offset of the next entry, type,
    /// name) until it says its buffer is full. As in libfuse's
    /// `passthrough_ll`, offsets are the backing filesystem's own directory
    /// offsets, so they stay valid while entries come and go, and offset 0
    /// (`rewinddir`) lists the directory as it is now.
    pub(crate) fn read_dir(
        &self,
        fh: FileHandle,
        offset: u64,
        mut add: impl FnMut(u64, u64, FileType, &OsStr) -> bool,
    ) -> Result<(), Errno> {
        let handle = self.handles.get(fh)?;
        let Handle::Dir { stream, .. } = &*handle else {
            return Err(Errno::ENOTDIR);
        };
        let mut stream = stream.lock().unwrap_or_else(|p| p.into_inner());
        if stream.position != Some(offset) {
            stream.dir.seek(offset as i64).map_err(errno)?;
        }
        // Unknown until the loop ends at an entry boundary.
        stream.position = None;
        let mut at = offset;
        while let Some(entry) = stream.dir.read() {
            let entry = entry.map_err(errno)?;
            let ino = self.inodes.number(stream.dev, entry.ino());
            let next = entry.offset() as u64;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if add(ino, next, dirent_kind(entry.file_type()), name) {
                // Not sent: the next request starts at it again.
                return Ok(());
            }
            at = next;
        }
        stream.position = Some(at);
        Ok(())
    }

    /// `fsyncdir`: makes the backing directory's entries durable (a rename
    /// followed by `fsync` of the directory must survive a power cut).
    pub(crate) fn sync_dir(&self, inode: &Inode, datasync: bool) -> Result<(), Errno> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = rustix::fs::openat(&inode.fd, ".", flags, Mode::empty()).map_err(errno)?;
        if datasync {
            rustix::fs::fdatasync(&dir).map_err(errno)
        } else {
            rustix::fs::fsync(&dir).map_err(errno)
        }
    }

    /// `statfs` of the backing filesystem.
    pub(crate) fn stat_fs(&self) -> Result<rustix::fs::StatVfs, Errno> {
        let root = self.inode(fuser::INodeNo::ROOT)?;
        rustix::fs::fstatvfs(&root.fd).map_err(errno)
    }
}

/// An open backing directory being listed.
pub struct DirStream {
    dir: Dir,
    /// The offset the stream is at, if it is at the end of an entry given
    /// out (a request for another offset seeks).
    position: Option<u64>,
    /// The directory's device, to number its entries.
    dev: u64,
}

fn dirent_kind(kind: rustix::fs::FileType) -> FileType {
    use rustix::fs::FileType as T;
    match kind {
        T::Directory => FileType::Directory,
        T::Symlink => FileType::Symlink,
        T::Fifo => FileType::NamedPipe,
        T::Socket => FileType::Socket,
        T::CharacterDevice => FileType::CharDevice,
        T::BlockDevice => FileType::BlockDevice,
        T::RegularFile | T::Unknown => FileType::RegularFile,
    }
}
