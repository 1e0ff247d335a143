//! Extended attributes, passed through except for the layout's private
//! ones, which are invisible and untouchable through the mount.

use std::ffi::OsStr;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use fuser::{Errno, FileType};
use rustix::fs::XattrFlags;
use verityfs::XATTR_PREFIX;

use crate::caller::Caller;
use crate::fs::VerityFs;
use crate::inodes::{errno, Inode};

/// A virtual extended attribute of the mount's root directory whose value
/// is the read path's counters as JSON (what `verityfs stats` prints).
pub const STATS_XATTR: &str = "user.verityfs.stats";

/// A virtual extended attribute of every regular file and directory whose
/// value is the path of its backing object as the daemon sees it, so that
/// tools given a path through the mount (`verityfs verify`,
/// `dump_metadata`) can examine the stored file itself. It reveals no more
/// than the mount's source in `/proc/self/mountinfo` does, and only to
/// those the kernel lets read the file's attributes.
pub const BACKING_XATTR: &str = "user.verityfs.backing";

fn is_private(name: &OsStr) -> bool {
    name.as_bytes().starts_with(XATTR_PREFIX.as_bytes())
}

/// Only regular files and directories: `/proc/self/fd` paths of other
/// objects would reach the wrong thing.
fn check_kind(inode: &Inode) -> Result<(), Errno> {
    match inode.kind {
        FileType::RegularFile | FileType::Directory => Ok(()),
        _ => Err(Errno::from_i32(libc::EOPNOTSUPP)),
    }
}

impl VerityFs {
    /// `getxattr`: the value (or its size when `size` is 0).
    pub(crate) fn get_xattr(
        &self,
        caller: Caller,
        inode: &Inode,
        name: &OsStr,
        size: u32,
    ) -> Result<Vec<u8>, Errno> {
        check_kind(inode)?;
        if inode.ino == fuser::INodeNo::ROOT && name == STATS_XATTR {
            return Ok(stats_json(&self.verifier).into_bytes());
        }
        if name == BACKING_XATTR {
            let path = std::fs::read_link(inode.proc_path()).map_err(Errno::from)?;
            return Ok(path.into_os_string().into_vec());
        }
        if is_private(name) {
            return Err(Errno::from_i32(libc::ENODATA));
        }
        // As the caller: the backing filesystem decides what they may see
        // (trusted.* names, ACLs...).
        self.as_caller(&caller, || {
            let path = inode.proc_path();
            let len = rustix::fs::getxattr_query(&path, name).map_err(errno)?;
            if size == 0 {
                return Ok(vec![0; len]);
            }
            let mut buf = vec![0u8; size as usize];
            let n = rustix::fs::getxattr(&path, name, &mut buf[..]).map_err(errno)?;
            buf.truncate(n);
            Ok(buf)
        })
    }

    /// `listxattr`: the names, NUL-terminated, without private ones.
    pub(crate) fn list_xattr(&self, caller: Caller, inode: &Inode) -> Result<Vec<u8>, Errno> {
        check_kind(inode)?;
        let path = inode.proc_path();
        let (buf, n) = self.as_caller(&caller, || {
            let len = rustix::fs::listxattr_query(&path).map_err(errno)?;
            let mut buf = vec![0u8; len];
            let n = rustix::fs::listxattr(&path, &mut buf[..]).map_err(errno)?;
            Ok((buf, n))
        })?;
        let mut names = Vec::with_capacity(n);
        for name in buf[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
            if !is_private(OsStr::from_bytes(name)) {
                names.extend_from_slice(name);
                names.push(0);
            }
        }
        Ok(names)
    }

    /// `setxattr`.
    pub(crate) fn set_xattr(
        &self,
        caller: Caller,
        inode: &Inode,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        check_kind(inode)?;
        if is_private(name) {
            return Err(Errno::EPERM);
        }
        let flags = XattrFlags::from_bits_retain(flags as u32);
        self.as_caller(&caller, || {
            rustix::fs::setxattr(inode.proc_path(), name, value, flags).map_err(errno)
        })
    }

    /// `removexattr`.
    pub(crate) fn remove_xattr(
        &self,
        caller: Caller,
        inode: &Inode,
        name: &OsStr,
    ) -> Result<(), Errno> {
        check_kind(inode)?;
        if is_private(name) {
            return Err(Errno::from_i32(libc::ENODATA));
        }
        self.as_caller(&caller, || {
            rustix::fs::removexattr(inode.proc_path(), name).map_err(errno)
        })
    }
}

/// The counters of `verifier` summed over all files, and the cache's size,
/// as JSON: the value of [`STATS_XATTR`].
pub(crate) fn stats_json(verifier: &verityfs::Verifier) -> String {
    let totals = verifier.totals().snapshot();
    let mut fields: Vec<String> = totals
        .fields()
        .iter()
        .map(|(name, value)| format!("  \"{name}\": {value}"))
        .collect();
    fields.push(format!("  \"cache_bytes\": {}", verifier.cache_bytes()));
    format!("{{\n{}\n}}\n", fields.join(",\n"))
}
