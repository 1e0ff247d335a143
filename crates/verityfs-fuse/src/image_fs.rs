//! A read-only filesystem serving an image (`docs/IMAGE.md`): the tree
//! from its verified manifest, each regular file's bytes from its object,
//! verified as they are read.
//!
//! Inode numbers are manifest indexes plus one (the root, index 0, is
//! FUSE's root inode 1). Names, modes, sizes and times come from the
//! manifest; owners are not recorded in images, so every file belongs to
//! the user who mounted it (root for a mount by root). Nothing can change:
//! every request that would gets `EROFS`.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, INodeNo};
use verityfs::image::{
    open_manifest, open_object, EntryKind, FileObject, Manifest, ManifestTrust, Store,
    MANIFEST_NAME,
};
use verityfs::uapi::{
    encode_flags, FS_IOC32_GETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_ENABLE_VERITY, FS_IOC_FSGETXATTR,
    FS_IOC_FSSETXATTR, FS_IOC_GETFLAGS, FS_IOC_MEASURE_VERITY, FS_IOC_SETFLAGS, FS_VERITY_FL,
};
use verityfs::{HashAlgorithm, ReadOptions, Verifier, VerityFile};

use crate::attr::system_time;
use crate::filesystem::ImageJob;
use crate::fs::lib_errno;
use crate::ioctl::{fsxattr_from_flags, measure_reply};
use crate::mount::MountState;
use crate::readers::Readers;
use crate::xattr_ops::{stats_json, STATS_XATTR};

/// How long the kernel may cache attributes and entries: an image never
/// changes while mounted.
pub const IMAGE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The size directories report (as most filesystems do: one block).
const DIR_SIZE: u64 = 4096;
/// The I/O size files report.
const BLKSIZE: u32 = 4096;

/// One directory entry of a listing: inode, kind, name.
type DirEntry<'a> = (u64, FileType, &'a [u8]);

/// The open regular files by manifest index, with their number of opens:
/// one verity file per inode, shared by its opens (and so its cache of
/// verified tree blocks), dropped with the last.
type OpenFiles = Mutex<HashMap<u32, (Arc<VerityFile>, usize)>>;

/// The filesystem of one image, verified against its digest.
pub struct ImageFs {
    manifest: Manifest,
    /// Each entry's number of subdirectories (for directories' link
    /// counts, which a large directory would make slow to count each time).
    subdirs: Vec<u32>,
    store: Arc<dyn Store>,
    verifier: Arc<Verifier>,
    open: Arc<OpenFiles>,
    /// The owner of every file: the mounting user and group.
    owner: (u32, u32),
    /// The mount, once mounted.
    pub(crate) mount: Arc<MountState>,
    /// The threads serving reads and first opens, which may wait for the
    /// network.
    pub(crate) readers: Readers<ImageJob>,
}

impl ImageFs {
    /// The image in `store`, whose manifest `trust` must accept: its digest
    /// (else [`verityfs::Error::Corrupted`]) or its signature (nothing is
    /// served that does not follow from the digest or the certificate).
    pub fn open(
        store: Arc<dyn Store>,
        trust: &ManifestTrust,
        read: ReadOptions,
    ) -> verityfs::Result<Self> {
        let verifier = Verifier::new(read);
        let manifest = open_manifest(&verifier, store.open(MANIFEST_NAME)?, trust)?;
        Ok(ImageFs {
            subdirs: count_subdirs(&manifest),
            manifest,
            store,
            verifier,
            open: Arc::default(),
            owner: (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            ),
            mount: Arc::default(),
            readers: Readers::new(crate::readers::IMAGE_WORKERS),
        })
    }

    /// The number of entries (files, directories, symlinks and the root).
    pub fn entries(&self) -> usize {
        self.manifest.entries().len()
    }

    /// The manifest index of inode `ino`.
    fn index(&self, ino: INodeNo) -> Result<u32, Errno> {
        let index = ino.0.checked_sub(1).and_then(|i| u32::try_from(i).ok());
        index
            .filter(|&i| self.manifest.entry(i).is_some())
            .ok_or(Errno::ENOENT)
    }

    fn kind(&self, index: u32) -> &EntryKind {
        &self.manifest.entries()[index as usize].kind
    }

    /// The attributes of inode `ino`.
    pub(crate) fn attr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let index = self.index(ino)?;
        let entry = &self.manifest.entries()[index as usize];
        let (size, nlink) = match &entry.kind {
            // Its entry, its `.`, and each subdirectory's `..`.
            EntryKind::Directory => (DIR_SIZE, 2 + self.subdirs[index as usize]),
            EntryKind::Regular(object) => (object.location.data_size, 1),
            EntryKind::Symlink(target) => (target.len() as u64, 1),
        };
        let time = system_time(entry.mtime.0, entry.mtime.1);
        Ok(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind: file_type(&entry.kind),
            perm: entry.mode,
            nlink,
            uid: self.owner.0,
            gid: self.owner.1,
            rdev: 0,
            blksize: BLKSIZE,
            flags: 0,
        })
    }

    /// The child `name` of directory `parent`, with its attributes.
    pub(crate) fn lookup(&self, parent: INodeNo, name: &[u8]) -> Result<FileAttr, Errno> {
        let dir = self.dir(parent)?;
        let child = self.manifest.child(dir, name).ok_or(Errno::ENOENT)?;
        self.attr(INodeNo(u64::from(child) + 1))
    }

    /// The manifest index of directory `ino` (`ENOTDIR` if it is not one).
    pub(crate) fn dir(&self, ino: INodeNo) -> Result<u32, Errno> {
        let index = self.index(ino)?;
        match self.kind(index) {
            EntryKind::Directory => Ok(index),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// The target of symlink `ino`.
    pub(crate) fn read_link(&self, ino: INodeNo) -> Result<&[u8], Errno> {
        match self.kind(self.index(ino)?) {
            EntryKind::Symlink(target) => Ok(target),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Passes the entries of directory `ino` from position `offset` to
    /// `add` (inode, offset of the next, kind, name) until it says the
    /// reply is full.
    pub(crate) fn read_dir(
        &self,
        ino: INodeNo,
        offset: u64,
        mut add: impl FnMut(u64, u64, FileType, &[u8]) -> bool,
    ) -> Result<(), Errno> {
        let dir = self.dir(ino)?;
        let parent = self.manifest.entries()[dir as usize].parent;
        let dots: [DirEntry; 2] = [
            (ino.0, FileType::Directory, b"."),
            (u64::from(parent) + 1, FileType::Directory, b".."),
        ];
        let children = self.manifest.children(dir).map(|c| {
            let entry = &self.manifest.entries()[c as usize];
            (u64::from(c) + 1, file_type(&entry.kind), &entry.name[..])
        });
        let all = dots.into_iter().chain(children).enumerate();
        for (i, (ino, kind, name)) in all.skip(offset as usize) {
            if add(ino, i as u64 + 1, kind, name) {
                break;
            }
        }
        Ok(())
    }

    /// Opens regular file `ino` for reading (`EROFS` for writing) if it is
    /// open already; else gives what its first open needs, which may wait
    /// for the network ([`Opening`]).
    pub(crate) fn open_file(&self, ino: INodeNo, flags: i32) -> Result<Option<Opening>, Errno> {
        let index = self.index(ino)?;
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Errno::from_i32(libc::EROFS));
        }
        if let Some((_, opens)) = lock(&self.open).get_mut(&index) {
            *opens += 1;
            return Ok(None);
        }
        let EntryKind::Regular(object) = self.kind(index) else {
            return Err(Errno::EISDIR);
        };
        Ok(Some(Opening {
            index,
            object: *object,
            path: self.path(index),
            alg: self.manifest.algorithm(),
            store: self.store.clone(),
            verifier: self.verifier.clone(),
            open: self.open.clone(),
        }))
    }

    /// Ends one open of `ino`.
    pub(crate) fn release_file(&self, ino: INodeNo) {
        let Ok(index) = self.index(ino) else { return };
        let mut open = lock(&self.open);
        if let Some((_, opens)) = open.get_mut(&index) {
            *opens -= 1;
            if *opens == 0 {
                open.remove(&index);
            }
        }
    }

    /// The verity file of open file `ino`.
    pub(crate) fn open_file_of(&self, ino: INodeNo) -> Result<Arc<VerityFile>, Errno> {
        let index = self.index(ino)?;
        let open = lock(&self.open);
        open.get(&index)
            .map(|(file, _)| file.clone())
            .ok_or(Errno::EBADF)
    }

    /// The ioctls: measuring, the verity flag, and `EROFS` for changes.
    pub(crate) fn ioctl(&self, ino: INodeNo, cmd: u32, input: &[u8]) -> Result<Vec<u8>, Errno> {
        let regular = matches!(self.kind(self.index(ino)?), EntryKind::Regular(_));
        let flags = if regular { FS_VERITY_FL } else { 0 };
        match cmd {
            FS_IOC_MEASURE_VERITY if regular => {
                measure_reply(input, &verityfs::measure(&*self.open_file_of(ino)?))
            }
            FS_IOC_MEASURE_VERITY => Err(Errno::from_i32(libc::ENODATA)),
            FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => Ok(encode_flags(flags).to_vec()),
            FS_IOC_FSGETXATTR => Ok(fsxattr_from_flags(flags)),
            // Enabling (on files already verity) and setting flags change
            // the filesystem, which is read-only, as the kernel checks
            // first.
            FS_IOC_ENABLE_VERITY | FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS | FS_IOC_FSSETXATTR => {
                Err(Errno::from_i32(libc::EROFS))
            }
            _ => Err(Errno::ENOTTY),
        }
    }

    /// `getxattr`: the read path's counters on the root ([`STATS_XATTR`]);
    /// images have no other extended attributes.
    pub(crate) fn get_xattr(&self, ino: INodeNo, name: &OsStr) -> Result<Vec<u8>, Errno> {
        match self.index(ino)? == 0 && name == STATS_XATTR {
            true => Ok(stats_json(&self.verifier).into_bytes()),
            false => Err(Errno::from_i32(libc::ENODATA)),
        }
    }

    /// The path of entry `index` from the root of the image, for messages.
    fn path(&self, index: u32) -> PathBuf {
        let entries = self.manifest.entries();
        let mut names = Vec::new();
        let mut at = index;
        while at != 0 {
            names.push(OsStr::from_bytes(&entries[at as usize].name));
            at = entries[at as usize].parent;
        }
        names.iter().rev().collect()
    }
}

/// The first open of a regular file: its object checked against the
/// manifest's digest for it, then shared by the file's other opens.
pub(crate) struct Opening {
    index: u32,
    object: FileObject,
    /// Its path from the root of the image, for messages.
    path: PathBuf,
    alg: HashAlgorithm,
    store: Arc<dyn Store>,
    verifier: Arc<Verifier>,
    open: Arc<OpenFiles>,
}

impl Opening {
    /// Opens the object, which may wait for the network, then counts the
    /// open.
    pub(crate) fn finish(self) -> Result<(), Errno> {
        // Opened without the lock: fetching a remote object's metadata
        // must not hold up the opens of other files.
        let file = Arc::new(self.open_object()?);
        lock(&self.open).entry(self.index).or_insert((file, 0)).1 += 1;
        Ok(())
    }

    fn open_object(&self) -> Result<VerityFile, Errno> {
        let opened = self
            .store
            .open(&self.object.path(self.alg))
            .map_err(verityfs::Error::from)
            .and_then(|source| {
                open_object(&self.verifier, self.alg, &self.object, source, &self.path)
            });
        opened.map_err(|e| {
            tracing::error!("{}: cannot open its object: {e}", self.path.display());
            match e {
                // The manifest lists it: a missing object is the image's
                // fault, not a missing file.
                verityfs::Error::Io(io) if io.kind() == io::ErrorKind::NotFound => Errno::EIO,
                e => lib_errno(e),
            }
        })
    }
}

fn lock(open: &OpenFiles) -> MutexGuard<'_, HashMap<u32, (Arc<VerityFile>, usize)>> {
    open.lock().unwrap_or_else(|p| p.into_inner())
}

/// The number of subdirectories of each entry of `manifest`.
fn count_subdirs(manifest: &Manifest) -> Vec<u32> {
    let entries = manifest.entries();
    let mut counts = vec![0u32; entries.len()];
    for entry in &entries[1..] {
        if entry.kind == EntryKind::Directory {
            counts[entry.parent as usize] += 1;
        }
    }
    counts
}

fn file_type(kind: &EntryKind) -> FileType {
    match kind {
        EntryKind::Directory => FileType::Directory,
        EntryKind::Regular(_) => FileType::RegularFile,
        EntryKind::Symlink(_) => FileType::Symlink,
    }
}
