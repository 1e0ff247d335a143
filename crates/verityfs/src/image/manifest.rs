//! The manifest of an image: the directory tree, in the canonical binary
//! encoding of `docs/IMAGE.md`.
//!
//! Entries are kept in the order they are stored: sorted by (parent index,
//! name), which is a breadth-first walk with each directory's children in
//! byte order. That order is unique for a tree, so a tree has exactly one
//! encoding, and it makes every lookup a binary search: the children of a
//! directory are one contiguous run.

use std::ops::Range;

use crate::hash_algs::{Digest, HashAlgorithm};
use crate::layout::Location;

/// The manifest's magic bytes.
const MAGIC: [u8; 4] = *b"VFSM";
/// The version of the encoding this module reads and writes.
pub const VERSION: u8 = 1;
/// Bytes of the header.
const HEADER_SIZE: usize = 16;
/// Bytes of an entry's fixed part.
const ENTRY_SIZE: usize = 24;
/// Bytes of a regular file's object record, before its digest.
const OBJECT_SIZE: usize = 24;

/// The most entries a manifest may hold (the root included).
pub const MAX_ENTRIES: u32 = 1 << 22;
/// The longest name (Linux's `NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;
/// The longest symlink target (Linux's `PATH_MAX` less the NUL).
pub const MAX_TARGET_LEN: usize = 4095;
/// The deepest entry below the root (a 4096-byte path of one-byte names).
pub const MAX_DEPTH: u32 = 2048;
/// The permission bits an entry's mode may have.
pub const MODE_MASK: u16 = 0o7777;

/// Why a manifest is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The bytes end inside the header or an entry.
    #[error("manifest truncated")]
    Truncated,
    /// Bytes follow the last entry.
    #[error("trailing bytes after the last manifest entry")]
    TrailingBytes,
    /// Not a manifest.
    #[error("bad manifest magic")]
    BadMagic,
    /// A manifest of another version of the encoding.
    #[error("unsupported manifest version {0}")]
    UnsupportedVersion(u8),
    /// A digest algorithm other than SHA-256 and SHA-512.
    #[error("unknown hash algorithm {0} in manifest")]
    UnknownHashAlgorithm(u8),
    /// No entries, or more than [`MAX_ENTRIES`].
    #[error("bad manifest entry count {0}")]
    BadEntryCount(u32),
    /// An entry breaks a rule of the encoding.
    #[error("manifest entry {index}: {reason}")]
    BadEntry {
        /// The entry's position in the manifest (0 is the root).
        index: u32,
        /// The rule it breaks.
        reason: &'static str,
    },
}

/// What kind of file an entry is, with what that kind has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory: its children are the entries whose parent it is.
    Directory,
    /// A regular file, stored as an object.
    Regular(FileObject),
    /// A symbolic link to the target (not followed by the image).
    Symlink(Vec<u8>),
}

/// Where a regular file's contents are and what they must hash to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileObject {
    /// The fs-verity file digest: the object's name, and what its
    /// descriptor must hash to.
    pub digest: Digest,
    /// The layout of the object: data, tree and descriptor positions
    /// follow from the sizes as in a backing file (`docs/FORMAT.md`).
    pub location: Location,
}

/// One file of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The index of the directory holding it (0, the root's own, for the
    /// root).
    pub parent: u32,
    /// Its name in that directory (empty for the root).
    pub name: Vec<u8>,
    /// Permission bits (at most [`MODE_MASK`]).
    pub mode: u16,
    /// Modification time: seconds since the epoch and nanoseconds.
    pub mtime: (i64, u32),
    /// Its kind.
    pub kind: EntryKind,
}

/// A directory tree: the decoded manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    alg: HashAlgorithm,
    entries: Vec<Entry>,
}

impl Manifest {
    /// A manifest of `entries` (root first, in canonical order) whose file
    /// digests are `alg` digests; the same checks as [`Manifest::decode`].
    pub fn new(alg: HashAlgorithm, entries: Vec<Entry>) -> Result<Self, ManifestError> {
        let count = u32::try_from(entries.len()).unwrap_or(u32::MAX);
        if !(1..=MAX_ENTRIES).contains(&count) {
            return Err(ManifestError::BadEntryCount(count));
        }
        let mut depths = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let depth = check_entry(alg, &entries[..index], &depths, entry).map_err(|reason| {
                ManifestError::BadEntry {
                    index: index as u32,
                    reason,
                }
            })?;
            depths.push(depth);
        }
        Ok(Manifest { alg, entries })
    }

    /// The algorithm of every file digest.
    pub fn algorithm(&self) -> HashAlgorithm {
        self.alg
    }

    /// All entries, the root first.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry at `index`.
    pub fn entry(&self, index: u32) -> Option<&Entry> {
        self.entries.get(index as usize)
    }

    /// The indexes of the children of entry `dir`, in name order (empty
    /// if it is not a directory).
    pub fn children(&self, dir: u32) -> Range<u32> {
        let start = self.entries[1..].partition_point(|e| e.parent < dir) + 1;
        let end = self.entries[1..].partition_point(|e| e.parent <= dir) + 1;
        start as u32..end as u32
    }

    /// The child of directory `dir` named `name`.
    pub fn child(&self, dir: u32, name: &[u8]) -> Option<u32> {
        let key = (dir, name);
        let found = self.entries[1..].binary_search_by(|e| (e.parent, &e.name[..]).cmp(&key));
        found.ok().map(|i| i as u32 + 1)
    }

    /// The entry at `path`, relative to the root (`a/b/c`; empty or `/`
    /// for the root). Symlinks are not followed; `.` and `..` name nothing.
    pub fn lookup(&self, path: &[u8]) -> Option<u32> {
        path.split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .try_fold(0, |dir, name| self.child(dir, name))
    }

    /// The encoding (the bytes stored as the manifest file's data).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_SIZE + self.entries.len() * 64);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, self.alg.id(), 0, 0]);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        for entry in &self.entries {
            encode_entry(entry, &mut out);
        }
        out
    }

    /// Decodes and checks a manifest: every rule of `docs/IMAGE.md`, with
    /// a typed error for the first one broken. Never panics; allocates in
    /// proportion to `bytes.len()` at most.
    pub fn decode(bytes: &[u8]) -> Result<Self, ManifestError> {
        let mut r = Reader(bytes);
        let header = r.take(HEADER_SIZE).ok_or(ManifestError::Truncated)?;
        if header[..4] != MAGIC {
            return Err(ManifestError::BadMagic);
        }
        if header[4] != VERSION {
            return Err(ManifestError::UnsupportedVersion(header[4]));
        }
        let alg = HashAlgorithm::from_id(header[5].into())
            .map_err(|_| ManifestError::UnknownHashAlgorithm(header[5]))?;
        if header[6..8] != [0; 2] || header[12..] != [0; 4] {
            return Err(ManifestError::BadEntry {
                index: 0,
                reason: "reserved header bytes set",
            });
        }
        let count = le32(&header[8..12]);
        // Each entry takes at least ENTRY_SIZE bytes: a count the bytes
        // cannot hold is refused before anything is allocated for it.
        if count == 0 || count > MAX_ENTRIES || count as usize > r.0.len() / ENTRY_SIZE {
            return Err(match count == 0 || count > MAX_ENTRIES {
                true => ManifestError::BadEntryCount(count),
                false => ManifestError::Truncated,
            });
        }
        let mut entries = Vec::with_capacity(count as usize);
        let mut depths = Vec::with_capacity(count as usize);
        for index in 0..count {
            let bad = |reason| ManifestError::BadEntry { index, reason };
            let entry = decode_entry(alg, &mut r)?.map_err(bad)?;
            depths.push(check_entry(alg, &entries, &depths, &entry).map_err(bad)?);
            entries.push(entry);
        }
        if !r.0.is_empty() {
            return Err(ManifestError::TrailingBytes);
        }
        Ok(Manifest { alg, entries })
    }
}

/// Checks `entry`, which follows `before` (whose depths are `depths`);
/// returns its depth.
fn check_entry(
    alg: HashAlgorithm,
    before: &[Entry],
    depths: &[u32],
    entry: &Entry,
) -> Result<u32, &'static str> {
    if entry.mode & !MODE_MASK != 0 {
        return Err("mode has bits other than permissions");
    }
    if entry.mtime.1 >= 1_000_000_000 {
        return Err("nanoseconds out of range");
    }
    check_kind(alg, &entry.kind)?;
    let Some(previous) = before.last() else {
        return match (entry.parent, entry.name.is_empty(), &entry.kind) {
            (0, true, EntryKind::Directory) => Ok(0),
            _ => Err("the root must be a directory without a name or parent"),
        };
    };
    check_name(&entry.name)?;
    let parent = before
        .get(entry.parent as usize)
        .ok_or("parent is not an earlier entry")?;
    if parent.kind != EntryKind::Directory {
        return Err("parent is not a directory");
    }
    if before.len() > 1 && (entry.parent, &entry.name) <= (previous.parent, &previous.name) {
        return Err("entries not sorted by parent and name, or a duplicate name");
    }
    let depth = depths[entry.parent as usize] + 1;
    match depth <= MAX_DEPTH {
        true => Ok(depth),
        false => Err("deeper than the limit"),
    }
}

fn check_name(name: &[u8]) -> Result<(), &'static str> {
    match name {
        [] => Err("empty name"),
        b"." | b".." => Err("name is . or .."),
        _ if name.len() > MAX_NAME_LEN => Err("name longer than 255 bytes"),
        _ if name.iter().any(|&b| b == b'/' || b == 0) => Err("name contains / or NUL"),
        _ => Ok(()),
    }
}

fn check_kind(alg: HashAlgorithm, kind: &EntryKind) -> Result<(), &'static str> {
    match kind {
        EntryKind::Directory => Ok(()),
        EntryKind::Symlink(target) if target.is_empty() || target.len() > MAX_TARGET_LEN => {
            Err("symlink target empty or longer than 4095 bytes")
        }
        EntryKind::Symlink(target) if target.contains(&0) => Err("symlink target contains NUL"),
        EntryKind::Symlink(_) => Ok(()),
        EntryKind::Regular(object) => check_object(alg, object),
    }
}

fn check_object(alg: HashAlgorithm, object: &FileObject) -> Result<(), &'static str> {
    if object.digest.as_bytes().len() != alg.digest_size() {
        return Err("digest size is not the algorithm's");
    }
    let l = &object.location;
    match Location::decode(&l.encode()) {
        Ok(decoded) if decoded == *l => Ok(()),
        _ => Err("object sizes out of range"),
    }
}

const KIND_DIRECTORY: u8 = 1;
const KIND_REGULAR: u8 = 2;
const KIND_SYMLINK: u8 = 3;

fn encode_entry(entry: &Entry, out: &mut Vec<u8>) {
    let kind = match entry.kind {
        EntryKind::Directory => KIND_DIRECTORY,
        EntryKind::Regular(_) => KIND_REGULAR,
        EntryKind::Symlink(_) => KIND_SYMLINK,
    };
    out.extend_from_slice(&entry.parent.to_le_bytes());
    out.extend_from_slice(&[kind, entry.name.len() as u8]);
    out.extend_from_slice(&entry.mode.to_le_bytes());
    out.extend_from_slice(&entry.mtime.0.to_le_bytes());
    out.extend_from_slice(&entry.mtime.1.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    match &entry.kind {
        EntryKind::Directory => {}
        EntryKind::Regular(object) => {
            let l = &object.location;
            out.extend_from_slice(&l.data_size.to_le_bytes());
            out.extend_from_slice(&l.tree_size.to_le_bytes());
            out.extend_from_slice(&l.desc_size.to_le_bytes());
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(object.digest.as_bytes());
        }
        EntryKind::Symlink(target) => {
            out.extend_from_slice(&(target.len() as u16).to_le_bytes());
            out.extend_from_slice(target);
        }
    }
    out.extend_from_slice(&entry.name);
}

/// Reads one entry: `Err` if the bytes end inside it (the outer result),
/// or the rule its fields break (the inner one).
fn decode_entry(
    alg: HashAlgorithm,
    r: &mut Reader<'_>,
) -> Result<Result<Entry, &'static str>, ManifestError> {
    let b = r.take(ENTRY_SIZE).ok_or(ManifestError::Truncated)?;
    if b[20..24] != [0; 4] {
        return Ok(Err("reserved bytes set"));
    }
    let kind = match b[4] {
        KIND_DIRECTORY => EntryKind::Directory,
        KIND_REGULAR => match decode_object(alg, r)? {
            Ok(object) => EntryKind::Regular(object),
            Err(reason) => return Ok(Err(reason)),
        },
        KIND_SYMLINK => {
            let len = u16::from_le_bytes([r.byte()?, r.byte()?]);
            EntryKind::Symlink(r.take(len.into()).ok_or(ManifestError::Truncated)?.to_vec())
        }
        _ => return Ok(Err("unknown kind")),
    };
    let name = r
        .take(b[5].into())
        .ok_or(ManifestError::Truncated)?
        .to_vec();
    Ok(Ok(Entry {
        parent: le32(&b[..4]),
        name,
        mode: u16::from_le_bytes([b[6], b[7]]),
        mtime: (le64(&b[8..16]) as i64, le32(&b[16..20])),
        kind,
    }))
}

fn decode_object(
    alg: HashAlgorithm,
    r: &mut Reader<'_>,
) -> Result<Result<FileObject, &'static str>, ManifestError> {
    let b = r.take(OBJECT_SIZE).ok_or(ManifestError::Truncated)?;
    let digest = r.take(alg.digest_size()).ok_or(ManifestError::Truncated)?;
    let digest = Digest::from_slice(digest).expect("a digest size");
    if b[20..24] != [0; 4] {
        return Ok(Err("reserved bytes set"));
    }
    let location = Location::new(le64(&b[..8]), le64(&b[8..16]), le32(&b[16..20]));
    Ok(location
        .map(|location| FileObject { digest, location })
        .map_err(|_| "object sizes out of range"))
}

/// The unread rest of the input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(taken)
    }

    fn byte(&mut self) -> Result<u8, ManifestError> {
        Ok(self.take(1).ok_or(ManifestError::Truncated)?[0])
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}
