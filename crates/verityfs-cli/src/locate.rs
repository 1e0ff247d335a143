//! Finding the stored file behind a path, so that commands reading verity
//! metadata work both on backing files and on paths through a `verityfs
//! mount`, where the layout's extended attributes are hidden: the daemon
//! names a file's backing object in the virtual extended attribute
//! [`verityfs_fuse::BACKING_XATTR`].

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// The backing file of `path` if `path` is on a verityfs mount, else
/// `None` (the attribute does not exist anywhere else).
pub fn backing_path(path: &Path) -> Option<PathBuf> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::getxattr(path, verityfs_fuse::BACKING_XATTR, &mut buf[..]).ok()?;
    buf.truncate(n);
    Some(PathBuf::from(OsString::from_vec(buf)))
}

/// The file to read `path`'s verity metadata from: its backing file when it
/// is on a verityfs mount, else `path` itself.
pub struct Located {
    /// The open file.
    pub file: File,
    /// The backing file it was reached through, if any.
    pub backing: Option<PathBuf>,
}

/// Opens the file holding `path`'s verity metadata for reading. A failure
/// to open a backing file names it.
pub fn open(path: &Path) -> io::Result<Located> {
    match backing_path(path) {
        Some(backing) => File::open(&backing)
            .map(|file| Located {
                file,
                backing: Some(backing.clone()),
            })
            .map_err(|e| {
                let what = format!("its backing file '{}'", backing.display());
                io::Error::new(e.kind(), format!("{what}: {}", crate::output::strerror(&e)))
            }),
        None => File::open(path).map(|file| Located {
            file,
            backing: None,
        }),
    }
}
