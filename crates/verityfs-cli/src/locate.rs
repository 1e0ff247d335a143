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
/// `None`. Only a verityfs daemon's answer is taken: elsewhere the
/// attribute could be an ordinary one, set by whoever controls the file to
/// send the commands to another file.
pub fn backing_path(path: &Path) -> Option<PathBuf> {
    if !on_verityfs_mount(path) {
        return None;
    }
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

/// Whether the filesystem holding `path` is a verityfs mount: the mount
/// table entry with its device has the type `fuse.verityfs`, or `fuse`
/// with a root directory answering the daemon's own statistics attribute
/// (mounts made with mount(2) directly do not show the subtype).
fn on_verityfs_mount(path: &Path) -> bool {
    let Ok(st) = rustix::fs::stat(path) else {
        return false;
    };
    let device = format!(
        "{}:{}",
        rustix::fs::major(st.st_dev),
        rustix::fs::minor(st.st_dev)
    );
    let Ok(mounts) = verityfs::mountinfo::mounts() else {
        return false;
    };
    // The last entry for the device: the one mounted on top.
    let Some(mount) = mounts.into_iter().rfind(|m| m.device == device) else {
        return false;
    };
    match mount.fstype.as_str() {
        "fuse.verityfs" => true,
        "fuse" => answers_stats(&mount.point),
        _ => false,
    }
}

/// Whether the mount root `mountpoint` serves the statistics attribute
/// as a verityfs daemon does. Another FUSE filesystem passing attributes
/// through could only fake it with control of its source's root
/// directory as well as of the file.
fn answers_stats(mountpoint: &Path) -> bool {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::getxattr(mountpoint, verityfs_fuse::STATS_XATTR, &mut buf[..]) {
        Ok(n) => {
            buf[..n].starts_with(b"{") && buf[..n].windows(13).any(|w| w == b"\"cache_bytes\"")
        }
        Err(_) => false,
    }
}
