//! Publishing a directory tree as an image (`docs/IMAGE.md`).
//!
//! The source is walked breadth first with each directory's names sorted,
//! which is the manifest's canonical order, so entries are appended as they
//! are found. Nothing in the source is followed: directories are opened
//! with `O_NOFOLLOW` and must still be the inode seen when they were listed,
//! entries are examined with `lstat`, files are opened with `O_NOFOLLOW`
//! and must be the regular file that was examined. A file's bytes are
//! hashed as they are copied into its object, so the object always matches
//! its digest even if the source changes meanwhile.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

use super::manifest::{Entry, EntryKind, FileObject, Manifest, ManifestError, MAX_ENTRIES};
use super::{object_path, MANIFEST_NAME, OBJECTS_DIR};
use crate::build::build_merkle_tree;
use crate::descriptor::{Descriptor, DESCRIPTOR_SIZE};
use crate::error::{Error, Result};
use crate::hash_algs::{Digest, HashAlgorithm};
use crate::layout::Location;
use crate::params::MerkleTreeParams;

/// What [`publish`] did.
#[derive(Clone, Debug)]
pub struct Published {
    /// The algorithm of the digests.
    pub algorithm: HashAlgorithm,
    /// The manifest's fs-verity digest: the one value readers must trust.
    pub digest: Digest,
    /// Entries in the manifest, the root included.
    pub entries: usize,
    /// Objects written (identical contents are stored once; objects
    /// already in the destination with the same bytes are kept).
    pub objects_written: usize,
    /// Files of other types (devices, FIFOs, sockets), not published.
    pub skipped: Vec<PathBuf>,
}

/// Publishes the tree at `src` (a directory, not a symlink to one) into
/// `dest` (created if missing, not inside `src`, else `EINVAL`): one object per distinct file content in
/// `dest/objects/`, then the manifest as `dest/manifest`, each written
/// under a temporary name, synced and renamed into place, so a reader
/// never sees a partial object or manifest. Objects already present with
/// the same bytes are kept (several images can share one destination);
/// others under an object's name are replaced.
///
/// Regular files, directories and symlinks are published with their
/// permission bits and modification times; owners are not recorded (the
/// mount decides them); other file types are skipped and listed in
/// [`Published::skipped`]. Limits of the manifest (names, depth, entry
/// count) are [`Error::InvalidManifest`].
pub fn publish(src: &Path, dest: &Path, params: &MerkleTreeParams) -> Result<Published> {
    publish_signed(src, dest, params, None)
}

/// Signs a manifest's digest: the built-in signature stored with it (as
/// `verityfs sign` makes one, with `signature::sign_digest`); its failure
/// (carrying the signer's error) fails the publish.
pub type ManifestSigner<'a> = &'a dyn Fn(HashAlgorithm, &Digest) -> io::Result<Vec<u8>>;

/// [`publish`], storing with the manifest the signature `signer` makes of
/// its digest (readers may then trust a certificate instead of the
/// digest); the digest is the same as unsigned.
pub fn publish_signed(
    src: &Path,
    dest: &Path,
    params: &MerkleTreeParams,
    signer: Option<ManifestSigner<'_>>,
) -> Result<Published> {
    params.check_kernel_limits()?;
    let root = at(src, rustix::fs::lstat(src))?;
    if FileType::from_raw_mode(root.st_mode) != FileType::Directory {
        return Err(Error::InvalidArgument("the source is not a directory"));
    }
    fs::create_dir_all(dest.join(OBJECTS_DIR))?;
    if fs::canonicalize(dest)?.starts_with(fs::canonicalize(src)?) {
        return Err(Error::InvalidArgument(
            "the destination is inside the source",
        ));
    }
    let mut publisher = Publisher {
        params,
        dest,
        entries: vec![entry(0, Vec::new(), &root, EntryKind::Directory)],
        dirs: VecDeque::from([(0, src.to_path_buf(), identity(&root))]),
        objects_written: 0,
        skipped: Vec::new(),
    };
    while let Some(dir) = publisher.dirs.pop_front() {
        publisher.add_directory(dir)?;
    }
    let manifest = Manifest::new(params.hash_algorithm(), publisher.entries)?;
    sync_dir(&dest.join(OBJECTS_DIR))?;
    let digest = write_manifest(dest, params, &manifest, signer)?;
    Ok(Published {
        algorithm: params.hash_algorithm(),
        digest,
        entries: manifest.entries().len(),
        objects_written: publisher.objects_written,
        skipped: publisher.skipped,
    })
}

/// A directory waiting to be listed: its entry, path and (device, inode).
type PendingDir = (u32, PathBuf, (u64, u64));

struct Publisher<'a> {
    params: &'a MerkleTreeParams,
    dest: &'a Path,
    entries: Vec<Entry>,
    dirs: VecDeque<PendingDir>,
    objects_written: usize,
    skipped: Vec<PathBuf>,
}

impl Publisher<'_> {
    /// Appends the children of a directory, in name order.
    fn add_directory(&mut self, (index, path, id): PendingDir) -> Result<()> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = at(&path, rustix::fs::open(&path, flags, Mode::empty()))?;
        if identity(&at(&path, rustix::fs::fstat(&fd))?) != id {
            return Err(changed(&path));
        }
        let mut names = Vec::new();
        for dirent in at(&path, rustix::fs::Dir::read_from(&fd))? {
            let name = at(&path, dirent)?.file_name().to_owned();
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                names.push(name);
            }
        }
        names.sort();
        for name in names {
            if self.entries.len() >= MAX_ENTRIES as usize {
                return Err(ManifestError::BadEntryCount(MAX_ENTRIES).into());
            }
            self.add_child(index, &fd, &path, &name)?;
        }
        Ok(())
    }

    /// Appends the entry `name` of directory `parent` (open as `dir`).
    fn add_child(
        &mut self,
        parent: u32,
        dir: &OwnedFd,
        dir_path: &Path,
        name: &CStr,
    ) -> Result<()> {
        let path = dir_path.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let stat = at(
            &path,
            rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW),
        )?;
        let kind = match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                let index = self.entries.len() as u32;
                self.dirs.push_back((index, path, identity(&stat)));
                EntryKind::Directory
            }
            FileType::RegularFile => EntryKind::Regular(self.add_file(dir, name, &stat, &path)?),
            FileType::Symlink => {
                let target = at(&path, rustix::fs::readlinkat(dir, name, Vec::new()))?;
                EntryKind::Symlink(target.into_bytes())
            }
            _ => {
                self.skipped.push(path);
                return Ok(());
            }
        };
        let name = name.to_bytes().to_vec();
        self.entries.push(entry(parent, name, &stat, kind));
        Ok(())
    }

    /// Stores the contents of regular file `name` of `dir` as an object.
    fn add_file(
        &mut self,
        dir: &OwnedFd,
        name: &CStr,
        stat: &Stat,
        path: &Path,
    ) -> Result<FileObject> {
        // NONBLOCK: should the file have been replaced by a FIFO since it
        // was examined, opening it must not wait for a writer.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK;
        let file = File::from(at(
            path,
            rustix::fs::openat(dir, name, flags | OFlags::CLOEXEC, Mode::empty()),
        )?);
        let now = at(path, rustix::fs::fstat(&file))?;
        if identity(&now) != identity(stat)
            || FileType::from_raw_mode(now.st_mode) != FileType::RegularFile
        {
            return Err(changed(path));
        }
        let objects = self.dest.join(OBJECTS_DIR);
        let temp = TempFile::create(&objects)?;
        let tee = Tee {
            from: &file,
            to: &temp.file,
        };
        let size = now.st_size as u64;
        let (descriptor, tree) =
            build_merkle_tree(self.params, size, tee, Vec::new(), &mut |_| Ok(())).map_err(
                |e| match e {
                    Error::UnexpectedEof { .. } => changed(path),
                    Error::Io(e) => named(path, e),
                    e => e,
                },
            )?;
        let location = write_metadata(&temp.file, &descriptor, &tree, &[])?;
        let object = FileObject {
            digest: descriptor.file_digest(),
            location,
        };
        let target = self
            .dest
            .join(object_path(self.params.hash_algorithm(), &object.digest));
        if !holds_same(&target, &temp.file).map_err(|e| named(&target, e))? {
            temp.persist(&target).map_err(|e| named(&target, e))?;
            self.objects_written += 1;
        }
        Ok(object)
    }
}

/// Whether `target` is a regular file (not followed if a link) with the
/// bytes of `new`: an object published before, kept as it is. One damaged
/// or cut short (a disk error, a copy stopped halfway, anyone who can write
/// the destination), a link or a socket is replaced, so that a publish
/// leaves the objects its manifest names; a directory there is an error
/// naming it.
fn holds_same(target: &Path, new: &File) -> io::Result<bool> {
    // Not blocking on a FIFO someone put there.
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let old = match rustix::fs::open(target, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        // Nothing there, a link, a socket.
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NXIO) => {
            return Ok(false)
        }
        Err(e) => return Err(e.into()),
    };
    let (old_meta, size) = (old.metadata()?, new.metadata()?.len());
    if !old_meta.is_file() || old_meta.len() != size {
        return Ok(false);
    }
    let (mut theirs, mut ours) = (vec![0; COMPARE_CHUNK], vec![0; COMPARE_CHUNK]);
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(COMPARE_CHUNK as u64) as usize;
        old.read_exact_at(&mut theirs[..n], pos)?;
        new.read_exact_at(&mut ours[..n], pos)?;
        if theirs[..n] != ours[..n] {
            return Ok(false);
        }
        pos += n as u64;
    }
    Ok(true)
}

/// How much of an object [`holds_same`] compares at a time.
const COMPARE_CHUNK: usize = 1 << 20;

/// An entry with the permission bits and modification time of `stat`.
fn entry(parent: u32, name: Vec<u8>, stat: &Stat, kind: EntryKind) -> Entry {
    Entry {
        parent,
        name,
        mode: (stat.st_mode & 0o7777) as u16,
        mtime: (stat.st_mtime, stat.st_mtime_nsec as u32),
        kind,
    }
}

/// A failed system call on `path` as an error naming the path.
fn at<T>(path: &Path, result: rustix::io::Result<T>) -> Result<T> {
    result.map_err(|e| named(path, e.into()))
}

fn named(path: &Path, source: io::Error) -> Error {
    let path = path.to_owned();
    Error::IoAt { path, source }
}

fn identity(stat: &Stat) -> (u64, u64) {
    (stat.st_dev, stat.st_ino)
}

fn changed(path: &Path) -> Error {
    let what = format!("{} changed while being published", path.display());
    io::Error::other(what).into()
}

/// Writes the tree and descriptor (with its `signature`, if not empty) of
/// data already in `file` where the backing format puts them (the gap
/// before the tree stays a hole).
fn write_metadata(
    file: &File,
    descriptor: &Descriptor,
    tree: &[u8],
    signature: &[u8],
) -> Result<Location> {
    let descriptor = descriptor.with_sig_size(signature.len() as u32)?;
    let location = Location::new(
        descriptor.data_size(),
        tree.len() as u64,
        (DESCRIPTOR_SIZE + signature.len()) as u32,
    )?;
    file.set_len(location.tree_pos)?;
    file.write_all_at(tree, location.tree_pos)?;
    let mut stored = descriptor.to_bytes().to_vec();
    stored.extend_from_slice(signature);
    file.write_all_at(&stored, location.desc_pos)?;
    Ok(location)
}

/// Writes the manifest object (with its location record after it) and
/// renames it into place; returns its digest.
fn write_manifest(
    dest: &Path,
    params: &MerkleTreeParams,
    manifest: &Manifest,
    signer: Option<ManifestSigner<'_>>,
) -> Result<Digest> {
    let bytes = manifest.encode();
    let (descriptor, tree) = build_merkle_tree(
        params,
        bytes.len() as u64,
        &bytes[..],
        Vec::new(),
        &mut |_| Ok(()),
    )?;
    let signature = match signer {
        Some(sign) => sign(params.hash_algorithm(), &descriptor.file_digest())?,
        None => Vec::new(),
    };
    let temp = TempFile::create(dest)?;
    temp.file.write_all_at(&bytes, 0)?;
    let location = write_metadata(&temp.file, &descriptor, &tree, &signature)?;
    let end = location.end().expect("Location::new checked the end");
    temp.file.write_all_at(&location.encode(), end)?;
    temp.persist(&dest.join(MANIFEST_NAME))?;
    sync_dir(dest)?;
    Ok(descriptor.file_digest())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Copies what is read from `from` to `to`: the bytes hashed are the bytes
/// stored.
struct Tee<'a> {
    from: &'a File,
    to: &'a File,
}

impl Read for Tee<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (mut from, mut to) = (self.from, self.to);
        let n = from.read(buf)?;
        to.write_all(&buf[..n])?;
        Ok(n)
    }
}

/// A file being written under a temporary name, removed unless persisted.
struct TempFile {
    path: PathBuf,
    file: File,
}

impl TempFile {
    fn create(dir: &Path) -> io::Result<TempFile> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".tmp-{}-{n}", std::process::id()));
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok(TempFile { path, file })
    }

    /// Syncs the file and renames it to `target`.
    fn persist(mut self, target: &Path) -> io::Result<()> {
        self.file.sync_all()?;
        fs::rename(&self.path, target)?;
        self.path.clear();
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}
