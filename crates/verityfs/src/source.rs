//! Where a verity file's bytes come from: a [`Source`] of byte ranges.
//!
//! The verified read path (verification, the tree block cache, Merkle tree
//! readahead) is one implementation over this trait: a local [`File`] (with
//! the very system calls the read path always made: `pread`, `preadv`,
//! `posix_fadvise(WILLNEED)`) and a remote object alike.
//!
//! An open file holds its sources as `Arc<dyn Source>` rather than being
//! generic over them: a read makes one call for its data and one per run of
//! missing tree blocks or readahead hint, never one per block, so the
//! indirect call costs nothing measurable (callgrind on the `read_path`
//! benchmark's `--count` mode: the same instructions per read as direct
//! `File` calls, within 0.01%, for 100-byte, 4 KiB and 128 KiB reads),
//! while a single [`VerityFile`](crate::VerityFile) type serves every kind
//! of source, without making the FUSE and CLI code generic, and the data
//! and the tree can share one source (an image object holds both).

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::num::NonZeroU64;
use std::ops::{Deref, Range};
use std::os::unix::fs::FileExt;

use rustix::fs::{fadvise, Advice};

/// The most buffers one `preadv` takes (Linux's `IOV_MAX`).
const MAX_IOVECS: usize = 1024;

/// Positioned reads of an immutable run of bytes (a file, an object on a
/// server). Nothing read from a source is trusted: the read path checks it.
pub trait Source: Send + Sync {
    /// Fills `buf` from `offset`, like [`FileExt::read_exact_at`]: fails
    /// with [`io::ErrorKind::UnexpectedEof`] if the source ends first.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Fills `bufs` in order from `offset`, as one request where the source
    /// can (a run of tree blocks into the buffers the cache keeps). The
    /// default makes one [`Source::read_exact_at`] per buffer: a source
    /// where a request is costly (a range request) should override it.
    fn read_exact_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        let mut pos = offset;
        for buf in bufs {
            self.read_exact_at(buf, pos)?;
            pos += buf.len() as u64;
        }
        Ok(())
    }

    /// A hint that `len` bytes from `offset` will be read soon: start
    /// fetching them without waiting. Failures are ignored (they only cost
    /// speed); the default does nothing.
    fn prefetch(&self, _offset: u64, _len: u64) {}

    /// The number of bytes in the source.
    fn size(&self) -> io::Result<u64>;

    /// Says that the source's data (what streams read, and what is worth
    /// reading ahead) ends at `data_size`: what follows is the tree and the
    /// descriptor, fetched when the tree needs them. The default does
    /// nothing.
    fn data_ends_at(&self, _data_size: u64) {}

    /// The largest tree worth fetching whole, with the descriptor, when a
    /// verity file is opened (one request instead of several as reads need
    /// it). The default suits a local disk; a source where a request is a
    /// network round trip says more.
    fn open_tree_prefetch(&self) -> u64 {
        crate::open::TREE_PREFETCH_BYTES
    }

    /// The `len` bytes at `offset` failed verification: a source that keeps
    /// copies (a cache in memory or on disk) drops them, so that the next
    /// read fetches them again instead of failing for ever. Returns whether
    /// it dropped any: then reading them again may give other bytes. The
    /// default does nothing (a file has no copy of its own).
    fn invalidate(&self, _offset: u64, _len: u64) -> bool {
        false
    }

    /// The `len` bytes at `offset`, if the source holds them in memory
    /// that nobody changes while they are lent (bytes it fetched earlier):
    /// a reader then verifies and returns that very memory, with no copy.
    /// `None` if it does not hold them all; it may wait for bytes already
    /// on their way, but starts no read. The default lends nothing (a
    /// file's bytes can change under a reader: they are copied, then
    /// verified).
    fn lend(&self, _offset: u64, _len: usize) -> Option<Lent> {
        None
    }
}

/// Bytes a [`Source`] lent (see [`Source::lend`]): memory it keeps alive
/// and unchanged for as long as the loan lives.
pub struct Lent {
    bytes: Box<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl Lent {
    /// A loan of all of `bytes`, which must never change while it lives
    /// (an immutable, shared buffer).
    pub fn new(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Self {
        let len = bytes.as_ref().len();
        Lent {
            bytes: Box::new(bytes),
            range: 0..len,
        }
    }

    /// The part `range` of the loan (relative to it), or `None` if it
    /// reaches past its end.
    pub fn narrow(self, range: Range<usize>) -> Option<Self> {
        let start = self.range.start.checked_add(range.start)?;
        let end = self.range.start.checked_add(range.end)?;
        (range.start <= range.end && end <= self.range.end).then_some(Lent {
            bytes: self.bytes,
            range: start..end,
        })
    }
}

impl Deref for Lent {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.range.clone()]
    }
}

impl Source for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    /// One `preadv` for the whole run (of at most `IOV_MAX` buffers
    /// per call), retried after a short read or an interruption.
    fn read_exact_vectored_at(
        &self,
        mut bufs: &mut [IoSliceMut<'_>],
        mut pos: u64,
    ) -> io::Result<()> {
        while !bufs.is_empty() {
            let n = bufs.len().min(MAX_IOVECS);
            match rustix::io::preadv(self, &mut bufs[..n], pos) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(read) => {
                    pos += read as u64;
                    IoSliceMut::advance_slices(&mut bufs, read);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// `POSIX_FADV_WILLNEED`: the kernel starts reading the range.
    fn prefetch(&self, offset: u64, len: u64) {
        let _ = fadvise(self, offset, NonZeroU64::new(len), Advice::WillNeed);
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}
