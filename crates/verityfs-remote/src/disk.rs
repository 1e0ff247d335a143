//! A cache of fetched bytes on local disk (`--cache-dir`): what was read
//! once is read again without the network, across remounts and offline.
//!
//! Each object has a sparse file of its bytes, named as the cache names
//! objects ([`is_cache_name`]), and a map (the same name and `.map`): a
//! header (magic, the object's size) and a bit per 4 KiB block held.
//!
//! Nothing here is trusted: what is read from the cache is verified like
//! what comes from the network, and a block that fails is dropped
//! ([`CachedObject::forget`]) and fetched again. Nothing is synced either:
//! bytes are written before their bit, so a crash of the process loses
//! blocks at most; after a crash of the system, the two files may have
//! reached the disk in any order, and a bit may stand for bytes that did
//! not (zeros, or older bytes): verification catches those, and they are
//! dropped like any other bad block. The cache stays under its size by
//! dropping the objects used least recently, down to 90% of it.
//!
//! The daemon may run as root, and the directory may hold what others put
//! there: it must belong to the daemon's user and be writable by no one
//! else, no path is followed through a symlink, and a file the cache did
//! not make (not a regular file, another owner, a hard link, a map without
//! the magic, an object's bytes without a map) is left alone: that object
//! is read from the network. Only files named and made as the cache's are
//! ever dropped. Sizes are claimed by the server: an object larger than
//! the cache, or than [`MAX_OBJECT`], is not kept, which bounds a map.
//!
//! Mounts sharing a directory each hold their maps in memory: a map's
//! bytes are changed in the file under a lock on it, combined with what
//! the file holds, so that they keep each other's blocks.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, ResolveFlags, Stat, StatxFlags};
use rustix::io::Errno;
use verityfs::safe_dir::{open_dir, PathError};

/// The granularity of the map.
const BLOCK: u64 = 4096;
/// A map file starts with this and the object's size (0: not known yet).
const MAGIC: &[u8; 8] = b"vfscach1";
const HEADER: u64 = 16;
/// The suffix of map files.
const MAP: &str = ".map";
/// The largest object kept, however large the cache: its map is at most
/// 32 MiB, in memory too. Offsets in the cache's files stay far from
/// overflowing.
const MAX_OBJECT: u64 = 1 << 40;
/// The algorithms of the digests objects are named by, with the length of
/// a digest in hex.
const ALGS: [(&str, usize); 2] = [("sha256", 64), ("sha512", 128)];
/// How files are looked up in the directory: beneath it, never through a
/// symlink.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);
/// How files are opened: without following a symlink, waiting on a FIFO
/// or taking a terminal.
const OPEN: OFlags = OFlags::NOFOLLOW
    .union(OFlags::CLOEXEC)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY);

/// Whether `name` is one the cache gives objects: `objects-ALG-HEX`, or
/// the manifest's `manifest-ALG-HEX` (`manifest-HEX` for a digest given
/// without its algorithm), HEX lowercase and of the algorithm's length.
fn is_cache_name(name: &str) -> bool {
    let hex = |h: &str, len: usize| {
        h.len() == len && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let alg_hex = |rest: &str| {
        ALGS.iter().any(|&(alg, len)| {
            rest.strip_prefix(alg)
                .and_then(|r| r.strip_prefix('-'))
                .is_some_and(|h| hex(h, len))
        })
    };
    if let Some(rest) = name.strip_prefix("objects-") {
        alg_hex(rest)
    } else if let Some(rest) = name.strip_prefix("manifest-") {
        alg_hex(rest) || ALGS.iter().any(|&(_, len)| hex(rest, len))
    } else {
        false
    }
}

/// The error for a file of the directory that the cache did not make.
fn not_ours(name: &str, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{name} in the cache directory {why}: not the cache's, left alone"),
    )
}

fn is_regular(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
}

/// The bytes `st` takes on disk.
fn taken(st: &Stat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

/// Runs `f` with an exclusive lock on `file`, held by other mounts
/// sharing the directory too. The lock is waited for [`LOCK_WAIT`] at
/// most (`EWOULDBLOCK` then): another mount holds it only while it changes
/// a few bytes, and one stopped while holding it, or whoever else holds
/// it, must not stop this mount's reads, which wait for the map's mutex
/// meanwhile. What could not be written to the file stays in memory.
fn locked<T>(file: &File, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let start = Instant::now();
    while let Err(e) = rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive) {
        if e != rustix::io::Errno::WOULDBLOCK || start.elapsed() >= LOCK_WAIT {
            return Err(e.into());
        }
        std::thread::sleep(LOCK_WAIT / 16);
    }
    let result = f();
    rustix::fs::flock(file, FlockOperation::Unlock)?;
    result
}

/// How long [`locked`] waits for a map file's lock.
const LOCK_WAIT: Duration = Duration::from_millis(20);

/// Fills `buf` from `pos` of `file` as far as the file goes (the rest
/// stays as it is).
fn read_upto(file: &File, buf: &mut [u8], pos: u64) -> io::Result<()> {
    let mut done = 0;
    while let Some(rest) = buf.get_mut(done..).filter(|r| !r.is_empty()) {
        match file.read_at(rest, pos.saturating_add(done as u64)) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A cache directory.
pub(crate) struct DiskCache {
    dir: OwnedFd,
    /// The daemon's user, whom the directory and its files must belong to.
    owner: u32,
    /// The most bytes the cache's files may take.
    max: u64,
    /// The largest object kept: one larger than the cache would push out
    /// every other, then itself.
    largest: u64,
    /// The bytes they take, as last counted plus what was written since.
    used: AtomicU64,
    /// Held while dropping objects.
    evicting: Mutex<()>,
    /// The objects open now: one dropped while open keeps its files until
    /// it is closed, so it is told to stop using them and to let their
    /// space go (see [`CachedObject::evicted`]).
    open: Mutex<Vec<Weak<CachedObject>>>,
}

/// An object of the cache, as eviction sees it.
struct Entry {
    name: String,
    last_used: SystemTime,
    /// The bytes its two files take.
    taken: u64,
}

impl DiskCache {
    /// The cache in `dir` (created if missing, mode 0700), at most `max`
    /// bytes. The directory must belong to the daemon's user and be
    /// writable by no one else; no symbolic link on its path is followed
    /// unless it belongs to root or that user, and the last component
    /// never.
    pub(crate) fn open(dir: &Path, max: u64) -> io::Result<Arc<Self>> {
        let refuse = |kind, why: String| {
            io::Error::new(kind, format!("cache directory {}: {why}", dir.display()))
        };
        // Not through a final symlink, nor through another user's link on
        // the way (see `verityfs::safe_dir`).
        let fd = match open_dir(dir, Some(0o700)) {
            Ok(opened) => opened.into_fd(),
            Err(e) => match PathError::errno_of(&e) {
                Some(_) => return Err(io::Error::new(e.kind(), format!("cache directory {e}"))),
                None => return Err(refuse(e.kind(), e.to_string())),
            },
        };
        let st = rustix::fs::fstat(&fd)?;
        let owner = rustix::process::geteuid().as_raw();
        if st.st_uid != owner {
            return Err(refuse(
                io::ErrorKind::PermissionDenied,
                format!(
                    "belongs to uid {}, not to uid {owner} who mounts: the daemon keeps its \
                     cache only in a directory of its user's own (give a missing one, it is \
                     created with mode 0700)",
                    st.st_uid
                ),
            ));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(refuse(
                io::ErrorKind::PermissionDenied,
                format!(
                    "writable by other users (mode {:o}): the cache must be writable by its \
                     owner only (chmod go-w it, or give a directory of its own)",
                    st.st_mode & 0o7777
                ),
            ));
        }
        let cache = Arc::new(DiskCache {
            dir: fd,
            owner,
            max,
            largest: max.min(MAX_OBJECT),
            used: AtomicU64::new(0),
            evicting: Mutex::new(()),
            open: Mutex::default(),
        });
        cache.evict_if_full()?;
        Ok(cache)
    }

    /// The cached object named `name` (see [`is_cache_name`]); an error if
    /// its files are not the cache's.
    pub(crate) fn object(self: &Arc<Self>, name: &str) -> io::Result<Arc<CachedObject>> {
        if !is_cache_name(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: not a name the cache gives objects"),
            ));
        }
        // Not while objects are dropped: one opened from files being
        // removed, but registered after, would never be told.
        let _no_eviction = self.evicting.lock().unwrap_or_else(|e| e.into_inner());
        // The map first, the bytes second (and eviction drops them the
        // other way round): bytes without a map were not made here.
        let map_name = format!("{name}{MAP}");
        let (map, created) = self.open_file(&map_name)?;
        let opened = Map::read(&map, &map_name, self.largest).and_then(|(state, new_map)| {
            let (data, new_data) = self.open_file(name)?;
            if new_map && !new_data {
                return Err(not_ours(name, "has no map"));
            }
            Ok((state, data, new_data))
        });
        let (mut state, data, new_data) = opened.inspect_err(|_| {
            // The same refusal next time, not a map that makes the bytes
            // look the cache's.
            if created {
                let _ = rustix::fs::unlinkat(&self.dir, &map_name, AtFlags::empty());
            }
        })?;
        if new_data && !state.bits.is_empty() {
            // The bytes of the map's blocks are gone.
            state.reset(&map, state.size)?;
        }
        map.set_modified(SystemTime::now())?;
        let object = Arc::new(CachedObject {
            cache: self.clone(),
            name: name.to_owned(),
            data,
            map,
            state: Mutex::new(state),
            evicted: AtomicBool::new(false),
        });
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|o| o.strong_count() > 0);
        open.push(Arc::downgrade(&object));
        Ok(object)
    }

    /// The file `name` of the directory, to read and write, created (mode
    /// 0600) if missing; whether it was. A file there already must be the
    /// cache's: a regular file of the daemon's user, with no other link
    /// (not a hard link to a file elsewhere).
    fn open_file(&self, name: &str) -> io::Result<(File, bool)> {
        let open = |flags, mode| rustix::fs::openat2(&self.dir, name, flags, mode, RESOLVE);
        let flags = OFlags::RDWR | OPEN;
        match open(
            flags | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => return Ok((File::from(fd), true)),
            Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        // Not opened at all if not a regular file (a device, a FIFO).
        self.check(
            name,
            &rustix::fs::statat(&self.dir, name, AtFlags::SYMLINK_NOFOLLOW)?,
        )?;
        let fd = open(flags, Mode::empty())?;
        self.check(name, &rustix::fs::fstat(&fd)?)?;
        Ok((File::from(fd), false))
    }

    /// Whether a file `name` of status `st` may be the cache's.
    fn check(&self, name: &str, st: &Stat) -> io::Result<()> {
        if !is_regular(st) {
            Err(not_ours(name, "is not a regular file"))
        } else if st.st_uid != self.owner {
            Err(not_ours(name, "belongs to another user"))
        } else if st.st_nlink != 1 {
            Err(not_ours(name, "has other links"))
        } else {
            Ok(())
        }
    }

    /// The cache's objects: the files named as the cache's whose map is a
    /// regular file starting with the magic.
    fn entries(&self) -> io::Result<Vec<Entry>> {
        let dir = rustix::fs::openat(&self.dir, ".", OFlags::DIRECTORY | OPEN, Mode::empty())?;
        let mut entries = Vec::new();
        for entry in rustix::fs::Dir::read_from(&dir)? {
            let entry = entry?;
            let Some(name) = entry
                .file_name()
                .to_str()
                .ok()
                .and_then(|n| n.strip_suffix(MAP))
            else {
                continue;
            };
            if !is_cache_name(name) {
                continue;
            }
            let Some((map_taken, last_used)) = self.map_entry(&format!("{name}{MAP}")) else {
                continue;
            };
            let data = rustix::fs::statat(&self.dir, name, AtFlags::SYMLINK_NOFOLLOW);
            let data_taken = data.ok().filter(is_regular).map_or(0, |st| taken(&st));
            entries.push(Entry {
                name: name.to_owned(),
                last_used,
                taken: map_taken.saturating_add(data_taken),
            });
        }
        Ok(entries)
    }

    /// The bytes the map `name` takes and when it was last used (its
    /// mtime), if it is a regular file starting with the magic.
    fn map_entry(&self, name: &str) -> Option<(u64, SystemTime)> {
        let st = rustix::fs::statat(&self.dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        if !is_regular(&st) {
            return None;
        }
        let fd = rustix::fs::openat2(
            &self.dir,
            name,
            OFlags::RDONLY | OPEN,
            Mode::empty(),
            RESOLVE,
        );
        let mut magic = [0; MAGIC.len()];
        let read = File::from(fd.ok()?).read_exact_at(&mut magic, 0);
        let mtime = Duration::new(
            u64::try_from(st.st_mtime).unwrap_or(0),
            u32::try_from(st.st_mtime_nsec).unwrap_or(0),
        );
        (read.is_ok() && magic == *MAGIC).then_some((taken(&st), SystemTime::UNIX_EPOCH + mtime))
    }

    /// Adds `n` bytes to the count; drops objects if over the limit.
    fn grew(&self, n: u64) {
        if self.used.fetch_add(n, Ordering::Relaxed).saturating_add(n) > self.max {
            // Failing to drop only costs space: the next write tries again.
            let _ = self.evict_if_full();
        }
    }

    /// Tells the open objects named `name`, whose files were just removed,
    /// that they were.
    fn evicted(&self, name: &str) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for object in open.iter().filter_map(Weak::upgrade) {
            if object.name == name {
                object.evicted();
            }
        }
    }

    /// Counts what the cache takes; if over its limit, drops the least
    /// recently used objects until it takes at most 90% of it, so that
    /// the next writes do not count and drop again at once.
    fn evict_if_full(&self) -> io::Result<()> {
        let _one_at_a_time = self.evicting.lock().unwrap_or_else(|e| e.into_inner());
        let mut entries = self.entries()?;
        let mut used = entries
            .iter()
            .fold(0, |sum: u64, e| sum.saturating_add(e.taken));
        if used > self.max {
            entries.sort_by_key(|e| e.last_used);
            let low = self.max - self.max / 10;
            for entry in &entries {
                if used <= low {
                    break;
                }
                // The bytes first, then the map (see `object`).
                let _ = rustix::fs::unlinkat(&self.dir, &entry.name, AtFlags::empty());
                let map = format!("{}{MAP}", entry.name);
                let _ = rustix::fs::unlinkat(&self.dir, map, AtFlags::empty());
                self.evicted(&entry.name);
                used = used.saturating_sub(entry.taken);
            }
        }
        self.used.store(used, Ordering::Relaxed);
        Ok(())
    }
}

/// One object's bytes in the cache.
pub(crate) struct CachedObject {
    cache: Arc<DiskCache>,
    /// Its name in the cache.
    name: String,
    data: File,
    map: File,
    state: Mutex<Map>,
    /// Its files were removed from the cache while it was open: they are
    /// neither read nor written any more.
    evicted: AtomicBool,
}

/// A map in memory.
#[derive(Debug, PartialEq)]
struct Map {
    /// The object's size (0: not known yet), at most the cache's largest.
    size: u64,
    /// A bit per block, up to the last block held at most.
    bits: Vec<u8>,
}

/// The bytes of the bitmap of an object of `size` bytes (at most 32 MiB
/// for [`MAX_OBJECT`]).
fn bitmap_len(size: u64) -> u64 {
    size.div_ceil(BLOCK).div_ceil(8)
}

/// The bytes of the bitmap that `blocks` touch: the first one's index, and
/// in each the bits of `blocks`.
fn masks(blocks: &Range<u64>) -> (usize, Vec<u8>) {
    let first = blocks.start / 8;
    let len = blocks.end.div_ceil(8).saturating_sub(first);
    let mut masks = vec![0u8; usize::try_from(len).unwrap_or(0)];
    for block in blocks.clone() {
        if let Some(byte) = usize::try_from(block / 8 - first)
            .ok()
            .and_then(|i| masks.get_mut(i))
        {
            *byte |= 1 << (block % 8);
        }
    }
    (usize::try_from(first).unwrap_or(usize::MAX), masks)
}

impl Map {
    /// The map in `file` (named `name`), and whether it was new (empty:
    /// the header is written then). A map claiming an object larger than
    /// `largest` is emptied; no more of it is read than its object needs.
    fn read(file: &File, name: &str, largest: u64) -> io::Result<(Self, bool)> {
        let mut map = Map {
            size: 0,
            bits: Vec::new(),
        };
        let len = file.metadata()?.len();
        if len == 0 {
            map.reset(file, 0)?;
            return Ok((map, true));
        }
        let mut header = [0; HEADER as usize];
        if len < HEADER || file.read_exact_at(&mut header, 0).is_err() || header[..8] != *MAGIC {
            return Err(not_ours(name, "does not start with the magic of a map"));
        }
        let (_, size) = header.split_at(MAGIC.len());
        let size = u64::from_le_bytes(size.try_into().expect("8 bytes"));
        if size > largest {
            map.reset(file, 0)?;
            return Ok((map, false));
        }
        map.size = size;
        let bits = (len - HEADER).min(bitmap_len(size));
        map.bits = vec![0; usize::try_from(bits).unwrap_or(0)];
        file.read_exact_at(&mut map.bits, HEADER)?;
        Ok((map, false))
    }

    /// Sets the object's size, in memory and in `file`. A size known
    /// already and different is another object's (a server lied, then or
    /// now): the blocks held are dropped.
    fn set_size(&mut self, file: &File, size: u64) -> io::Result<()> {
        if self.size != 0 {
            return self.reset(file, size);
        }
        self.size = size;
        locked(file, || {
            file.write_all_at(&size.to_le_bytes(), MAGIC.len() as u64)
        })
    }

    /// Empties the map, for an object of `size` bytes, in memory and in
    /// `file`.
    fn reset(&mut self, file: &File, size: u64) -> io::Result<()> {
        self.size = size;
        self.bits.clear();
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&size.to_le_bytes());
        locked(file, || {
            file.set_len(HEADER)?;
            file.write_all_at(&header, 0)
        })
    }

    fn has(&self, block: u64) -> bool {
        usize::try_from(block / 8)
            .ok()
            .and_then(|i| self.bits.get(i))
            .is_some_and(|b| b & (1 << (block % 8)) != 0)
    }

    /// Whether every block of `pos..pos + len` is held.
    fn holds(&self, pos: u64, len: u64) -> bool {
        pos.checked_add(len)
            .is_some_and(|end| (pos / BLOCK..end.div_ceil(BLOCK)).all(|b| self.has(b)))
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

    /// Stops using its files, removed from the cache: nothing is held any
    /// more, and the space of its bytes is given back now rather than when
    /// it is closed, so that the cache keeps to its limit. (A write already
    /// under way may still land in the removed file: one piece at most.)
    fn evicted(&self) {
        let mut map = self.lock();
        self.evicted.store(true, Ordering::Relaxed);
        map.bits.clear();
        let _ = self.data.set_len(0);
        let _ = self.map.set_len(0);
    }

    /// Whether its files were removed from the cache, by this mount or
    /// by another one sharing the directory (which cannot tell this one):
    /// then it stops using them, as [`CachedObject::evicted`] says.
    fn is_evicted(&self) -> bool {
        if self.evicted.load(Ordering::Relaxed) {
            return true;
        }
        // Either file: another mount may have made a new data file beside
        // a map about to go. Only the link count is asked for (a full
        // `stat` would make every later write take a fine-grained time).
        let unlinked = |file: &File| {
            rustix::fs::statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::NLINK)
                .is_ok_and(|st| st.stx_mask & StatxFlags::NLINK.bits() != 0 && st.stx_nlink == 0)
        };
        let removed = unlinked(&self.data) || unlinked(&self.map);
        if removed {
            self.evicted();
        }
        removed
    }

    /// Fills `buf` from `pos` if every block it touches is held.
    pub(crate) fn read(&self, buf: &mut [u8], pos: u64) -> bool {
        !self.is_evicted()
            && self.lock().holds(pos, buf.len() as u64)
            && self.data.read_exact_at(buf, pos).is_ok()
    }

    /// Keeps `bytes`, fetched from `pos` of an object of `size` bytes: the
    /// whole blocks among them (and a last partial block at the end).
    /// Nothing is kept of an object larger than the cache keeps, nor of
    /// bytes past `size`.
    pub(crate) fn record(&self, bytes: &[u8], pos: u64, size: u64) {
        let Some(end) = pos.checked_add(bytes.len() as u64) else {
            return;
        };
        if size > self.cache.largest || end > size || self.is_evicted() {
            return;
        }
        // From here on, offsets are at most `MAX_OBJECT` and a block.
        let first = pos.div_ceil(BLOCK);
        let last = if end == size {
            end.div_ceil(BLOCK)
        } else {
            end / BLOCK
        };
        if first >= last {
            return;
        }
        let (from, to) = (first * BLOCK, (last * BLOCK).min(end));
        let Some(piece) = bytes.get((from - pos) as usize..(to - pos) as usize) else {
            return;
        };
        if self.data.write_all_at(piece, from).is_err() {
            return;
        }
        let mut map = self.lock();
        if self.evicted.load(Ordering::Relaxed)
            || (map.size != size && map.set_size(&self.map, size).is_err())
        {
            return;
        }
        let grown = self.update(&mut map, first..last, true);
        drop(map);
        self.cache.grew(grown * BLOCK);
    }

    /// Drops the blocks of `len` bytes at `offset` (they failed
    /// verification); returns whether any was held.
    pub(crate) fn forget(&self, offset: u64, len: u64) -> bool {
        let mut map = self.lock();
        // Blocks past the bitmap in memory were not read from here.
        let held = map.bits.len() as u64 * 8;
        let start = (offset / BLOCK).min(held);
        let end = offset.saturating_add(len).div_ceil(BLOCK).min(held);
        if !(start..end).any(|b| map.has(b)) {
            return false;
        }
        self.update(&mut map, start..end, false);
        true
    }

    /// Sets (`on`) or clears the bits of `blocks` in `map` and in the map
    /// file; returns how many were newly set in memory. The file's bytes
    /// are read, changed and written back under its lock: bits set there
    /// by another mount are kept, and learnt. If the file cannot be
    /// written, memory changes all the same.
    fn update(&self, map: &mut Map, blocks: Range<u64>, on: bool) -> u64 {
        let (first, masks) = masks(&blocks);
        let end = first.saturating_add(masks.len());
        if map.bits.len() < end {
            map.bits.resize(end, 0);
        }
        let Some(mine) = map.bits.get_mut(first..end) else {
            return 0;
        };
        let change = |bytes: &mut [u8]| {
            for (byte, mask) in bytes.iter_mut().zip(&masks) {
                *byte = if on { *byte | mask } else { *byte & !mask };
            }
        };
        let newly = (mine.iter().zip(&masks))
            .map(|(byte, mask)| u64::from((mask & !byte).count_ones()))
            .sum();
        let at = HEADER + first as u64;
        let stored = locked(&self.map, || {
            let mut bytes = vec![0; masks.len()];
            read_upto(&self.map, &mut bytes, at)?;
            change(&mut bytes);
            self.map.write_all_at(&bytes, at)?;
            Ok(bytes)
        });
        match stored {
            Ok(bytes) => mine.copy_from_slice(&bytes),
            Err(_) => change(mine),
        }
        if on {
            newly
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of `range` if every block is held.
    fn read_range(object: &CachedObject, range: Range<u64>) -> Option<Vec<u8>> {
        let len = range.end.checked_sub(range.start)?;
        // Held blocks bound the length before anything is allocated.
        if !object.lock().holds(range.start, len) {
            return None;
        }
        let mut buf = vec![0; usize::try_from(len).ok()?];
        object.read(&mut buf, range.start).then_some(buf)
    }

    const HEX64: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// A cache in a new directory of its own, at most `max` bytes.
    fn cache(max: u64) -> (tempfile::TempDir, Arc<DiskCache>) {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(&dir.path().join("cache"), max).unwrap();
        (dir, cache)
    }

    fn name(i: u8) -> String {
        format!("objects-sha256-{:02x}{}", i, &HEX64[2..])
    }

    #[test]
    fn only_the_cache_names_are_its() {
        let hex128 = HEX64.repeat(2);
        for good in [
            format!("objects-sha256-{HEX64}"),
            format!("objects-sha512-{hex128}"),
            format!("manifest-sha256-{HEX64}"),
            format!("manifest-{HEX64}"),
            format!("manifest-{hex128}"),
        ] {
            assert!(is_cache_name(&good), "{good}");
        }
        for bad in [
            "app.js".to_owned(),
            "objects-sha256-".to_owned(),
            format!("objects-sha256-{}", HEX64.to_uppercase()),
            format!("objects-sha512-{HEX64}"),
            format!("objects-md5-{HEX64}"),
            format!("objects-{HEX64}"),
            format!("objects-sha256-{HEX64}0"),
            format!("objects-sha256-{HEX64}.map"),
            format!("manifest-sha256-{}", &HEX64[1..]),
            format!("manifests-sha256-{HEX64}"),
            format!("../objects-sha256-{HEX64}"),
        ] {
            assert!(!is_cache_name(&bad), "{bad}");
        }
    }

    #[test]
    fn masks_cover_the_blocks_and_no_more() {
        assert_eq!(masks(&(0..8)), (0, vec![0xff]));
        assert_eq!(masks(&(3..5)), (0, vec![0b11000]));
        assert_eq!(masks(&(7..17)), (0, vec![0x80, 0xff, 0x01]));
        assert_eq!(masks(&(16..16)), (2, vec![]));
        let (first, m) = masks(&((1 << 28) - 1..1 << 28));
        assert_eq!((first, m), ((1 << 25) - 1, vec![0x80]));
    }

    #[test]
    fn recorded_blocks_read_back_and_count_once() {
        let (_dir, cache) = cache(1 << 30);
        let object = cache.object(&name(1)).unwrap();
        let size = 3 * BLOCK + 100;
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        // Partial blocks at either end are not kept, but the object's end.
        object.record(&data[10..2 * BLOCK as usize + 5], 10, size);
        assert!(read_range(&object, BLOCK..2 * BLOCK).is_some());
        assert!(read_range(&object, 0..BLOCK).is_none());
        assert!(read_range(&object, BLOCK..2 * BLOCK + 1).is_none());
        let used = cache.used.load(Ordering::Relaxed);
        object.record(&data, 0, size);
        assert_eq!(cache.used.load(Ordering::Relaxed), used + 3 * BLOCK);
        object.record(&data, 0, size);
        assert_eq!(cache.used.load(Ordering::Relaxed), used + 3 * BLOCK);
        let all = read_range(&object, 0..size).unwrap();
        assert_eq!(&all[..], &data[..]);
        assert_eq!(object.size(), Some(size));

        // A remount finds them.
        drop(object);
        let object = cache.object(&name(1)).unwrap();
        assert_eq!(object.size(), Some(size));
        assert_eq!(&read_range(&object, 0..size).unwrap()[..], &data[..]);
        assert!(object.forget(BLOCK + 1, 1));
        assert!(!object.forget(BLOCK, 1));
        assert!(read_range(&object, 0..BLOCK).is_some());
        assert!(read_range(&object, BLOCK..2 * BLOCK).is_none());
    }

    #[test]
    fn claimed_sizes_and_ranges_cannot_overflow_or_blow_up() {
        let (_dir, cache) = cache(1 << 30);
        let object = cache.object(&name(2)).unwrap();
        let block = vec![7; BLOCK as usize];
        // Larger than the cache, past the claimed size, at the end of u64.
        object.record(&block, 0, u64::MAX);
        object.record(&block, 1 << 43, 1 << 43);
        object.record(&block, (1 << 30) - BLOCK + 1, 1 << 30);
        object.record(&block, u64::MAX - 10, u64::MAX);
        object.record(&block, 8 * BLOCK, BLOCK);
        assert_eq!(
            *object.lock(),
            Map {
                size: 0,
                bits: vec![]
            }
        );
        // The largest object kept: its last block.
        object.record(&block, (1 << 30) - BLOCK, 1 << 30);
        assert_eq!(object.size(), Some(1 << 30));
        assert_eq!(object.lock().bits.len(), 1 << 15);
        assert!(read_range(&object, (1 << 30) - BLOCK..1 << 30).is_some());
        assert!(read_range(&object, Range { start: 10, end: 5 }).is_none());
        assert!(read_range(&object, 0..u64::MAX).is_none());
        assert!(!object.read(&mut [0; 8], u64::MAX - 4));
        // Forgetting past the bitmap does not grow it.
        assert!(!object.forget(1 << 40, 1 << 40));
        assert!(!object.forget(u64::MAX - 1, u64::MAX));
        assert_eq!(object.lock().bits.len(), 1 << 15);
    }

    #[test]
    fn a_map_claiming_a_huge_object_is_emptied_not_read() {
        let (dir, cache) = cache(1 << 30);
        let map_path = dir.path().join("cache").join(format!("{}.map", name(3)));
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&(1u64 << 43).to_le_bytes());
        std::fs::write(&map_path, &bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&map_path)
            .unwrap()
            .set_len(HEADER + (1 << 28))
            .unwrap();
        let object = cache.object(&name(3)).unwrap();
        assert_eq!(
            *object.lock(),
            Map {
                size: 0,
                bits: vec![]
            }
        );
        assert_eq!(std::fs::metadata(&map_path).unwrap().len(), HEADER);

        // A map longer than its object's size needs: read up to that.
        bytes[8..].copy_from_slice(&(100 * BLOCK).to_le_bytes());
        bytes.extend_from_slice(&[0xff; 4096]);
        std::fs::write(&map_path, &bytes).unwrap();
        std::fs::write(dir.path().join("cache").join(name(3)), [1]).unwrap();
        let object = cache.object(&name(3)).unwrap();
        assert_eq!(object.lock().bits.len(), 13);
    }

    #[test]
    fn files_the_cache_did_not_make_are_left_alone() {
        let (dir, cache) = cache(1 << 30);
        let path = |n: &str| dir.path().join("cache").join(n);
        let refused = |i: u8, why: &str| {
            let e = cache.object(&name(i)).err().expect("refused");
            assert!(e.to_string().contains(why), "{e}");
        };
        // Not a map.
        std::fs::write(path(&format!("{}.map", name(4))), b"not a map at all").unwrap();
        refused(4, "does not start with the magic of a map");
        assert_eq!(
            std::fs::read(path(&format!("{}.map", name(4)))).unwrap(),
            b"not a map at all"
        );
        // A hard link (as the bytes, then as the map).
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, b"precious").unwrap();
        std::fs::hard_link(&elsewhere, path(&name(5))).unwrap();
        refused(5, "has other links");
        // Its map is there now, and valid.
        refused(5, "has other links");
        std::fs::hard_link(&elsewhere, path(&format!("{}.map", name(6)))).unwrap();
        refused(6, ".map in the cache directory has other links");
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"precious");
        // Bytes without a map; a FIFO; a directory; a symlink.
        std::fs::write(path(&name(7)), b"mine").unwrap();
        refused(7, "has no map");
        refused(7, "has no map");
        assert_eq!(std::fs::read(path(&name(7))).unwrap(), b"mine");
        rustix::fs::mknodat(
            &cache.dir,
            name(8),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        refused(8, "is not a regular file");
        std::fs::create_dir(path(&format!("{}.map", name(9)))).unwrap();
        refused(9, "is not a regular file");
        std::os::unix::fs::symlink(&elsewhere, path(&name(10))).unwrap();
        refused(10, "is not a regular file");
        let e = cache.object("app.js").err().unwrap();
        assert!(e.to_string().contains("not a name the cache gives"), "{e}");
    }

    #[test]
    fn eviction_drops_only_the_cache_objects_down_to_90_percent() {
        let max = 64 * BLOCK;
        let (dir, cache) = cache(max);
        let path = |n: &str| dir.path().join("cache").join(n);
        for unrelated in [
            "app.js",
            "app.js.map",
            "objects-sha256-x",
            "objects-sha256-x.map",
        ] {
            std::fs::write(path(unrelated), vec![1; 40 * BLOCK as usize]).unwrap();
        }
        // Named as the cache's, but its map has no magic.
        std::fs::write(path(&name(20)), vec![1; 40 * BLOCK as usize]).unwrap();
        std::fs::write(path(&format!("{}.map", name(20))), b"no magic").unwrap();
        let block = vec![3; 10 * BLOCK as usize];
        for i in 0..10 {
            let object = cache.object(&name(i)).unwrap();
            object.record(&block, 0, 10 * BLOCK);
        }
        let used = cache.used.load(Ordering::Relaxed);
        assert!(used <= max, "{used}");
        let kept = (0..10)
            .filter(|&i| path(&name(i)).exists() && path(&format!("{}.map", name(i))).exists())
            .count();
        assert!((1..10).contains(&kept), "{kept} kept");
        for unrelated in [
            "app.js",
            "app.js.map",
            "objects-sha256-x",
            "objects-sha256-x.map",
        ] {
            assert!(path(unrelated).exists(), "{unrelated} was dropped");
        }
        assert!(path(&name(20)).exists());
    }

    #[test]
    fn two_mounts_sharing_a_map_keep_each_other_s_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let a = DiskCache::open(&dir.path().join("cache"), 1 << 30).unwrap();
        let b = DiskCache::open(&dir.path().join("cache"), 1 << 30).unwrap();
        let (a, b) = (a.object(&name(1)).unwrap(), b.object(&name(1)).unwrap());
        let size = 16 * BLOCK;
        let data = vec![9; size as usize];
        a.record(&data[..BLOCK as usize], 0, size);
        b.record(&data[BLOCK as usize..2 * BLOCK as usize], BLOCK, size);
        // b learnt a's block; a learns b's when it writes that byte again.
        assert!(read_range(&b, 0..2 * BLOCK).is_some());
        a.record(
            &data[2 * BLOCK as usize..3 * BLOCK as usize],
            2 * BLOCK,
            size,
        );
        assert!(read_range(&a, 0..3 * BLOCK).is_some());
        drop((a, b));
        let cache = DiskCache::open(&dir.path().join("cache"), 1 << 30).unwrap();
        let object = cache.object(&name(1)).unwrap();
        assert!(read_range(&object, 0..3 * BLOCK).is_some());
        assert!(read_range(&object, 3 * BLOCK..4 * BLOCK).is_none());
    }

    #[test]
    fn an_object_another_mount_evicted_gives_its_space_back() {
        let dir = tempfile::tempdir().unwrap();
        let max = 64 * BLOCK;
        let a = DiskCache::open(&dir.path().join("cache"), max).unwrap();
        let b = DiskCache::open(&dir.path().join("cache"), max).unwrap();
        let size = 40 * BLOCK;
        let data = vec![5; size as usize];
        let held = a.object(&name(1)).unwrap();
        held.record(&data[..20 * BLOCK as usize], 0, size);
        assert!(read_range(&held, 0..BLOCK).is_some());
        // b fills the cache: a's object, the least recently used, goes.
        for i in [2, 3] {
            b.object(&name(i)).unwrap().record(&data, 0, size);
        }
        assert!(!dir.path().join("cache").join(name(1)).exists());
        // a finds out at its next write (or read), and keeps nothing more.
        held.record(&data[20 * BLOCK as usize..], 20 * BLOCK, size);
        assert_eq!(held.data.metadata().unwrap().len(), 0);
        assert!(read_range(&held, 0..BLOCK).is_none());
        assert!(read_range(&held, 20 * BLOCK..21 * BLOCK).is_none());
        // Only the map gone (a new data file made beside it meanwhile): a
        // read finds out.
        let other = a.object(&name(4)).unwrap();
        other.record(&data[..BLOCK as usize], 0, size);
        assert!(read_range(&other, 0..BLOCK).is_some());
        std::fs::remove_file(dir.path().join("cache").join(format!("{}.map", name(4)))).unwrap();
        assert!(read_range(&other, 0..BLOCK).is_none());
        assert_eq!(other.data.metadata().unwrap().len(), 0);
    }

    #[test]
    fn a_directory_of_another_user_or_writable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        rustix::fs::chmod(&cache, Mode::from_raw_mode(0o777)).unwrap();
        let e = DiskCache::open(&cache, 1 << 30).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            e.to_string().contains("writable by other users (mode 777)"),
            "{e}"
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&cache, &link).unwrap();
        let e = DiskCache::open(&link, 1 << 30).err().unwrap();
        assert!(
            e.to_string().contains("is a symbolic link, not followed"),
            "{e}"
        );
    }

    #[test]
    fn a_path_through_another_user_s_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let nobody = rustix::fs::Uid::from_raw(65534);
        rustix::fs::chownat(
            rustix::fs::CWD,
            &link,
            Some(nobody),
            None,
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .expect("giving a link to another user (the tests run as root)");
        let e = DiskCache::open(&link.join("cache"), 1 << 30).err().unwrap();
        assert!(e.to_string().contains("symbolic link of uid 65534"), "{e}");
        assert!(!victim.join("cache").exists());
    }
}
