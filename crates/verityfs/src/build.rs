//! Building a Merkle tree by streaming the data once.
//!
//! Memory is one block per tree level plus two read buffers, whatever the
//! file's size. Each tree block is handed to a [`TreeSink`] at its final
//! position in the stored tree as soon as it is complete, so the same code
//! computes a digest, writes `--out-merkle-tree` files and writes a tree into
//! place when enabling verity (kernel: `fs/verity/enable.c`,
//! libfsverity: `compute_root_hash()`).

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::geometry::TreeGeometry;
use crate::hash_algs::{Digest, SaltedHasher};
use crate::params::MerkleTreeParams;

/// Where finished tree blocks go.
pub trait TreeSink {
    /// Stores one tree block at byte position `pos` of the stored tree
    /// (top level first, level 0 last). Level 0 blocks come first in time,
    /// so positions are not increasing.
    fn write_tree_block(&mut self, pos: u64, block: &[u8]) -> io::Result<()>;
}

/// A sink that drops the tree: for computing a digest only.
#[derive(Debug, Default, Clone, Copy)]
pub struct DiscardTree;

impl TreeSink for DiscardTree {
    fn write_tree_block(&mut self, _pos: u64, _block: &[u8]) -> io::Result<()> {
        Ok(())
    }
}

/// Collects the stored tree in memory (for small trees and tests).
impl TreeSink for Vec<u8> {
    fn write_tree_block(&mut self, pos: u64, block: &[u8]) -> io::Result<()> {
        let pos = usize::try_from(pos).map_err(io::Error::other)?;
        if self.len() < pos + block.len() {
            self.resize(pos + block.len(), 0);
        }
        self[pos..pos + block.len()].copy_from_slice(block);
        Ok(())
    }
}

impl<S: TreeSink + ?Sized> TreeSink for &mut S {
    fn write_tree_block(&mut self, pos: u64, block: &[u8]) -> io::Result<()> {
        (**self).write_tree_block(pos, block)
    }
}

/// The partly filled block of one tree level.
struct PendingBlock {
    buf: Vec<u8>,
    filled: usize,
    next_index: u64,
}

/// Builds a tree from the hashes of the data blocks, fed in data order.
pub(crate) struct TreeBuilder<S> {
    geometry: TreeGeometry,
    hasher: SaltedHasher,
    pending: Vec<PendingBlock>,
    data_hashes: u64,
    root: Option<Digest>,
    sink: S,
}

impl<S: TreeSink> TreeBuilder<S> {
    /// A builder for a file of `data_size` bytes, sending blocks to `sink`.
    pub fn new(params: &MerkleTreeParams, data_size: u64, sink: S) -> Self {
        let geometry = TreeGeometry::new(params, data_size);
        let pending = (0..geometry.num_levels())
            .map(|_| PendingBlock {
                buf: vec![0; params.block_size()],
                filled: 0,
                next_index: 0,
            })
            .collect();
        TreeBuilder {
            geometry,
            hasher: params.hasher(),
            pending,
            data_hashes: 0,
            root: None,
            sink,
        }
    }

    /// Adds the hashes of the next data blocks: concatenated digests.
    pub fn add_data_hashes(&mut self, hashes: &[u8]) -> Result<()> {
        self.data_hashes += (hashes.len() / self.hasher.algorithm().digest_size()) as u64;
        if self.data_hashes > self.geometry.data_blocks() {
            return Err(Error::Io(io::Error::other(
                "more data blocks than the file size allows",
            )));
        }
        self.push(0, hashes)
    }

    /// Appends hashes to `level`'s pending block, completing blocks as they
    /// fill up. The hash pushed above the top level is the root hash.
    fn push(&mut self, level: usize, mut hashes: &[u8]) -> Result<()> {
        if level == self.geometry.num_levels() {
            debug_assert!(self.root.is_none());
            self.root = Digest::from_slice(hashes);
            return Ok(());
        }
        while !hashes.is_empty() {
            let p = &mut self.pending[level];
            let n = hashes.len().min(p.buf.len() - p.filled);
            p.buf[p.filled..p.filled + n].copy_from_slice(&hashes[..n]);
            p.filled += n;
            hashes = &hashes[n..];
            if p.filled == p.buf.len() {
                self.complete_block(level)?;
            }
        }
        Ok(())
    }

    /// Zero-pads `level`'s pending block, stores it, and pushes its hash up.
    fn complete_block(&mut self, level: usize) -> Result<()> {
        let p = &mut self.pending[level];
        p.buf[p.filled..].fill(0);
        let index = self.geometry.levels()[level].start_block + p.next_index;
        let pos = index << self.geometry.block_size().trailing_zeros();
        self.sink.write_tree_block(pos, &p.buf)?;
        p.next_index += 1;
        p.filled = 0;
        let hash = self.hasher.hash_block(&p.buf);
        self.push(level + 1, hash.as_bytes())
    }

    /// Completes the partial blocks of every level and returns the root hash
    /// and the sink.
    pub fn finish(mut self) -> Result<(Digest, S)> {
        if self.data_hashes != self.geometry.data_blocks() {
            return Err(Error::UnexpectedEof {
                got: self.data_hashes << self.geometry.block_size().trailing_zeros(),
                expected: self.geometry.data_size(),
            });
        }
        for level in 0..self.geometry.num_levels() {
            if self.pending[level].filled > 0 {
                self.complete_block(level)?;
            }
        }
        let digest_size = self.hasher.algorithm().digest_size();
        let root = self.root.unwrap_or_else(|| Digest::zero(digest_size));
        debug_assert!(self
            .pending
            .iter()
            .zip(self.geometry.levels())
            .all(|(p, l)| p.next_index == l.num_blocks));
        Ok((root, self.sink))
    }
}

/// Size of each read from the data source.
const CHUNK_SIZE: usize = 2 << 20;

/// Builds the Merkle tree of the `data_size` bytes read from `data`, sends
/// its blocks to `sink`, and returns the descriptor (whose
/// [`Descriptor::file_digest`] is the fs-verity digest) and the sink.
///
/// Data blocks are hashed on all of rayon's threads while the next chunk is
/// read on another thread. `progress` is called with the number of bytes
/// done after each chunk; an error it returns stops the build and is
/// returned. Reading fewer than `data_size` bytes is an error;
/// bytes past `data_size` are not read.
///
/// The tree goes to `sink`: [`DiscardTree`] to compute a digest only, a
/// `Vec<u8>` to collect it in memory (it is then byte for byte what
/// `fsverity digest --out-merkle-tree` writes), or any [`TreeSink`].
///
/// # Example
///
/// The digest `fsverity digest --hash-alg=sha512 --block-size=1024 FILE`
/// prints, and the tree `--out-merkle-tree` writes:
///
/// ```
/// use std::fs::File;
/// use verityfs::{build_merkle_tree, HashAlgorithm, MerkleTreeParams};
///
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("file");
/// # std::fs::write(&path, vec![0u8; 1_000_000])?;
/// let file = File::open(&path)?;
/// let size = file.metadata()?.len();
/// let params = MerkleTreeParams::new(HashAlgorithm::Sha512, 1024, b"")?;
/// let mut done = 0;
/// let (descriptor, tree) = build_merkle_tree(&params, size, file, Vec::new(), &mut |bytes| {
///     done = bytes; // progress: bytes hashed so far
///     Ok(())
/// })?;
/// assert_eq!(done, size);
/// // 977 data blocks of 1 KiB; 16 SHA-512 hashes per tree block: 62 + 4 + 1 tree blocks.
/// assert_eq!(tree.len(), 67 * 1024);
/// assert_eq!(tree.len() as u64, verityfs::TreeGeometry::new(&params, size).tree_size());
/// println!("{}:{}", params.hash_algorithm(), descriptor.file_digest());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn build_merkle_tree<R: Read + Send, S: TreeSink>(
    params: &MerkleTreeParams,
    data_size: u64,
    data: R,
    sink: S,
    progress: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<(Descriptor, S)> {
    let mut builder = TreeBuilder::new(params, data_size, sink);
    let hasher = params.hasher();
    let block_size = params.block_size();
    let digest_size = params.hash_algorithm().digest_size();
    let mut hashes = Vec::new();
    let mut done = 0u64;
    for_each_chunk(
        data,
        data_size,
        chunk_size(data_size, block_size),
        |chunk| {
            hashes.resize(chunk.len().div_ceil(block_size) * digest_size, 0);
            hasher.hash_data_blocks(chunk, block_size, &mut hashes);
            builder.add_data_hashes(&hashes)?;
            done += chunk.len() as u64;
            progress(done)
        },
    )?;
    let (root, sink) = builder.finish()?;
    Ok((Descriptor::new(*params, data_size, root), sink))
}

/// The read size for `data_size` bytes: [`CHUNK_SIZE`], but no more than
/// the file (small files do not get megabyte buffers), and whole blocks.
fn chunk_size(data_size: u64, block_size: usize) -> usize {
    let file = usize::try_from(data_size).unwrap_or(usize::MAX);
    CHUNK_SIZE
        .min(file.next_multiple_of(block_size))
        .max(block_size)
}

/// Reads `size` bytes from `data` in chunks on a helper thread (two buffers
/// in flight) and calls `f` on each chunk, in order, on this thread.
fn for_each_chunk<R: Read + Send>(
    data: R,
    size: u64,
    chunk_size: usize,
    mut f: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    if size == 0 {
        return Ok(());
    }
    let (full_tx, full_rx) = sync_channel::<Result<Vec<u8>>>(2);
    let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(2);
    for _ in 0..2 {
        empty_tx
            .send(Vec::with_capacity(chunk_size))
            .expect("channel has room");
    }
    std::thread::scope(|scope| {
        scope.spawn(move || read_chunks(data, size, chunk_size, empty_rx, full_tx));
        let mut result = Ok(());
        for chunk in full_rx.iter() {
            let chunk = chunk?;
            result = f(&chunk);
            if result.is_err() {
                break;
            }
            // The reader may already be done, so a failed send is fine.
            let _ = empty_tx.send(chunk);
        }
        // Closing both channels before the scope joins the reader stops it
        // wherever it waits.
        drop((full_rx, empty_tx));
        result
    })
}

/// The reader thread of [`for_each_chunk`]: fills recycled buffers until
/// `size` bytes were read, an error occurs, or the consumer stops.
fn read_chunks<R: Read>(
    mut data: R,
    size: u64,
    chunk_size: usize,
    empty: Receiver<Vec<u8>>,
    full: SyncSender<Result<Vec<u8>>>,
) {
    let mut offset = 0u64;
    while offset < size {
        let Ok(mut buf) = empty.recv() else { return };
        let want = (size - offset).min(chunk_size as u64) as usize;
        buf.resize(want, 0);
        let result = read_full(&mut data, &mut buf).and_then(|got| {
            if got < want {
                return Err(Error::UnexpectedEof {
                    got: offset + got as u64,
                    expected: size,
                });
            }
            Ok(buf)
        });
        let failed = result.is_err();
        if full.send(result).is_err() || failed {
            return;
        }
        offset += want as u64;
    }
}

/// Reads until `buf` is full or the source ends; returns the bytes read.
fn read_full<R: Read>(data: &mut R, buf: &mut [u8]) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match data.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that fails after `ok_bytes` bytes.
    struct FailingReader {
        ok_bytes: usize,
    }

    impl Read for FailingReader {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.ok_bytes == 0 {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            let n = buf.len().min(self.ok_bytes);
            buf[..n].fill(1);
            self.ok_bytes -= n;
            Ok(n)
        }
    }

    /// A sink that fails on its `n`th block.
    struct FailingSink(usize);

    impl TreeSink for FailingSink {
        fn write_tree_block(&mut self, _pos: u64, _block: &[u8]) -> io::Result<()> {
            self.0 = self.0.checked_sub(1).ok_or(io::ErrorKind::StorageFull)?;
            Ok(())
        }
    }

    fn build(size: u64, data: impl Read + Send, sink: impl TreeSink) -> Result<Descriptor> {
        let params = MerkleTreeParams::default();
        build_merkle_tree(&params, size, data, sink, &mut |_| Ok(())).map(|(d, _)| d)
    }

    #[test]
    fn read_errors_stop_the_build_at_any_point() {
        for ok_bytes in [0, 1, 4096, CHUNK_SIZE, 3 * CHUNK_SIZE + 5] {
            let err = build(10 << 20, FailingReader { ok_bytes }, DiscardTree).unwrap_err();
            assert_eq!(err.errno(), libc::EIO, "after {ok_bytes} bytes: {err}");
        }
    }

    #[test]
    fn short_data_is_an_error() {
        let data = vec![0u8; 5000];
        let err = build(CHUNK_SIZE as u64 * 3, &data[..], DiscardTree).unwrap_err();
        assert!(
            matches!(err, Error::UnexpectedEof { got: 5000, .. }),
            "{err}"
        );
        // Extra bytes past the size are not part of the file.
        let d = build(4096, &data[..], DiscardTree).unwrap();
        assert_eq!(d.data_size(), 4096);
    }

    #[test]
    fn sink_errors_stop_the_build() {
        for n in [0, 1, 100] {
            let data = vec![0u8; 64 << 20];
            let err = build(data.len() as u64, &data[..], FailingSink(n)).unwrap_err();
            assert!(matches!(err, Error::Io(ref e) if e.kind() == io::ErrorKind::StorageFull));
        }
    }

    #[test]
    fn tree_blocks_arrive_at_their_final_positions() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let params = MerkleTreeParams::new(crate::HashAlgorithm::Sha256, 1024, b"s").unwrap();
        let (d, tree) = build_merkle_tree(
            &params,
            data.len() as u64,
            &data[..],
            Vec::new(),
            &mut |_| Ok(()),
        )
        .unwrap();
        let g = TreeGeometry::new(&params, data.len() as u64);
        assert_eq!(tree.len() as u64, g.tree_size());
        // Every level-0 hash is the hash of its data block, and the top block
        // hashes to the root.
        let hasher = params.hasher();
        for (i, block) in data.chunks(1024).enumerate() {
            let mut padded = block.to_vec();
            padded.resize(1024, 0);
            let (b, off) = g.hash_location(0, i as u64);
            let at = b as usize * 1024 + off;
            assert_eq!(&tree[at..at + 32], hasher.hash_block(&padded).as_bytes());
        }
        assert_eq!(hasher.hash_block(&tree[..1024]), *d.root_hash());
    }
}
