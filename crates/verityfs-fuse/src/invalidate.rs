//! Dropping the kernel's cached pages of a file. When a file becomes verity
//! (through the mount or behind its back in the backing store), pages the
//! kernel cached while it was ordinary were never verified: none may be
//! served once the daemon has seen the file as verity.
//!
//! The notification is written to the FUSE device from a thread of its own:
//! the kernel handles it by locking every cached page of the file, and a
//! page being read is locked until its read request is answered, so a
//! worker thread that sent it while serving such a read would wait for
//! itself. Dropping only the cached attributes locks no page: that one is
//! sent at once, before the reply it must precede.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock};

use fuser::{INodeNo, Notifier};

/// Queues page cache invalidations for the notifying thread.
pub(crate) struct Invalidator {
    queue: Sender<INodeNo>,
    /// Taken by the mount once its FUSE session exists.
    pending: Mutex<Option<Receiver<INodeNo>>>,
    /// For the attributes, sent from the threads serving requests.
    attributes: OnceLock<Notifier>,
}

impl Invalidator {
    pub(crate) fn new() -> Self {
        let (queue, pending) = channel();
        Invalidator {
            queue,
            pending: Mutex::new(Some(pending)),
            attributes: OnceLock::new(),
        }
    }

    /// Drops the cached attributes (the size) of `ino` now: the kernel
    /// asks for them again before it reads past the size it had, and a
    /// reply carrying them that was already on its way is ignored.
    pub(crate) fn invalidate_attributes(&self, ino: INodeNo) {
        if let Some(notifier) = self.attributes.get() {
            // Offset -1: the attributes only. ENOENT: none cached.
            if let Err(e) = notifier.inval_inode(ino, -1, 0) {
                tracing::debug!("invalidating the attributes of inode {}: {e}", ino.0);
            }
        }
    }

    /// Drops every cached page (and the cached attributes) of `ino`, soon.
    pub(crate) fn invalidate(&self, ino: INodeNo) {
        // Fails only once the mount is gone, and its cache with it.
        let _ = self.queue.send(ino);
    }

    /// Starts the thread sending the queued invalidations through
    /// `notifier`; it ends with the filesystem.
    pub(crate) fn serve(&self, notifier: Notifier) -> std::io::Result<()> {
        let Some(pending) = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Ok(());
        };
        let _ = self.attributes.set(notifier.clone());
        std::thread::Builder::new()
            .name("invalidate".into())
            .spawn(move || {
                for ino in pending {
                    // Offset 0, length 0: the whole file. ENOENT: the kernel
                    // holds no pages of it.
                    if let Err(e) = notifier.inval_inode(ino, 0, 0) {
                        tracing::debug!("invalidating inode {}: {e}", ino.0);
                    }
                }
            })
            .map(drop)
    }
}
