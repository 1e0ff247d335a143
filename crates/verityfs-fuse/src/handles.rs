//! Open file and directory handles.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use fuser::{Errno, FileHandle};
use verityfs::VerityFile;

use crate::creds::Creds;
use crate::inodes::Inode;

/// What a handle refers to.
pub enum Handle {
    /// An ordinary file, read and written through its backing file.
    Plain {
        /// The backing file, opened with the caller's access mode.
        file: File,
        /// Opened for reading.
        read: bool,
        /// Opened for writing (counted in the inode's writers).
        write: bool,
        /// The inode.
        inode: Arc<Inode>,
        /// Its opener's credentials, for writes through it.
        creds: Creds,
    },
    /// A verity file: read-only, every read verified.
    Verity {
        /// The shared open verity file.
        file: Arc<VerityFile>,
        /// The inode.
        inode: Arc<Inode>,
    },
    /// A directory being listed.
    Dir {
        /// The backing directory's stream.
        stream: std::sync::Mutex<crate::dir_ops::DirStream>,
        /// The directory inode.
        inode: Arc<Inode>,
    },
}

impl Handle {
    /// The inode the handle is open on.
    pub fn inode(&self) -> &Arc<Inode> {
        match self {
            Handle::Plain { inode, .. }
            | Handle::Verity { inode, .. }
            | Handle::Dir { inode, .. } => inode,
        }
    }
}

/// All open handles.
#[derive(Default)]
pub struct HandleTable {
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    next: AtomicU64,
}

impl HandleTable {
    /// Stores `handle` and returns its number.
    pub fn insert(&self, handle: Handle) -> FileHandle {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(handle));
        FileHandle(fh)
    }

    /// The handle `fh`; `EBADF` if unknown.
    pub fn get(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        let handles = self.handles.read().unwrap_or_else(|p| p.into_inner());
        handles.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// Removes and returns the handle `fh`.
    pub fn remove(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        self.handles
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh.0)
    }
}
