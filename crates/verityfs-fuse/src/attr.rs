//! Backing attributes as FUSE attributes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, INodeNo};
use rustix::fs::Stat;

use crate::inodes::file_type;

/// How long the kernel may cache attributes and entries. Short, because the
/// backing directory may change behind our back.
pub const TTL: Duration = Duration::from_secs(1);

/// The FUSE attributes of inode `ino` whose backing object has `st`, with
/// `size` as the size readers see (a verity file's data size).
pub fn to_file_attr(ino: INodeNo, st: &Stat, size: u64) -> FileAttr {
    let time = |sec: i64, nsec: i64| system_time(sec, nsec as u32);
    FileAttr {
        ino,
        size,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec as i64),
        mtime: time(st.st_mtime, st.st_mtime_nsec as i64),
        ctime: time(st.st_ctime, st.st_ctime_nsec as i64),
        crtime: SystemTime::UNIX_EPOCH,
        kind: file_type(st),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// The time `nsec` nanoseconds after `sec` seconds since the epoch (also
/// before 1970).
pub fn system_time(sec: i64, nsec: u32) -> SystemTime {
    let whole = Duration::from_secs(sec.unsigned_abs());
    let seconds = if sec >= 0 {
        UNIX_EPOCH + whole
    } else {
        UNIX_EPOCH - whole
    };
    seconds + Duration::from_nanos(nsec.into())
}
