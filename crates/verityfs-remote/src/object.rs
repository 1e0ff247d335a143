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
use object_store::GetRange;
use verityfs::{Lent, Source};

use crate::chunks::{Key, Slot, CHUNK};
use crate::disk::CachedObject;
use crate::errors::past_end;
use crate::fetch::{cached_chunk, Origin, Run};
use crate::runtime::within;
use crate::store::Remote;

/// The read-ahead window of a stream, in chunks: where it starts and the
/// most it grows to.
const WINDOW: Range<u64> = 2..32;

/// The chunks a stream keeps behind the one it reads: as many as the
/// kernel's read-ahead has reads in flight (12 of at most 1 MiB by
/// default), which the mount's read workers may serve in any order.
const KEPT_BEHIND: u64 = 6;

/// The size of an object not known yet.
const UNKNOWN: u64 = u64::MAX;

/// A sequential stream.
struct Stream {
    /// The end of its last read.
    end: u64,
    /// How many chunks it reads ahead.
    window: u64,
    /// The chunk from which it has not given chunks back.
    given_back: u64,
}

/// An object of the image.
pub(crate) struct Object {
    remote: Arc<Remote>,
    path: Path,
    /// The store's number for the object (its chunks' keys).
    id: u64,
    /// Its size, as the last response said ([`UNKNOWN`] before).
    size: Arc<AtomicU64>,
    /// The sequential stream reading it.
    stream: Mutex<Stream>,
    /// The end of the object, when [`Source::size`] had to ask for it
    /// (dropped by [`Source::invalidate`]).
    tail: Mutex<Option<(u64, Bytes)>>,
    /// Its bytes on disk, with a cache directory.
    disk: Option<Arc<CachedObject>>,
    /// Whether the size the disk cache keeps was found wrong
    /// ([`Source::invalidate`]): then only the server's answer counts.
    disk_size_wrong: std::sync::atomic::AtomicBool,
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
        Object {
            remote,
            path,
            id,
            // Only what the server says in this mount: a size kept on disk
            // is a hint for reading the disk, never a reason to refuse a
            // read (a lie kept there would outlive the liar).
            size: Arc::new(AtomicU64::new(UNKNOWN)),
            stream: Mutex::new(Stream {
                end: 0,
                window: WINDOW.start,
                given_back: 0,
            }),
            tail: Mutex::new(None),
            disk,
            disk_size_wrong: std::sync::atomic::AtomicBool::new(false),
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

    /// Fetches `range` now, on the calling thread, by `deadline`.
    fn fetch_now(&self, range: GetRange, deadline: Instant) -> io::Result<Bytes> {
        let origin = Origin {
            store: &self.remote.store,
            path: &self.path,
            size: &self.size,
            disk: self.disk.clone(),
        };
        let limit = deadline.saturating_duration_since(Instant::now());
        self.remote.rt.block_on(limit, origin.fetch(range))
    }

    /// Starts fetching the run of chunks from `first` into `slots`: those
    /// the disk cache holds from there, the rest with one request.
    fn spawn_fetch(&self, first: u64, slots: Vec<Arc<Slot>>) {
        let mut run = Run {
            chunks: self.remote.chunks.clone(),
            id: self.id,
            next: first,
            slots: slots.into(),
        };
        let (store, path) = (self.remote.store.clone(), self.path.clone());
        let (size, disk, limit) = (
            self.size.clone(),
            self.disk.clone(),
            self.remote.options.timeout,
        );
        self.remote.rt.spawn(async move {
            while let (Some(d), false) = (&disk, run.slots.is_empty()) {
                let range = run.next * CHUNK..(run.next + 1) * CHUNK;
                let buffer = run.chunks.buffer();
                match cached_chunk(d.clone(), range, buffer).await {
                    Some(bytes) => run.finish_next(&Ok(bytes)),
                    None => break,
                }
            }
            if run.slots.is_empty() {
                return;
            }
            let origin = Origin {
                store: &store,
                path: &path,
                size: &size,
                disk,
            };
            if let Err(e) = within(limit, origin.fetch_run(&mut run)).await {
                run.finish_rest(&Err(e));
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
        // Concurrent readers of one stream (the kernel's read-ahead, the
        // file system's threads) arrive a little out of order: a read
        // within the window behind the stream's end continues it too.
        let behind = stream.window * CHUNK;
        let sequential = range.start == 0
            || (range.start.saturating_add(behind) >= stream.end
                && range.start <= stream.end.saturating_add(CHUNK));
        if !sequential && in_memory {
            return false;
        }
        if range.start == 0 || !sequential {
            stream.given_back = range.start / CHUNK;
        }
        stream.window = match sequential {
            true => (stream.window * 2).min(WINDOW.end),
            false => WINDOW.start,
        };
        stream.end = match range.start {
            0 => range.end,
            _ if sequential => range.end.max(stream.end),
            _ => range.end,
        };
        if sequential {
            self.give_back_passed(&mut stream);
            self.read_ahead((range.end - 1) / CHUNK + 1, stream.window, false);
        }
        sequential
    }

    /// Gives back the chunks a stream has passed, all but the last
    /// [`KEPT_BEHIND`] (its reads arrive a little out of order): what it
    /// read is in the page cache now, and the chunks it reads next reuse
    /// their buffers.
    fn give_back_passed(&self, stream: &mut Stream) {
        let passed = (stream.end / CHUNK).saturating_sub(KEPT_BEHIND);
        for chunk in stream.given_back..passed {
            self.remote.chunks.forget(self.key(chunk));
        }
        stream.given_back = stream.given_back.max(passed);
    }

    /// Fills `buf` from `pos` out of whole chunks, by `deadline`. A chunk
    /// too short for the read (a response or a disk cache that said the
    /// object ends sooner) is dropped, and the bytes asked for exactly.
    fn read_chunked(&self, mut buf: &mut [u8], mut pos: u64, deadline: Instant) -> io::Result<()> {
        while !buf.is_empty() {
            let within = (pos % CHUNK) as usize;
            let n = buf.len().min(CHUNK as usize - within);
            let (piece, rest) = buf.split_at_mut(n);
            match self.chunk(pos / CHUNK, deadline)? {
                Some(bytes) if bytes.len() >= within + n => {
                    piece.copy_from_slice(&bytes[within..within + n])
                }
                Some(_) => {
                    self.remote.chunks.forget(self.key(pos / CHUNK));
                    self.read_exact(piece, pos, deadline)?
                }
                None => self.read_exact(piece, pos, deadline)?,
            }
            (buf, pos) = (rest, pos + n as u64);
        }
        Ok(())
    }

    /// Fills `buf` from `pos` with one range request, by `deadline`.
    fn read_exact(&self, buf: &mut [u8], pos: u64, deadline: Instant) -> io::Result<()> {
        let range = GetRange::Bounded(pos..pos + buf.len() as u64);
        let bytes = self.fetch_now(range, deadline)?;
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
        let tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let Some((start, bytes)) = &*tail else {
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

    /// The range of a read of `len` bytes at `offset`, or `None` for an
    /// empty read. A read past the size a response gave still goes to the
    /// server: one lying response must not fail the reads that follow.
    fn range(&self, offset: u64, len: usize) -> io::Result<Option<Range<u64>>> {
        let end = offset.checked_add(len as u64).ok_or_else(past_end)?;
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
        let deadline = self.deadline();
        if self.note_read(&range, in_memory) || in_memory {
            self.read_chunked(buf, offset, deadline)
        } else {
            self.read_exact(buf, offset, deadline)
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
        let deadline = self.deadline();
        let bytes = (!in_memory)
            .then(|| self.fetch_now(GetRange::Bounded(range.clone()), deadline))
            .transpose()?;
        let mut pos = offset;
        for buf in bufs {
            let len = buf.len();
            match &bytes {
                Some(bytes) => {
                    let from = (pos - offset) as usize;
                    buf.copy_from_slice(bytes.get(from..from + len).ok_or_else(past_end)?);
                }
                None => self.read_chunked(buf, pos, deadline)?,
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

    /// The size a response said; else the size the disk cache keeps, so
    /// that a cached image mounts without the network (a wrong one fails
    /// the reads that follow, which drop it: [`Source::invalidate`]); else
    /// asks for the end of the object, which is kept: what is read next is
    /// there (a manifest's trailer and descriptor, all of a small
    /// manifest).
    fn size(&self) -> io::Result<u64> {
        if let Some(size) = self.known_size() {
            return Ok(size);
        }
        let disk_size = self.disk.as_ref().and_then(|d| d.size());
        if let Some(size) = disk_size.filter(|_| !self.disk_size_wrong.load(Ordering::Relaxed)) {
            return Ok(size);
        }
        let bytes = self.fetch_now(GetRange::Suffix(CHUNK), self.deadline())?;
        let size = self.known_size().ok_or_else(past_end)?;
        let start = size.checked_sub(bytes.len() as u64).ok_or_else(past_end)?;
        *self.tail.lock().unwrap_or_else(|e| e.into_inner()) = Some((start, bytes));
        Ok(size)
    }

    /// Lends out of a chunk that has arrived (what a stream reads, fetched
    /// ahead of it): a read lying in one chunk costs no copy. A chunk still
    /// on its way is not waited for here: the read that follows waits for
    /// it, within the read's deadline.
    fn lend(&self, offset: u64, len: usize) -> Option<Lent> {
        let range = self.range(offset, len).ok()??;
        let chunk = offset / CHUNK;
        if (range.end - 1) / CHUNK != chunk {
            return None;
        }
        let bytes = self.remote.chunks.get(self.key(chunk))?.ready()?;
        let within = (offset % CHUNK) as usize;
        let lent = Lent::new(bytes).narrow(within..within + len)?;
        self.note_read(&range, true);
        Some(lent)
    }

    /// Drops the chunks in memory and the blocks on disk of the range, and
    /// the object's size as told so far.
    fn invalidate(&self, offset: u64, len: u64) -> bool {
        let mut dropped = false;
        if len > 0 {
            for chunk in offset / CHUNK..=(offset + len - 1) / CHUNK {
                dropped |= self.remote.chunks.forget(self.key(chunk));
            }
        }
        if let Some(disk) = &self.disk {
            dropped |= disk.forget(offset, len);
            // A size only the disk told may be what was wrong: from now on
            // only a response's counts, and the caller may read again.
            dropped |= self.known_size().is_none()
                && disk.size().is_some()
                && !self.disk_size_wrong.swap(true, Ordering::Relaxed);
        }
        // So may a size a response told (one that lied once): asked again
        // when next needed.
        dropped |= self.size.swap(UNKNOWN, Ordering::Relaxed) != UNKNOWN;
        dropped
            | self
                .tail
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .is_some()
    }
}
