//! [`VerifiedReader`]: a verity file as a `std::io::Read + Seek` stream, for
//! code that consumes readers (`io::copy`, decompressors, parsers, `tar`).
//!
//! Every byte it returns was checked against the Merkle tree up to the root
//! hash; it stops at the first block that fails to verify. Bytes before that
//! block are delivered (as from the kernel, a read stops short of the bad
//! block), and the next read fails with an [`io::Error`] of kind
//! [`InvalidData`](io::ErrorKind::InvalidData) wrapping
//! [`Error::Corrupted`], whose [`Error::errno`] is `EIO`; [`corruption`]
//! extracts the [`Corruption`] report (position, level, hashes).

use std::borrow::Borrow;
use std::io::{self, Read, Seek, SeekFrom};

use crate::error::{Corruption, Error};
use crate::open::VerityFile;

/// Bytes verified at once by [`VerifiedReader::new`] (rounded up to whole
/// blocks): reads smaller than this are served from a buffer, so that small
/// or unaligned reads do not hash the same block twice.
const DEFAULT_BUFFER_SIZE: usize = 256 << 10;

/// A `Read + Seek` stream over the verified data of a [`VerityFile`].
///
/// `F` is the file itself, a reference to it or an
/// [`Arc`](std::sync::Arc) of it (anything that
/// [`Borrow`]s a [`VerityFile`]), so one open file can feed several
/// readers, each with its own position.
///
/// # Errors
///
/// A read that reaches a block that does not match the tree returns the
/// bytes before it; the next read fails with kind
/// [`InvalidData`](io::ErrorKind::InvalidData), its
/// [`get_ref`](io::Error::get_ref) being the [`Error::Corrupted`] the
/// verified read path found (`errno()` `EIO`, see [`corruption`]). Other
/// failures (`EIO` from the disk, a tree file cut off) are passed on as
/// the [`io::Error`]s they convert to ([`From<Error> for
/// io::Error`](Error)). Reading again retries, and fails again if the data
/// is still bad.
///
/// # Example
///
/// ```
/// use std::io::{Read, Seek, SeekFrom};
/// use verityfs::{build_merkle_tree, MerkleTreeParams, ReadOptions, VerifiedReader, Verifier, VerityFile};
///
/// let dir = tempfile::tempdir()?;
/// let (data_path, tree_path) = (dir.path().join("data"), dir.path().join("tree"));
/// let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
/// let params = MerkleTreeParams::default();
/// let (descriptor, tree) =
///     build_merkle_tree(&params, data.len() as u64, &data[..], Vec::new(), &mut |_| Ok(()))?;
/// std::fs::write(&data_path, &data)?;
/// std::fs::write(&tree_path, &tree)?;
///
/// let verifier = Verifier::new(ReadOptions::default());
/// let file = VerityFile::open_detached(
///     &verifier,
///     std::fs::File::open(&data_path)?,
///     std::fs::File::open(&tree_path)?,
///     &descriptor.to_unsigned_bytes(),
///     &data_path,
/// )?;
/// let mut reader = VerifiedReader::new(&file);
/// let mut all = Vec::new();
/// reader.read_to_end(&mut all)?;
/// assert_eq!(all, data);
///
/// // Tamper with the data: the stream stops at the bad block.
/// let mut tampered = data.clone();
/// tampered[20_000] ^= 1;
/// std::fs::write(&data_path, &tampered)?;
/// let file = VerityFile::open_detached(
///     &Verifier::new(ReadOptions::default()),
///     std::fs::File::open(&data_path)?,
///     std::fs::File::open(&tree_path)?,
///     &descriptor.to_unsigned_bytes(),
///     &data_path,
/// )?;
/// let mut reader = VerifiedReader::new(file);
/// let mut good = Vec::new();
/// let err = reader.read_to_end(&mut good).unwrap_err();
/// assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
/// let bad = verityfs::corruption(&err).unwrap();
/// assert_eq!((bad.pos, bad.level), (16384, -1)); // the 4096-byte block holding byte 20000
/// assert_eq!(good, &data[..16384]); // everything before it, verified
///
/// // Seeking past the bad block works; reads there are verified too.
/// reader.seek(SeekFrom::Start(40_000))?;
/// let mut tail = Vec::new();
/// reader.read_to_end(&mut tail)?;
/// assert_eq!(tail, &data[40_000..]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct VerifiedReader<F: Borrow<VerityFile> = VerityFile> {
    file: F,
    pos: u64,
    /// Verified bytes at `buf_pos..buf_pos + buf_len`.
    buf: Vec<u8>,
    buf_pos: u64,
    buf_len: usize,
    buffer_size: usize,
}

impl<F: Borrow<VerityFile>> VerifiedReader<F> {
    /// A reader at position 0, verifying 256 KiB at a time for small reads.
    pub fn new(file: F) -> Self {
        Self::with_buffer_size(file, DEFAULT_BUFFER_SIZE)
    }

    /// A reader whose buffer holds `size` bytes (rounded up to whole
    /// blocks). Reads at least that large go straight to the caller's
    /// buffer.
    pub fn with_buffer_size(file: F, size: usize) -> Self {
        let block_size = file.borrow().geometry().block_size();
        let buffer_size = size.max(1).div_ceil(block_size) * block_size;
        VerifiedReader {
            file,
            pos: 0,
            buf: Vec::new(),
            buf_pos: 0,
            buf_len: 0,
            buffer_size,
        }
    }

    /// The verity file.
    pub fn get_ref(&self) -> &VerityFile {
        self.file.borrow()
    }

    /// The verity file, giving up the reader.
    pub fn into_inner(self) -> F {
        self.file
    }

    /// The position of the next read.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Reads at `pos` into `out`: everything up to the end of `out`, or the
    /// verified bytes before the first bad block if there are any, else the
    /// error.
    fn read_verified(&self, out: &mut [u8], pos: u64) -> io::Result<usize> {
        let file = self.file.borrow();
        match file.read_at(out, pos) {
            Ok(n) => Ok(n),
            Err(Error::Corrupted(c)) if c.pos > pos => {
                // The blocks before the bad one were checked first, in order.
                let good = ((c.pos - pos) as usize).min(out.len());
                file.read_at(&mut out[..good], pos).map_err(io::Error::from)
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl<F: Borrow<VerityFile>> Read for VerifiedReader<F> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let size = self.file.borrow().data_size();
        if out.is_empty() || self.pos >= size {
            return Ok(0);
        }
        let buffered = self.pos.wrapping_sub(self.buf_pos);
        if buffered >= self.buf_len as u64 {
            if out.len() >= self.buffer_size {
                let n = self.read_verified(out, self.pos)?;
                self.pos += n as u64;
                return Ok(n);
            }
            // Fill the buffer from the start of the block holding `pos`.
            // It then covers `pos`: a bad block before `pos` would be that
            // very block, which fails the whole read.
            let block_size = self.file.borrow().geometry().block_size() as u64;
            let start = self.pos - self.pos % block_size;
            let mut buf = std::mem::take(&mut self.buf);
            buf.resize(self.buffer_size, 0);
            let result = self.read_verified(&mut buf, start);
            self.buf = buf;
            self.buf_pos = start;
            self.buf_len = 0;
            self.buf_len = result?;
            debug_assert!(self.pos - start < self.buf_len as u64);
        }
        let at = (self.pos - self.buf_pos) as usize;
        let n = out.len().min(self.buf_len - at);
        out[..n].copy_from_slice(&self.buf[at..at + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<F: Borrow<VerityFile>> Seek for VerifiedReader<F> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let (base, offset) = match to {
            SeekFrom::Start(n) => {
                self.pos = n;
                return Ok(n);
            }
            SeekFrom::End(d) => (self.file.borrow().data_size(), d),
            SeekFrom::Current(d) => (self.pos, d),
        };
        match base.checked_add_signed(offset) {
            Some(pos) => {
                self.pos = pos;
                Ok(pos)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "invalid seek to a negative or overflowing position",
            )),
        }
    }

    fn stream_position(&mut self) -> io::Result<u64> {
        Ok(self.pos)
    }
}

/// The corruption report carried by an error of a [`VerifiedReader`] (or
/// any [`io::Error`] converted from [`Error::Corrupted`]); `None` for other
/// errors.
pub fn corruption(e: &io::Error) -> Option<&Corruption> {
    match e.get_ref()?.downcast_ref::<Error>()? {
        Error::Corrupted(c) => Some(c),
        _ => None,
    }
}

impl From<Error> for io::Error {
    /// [`Error::Io`] gives back the I/O error; [`Error::Corrupted`] becomes
    /// an error of kind [`InvalidData`](io::ErrorKind::InvalidData)
    /// (errno `EIO`, see [`Error::errno`]); the others keep the error inside
    /// an [`io::Error`] of the kind of their errno.
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io(e) => e,
            Error::Corrupted(_) => io::Error::new(io::ErrorKind::InvalidData, e),
            e => io::Error::new(io::Error::from_raw_os_error(e.errno()).kind(), e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{build_merkle_tree, MerkleTreeParams, ReadOptions, Verifier};

    /// `data` and its tree in temporary files, opened detached.
    fn detached(data: &[u8], tamper: Option<usize>) -> (tempfile::TempDir, VerityFile) {
        let dir = tempfile::tempdir().unwrap();
        let params = MerkleTreeParams::default();
        let (descriptor, tree) = build_merkle_tree(
            &params,
            data.len() as u64,
            data,
            Vec::new(),
            &mut |_| Ok(()),
        )
        .unwrap();
        let mut stored = data.to_vec();
        if let Some(i) = tamper {
            stored[i] ^= 0x80;
        }
        std::fs::write(dir.path().join("d"), &stored).unwrap();
        std::fs::write(dir.path().join("t"), &tree).unwrap();
        let file = VerityFile::open_detached(
            &Verifier::new(ReadOptions::default()),
            std::fs::File::open(dir.path().join("d")).unwrap(),
            std::fs::File::open(dir.path().join("t")).unwrap(),
            &descriptor.to_unsigned_bytes(),
            "d".as_ref(),
        )
        .unwrap();
        (dir, file)
    }

    fn random_bytes(len: usize) -> Vec<u8> {
        let mut bytes = vec![0; len];
        fastrand::Rng::with_seed(len as u64).fill(&mut bytes);
        bytes
    }

    #[test]
    fn reads_in_odd_sizes_and_seeks() {
        let data = random_bytes(300_001);
        let (_dir, file) = detached(&data, None);
        let file = Arc::new(file);
        for (buffer, step) in [(4096, 1), (4096, 4097), (8192, 3000), (1 << 20, 100_000)] {
            let mut r = VerifiedReader::with_buffer_size(file.clone(), buffer);
            let mut out = Vec::new();
            let mut chunk = vec![0u8; step];
            loop {
                let n = r.read(&mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&chunk[..n]);
            }
            assert!(out == data, "buffer {buffer}, step {step}");
        }
        let mut r = VerifiedReader::new(&*file);
        assert_eq!(r.seek(SeekFrom::End(-10)).unwrap(), 299_991);
        let mut tail = Vec::new();
        r.read_to_end(&mut tail).unwrap();
        assert_eq!(tail, &data[299_991..]);
        assert_eq!(r.seek(SeekFrom::Current(-20)).unwrap(), 299_981);
        assert_eq!(r.seek(SeekFrom::Start(1 << 40)).unwrap(), 1 << 40);
        assert_eq!(r.read(&mut [0; 10]).unwrap(), 0);
        let e = r.seek(SeekFrom::Current(-(1 << 41))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(r.stream_position().unwrap(), 1 << 40);
    }

    #[test]
    fn stops_at_the_first_bad_block() {
        let data = random_bytes(1_000_000);
        for (bad, buffer) in [
            (0, 65536),
            (5000, 65536),
            (300_000, 4096),
            (999_999, 1 << 20),
        ] {
            let (_dir, file) = detached(&data, Some(bad));
            let block_start = (bad / 4096 * 4096) as u64;
            let mut r = VerifiedReader::with_buffer_size(&file, buffer);
            let mut got = Vec::new();
            let e = r.read_to_end(&mut got).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            let c = corruption(&e).expect("a corruption report");
            assert_eq!((c.pos, c.level), (block_start, -1));
            assert_eq!(got.len() as u64, block_start, "bad byte {bad}");
            assert!(got == data[..got.len()]);
            assert_eq!(r.position(), block_start);
            let inner = e.get_ref().unwrap().downcast_ref::<Error>().unwrap();
            assert_eq!(inner.errno(), libc::EIO);
            // Still failing; and reads from elsewhere still work.
            assert!(r.read(&mut [0; 1]).is_err());
            r.seek(SeekFrom::Start(block_start + 4096)).unwrap();
            let mut rest = Vec::new();
            r.read_to_end(&mut rest).unwrap();
            assert!(rest == data[(block_start + 4096).min(1_000_000) as usize..]);
        }
    }

    #[test]
    fn io_error_conversion() {
        let e = io::Error::from(Error::NotVerity);
        assert_eq!(e.raw_os_error(), None);
        assert!(corruption(&e).is_none());
        let e = io::Error::from(Error::Io(io::Error::from_raw_os_error(libc::ENOSPC)));
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        let e = io::Error::from(Error::MetadataTruncated);
        assert_eq!(e.to_string(), "verity metadata is truncated");
    }
}
