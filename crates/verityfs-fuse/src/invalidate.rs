//! Dropping the kernel's cached pages of a file. When a file becomes verity
//! (through the mount or behind its back in the backing store), pages the
//! kernel cached while it was ordinary were never verified: none may be
//! served once the daemon has seen the file as verity.
//!
//! The notification is written to the FUSE device from a thread of its own:
//! the kernel handles it by locking every cached page of the file, and a
//! page being read is locked until its read request is answered, so a
//! worker thread that sent it while serving such a read would wait for
//! itself. Until it is done, opens of the file do not keep its cache (each
//! drops it in the opener), and replies that tell a caller the file is
//! verity (a measure, the inode flags) are sent by that thread after it, so
//! that nobody is told what the file holds while a mapping of it may still
//! show something else. Dropping only the cached attributes locks no page:
//! that one is sent at once, before the reply it must precede.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use fuser::{INodeNo, Notifier};

use crate::inodes::{Inode, VerityState};

/// What the notifying thread does, in order.
enum Job {
    /// Drop every cached page of the inode, then mark its cache verified
    /// unless another drop was queued since (its number, `drops_queued`).
    Drop(Arc<Inode>, u64),
    /// Send a reply that must follow every drop queued before it.
    Reply(Box<dyn FnOnce() + Send>),
}

/// Queues page cache invalidations for the notifying thread.
pub(crate) struct Invalidator {
    queue: Sender<Job>,
    /// Taken by the mount once its FUSE session exists.
    pending: Mutex<Option<Receiver<Job>>>,
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

    /// Drops every cached page (and the cached attributes) of `inode`,
    /// whose state `verity` the caller holds locked, soon: its
    /// `cache_verified` is clear until then.
    pub(crate) fn invalidate(&self, inode: Arc<Inode>, verity: &mut VerityState) {
        verity.cache_verified = false;
        verity.drops_queued += 1;
        // Fails only once the mount is gone, and its cache with it.
        let _ = self.queue.send(Job::Drop(inode, verity.drops_queued));
    }

    /// Runs `reply` once every drop queued so far is done.
    pub(crate) fn after_drops(&self, reply: impl FnOnce() + Send + 'static) {
        if let Err(job) = self.queue.send(Job::Reply(Box::new(reply))) {
            // The thread is gone with the mount: nothing is cached.
            if let Job::Reply(reply) = job.0 {
                reply();
            }
        }
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
                for job in pending {
                    match job {
                        Job::Drop(inode, number) => drop_pages(&notifier, &inode, number),
                        Job::Reply(reply) => reply(),
                    }
                }
            })
            .map(drop)
    }
}

/// Drops every cached page of `inode` and marks its cache as verified,
/// if this drop (`number`) is the last one queued.
fn drop_pages(notifier: &Notifier, inode: &Inode, number: u64) {
    // Offset 0, length 0: the whole file. ENOENT: the kernel holds no
    // pages of it.
    let dropped = match notifier.inval_inode(inode.ino, 0, 0) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
        Err(e) => {
            tracing::debug!("invalidating inode {}: {e}", inode.ino.0);
            false
        }
    };
    // Else every open still drops the cache. A drop queued meanwhile (a
    // writer's stores since this one began) sets it when done.
    let mut verity = inode.verity();
    if verity.drops_queued == number {
        verity.cache_verified = dropped;
    }
}
