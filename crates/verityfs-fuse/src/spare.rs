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
//! workers of [`Readers`], which grow as needed, each user's requests on at
//! most half of them (a "file" there is a user): the daemon's own threads
//! are never all stuck. (Other users' requests that the kernel queues
//! behind stuck ones, in its background slots or behind a directory's
//! lock, still wait; see docs/SECURITY.md.) Requests that never wait for
//! the backing store (forgets, releases) are always served at once.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::readers::{Job, Readers};

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
            workers: Readers::new(),
        }
    }

    /// Whether this fuser thread may serve a request itself: held while it
    /// does. `None`: hand it over.
    pub(crate) fn serve_here(&self) -> Option<Serving<'_>> {
        let serving = self.serving.fetch_add(1, Ordering::AcqRel);
        let this = Serving(&self.serving);
        (serving < self.most).then_some(this)
    }

    /// Hands the request `serve` of user `uid` to a worker; serves it here
    /// if none can (none could be started).
    pub(crate) fn hand_over(&self, uid: u32, serve: impl FnOnce(&mut Vec<u8>) + Send + 'static) {
        if let Err(job) = self.workers.submit(uid.into(), Deferred(Box::new(serve))) {
            let mut buf = Vec::new();
            job.run(&mut buf);
        }
    }
}
