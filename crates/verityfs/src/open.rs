//! Opening a verity file for verified reads (kernel: `fs/verity/open.c`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::fs::{fadvise, Advice};

use crate::cache::{TreeCache, DEFAULT_CACHE_BYTES};
use crate::descriptor::Descriptor;
use crate::error::{Error, Result};
use crate::geometry::TreeGeometry;
use crate::hash_algs::{Digest, SaltedHasher};
use crate::layout::Location;
use crate::state::FileState;
use crate::stats::Counters;

/// Settings of the verified read path.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// Fetch Merkle tree blocks ahead of need: every level a read needs in
    /// one request per level, issued before the data is read, plus
    /// asynchronous readahead of level-0 blocks on sequential streams. Off
    /// reproduces the old behaviour: one synchronous read per tree block.
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

    /// The options.
    pub fn options(&self) -> &ReadOptions {
        &self.options
    }

    /// Bytes held by the tree block cache.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }
}

/// An open verity file: every byte [`VerityFile::read_at`] returns was
/// checked against the Merkle tree up to the root hash.
pub struct VerityFile {
    pub(crate) data: File,
    pub(crate) tree: File,
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
    /// Where the previous read ended, to recognise sequential streams.
    pub(crate) last_end: AtomicU64,
    /// Level-0 tree blocks below this index have had readahead issued.
    pub(crate) readahead_until: AtomicU64,
}

impl VerityFile {
    /// Opens the verity file whose backing file is `file`, named `name` in
    /// messages. Checks the location record and the descriptor with the
    /// kernel's rules (`EINVAL`), and that the metadata is all there
    /// (`EIO`); `ENODATA` if the file is not a verity file.
    pub fn open(verifier: &Arc<Verifier>, file: File, name: &Path) -> Result<VerityFile> {
        let FileState::Verity(location) = FileState::read(&file)? else {
            return Err(Error::NotVerity);
        };
        if file.metadata()?.len() < location.end().ok_or(Error::MetadataTruncated)? {
            return Err(Error::MetadataTruncated);
        }
        let mut stored = vec![0u8; location.desc_size as usize];
        file.read_exact_at(&mut stored, location.desc_pos)?;
        let (descriptor, signature) = Descriptor::parse(&stored)?;
        let params = *descriptor.params();
        let geometry = TreeGeometry::new(&params, descriptor.data_size());
        if descriptor.data_size() != location.data_size {
            return Err(Error::InvalidDescriptor(
                "data_size differs from the location record",
            ));
        }
        if geometry.tree_size() != location.tree_size {
            return Err(Error::InvalidDescriptor(
                "tree size differs from the location record",
            ));
        }
        params.check_kernel_limits()?;
        geometry.check_kernel_limits()?;
        Ok(VerityFile {
            tree: open_tree_reader(&file)?,
            data: file,
            name: name.to_owned(),
            cache_id: verifier.next_file_id.fetch_add(1, Ordering::Relaxed),
            location,
            signature: signature.to_vec(),
            digest: descriptor.file_digest(),
            hasher: params.hasher(),
            descriptor,
            geometry,
            verifier: verifier.clone(),
            stats: Counters::default(),
            last_end: AtomicU64::new(u64::MAX),
            readahead_until: AtomicU64::new(0),
        })
    }

    /// The fs-verity file digest (what `FS_IOC_MEASURE_VERITY` returns),
    /// computed once at open.
    pub fn digest(&self) -> &Digest {
        &self.digest
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
}

/// A second, independent open of the backing file for tree reads, so that
/// the kernel's readahead state for the data stream is not disturbed by tree
/// reads, and with the kernel's own readahead turned off on it: tree
/// readahead is ours to do (and to switch off).
fn open_tree_reader(file: &File) -> Result<File> {
    let tree = File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    fadvise(&tree, 0, None, Advice::Random).map_err(std::io::Error::from)?;
    Ok(tree)
}
