//! Directory and name operations, passed through to the backing directory
//! with `*at()` calls relative to the parent's `O_PATH` descriptor.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

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

    /// `opendir`: reads the entries once; `readdir` serves them by index.
    pub(crate) fn open_dir(&self, inode: &Arc<Inode>) -> Result<FileHandle, Errno> {
        let fd = rustix::fs::openat(
            &inode.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        let mut entries = Vec::new();
        for entry in Dir::read_from(fd.as_fd()).map_err(errno)? {
            let entry = entry.map_err(errno)?;
            let kind = dirent_kind(entry.file_type());
            entries.push((
                OsString::from(OsStr::from_bytes(entry.file_name().to_bytes())),
                entry.ino(),
                kind,
            ));
        }
        Ok(self.handles.insert(Handle::Dir {
            entries,
            inode: inode.clone(),
        }))
    }

    /// `statfs` of the backing filesystem.
    pub(crate) fn stat_fs(&self) -> Result<rustix::fs::StatVfs, Errno> {
        let root = self.inode(fuser::INodeNo::ROOT)?;
        rustix::fs::fstatvfs(&root.fd).map_err(errno)
    }
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
