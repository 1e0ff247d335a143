//! Range requests: an exact range into one buffer, or a run of chunks,
//! each handed to its readers as soon as its bytes are in.
//!
//! A body is read frame by frame and refused as soon as it is longer than
//! the range asked for: a server cannot make the daemon hold more than it
//! asked for.

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::chunks::{Chunks, Slot, CHUNK};
use crate::disk::CachedObject;
use crate::errors::{io_error, past_end};

/// The most bytes one request asks for: a run of chunks fetched for a
/// prefetch hint (a tree fetched whole at open).
pub(crate) const MAX_FETCH: u64 = 64 << 20;

/// Where a fetch comes from, and where its bytes are kept besides memory.
pub(crate) struct Origin<'a> {
    pub(crate) store: &'a Arc<dyn ObjectStore>,
    pub(crate) path: &'a Path,
    /// The object's size, recorded from each response.
    pub(crate) size: &'a AtomicU64,
    pub(crate) disk: Option<Arc<CachedObject>>,
}

/// A response's body, checked frame by frame against its length.
struct Body {
    frames: BoxStream<'static, object_store::Result<Bytes>>,
    /// Where the body starts in the object, and the object's size.
    start: u64,
    total: u64,
    /// The bytes still to come.
    left: u64,
}

impl Origin<'_> {
    /// Asks for `range`; records the object's size.
    async fn get(&self, range: GetRange) -> io::Result<Body> {
        let options = GetOptions {
            range: Some(range),
            ..GetOptions::default()
        };
        let result = self
            .store
            .get_opts(self.path, options)
            .await
            .map_err(io_error)?;
        let (start, total) = (result.range.start, result.meta.size);
        let left = result.range.end.checked_sub(start).ok_or_else(past_end)?;
        self.size.store(total, Ordering::Relaxed);
        Ok(Body {
            frames: result.into_stream(),
            start,
            total,
            left,
        })
    }

    /// Keeps `bytes`, at `pos` in the object, on disk (off the runtime's
    /// threads, which every read's network I/O needs: a slow cache file
    /// system must not stall them).
    async fn record(&self, bytes: &Bytes, pos: u64, total: u64) {
        if let Some(disk) = self.disk.clone() {
            let kept = bytes.clone();
            let _ = tokio::task::spawn_blocking(move || disk.record(&kept, pos, total)).await;
        }
    }

    /// Fetches `range` into one buffer.
    pub(crate) async fn fetch(&self, range: GetRange) -> io::Result<Bytes> {
        let mut body = self.get(range).await?;
        let mut bytes = BytesMut::with_capacity(body.left.min(MAX_FETCH) as usize);
        while let Some(frame) = body.next().await? {
            bytes.extend_from_slice(&frame);
        }
        let bytes = bytes.freeze();
        self.record(&bytes, body.start, body.total).await;
        Ok(bytes)
    }

    /// Fetches the chunks of `run` with one request, finishing each as its
    /// last byte arrives: a reader of the first chunk of a long run waits
    /// for that chunk, not for the run.
    pub(crate) async fn fetch_run(&self, run: &mut Run) -> io::Result<()> {
        let first = run.next * CHUNK;
        let range = first..first + run.slots.len() as u64 * CHUNK;
        let mut body = self.get(GetRange::Bounded(range)).await?;
        if body.start != first {
            return Err(past_end());
        }
        let mut buffer = run.chunks.buffer();
        while let Some(mut frame) = body.next().await? {
            while frame.has_remaining() {
                let n = frame.len().min(CHUNK as usize - buffer.len());
                buffer.extend_from_slice(&frame[..n]);
                frame.advance(n);
                if buffer.len() == CHUNK as usize {
                    let full = std::mem::replace(&mut buffer, run.chunks.buffer());
                    self.finish_chunk(run, full.freeze(), body.total).await;
                }
            }
        }
        // The end of the object: a last chunk shorter than the others.
        match buffer.is_empty() {
            true => run.chunks.recycle(buffer),
            false => self.finish_chunk(run, buffer.freeze(), body.total).await,
        }
        // Chunks past the end of the object: empty (readers of them fetch
        // what they asked for exactly, and learn where the object ends).
        run.finish_rest(&Ok(Bytes::new()));
        Ok(())
    }

    async fn finish_chunk(&self, run: &mut Run, bytes: Bytes, total: u64) {
        self.record(&bytes, run.next * CHUNK, total).await;
        run.finish_next(&Ok(bytes));
    }
}

impl Body {
    /// The next frame, or `None` at the end; an error if the body is longer
    /// or shorter than its range.
    async fn next(&mut self) -> io::Result<Option<Bytes>> {
        match self.frames.next().await {
            Some(frame) => {
                let frame = frame.map_err(io_error)?;
                self.left = self.left.checked_sub(frame.len() as u64).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "response longer than its range")
                })?;
                Ok(Some(frame))
            }
            None if self.left > 0 => Err(past_end()),
            None => Ok(None),
        }
    }
}

/// The chunk at `range` (within one chunk) from the disk cache `disk`, if
/// it holds all of it, read into `buffer` off the runtime's threads. The
/// size the disk keeps is a hint for the object's last chunk only.
pub(crate) async fn cached_chunk(
    disk: Arc<CachedObject>,
    range: Range<u64>,
    mut buffer: BytesMut,
) -> Option<Bytes> {
    let read = move || {
        let end = disk.size().map_or(range.end, |size| range.end.min(size));
        let len = usize::try_from(end.checked_sub(range.start)?).ok()?;
        buffer.resize(len, 0);
        (len > 0 && disk.read(&mut buffer, range.start)).then(|| buffer.freeze())
    };
    tokio::task::spawn_blocking(read).await.ok().flatten()
}

/// A run of chunks being fetched with one request: its slots are finished
/// in order as their bytes arrive, and those left when the request ends (or
/// when the task is dropped first: a panic, the runtime shutting down) with
/// an error, so that no reader waits for a fetch that will never end and no
/// slot stays in flight for ever.
pub(crate) struct Run {
    pub(crate) chunks: Arc<Chunks>,
    pub(crate) id: u64,
    /// The index of the chunk of the first slot.
    pub(crate) next: u64,
    pub(crate) slots: VecDeque<Arc<Slot>>,
}

impl Run {
    /// Finishes the next slot with `result`.
    pub(crate) fn finish_next(&mut self, result: &io::Result<Bytes>) {
        if let Some(slot) = self.slots.pop_front() {
            self.chunks.finish((self.id, self.next), &slot, result);
            self.next += 1;
        }
    }

    /// Finishes every slot left with `result`.
    pub(crate) fn finish_rest(&mut self, result: &io::Result<Bytes>) {
        while !self.slots.is_empty() {
            self.finish_next(result);
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let cancelled = io::Error::new(io::ErrorKind::Interrupted, "the fetch was cancelled");
        self.finish_rest(&Err(cancelled));
    }
}
