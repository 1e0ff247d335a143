//! The last of a directory mount's fuser threads is kept free.
//!
//! Any request may wait in a backing system call for as long as someone
//! else decides: a file's or a directory's inode lock is held for as long
//! as a `write(2)` or `getdents(2)` faults on a buffer mapped from a FUSE
//! filesystem whose server does not answer, and truncations, writes,
//! creations, even lookups behind a waiting creation, wait for it. Served
//! on fuser's few threads, a handful of such requests would hold them all,
//! and the mount would stop for every user.
//!
//! So at most all but one of fuser's threads serve requests themselves;
//! while they all are, the last one hands each request it reads to the
//! workers of [`Readers`], which grow as needed (up to [`MAX_WORKERS`]):
//! the daemon's own threads are never all stuck.
//!
//! The workers are shared by object, not by user: a request is counted
//! against the object whose lock the kernel holds while it waits for the
//! answer (the directory of a lookup or a creation, the file of a write or
//! a truncation), at most [`PER_FILE`](crate::readers::PER_FILE) of them
//! served at once. A request parked behind its object's stuck ones thus
//! holds only a lock that the stuck ones already block, and requests on other objects, whoever makes them,
//! find a worker. Counted by user, a user's lookup parked behind the
//! user's stuck truncations would hold its directory's lock, and every
//! other user's creations in that directory would wait for it. (Requests
//! that the kernel queues behind stuck ones in its background slots still
//! wait; see docs/SECURITY.md.) Requests that never wait for the backing
//! store (forgets, releases) are always served at once.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::readers::{Job, Readers};

/// The most workers: a user needs 16 objects with
/// [`PER_FILE`](crate::readers::PER_FILE) requests stuck on each to take
/// them all.
const MAX_WORKERS: usize = 1024;

/// Serves a request, with a worker's buffer for reads.
type ServeFn = Box<dyn FnOnce(&mut Vec<u8>) + Send>;

/// A request handed over, with its reply.
pub(crate) struct Deferred(ServeFn);

impl Job for Deferred {
    fn run(self, buf: &mut Vec<u8>) {
        (self.0)(buf)
    }
}

/// The fuser threads serving requests, and the workers for the rest.
pub(crate) struct Spare {
    serving: AtomicUsize,
    /// How many fuser threads may serve at once.
    most: usize,
    workers: Readers<Deferred>,
}

/// A fuser thread serving a request.
pub(crate) struct Serving<'a>(&'a AtomicUsize);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Spare {
    /// For a mount served by `threads` fuser threads. With one, it serves
    /// every request itself.
    pub(crate) fn new(threads: usize) -> Self {
        Spare {
            serving: AtomicUsize::new(0),
            most: threads.saturating_sub(1).max(1),
            workers: Readers::new(MAX_WORKERS),
        }
    }

    /// Whether this fuser thread may serve a request itself: held while it
    /// does. `None`: hand it over.
    pub(crate) fn serve_here(&self) -> Option<Serving<'_>> {
        let serving = self.serving.fetch_add(1, Ordering::AcqRel);
        let this = Serving(&self.serving);
        (serving < self.most).then_some(this)
    }

    /// Hands the request `serve`, which holds the kernel's lock of inode
    /// `ino`, to a worker; serves it here if none can (none could be
    /// started).
    pub(crate) fn hand_over(&self, ino: u64, serve: impl FnOnce(&mut Vec<u8>) + Send + 'static) {
        if let Err(job) = self.workers.submit(ino, Deferred(Box::new(serve))) {
            let mut buf = Vec::new();
            job.run(&mut buf);
        }
    }
}
