//! A cache of fetched bytes on local disk (`--cache-dir`): what was read
//! once is read again without the network, across remounts and offline.
//!
//! Each object has a sparse file of its bytes and a map: a header (magic,
//! the object's size) and a bit per 4 KiB block held. Bytes are written
//! before their bit, so a crash can only lose blocks, never mark as held a
//! block that was not written; and nothing here is trusted anyway: a block
//! that fails verification is dropped ([`CachedObject::forget`]) and
//! fetched again. The cache stays under its size by dropping the objects
//! used least recently.
//!
//! The directory is the mounting user's, but the daemon may run as root: no
//! path is followed through a symlink, and only regular files are used.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

/// The granularity of the map.
const BLOCK: u64 = 4096;
/// A map file starts with this and the object's size (0: not known yet).
const MAGIC: &[u8; 8] = b"vfscach1";
const HEADER: u64 = 16;
/// The suffix of map files.
const MAP: &str = ".map";

/// A cache directory.
pub(crate) struct DiskCache {
    dir: OwnedFd,
    /// The most bytes the cache's files may take.
    max: u64,
    /// The bytes they take, as last counted plus what was written since.
    used: AtomicU64,
    /// Held while dropping objects.
    evicting: Mutex<()>,
}

impl DiskCache {
    /// The cache in `dir` (created if missing, mode 0700), at most `max`
    /// bytes.
    pub(crate) fn open(dir: &Path, max: u64) -> io::Result<Arc<Self>> {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let dir = rustix::fs::open(dir, flags, Mode::empty())?;
        let cache = Arc::new(DiskCache {
            dir,
            max,
            used: AtomicU64::new(0),
            evicting: Mutex::new(()),
        });
        cache.used.store(cache.count_used()?, Ordering::Relaxed);
        cache.evict_if_full()?;
        Ok(cache)
    }

    /// The cached object named `name` (a file name of the cache's own).
    pub(crate) fn object(self: &Arc<Self>, name: &str) -> io::Result<Arc<CachedObject>> {
        let data = self.open_file(name)?;
        let map = self.open_file(&format!("{name}{MAP}"))?;
        map.set_modified(SystemTime::now())?;
        let state = Map::read(&map)?;
        Ok(Arc::new(CachedObject {
            cache: self.clone(),
            data,
            map,
            state: Mutex::new(state),
        }))
    }

    /// Opens (creating) the regular file `name` in the directory, without
    /// following a symlink and without waiting on a FIFO.
    fn open_file(&self, name: &str) -> io::Result<File> {
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let fd = rustix::fs::openat2(&self.dir, name, flags, Mode::from_raw_mode(0o600), resolve)?;
        if !FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode).is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name} in the cache directory is not a regular file"),
            ));
        }
        Ok(File::from(fd))
    }

    /// The cache's entries: (name without the map suffix, last use, bytes
    /// taken by the object and its map).
    fn entries(&self) -> io::Result<Vec<(String, SystemTime, u64)>> {
        let dir = rustix::fs::openat(
            &self.dir,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut entries = Vec::new();
        for entry in rustix::fs::Dir::read_from(&dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let Some(object) = name.strip_suffix(MAP) else {
                continue;
            };
            let taken = |n: &str| {
                rustix::fs::statat(&self.dir, n, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| (st.st_blocks as u64 * 512, st.st_mtime))
            };
            let (Ok((map_bytes, used)), Ok((data_bytes, _))) = (taken(&name), taken(object)) else {
                continue;
            };
            let used = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(used.max(0) as u64);
            entries.push((object.to_owned(), used, map_bytes + data_bytes));
        }
        Ok(entries)
    }

    fn count_used(&self) -> io::Result<u64> {
        Ok(self.entries()?.iter().map(|e| e.2).sum())
    }

    /// Adds `n` bytes to the count; drops objects if over the limit.
    fn grew(&self, n: u64) {
        if self.used.fetch_add(n, Ordering::Relaxed) + n > self.max {
            // Failing to drop only costs space: the next write tries again.
            let _ = self.evict_if_full();
        }
    }

    /// Drops the least recently used objects until the cache takes at most
    /// 90% of its limit.
    fn evict_if_full(&self) -> io::Result<()> {
        let _one_at_a_time = self.evicting.lock().unwrap_or_else(|e| e.into_inner());
        let mut entries = self.entries()?;
        let mut used: u64 = entries.iter().map(|e| e.2).sum();
        entries.sort_by_key(|e| e.1);
        for (name, _, bytes) in entries {
            if used <= self.max {
                break;
            }
            let _ = rustix::fs::unlinkat(
                &self.dir,
                format!("{name}{MAP}"),
                rustix::fs::AtFlags::empty(),
            );
            let _ = rustix::fs::unlinkat(&self.dir, &name, rustix::fs::AtFlags::empty());
            used -= bytes;
        }
        self.used.store(used, Ordering::Relaxed);
        Ok(())
    }
}

/// One object's bytes in the cache.
pub(crate) struct CachedObject {
    cache: Arc<DiskCache>,
    data: File,
    map: File,
    state: Mutex<Map>,
}

/// A map in memory.
struct Map {
    size: u64,
    bits: Vec<u8>,
}

impl Map {
    /// The map in `file`; an empty one if it is new or not a map.
    fn read(file: &File) -> io::Result<Self> {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut &*file, &mut bytes)?;
        let (header, bits) = bytes.split_at(bytes.len().min(HEADER as usize));
        match header.split_at_checked(MAGIC.len()) {
            Some((magic, size)) if magic == MAGIC && size.len() == 8 => Ok(Map {
                size: u64::from_le_bytes(size.try_into().expect("8 bytes")),
                bits: bits.to_vec(),
            }),
            _ => {
                file.set_len(0)?;
                let mut header = MAGIC.to_vec();
                header.extend_from_slice(&0u64.to_le_bytes());
                file.write_all_at(&header, 0)?;
                Ok(Map {
                    size: 0,
                    bits: Vec::new(),
                })
            }
        }
    }

    fn has(&self, block: u64) -> bool {
        self.bits
            .get((block / 8) as usize)
            .is_some_and(|b| b & (1 << (block % 8)) != 0)
    }

    /// Sets or clears the bits of `blocks`; returns the range of bytes of
    /// the bitmap that changed.
    fn set(&mut self, blocks: std::ops::Range<u64>, on: bool) -> std::ops::Range<usize> {
        let bytes = (blocks.start / 8) as usize..blocks.end.div_ceil(8) as usize;
        if self.bits.len() < bytes.end {
            self.bits.resize(bytes.end, 0);
        }
        for block in blocks {
            let byte = &mut self.bits[(block / 8) as usize];
            let bit = 1 << (block % 8);
            *byte = if on { *byte | bit } else { *byte & !bit };
        }
        bytes
    }
}

impl CachedObject {
    /// The object's size, if a fetch has told it.
    pub(crate) fn size(&self) -> Option<u64> {
        Some(self.lock().size).filter(|&s| s != 0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fills `buf` from `pos` if every block it touches is held.
    pub(crate) fn read(&self, buf: &mut [u8], pos: u64) -> bool {
        let end = pos + buf.len() as u64;
        let held = {
            let map = self.lock();
            (pos / BLOCK..end.div_ceil(BLOCK)).all(|b| map.has(b))
        };
        held && self.data.read_exact_at(buf, pos).is_ok()
    }

    /// The bytes of `range` if every block is held.
    pub(crate) fn read_range(&self, range: std::ops::Range<u64>) -> Option<Bytes> {
        let mut buf = vec![0; (range.end - range.start) as usize];
        self.read(&mut buf, range.start).then(|| buf.into())
    }

    /// Keeps `bytes`, fetched from `pos` of an object of `size` bytes: the
    /// whole blocks among them (and a last partial block at the end).
    pub(crate) fn record(&self, bytes: &[u8], pos: u64, size: u64) {
        let end = pos + bytes.len() as u64;
        let first = pos.div_ceil(BLOCK);
        let last = if end == size {
            end.div_ceil(BLOCK)
        } else {
            end / BLOCK
        };
        if first >= last {
            return;
        }
        let skip = (first * BLOCK - pos) as usize;
        let upto = ((last * BLOCK).min(end) - pos) as usize;
        if self
            .data
            .write_all_at(&bytes[skip..upto], first * BLOCK)
            .is_err()
        {
            return;
        }
        let mut map = self.lock();
        if map.size != size {
            map.size = size;
            let _ = self
                .map
                .write_all_at(&size.to_le_bytes(), MAGIC.len() as u64);
        }
        let changed = map.set(first..last, true);
        let _ = self
            .map
            .write_all_at(&map.bits[changed.clone()], HEADER + changed.start as u64);
        drop(map);
        self.cache.grew((upto - skip) as u64);
    }

    /// Drops the blocks of `len` bytes at `offset` (they failed
    /// verification); returns whether any was held.
    pub(crate) fn forget(&self, offset: u64, len: u64) -> bool {
        let blocks = offset / BLOCK..(offset + len).div_ceil(BLOCK);
        let mut map = self.lock();
        let held = blocks.clone().any(|b| map.has(b));
        let changed = map.set(blocks, false);
        let _ = self
            .map
            .write_all_at(&map.bits[changed.clone()], HEADER + changed.start as u64);
        held
    }
}
