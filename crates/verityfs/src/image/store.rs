//! Where an image's files are read from: a [`Store`] gives a [`Source`]
//! for each path of the image (`manifest`, `objects/ALG-HEX`). A local
//! directory is a [`DirStore`]; a web server or an object store is
//! another implementation of the same trait.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

use crate::source::Source;

/// The files of an image, by their path relative to it. Nothing a store
/// returns is trusted: the manifest's digest and the objects' trees check
/// every byte.
pub trait Store: Send + Sync {
    /// The file at `path` (`manifest`, or an object's
    /// [`FileObject::path`](super::FileObject::path)).
    fn open(&self, path: &str) -> io::Result<Arc<dyn Source>>;
}

/// An image in a local directory, as [`publish`](super::publish) writes it.
pub struct DirStore {
    /// The directory, held open: files are opened relative to it, so that
    /// the image stays reachable when something is mounted over its path
    /// (a mount of the image on its own directory).
    dir: OwnedFd,
}

impl DirStore {
    /// The image in the directory `dir`, opened once and never through
    /// another user's symbolic link on its path
    /// ([`open_dir_following`](crate::safe_dir::open_dir_following)).
    pub fn new(dir: &Path) -> io::Result<Self> {
        let dir = crate::safe_dir::open_dir_following(dir, None)?.into_fd();
        Ok(DirStore { dir })
    }
}

impl Store for DirStore {
    /// Whoever can write the image directory must not make the reader
    /// (perhaps a root daemon) follow a symlink out of it, block on a FIFO
    /// or open a device: the path stays beneath the directory without
    /// symlinks, the open does not wait, and only a regular file is kept.
    fn open(&self, path: &str) -> io::Result<Arc<dyn Source>> {
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let fd = rustix::fs::openat2(&self.dir, path, flags, Mode::empty(), resolve)?;
        if !FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode).is_file() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(Arc::new(File::from(fd)))
    }
}
