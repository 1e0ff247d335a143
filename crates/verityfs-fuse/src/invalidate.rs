//! Dropping the kernel's cached pages of a file. When a file becomes verity
//! (through the mount or behind its back in the backing store), pages the
//! kernel cached while it was ordinary were never verified: none may be
//! served once the daemon has seen the file as verity.
//!
//! The notification is written to the FUSE device from a thread of its own:
//! the kernel handles it by locking every cached page of the file, and a
//! page being read is locked until its read request is answered, so a
//! worker thread that sent it while serving such a read would wait for
//! itself.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

use fuser::{INodeNo, Notifier};

/// Queues page cache invalidations for the notifying thread.
pub(crate) struct Invalidator {
    queue: Sender<INodeNo>,
    /// Taken by the mount once its FUSE session exists.
    pending: Mutex<Option<Receiver<INodeNo>>>,
}

impl Invalidator {
    pub(crate) fn new() -> Self {
        let (queue, pending) = channel();
        Invalidator {
            queue,
            pending: Mutex::new(Some(pending)),
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
