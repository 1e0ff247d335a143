//! One object of a remote image as a [`Source`]: byte ranges fetched with
//! range requests, through the store's chunks in memory.
//!
//! A sequential stream (a read at the start, or next to the previous one)
//! is read in whole chunks, with the chunks after it requested ahead,
//! several in flight, the window doubling up to a limit: a stream pays one
//! round trip per window, not one per read. A read elsewhere fetches
//! exactly its bytes: a random 4 KiB read costs one round trip of 4 KiB.
//! Prefetch hints (the tree's levels, a small file at open) fetch whole
//! chunks that later reads find in memory.

use std::io::{self, IoSliceMut};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore};
use verityfs::Source;

use crate::chunks::{Key, Slot, CHUNK};
use crate::disk::CachedObject;
use crate::errors::{io_error, past_end};
use crate::runtime::within;
use crate::store::Remote;

/// The read-ahead window of a stream, in chunks: where it starts and the
/// most it grows to.
const WINDOW: Range<u64> = 2..32;

/// The size of an object not known yet.
const UNKNOWN: u64 = u64::MAX;

/// An object of the image.
pub(crate) struct Object {
    remote: Arc<Remote>,
    path: Path,
    /// The store's number for the object (its chunks' keys).
    id: u64,
    /// Its size, as the first response said ([`UNKNOWN`] before).
    size: Arc<AtomicU64>,
    /// The end of the last read of a stream, and its window.
    stream: Mutex<(u64, u64)>,
    /// The end of the object, when [`Source::size`] had to ask for it.
    tail: std::sync::OnceLock<(u64, Bytes)>,
    /// Its bytes on disk, with a cache directory.
    disk: Option<Arc<CachedObject>>,
    /// Where the data of the verity file it holds ends: streams read
    /// ahead up to there (the tree is fetched when the tree needs it).
    data_end: AtomicU64,
}

impl Object {
    pub(crate) fn new(
        remote: Arc<Remote>,
        path: Path,
        id: u64,
        disk: Option<Arc<CachedObject>>,
    ) -> Self {
        let size = disk.as_ref().and_then(|d| d.size()).unwrap_or(UNKNOWN);
        Object {
            remote,
            path,
            id,
            size: Arc::new(AtomicU64::new(size)),
            stream: Mutex::new((0, WINDOW.start)),
            tail: std::sync::OnceLock::new(),
            disk,
            data_end: AtomicU64::new(UNKNOWN),
        }
    }

    fn known_size(&self) -> Option<u64> {
        Some(self.size.load(Ordering::Relaxed)).filter(|&s| s != UNKNOWN)
    }

    fn key(&self, chunk: u64) -> Key {
        (self.id, chunk)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.remote.options.timeout
    }

    /// Fetches `range` now, on the calling thread.
    fn fetch_now(&self, range: GetRange) -> io::Result<Bytes> {
        let fetch = fetch(
            &self.remote.store,
            &self.path,
            range,
            &self.size,
            self.disk.as_deref(),
        );
        self.remote.rt.block_on(self.remote.options.timeout, fetch)
    }

    /// Starts fetching the run of chunks from `first` into `slots`, with
    /// one request (or from the disk cache).
    fn spawn_fetch(&self, first: u64, slots: Vec<Arc<Slot>>) {
        let (store, chunks) = (self.remote.store.clone(), self.remote.chunks.clone());
        let (path, size, disk) = (self.path.clone(), self.size.clone(), self.disk.clone());
        let (id, limit) = (self.id, self.remote.options.timeout);
        let mut range = first * CHUNK..(first + slots.len() as u64) * CHUNK;
        range.end = range.end.min(self.known_size().unwrap_or(UNKNOWN));
        self.remote.rt.spawn(async move {
            let result = match disk.as_ref().and_then(|d| d.read_range(range.clone())) {
                Some(bytes) => Ok(bytes),
                None => {
                    let range = GetRange::Bounded(range);
                    within(limit, fetch(&store, &path, range, &size, disk.as_deref())).await
                }
            };
            for (chunk, slot) in (first..).zip(slots) {
                let piece = result.as_ref().map(|bytes| {
                    let from = ((chunk - first) * CHUNK).min(bytes.len() as u64) as usize;
                    bytes.slice(from..(from + CHUNK as usize).min(bytes.len()))
                });
                let piece = piece.map_err(|e| io::Error::new(e.kind(), e.to_string()));
                chunks.finish((id, chunk), &slot, &piece);
            }
        });
    }

    /// Chunk `chunk`, fetched (or joined in flight) and waited for; `None`
    /// when the memory budget is all in flight.
    fn chunk(&self, chunk: u64, deadline: Instant) -> io::Result<Option<Bytes>> {
        let Some((slot, new)) = self.remote.chunks.claim(self.key(chunk)) else {
            return Ok(None);
        };
        if new {
            self.spawn_fetch(chunk, vec![slot.clone()]);
        }
        slot.wait(deadline).map(Some)
    }

    /// Starts fetching the chunks from `from`, as many as `window`, the
    /// budget and the object allow: one request per chunk (several in
    /// flight) for a stream, or one per run of missing chunks (`runs`).
    fn read_ahead(&self, from: u64, window: u64, runs: bool) {
        let end = match runs {
            true => self.known_size().unwrap_or(UNKNOWN),
            false => self.data_end.load(Ordering::Relaxed),
        };
        let end = end
            .min(self.known_size().unwrap_or(UNKNOWN))
            .div_ceil(CHUNK);
        let room = self.remote.chunks.room_ahead() as u64;
        let mut run: Vec<Arc<Slot>> = Vec::new();
        let mut run_start = from;
        for chunk in from..(from + window.min(room)).min(end) {
            match self.remote.chunks.claim(self.key(chunk)) {
                Some((slot, true)) if runs => run.push(slot),
                Some((slot, true)) => self.spawn_fetch(chunk, vec![slot]),
                _ if !run.is_empty() => self.spawn_fetch(run_start, std::mem::take(&mut run)),
                _ => {}
            }
            if run.is_empty() {
                run_start = chunk + 1;
            }
        }
        if !run.is_empty() {
            self.spawn_fetch(run_start, run);
        }
    }

    /// Whether a read of `range` continues a stream (then the chunks after
    /// it are requested ahead). A read from the start begins a stream; a
    /// read elsewhere that costs no request (`in_memory`: the descriptor
    /// and tree fetched when the file was opened) leaves the stream as it
    /// is, so that it does not take the next reads of the stream for
    /// random ones, fetched a second time.
    fn note_read(&self, range: &Range<u64>, in_memory: bool) -> bool {
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let (last_end, window) = &mut *stream;
        // Concurrent readers of one stream (the kernel's read-ahead, the
        // file system's threads) arrive a little out of order: a read
        // within the window behind the stream's end continues it too.
        let behind = *window * CHUNK;
        let sequential = range.start == 0
            || (range.start.saturating_add(behind) >= *last_end
                && range.start <= last_end.saturating_add(CHUNK));
        if !sequential && in_memory {
            return false;
        }
        *window = if sequential {
            (*window * 2).min(WINDOW.end)
        } else {
            WINDOW.start
        };
        *last_end = match range.start {
            0 => range.end,
            _ if sequential => range.end.max(*last_end),
            _ => range.end,
        };
        if sequential {
            self.read_ahead((range.end - 1) / CHUNK + 1, *window, false);
        }
        sequential
    }

    /// Fills `buf` from `pos` out of whole chunks.
    fn read_chunked(&self, mut buf: &mut [u8], mut pos: u64) -> io::Result<()> {
        let deadline = self.deadline();
        while !buf.is_empty() {
            let within = (pos % CHUNK) as usize;
            let n = buf.len().min(CHUNK as usize - within);
            let (piece, rest) = buf.split_at_mut(n);
            match self.chunk(pos / CHUNK, deadline)? {
                Some(bytes) => {
                    piece.copy_from_slice(bytes.get(within..within + n).ok_or_else(past_end)?)
                }
                None => self.read_exact(piece, pos)?,
            }
            (buf, pos) = (rest, pos + n as u64);
        }
        Ok(())
    }

    /// Fills `buf` from `pos` with one range request.
    fn read_exact(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        let bytes = self.fetch_now(GetRange::Bounded(pos..pos + buf.len() as u64))?;
        buf.copy_from_slice(bytes.get(..buf.len()).ok_or_else(past_end)?);
        Ok(())
    }

    /// Whether every chunk of `range` has arrived or is on its way.
    fn in_memory(&self, range: &Range<u64>) -> bool {
        (range.start / CHUNK..=(range.end - 1) / CHUNK)
            .all(|chunk| self.remote.chunks.get(self.key(chunk)).is_some())
    }

    /// `buf` from the end of the object fetched by [`Source::size`], if it
    /// lies there.
    fn read_tail(&self, buf: &mut [u8], range: &Range<u64>) -> bool {
        let Some((start, bytes)) = self.tail.get() else {
            return false;
        };
        let Some(piece) = range
            .start
            .checked_sub(*start)
            .and_then(|from| bytes.get(from as usize..from as usize + buf.len()))
        else {
            return false;
        };
        buf.copy_from_slice(piece);
        true
    }

    /// Fills `bufs` from `pos` out of the disk cache, if it holds them all.
    fn read_disk(&self, bufs: &mut [IoSliceMut<'_>], mut pos: u64) -> bool {
        let Some(disk) = &self.disk else {
            return false;
        };
        bufs.iter_mut().all(|buf| {
            let len = buf.len() as u64;
            let held = disk.read(buf, pos);
            pos += len;
            held
        })
    }

    /// The checks every read starts with: the range, or `None` for an
    /// empty read.
    fn range(&self, offset: u64, len: usize) -> io::Result<Option<Range<u64>>> {
        let end = offset.checked_add(len as u64).ok_or_else(past_end)?;
        if self.known_size().is_some_and(|size| end > size) {
            return Err(past_end());
        }
        Ok((len > 0).then_some(offset..end))
    }
}

impl Source for Object {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let Some(range) = self.range(offset, buf.len())? else {
            return Ok(());
        };
        if self.read_tail(buf, &range) || self.disk.as_ref().is_some_and(|d| d.read(buf, offset)) {
            return Ok(());
        }
        let in_memory = self.in_memory(&range);
        if self.note_read(&range, in_memory) || in_memory {
            self.read_chunked(buf, offset)
        } else {
            self.read_exact(buf, offset)
        }
    }

    /// A run of tree blocks: out of the chunks when they are in memory (the
    /// tree's read-ahead put them there), else with one range request.
    fn read_exact_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        let len = bufs.iter().map(|b| b.len()).sum();
        let Some(range) = self.range(offset, len)? else {
            return Ok(());
        };
        if self.read_disk(bufs, offset) {
            return Ok(());
        }
        let in_memory = self.in_memory(&range);
        let bytes = (!in_memory)
            .then(|| self.fetch_now(GetRange::Bounded(range.clone())))
            .transpose()?;
        let mut pos = offset;
        for buf in bufs {
            let len = buf.len();
            match &bytes {
                Some(bytes) => {
                    let from = (pos - offset) as usize;
                    buf.copy_from_slice(bytes.get(from..from + len).ok_or_else(past_end)?);
                }
                None => self.read_chunked(buf, pos)?,
            }
            pos += len as u64;
        }
        Ok(())
    }

    /// Whole chunks, fetched in the background, one request per run of
    /// chunks not in memory: a tree, however large, in one round trip.
    fn prefetch(&self, offset: u64, len: u64) {
        if len > 0 {
            let first = offset / CHUNK;
            self.read_ahead(first, (offset + len - 1) / CHUNK + 1 - first, true);
        }
    }

    fn data_ends_at(&self, data_size: u64) {
        self.data_end.store(data_size, Ordering::Relaxed);
    }

    /// A tree of up to 32 MiB (of 4 GiB of data with 4 KiB blocks) is
    /// fetched whole at open: a round trip costs more than the bytes.
    fn open_tree_prefetch(&self) -> u64 {
        32 << 20
    }

    /// The size a response said; else asks for the end of the object,
    /// which is kept: what is read next is there (a manifest's trailer and
    /// descriptor, all of a small manifest).
    fn size(&self) -> io::Result<u64> {
        if let Some(size) = self.known_size() {
            return Ok(size);
        }
        let bytes = self.fetch_now(GetRange::Suffix(CHUNK))?;
        let size = self.known_size().ok_or_else(past_end)?;
        let _ = self.tail.set((size - bytes.len() as u64, bytes));
        Ok(size)
    }

    /// Drops the chunks in memory and the blocks on disk of the range.
    fn invalidate(&self, offset: u64, len: u64) -> bool {
        let mut dropped = false;
        if len > 0 {
            for chunk in offset / CHUNK..=(offset + len - 1) / CHUNK {
                dropped |= self.remote.chunks.forget(self.key(chunk));
            }
        }
        if let Some(disk) = &self.disk {
            dropped |= disk.forget(offset, len);
        }
        dropped
    }
}

/// Fetches `range` of the object at `path`, recording its size, and
/// keeping the bytes on `disk`.
async fn fetch(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    range: GetRange,
    size: &AtomicU64,
    disk: Option<&CachedObject>,
) -> io::Result<Bytes> {
    let options = GetOptions {
        range: Some(range),
        ..GetOptions::default()
    };
    let result = store.get_opts(path, options).await.map_err(io_error)?;
    size.store(result.meta.size, Ordering::Relaxed);
    let (start, total) = (result.range.start, result.meta.size);
    let expected = result.range.end - start;
    let bytes = result.bytes().await.map_err(io_error)?;
    if bytes.len() as u64 != expected {
        return Err(past_end());
    }
    if let Some(disk) = disk {
        disk.record(&bytes, start, total);
    }
    Ok(bytes)
}
