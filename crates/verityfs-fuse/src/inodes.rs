//! The inode table: one entry per backing object the kernel knows about,
//! holding an `O_PATH` descriptor, so that renames in the backing directory
//! never confuse us (the design of libfuse's `passthrough_ll`).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use fuser::{Errno, FileType, INodeNo};
use rustix::fs::{FileType as RawType, Stat};
use verityfs::VerityFile;

/// The fs-verity state of a regular file, guarded by the inode's mutex.
///
/// Never held across a backing system call that can wait for the backing
/// inode's own lock (`i_rwsem`: truncation, writes, extended attribute
/// changes): a caller can hold that lock while its page fault on a mapping
/// of the same file through the mount waits for a read, and reads take
/// this mutex.
#[derive(Default)]
pub struct VerityState {
    /// Open handles with write access (the kernel's `i_writecount`).
    pub writers: u32,
    /// An enable is running on this inode.
    pub enabling: bool,
    /// The open verity file, shared by all readers, once the file is
    /// known to be verity. Once set, it stays for the inode's life in this
    /// daemon, whatever the backing store does: verity is for good.
    pub file: Option<Arc<VerityFile>>,
    /// The kernel's page cache of the file holds only pages this daemon
    /// verified: it was dropped once since the file became verity here,
    /// and after the last drop queued.
    pub cache_verified: bool,
    /// Drops of the page cache queued so far: only the last one's end
    /// sets `cache_verified`.
    pub drops_queued: u64,
    /// The kernel was shown this file as an ordinary one (its attributes,
    /// or a handle), so it may hold pages or a size from then. A file
    /// found to be verity before either, as most are at their first
    /// lookup, has nothing in the kernel to drop.
    pub shown_plain: bool,
    /// The sizes the kernel was given for the file. It keeps one for the
    /// attribute timeout and reads no further: a file switched to verity
    /// with another size has it dropped at the switch.
    pub shown_size: ShownSize,
}

/// The sizes the kernel was given for a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShownSize {
    #[default]
    None,
    One(u64),
    /// Several: of replies that cross, the kernel keeps the one it took
    /// first, not necessarily the last sent.
    Several,
}

impl ShownSize {
    /// Records a size given.
    pub fn show(&mut self, size: u64) {
        *self = match *self {
            ShownSize::None => ShownSize::One(size),
            ShownSize::One(shown) if shown == size => ShownSize::One(size),
            _ => ShownSize::Several,
        };
    }

    /// Whether the kernel may hold a size other than `size`.
    pub fn other_than(self, size: u64) -> bool {
        !matches!(self, ShownSize::None) && self != ShownSize::One(size)
    }
}

/// The locked verity state of an inode.
pub type VerityGuard<'a> = parking_lot::MutexGuard<'a, VerityState>;

/// One backing object.
pub struct Inode {
    /// Our inode number.
    pub ino: INodeNo,
    /// `O_PATH | O_NOFOLLOW` descriptor of the backing object.
    pub fd: OwnedFd,
    /// The object's type.
    pub kind: FileType,
    key: (u64, u64),
    verity: parking_lot::Mutex<VerityState>,
    /// No longer found by lookups (see [`InodeTable::retire`]).
    retired: AtomicBool,
    /// The retired inode of the same backing object this one succeeds,
    /// whose cached pages its old handles may still show.
    predecessor: Option<Arc<Inode>>,
}

/// What the kernel may show of a file that the daemon did not verify,
/// through an inode and the retired ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedPages {
    /// Only pages the daemon verified.
    Verified,
    /// Pages from before the switch, which are being dropped.
    Dropping,
    /// Pages that writers opened before the switch can still change.
    Writable,
}

impl Inode {
    /// A path naming the backing object through `/proc/self/fd`, usable to
    /// open it or to reach it with path-based calls.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The verity state (regular files).
    pub fn verity(&self) -> VerityGuard<'_> {
        self.verity.lock()
    }

    /// Whether [`InodeTable::retire`] was called for this inode.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// What the kernel may show of this file, through this inode and the
    /// retired ones before it, that the daemon did not verify.
    pub fn cached_pages(&self) -> CachedPages {
        let mut pages = CachedPages::Verified;
        let mut next = Some(self);
        while let Some(inode) = next {
            let verity = inode.verity();
            if verity.writers > 0 && inode.is_retired() {
                return CachedPages::Writable;
            }
            if verity.file.is_some() && !verity.cache_verified {
                pages = CachedPages::Dropping;
            }
            next = inode.predecessor.as_deref();
        }
        pages
    }

    /// The backing object's current attributes.
    pub fn stat(&self) -> Result<Stat, Errno> {
        rustix::fs::fstat(self.fd.as_fd()).map_err(errno)
    }
}

struct Entry {
    inode: Arc<Inode>,
    lookups: u64,
}

#[derive(Default)]
struct Tables {
    by_ino: HashMap<u64, Entry>,
    by_key: HashMap<(u64, u64), u64>,
    /// The last inode retired per backing object, while the kernel holds
    /// it: the predecessor of the next one.
    retired: HashMap<(u64, u64), Arc<Inode>>,
}

/// Where the numbers of objects outside the backing directory's filesystem
/// start (above any inode number filesystems give out in practice).
const FOREIGN_BASE: u64 = 1 << 63;

/// All inodes the kernel holds references to, and their numbers.
///
/// Numbers are the backing objects' own inode numbers (libfuse's
/// `use_ino`), so that `readdir`'s `d_ino` and `stat`'s `st_ino` agree
/// without a lookup per entry and hard links share one. The exceptions:
/// the root is 1 (FUSE's root), and objects of other filesystems mounted
/// under the backing directory (whose numbers could collide) get numbers
/// from [`FOREIGN_BASE`] up, remembered for the daemon's life so that
/// they never change.
pub struct InodeTable {
    tables: RwLock<Tables>,
    root_key: (u64, u64),
    foreign: Mutex<HashMap<(u64, u64), u64>>,
    /// Successors of retired inodes given out so far (see `insert`).
    successors: std::sync::atomic::AtomicU64,
}

impl InodeTable {
    /// A table whose root (inode 1) is the backing directory `root`.
    pub fn new(root: OwnedFd) -> Result<Self, Errno> {
        let st = rustix::fs::fstat(&root).map_err(errno)?;
        let table = InodeTable {
            tables: RwLock::default(),
            root_key: (st.st_dev, st.st_ino),
            foreign: Mutex::default(),
            successors: Default::default(),
        };
        table.insert(root, &st);
        Ok(table)
    }

    /// The number of the backing object with device `dev` and inode number
    /// `ino`.
    pub fn number(&self, dev: u64, ino: u64) -> u64 {
        let key = (dev, ino);
        if key == self.root_key {
            return INodeNo::ROOT.0;
        }
        if dev == self.root_key.0 && ino > INodeNo::ROOT.0 && ino < FOREIGN_BASE {
            return ino;
        }
        let mut foreign = self.foreign.lock().unwrap_or_else(|p| p.into_inner());
        let next = FOREIGN_BASE + foreign.len() as u64;
        *foreign.entry(key).or_insert(next)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Tables> {
        self.tables
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The inode `ino`; `ESTALE` if the kernel's reference is unknown.
    pub fn get(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        let tables = self
            .tables
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        tables
            .by_ino
            .get(&ino.0)
            .map(|e| e.inode.clone())
            .ok_or(Errno::from_i32(libc::ESTALE))
    }

    /// Records one more kernel reference to the object `fd` with
    /// attributes `st`, reusing the entry of a known object (hard links,
    /// repeated lookups).
    pub fn insert(&self, fd: OwnedFd, st: &Stat) -> Arc<Inode> {
        let key = (st.st_dev, st.st_ino);
        let mut tables = self.write();
        if let Some(&ino) = tables.by_key.get(&key) {
            let entry = tables.by_ino.get_mut(&ino).expect("tables agree");
            entry.lookups += 1;
            return entry.inode.clone();
        }
        let mut ino = self.number(key.0, key.1);
        if tables.by_ino.contains_key(&ino) {
            // The number belongs to a retired inode the kernel still holds:
            // its successor needs another, or the kernel would take it for
            // the same inode, page cache included. Counted down from the
            // top, where neither backing nor foreign numbers reach.
            ino = u64::MAX - self.successors.fetch_add(1, Ordering::Relaxed);
        }
        let inode = Arc::new(Inode {
            ino: INodeNo(ino),
            fd,
            kind: file_type(st),
            key,
            verity: Default::default(),
            retired: AtomicBool::new(false),
            predecessor: tables.retired.get(&key).cloned(),
        });
        tables.by_key.insert(key, ino);
        tables.by_ino.insert(
            ino,
            Entry {
                inode: inode.clone(),
                lookups: 1,
            },
        );
        inode
    }

    /// Takes `inode` out of lookups: the next lookup of its backing object
    /// makes a new inode (a new number, so a new kernel inode with an
    /// empty page cache), while the kernel's references to this one stay
    /// valid until forgotten.
    pub fn retire(&self, inode: &Arc<Inode>) {
        inode.retired.store(true, Ordering::Release);
        let mut tables = self.write();
        if tables.by_key.get(&inode.key) == Some(&inode.ino.0) {
            tables.by_key.remove(&inode.key);
        }
        tables.retired.insert(inode.key, inode.clone());
    }

    /// Drops `n` kernel references to `ino`, and the entry with the last.
    pub fn forget(&self, ino: INodeNo, n: u64) {
        if ino == INodeNo::ROOT {
            return;
        }
        let mut tables = self.write();
        let Some(entry) = tables.by_ino.get_mut(&ino.0) else {
            return;
        };
        entry.lookups = entry.lookups.saturating_sub(n);
        if entry.lookups == 0 {
            let key = entry.inode.key;
            tables.by_ino.remove(&ino.0);
            // A retired inode's key may name its successor by now.
            if tables.by_key.get(&key) == Some(&ino.0) {
                tables.by_key.remove(&key);
            }
            // Forgotten by the kernel: no handle or mapping shows its pages,
            // but those of the inodes retired before it may still: the next
            // successor follows them instead.
            if let Some(newest) = tables.retired.remove(&key) {
                let newest = match newest.ino == ino {
                    true => newest.predecessor.clone(),
                    false => Some(newest),
                };
                if let Some(newest) = newest {
                    tables.retired.insert(key, newest);
                }
            }
        }
    }
}

/// The FUSE file type of a backing object.
pub fn file_type(st: &Stat) -> FileType {
    match RawType::from_raw_mode(st.st_mode) {
        RawType::Directory => FileType::Directory,
        RawType::Symlink => FileType::Symlink,
        RawType::Fifo => FileType::NamedPipe,
        RawType::Socket => FileType::Socket,
        RawType::CharacterDevice => FileType::CharDevice,
        RawType::BlockDevice => FileType::BlockDevice,
        RawType::RegularFile | RawType::Unknown => FileType::RegularFile,
    }
}

/// A rustix error as a FUSE errno.
pub fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_i32(e.raw_os_error())
}

#[cfg(test)]
mod tests {
    use super::ShownSize;

    #[test]
    fn a_size_shown_once_among_others_is_never_forgotten() {
        let mut shown = ShownSize::default();
        assert!(!shown.other_than(5));
        shown.show(5);
        assert!(!shown.other_than(5));
        assert!(shown.other_than(6));
        shown.show(17);
        shown.show(5);
        assert!(shown.other_than(5), "the kernel may have kept 17");
    }
}
