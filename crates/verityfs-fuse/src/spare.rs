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
//! The workers are shared by object: a request is charged to the object
//! whose lock the kernel holds while it waits for the answer (the
//! directory of a lookup or a creation, the file of a write or a
//! truncation; for requests it holds no lock for, the inode they are
//! about), at most [`PER_FILE`](crate::readers::PER_FILE) of them served
//! at once; the next ones wait for one of them. Requests on other objects,
//! whoever makes them, find a worker. Waiting by user instead, a user's
//! lookup behind the user's own stuck truncations would hold its
//! directory's lock, and every other user's creations there would wait for
//! it. A request for which the kernel also holds the locks of other
//! objects (a rename's, a link's, a removal's) fails rather than wait for
//! them.
//!
//! Each user also has at most [`PER_USER`] requests handed over at once;
//! the next ones fail at once (`EIO`): they do not wait, which would hold
//! their objects' locks, and one user's stuck requests never take every
//! worker, nor memory without bound with what they carry. (Requests that
//! the kernel queues behind stuck ones in its background slots still
//! wait; see docs/SECURITY.md.) Requests that never wait for the backing
//! store (forgets, releases) are always served at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::readers::{Job, Readers};

/// The most workers.
const MAX_WORKERS: usize = 1024;
/// The most requests of one user handed over and not yet answered: a
/// user's stuck requests take at most a quarter of the workers, and the
/// memory their data takes (up to 1 MiB a write) is bounded by user.
const PER_USER: usize = MAX_WORKERS / 4;

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
    users: Users,
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
            users: Users::default(),
        }
    }

    /// Whether this fuser thread may serve a request itself: held while it
    /// does. `None`: hand it over.
    pub(crate) fn serve_here(&self) -> Option<Serving<'_>> {
        let serving = self.serving.fetch_add(1, Ordering::AcqRel);
        let this = Serving(&self.serving);
        (serving < self.most).then_some(this)
    }

    /// Hands the request `serve` to a worker, charged to `charge`; serves
    /// it here if none can (none could be started). It fails at once
    /// (`EIO`) if its user has [`PER_USER`] requests handed over already,
    /// or if it may not wait and its object's workers are all busy.
    pub(crate) fn hand_over(
        &self,
        charge: Charge,
        serve: impl FnOnce(&mut Vec<u8>) + Send + 'static,
    ) {
        let Some(counted) = self.count(charge.uid) else {
            // Dropping the request unserved fails it.
            return;
        };
        let job = Deferred(Box::new(move |buf| {
            let _counted = counted;
            serve(buf)
        }));
        let offered = if charge.may_wait {
            self.workers.submit(charge.object, job)
        } else {
            self.workers.submit_unless_busy(charge.object, job)
        };
        if let Err(job) = offered {
            let mut buf = Vec::new();
            job.run(&mut buf);
        }
    }

    /// Counts one more request of user `uid` handed over, until the
    /// returned guard is dropped; `None` if it has [`PER_USER`].
    fn count(&self, uid: u32) -> Option<Counted> {
        let mut users = lock(&self.users);
        let count = users.entry(uid).or_default();
        if *count >= PER_USER {
            return None;
        }
        *count += 1;
        Some(Counted {
            users: self.users.clone(),
            uid,
        })
    }
}

/// What a handed-over request is charged to.
#[derive(Clone, Copy)]
pub(crate) struct Charge {
    uid: u32,
    object: u64,
    may_wait: bool,
}

impl Charge {
    /// A request of user `uid` for which the kernel holds the lock of
    /// inode `object` (or of none: then the inode it is about).
    pub(crate) fn new(uid: u32, object: u64) -> Charge {
        Charge {
            uid,
            object,
            may_wait: true,
        }
    }

    /// One for which the kernel also holds the locks of other objects (a
    /// rename's second directory, a link's or a removal's file): it fails
    /// rather than wait behind its object's stuck requests, holding those
    /// locks for as long.
    pub(crate) fn holding_more(self) -> Charge {
        Charge {
            may_wait: false,
            ..self
        }
    }
}

/// Requests handed over and not yet answered, by user.
type Users = Arc<Mutex<HashMap<u32, usize>>>;

/// One request counted in [`Users`] until dropped, served or not.
struct Counted {
    users: Users,
    uid: u32,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut users = lock(&self.users);
        if let Some(count) = users.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                users.remove(&self.uid);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
