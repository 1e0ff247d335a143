//! Opening a verity file for verified reads (kernel: `fs/verity/open.c`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::fs::{fadvise, Advice};

use crate::access::Access;
use crate::cache::{TreeCache, DEFAULT_CACHE_BYTES};
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::expected::ExpectedDigest;
use crate::geometry::TreeGeometry;
use crate::hash_algs::{Digest, SaltedHasher};
use crate::layout::Location;
use crate::source::Source;
use crate::state::FileState;
use crate::stats::Counters;

/// Backing files up to this size (data up to about 900 KiB, tree and
/// descriptor) are fetched whole when opened: a small file is usually read
/// whole, and its data, tree and descriptor then cost one or two device
/// requests (two where the filesystem keeps the gap before the tree on the
/// disk too) instead of three.
pub(crate) const WHOLE_FILE_PREFETCH_BYTES: u64 = 1 << 20;

/// Trees up to this size (of up to 64 MiB of data with 4 KiB blocks and
/// SHA-256) are fetched with the descriptor when the file is opened: one
/// request instead of one for the descriptor and one or more for the tree.
pub(crate) const TREE_PREFETCH_BYTES: u64 = 512 << 10;

/// Settings of the verified read path.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// Fetch Merkle tree blocks ahead of need: every level a read needs in
    /// one request per level, issued before the data is read, plus
    /// asynchronous readahead of level-0 blocks on sequential streams
    /// (several per file), and level 0 in large windows on random reads.
    /// Off reproduces the old behaviour: one synchronous read per tree
    /// block.
    pub merkle_readahead: bool,
    /// Bytes of tree blocks the cache may hold.
    pub cache_bytes: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            merkle_readahead: true,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// What all open verity files share: the tree block cache, the total
/// counters and the options.
pub struct Verifier {
    pub(crate) cache: TreeCache,
    pub(crate) totals: Counters,
    pub(crate) options: ReadOptions,
    next_file_id: AtomicU64,
}

impl Verifier {
    /// A verifier with `options`.
    pub fn new(options: ReadOptions) -> Arc<Self> {
        Arc::new(Verifier {
            cache: TreeCache::new(options.cache_bytes),
            totals: Counters::default(),
            options,
            next_file_id: AtomicU64::new(1),
        })
    }

    /// The counters summed over all files.
    pub fn totals(&self) -> &Counters {
        &self.totals
    }

    /// Bytes held by the tree block cache.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }
}

/// An open verity file: every byte [`VerityFile::read_at`] returns was
/// checked against the Merkle tree up to the root hash.
pub struct VerityFile {
    pub(crate) data: Arc<dyn Source>,
    pub(crate) tree: Arc<dyn Source>,
    pub(crate) name: PathBuf,
    pub(crate) cache_id: u64,
    pub(crate) location: Location,
    pub(crate) descriptor: Descriptor,
    pub(crate) signature: Vec<u8>,
    pub(crate) digest: Digest,
    pub(crate) geometry: TreeGeometry,
    pub(crate) hasher: SaltedHasher,
    pub(crate) verifier: Arc<Verifier>,
    pub(crate) stats: Counters,
    /// The streams reading the file, for tree readahead.
    pub(crate) access: Access,
    /// The whole file was asked for when it was opened: tree readahead
    /// has nothing left to ask for.
    pub(crate) fetched_whole: bool,
}

impl VerityFile {
    /// Opens the verity file whose backing file is `file`, named `name` in
    /// messages. Checks the location record and the descriptor with the
    /// kernel's rules (`EINVAL`), and that the metadata is all there
    /// (`EIO`); `ENODATA` if the file is not a verity file.
    ///
    /// The backing file is one [`enable_verity`](crate::enable_verity) made
    /// (or `fsverity enable` through a `verityfs mount`): data, then tree
    /// and descriptor, located by the `user.verityfs` extended attribute.
    /// For data whose tree and descriptor are separate files, see
    /// [`VerityFile::open_detached`].
    ///
    /// # Example
    ///
    /// ```
    /// use std::fs::{File, OpenOptions};
    /// use verityfs::{enable_verity, EnableRequest, MerkleTreeParams, ReadOptions, Verifier, VerityFile};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("file");
    /// # let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    /// # std::fs::write(&path, &data)?;
    /// # let rw = OpenOptions::new().read(true).write(true).open(&path)?;
    /// # let request = EnableRequest { params: MerkleTreeParams::default(), signature: None, progress: &mut |_| true };
    /// # enable_verity(&rw, request)?;
    /// // One verifier (tree block cache, counters) for all the files a program reads.
    /// let verifier = Verifier::new(ReadOptions::default());
    /// let file = VerityFile::open(&verifier, File::open(&path)?, &path)?;
    /// println!("sha256:{}", file.digest()); // as `fsverity measure` prints it
    ///
    /// let mut buf = vec![0u8; 10_000];
    /// let n = file.read_at(&mut buf, 50_000)?; // like pread, but verified
    /// assert_eq!(&buf[..n], &data[50_000..60_000]);
    ///
    /// // Tamper with the stored data: the read fails (EIO), naming the place.
    /// # use std::os::unix::fs::FileExt;
    /// rw.write_all_at(b"X", 55_000)?;
    /// let verifier = Verifier::new(ReadOptions::default()); // nothing cached
    /// let file = VerityFile::open(&verifier, File::open(&path)?, &path)?;
    /// let err = file.read_at(&mut buf, 50_000).unwrap_err();
    /// assert_eq!(err.errno(), libc::EIO);
    /// assert!(err.to_string().contains("FILE CORRUPTED! pos=53248, level=-1"));
    ///
    /// // Ordinary files are not verity files: ENODATA.
    /// # std::fs::write(dir.path().join("plain"), b"x")?;
    /// let plain = File::open(dir.path().join("plain"))?;
    /// assert_eq!(VerityFile::open(&verifier, plain, "plain".as_ref()).err().unwrap().errno(), libc::ENODATA);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(verifier: &Arc<Verifier>, file: File, name: &Path) -> Result<VerityFile> {
        let FileState::Verity(location) = FileState::read(&file)? else {
            return Err(Error::NotVerity);
        };
        let end = location.end().ok_or(Error::MetadataTruncated)?;
        if file.metadata()?.len() < end {
            return Err(Error::MetadataTruncated);
        }
        // Before the descriptor is read, so that the descriptor comes in
        // the same request as what is fetched with it.
        let prefetch = open_prefetch(&location, &file);
        if let Some((start, len)) = prefetch {
            Source::prefetch(&file, start, len);
        }
        let mut stored = vec![0u8; location.desc_size as usize];
        Source::read_exact_at(&file, &mut stored, location.desc_pos)?;
        let file = Arc::new(file);
        // A file fetched whole has no readahead left to protect or to do:
        // its tree is read through the same descriptor.
        let tree: Arc<dyn Source> = match prefetch {
            Some((0, _)) => file.clone(),
            _ => Arc::new(open_tree_reader(&file)?),
        };
        let mut file = Self::from_sources(verifier, (file, tree), location, &stored, name)?;
        file.fetched_whole = matches!(prefetch, Some((0, _)));
        Ok(file)
    }

    /// Opens the verity file whose data is at offset 0 of `data`, whose
    /// tree and descriptor are at `location.tree_pos` of `tree` (which may
    /// be the same source), and whose stored descriptor (with its signature)
    /// is `descriptor`: the constructor every other one ends in, for any
    /// [`Source`] (a remote object, a cache).
    ///
    /// Checks the descriptor with the kernel's rules and that it agrees with
    /// `location` (`data_size`, the tree size its parameters imply, and the
    /// stored size): [`Error::InvalidDescriptor`] otherwise. Nothing is read
    /// here: a source that ends before `location` says fails the reads that
    /// need the missing bytes ([`Error::MetadataTruncated`], `EIO`). When
    /// `data` and `tree` are one source, a small file is asked for whole,
    /// and a mid-sized file's tree ([`Source::prefetch`]), as
    /// [`VerityFile::open`] does.
    pub fn open_sources(
        verifier: &Arc<Verifier>,
        sources: (Arc<dyn Source>, Arc<dyn Source>),
        location: Location,
        descriptor: &[u8],
        name: &Path,
    ) -> Result<VerityFile> {
        let one_source = Arc::ptr_eq(&sources.0, &sources.1);
        let mut file = Self::from_sources(verifier, sources, location, descriptor, name)?;
        if let Some((start, len)) = open_prefetch(&location, &*file.tree).filter(|_| one_source) {
            file.tree.prefetch(start, len);
            file.fetched_whole = start == 0;
        }
        Ok(file)
    }

    /// [`VerityFile::open_sources`] without the prefetch (for a caller
    /// that prefetched before reading the descriptor).
    pub(crate) fn from_sources(
        verifier: &Arc<Verifier>,
        (data, tree): (Arc<dyn Source>, Arc<dyn Source>),
        location: Location,
        descriptor: &[u8],
        name: &Path,
    ) -> Result<VerityFile> {
        let (parsed, signature) = Descriptor::parse(descriptor)?;
        let params = *parsed.params();
        let geometry = TreeGeometry::new(&params, parsed.data_size());
        if parsed.data_size() != location.data_size {
            return Err(Error::InvalidDescriptor(
                "data_size differs from the location record",
            ));
        }
        if geometry.tree_size() != location.tree_size {
            return Err(Error::InvalidDescriptor(
                "tree size differs from the location record",
            ));
        }
        if descriptor.len() != location.desc_size as usize {
            return Err(Error::InvalidDescriptor(
                "descriptor size differs from the location record",
            ));
        }
        params.check_kernel_limits()?;
        geometry.check_kernel_limits()?;
        data.data_ends_at(location.data_size);
        Ok(VerityFile {
            data,
            tree,
            name: name.to_owned(),
            cache_id: verifier.next_file_id.fetch_add(1, Ordering::Relaxed),
            location,
            signature: signature.to_vec(),
            digest: parsed.file_digest(),
            hasher: params.hasher(),
            descriptor: parsed,
            geometry,
            verifier: verifier.clone(),
            stats: Counters::default(),
            access: Access::default(),
            fetched_whole: false,
        })
    }

    /// The fs-verity file digest (what `FS_IOC_MEASURE_VERITY` returns),
    /// computed once at open.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// True if the file's digest is `expected` (its algorithm too, when
    /// `expected` names one): the check that makes the data trusted.
    pub fn matches(&self, expected: &ExpectedDigest) -> bool {
        expected.matches(self.descriptor.params().hash_algorithm(), &self.digest)
    }

    /// The descriptor (with `sig_size` as stored).
    pub fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    /// The built-in signature stored with the file (empty if none).
    pub fn signature(&self) -> &[u8] {
        &self.signature
    }

    /// The file's size: the size of its data.
    pub fn data_size(&self) -> u64 {
        self.location.data_size
    }

    /// The tree's geometry.
    pub fn geometry(&self) -> &TreeGeometry {
        &self.geometry
    }

    /// Where the metadata lies in the backing file.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The counters of this file.
    pub fn stats(&self) -> &Counters {
        &self.stats
    }

    /// The name the file was opened with.
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// Opens data whose Merkle tree and descriptor are kept apart from it,
    /// as `fsverity digest --out-merkle-tree=TREE --out-descriptor=DESC
    /// DATA` writes them: for programs that ship a file and its tree
    /// separately (downloads, container layers, read-only images).
    ///
    /// * `data` holds exactly the descriptor's `data_size` bytes;
    /// * `tree` holds exactly the Merkle tree, from offset 0 (top level
    ///   first, as `FS_IOC_READ_VERITY_METADATA` gives it);
    /// * `descriptor` is the 256-byte `struct fsverity_descriptor`, which
    ///   may be followed by the built-in signature it announces.
    ///
    /// Both files are read with positioned reads, so they must be regular
    /// files (or block devices), not pipes. Nothing is read from `data`
    /// here: each [`VerityFile::read_at`] checks what it returns against
    /// the tree up to the root hash in `descriptor`, whose hash is the file
    /// digest ([`VerityFile::digest`]). Trusting the data therefore comes
    /// down to trusting the descriptor: compare the digest with one you
    /// trust (or check a signature over it) before relying on the data.
    ///
    /// Errors: [`Error::InvalidDescriptor`] (`EINVAL`) if the descriptor
    /// breaks the kernel's rules or the data or tree file does not have the
    /// size the descriptor implies; the errors of
    /// [`MerkleTreeParams::check_kernel_limits`](crate::MerkleTreeParams::check_kernel_limits)
    /// and [`TreeGeometry::check_kernel_limits`] for parameters the kernel
    /// would refuse; [`Error::Io`] if a file cannot be examined.
    ///
    /// The [`location`](VerityFile::location) of such a file has the tree at
    /// position 0 (of `tree`) and the descriptor right after it, where
    /// nothing is stored.
    ///
    /// ```
    /// use std::fs::File;
    /// use std::io::Write;
    /// use verityfs::{build_merkle_tree, MerkleTreeParams, ReadOptions, Verifier, VerityFile};
    ///
    /// // What `fsverity digest --out-merkle-tree --out-descriptor` writes.
    /// let dir = tempfile::tempdir()?;
    /// let data = vec![7u8; 100_000];
    /// let (descriptor, tree) =
    ///     build_merkle_tree(&MerkleTreeParams::default(), data.len() as u64, &data[..], Vec::new(), &mut |_| Ok(()))?;
    /// std::fs::write(dir.path().join("data"), &data)?;
    /// std::fs::write(dir.path().join("tree"), &tree)?;
    ///
    /// let verifier = Verifier::new(ReadOptions::default());
    /// let file = VerityFile::open_detached(
    ///     &verifier,
    ///     File::open(dir.path().join("data"))?,
    ///     File::open(dir.path().join("tree"))?,
    ///     &descriptor.to_unsigned_bytes(),
    ///     "data".as_ref(),
    /// )?;
    /// assert_eq!(file.digest(), &descriptor.file_digest());
    /// let mut buf = [0u8; 10];
    /// assert_eq!(file.read_at(&mut buf, 99_995)?, 5); // short at the end, verified
    /// assert_eq!(&buf[..5], &[7; 5]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_detached(
        verifier: &Arc<Verifier>,
        data: File,
        tree: File,
        descriptor: &[u8],
        name: &Path,
    ) -> Result<VerityFile> {
        let (parsed, signature) = Descriptor::parse(descriptor)?;
        let params = *parsed.params();
        params.check_kernel_limits()?;
        let geometry = TreeGeometry::new(&params, parsed.data_size());
        geometry.check_kernel_limits()?;
        if data.metadata()?.len() != parsed.data_size() {
            return Err(Error::InvalidDescriptor(
                "data_size differs from the size of the data file",
            ));
        }
        if tree.metadata()?.len() != geometry.tree_size() {
            return Err(Error::InvalidDescriptor(
                "the tree file does not have the size of the tree the descriptor implies",
            ));
        }
        let location = Location {
            data_size: parsed.data_size(),
            tree_pos: 0,
            tree_size: geometry.tree_size(),
            desc_pos: geometry.tree_size(),
            desc_size: (crate::descriptor::DESCRIPTOR_SIZE + signature.len()) as u32,
        };
        // Tree readahead is ours to do (see `open_tree_reader`); a hint.
        let _ = fadvise(&tree, 0, None, Advice::Random);
        let stored = &descriptor[..location.desc_size as usize];
        let sources = (Arc::new(data) as Arc<dyn Source>, Arc::new(tree) as _);
        Self::from_sources(verifier, sources, location, stored, name)
    }
}

/// The range (start, length) of the backing file worth fetching with the
/// descriptor when the file is opened: all of a small file, the tree of a
/// mid-sized one.
pub(crate) fn open_prefetch(location: &Location, source: &dyn Source) -> Option<(u64, u64)> {
    let end = location.desc_pos + u64::from(location.desc_size);
    match end {
        _ if end <= WHOLE_FILE_PREFETCH_BYTES => Some((0, end)),
        _ if location.tree_size <= source.open_tree_prefetch() => {
            Some((location.tree_pos, end - location.tree_pos))
        }
        _ => None,
    }
}

/// A second, independent open of the backing file for tree reads, so that
/// the kernel's readahead state for the data stream is not disturbed by tree
/// reads, and with the kernel's own readahead turned off on it: tree
/// readahead is ours to do (and to switch off).
fn open_tree_reader(file: &File) -> Result<File> {
    // Without waiting for the holder of a lease on the file to give it up:
    // the caller, who opened it already, may not be able to wait that long.
    let tree = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    fadvise(&tree, 0, None, Advice::Random).map_err(std::io::Error::from)?;
    Ok(tree)
}
