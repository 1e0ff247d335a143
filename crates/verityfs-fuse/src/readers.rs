//! The threads that serve an image's reads, and the first opens of its
//! files, apart from the threads fuser reads requests with. A directory
//! mount hands them its requests too while fuser's threads are all but one
//! busy (see `spare`); there a "file" below is the object a request holds
//! the kernel's lock of.
//!
//! A read of a remote image, or a file's first open (which fetches its
//! object's tree), may wait for the network until its deadline
//! (`--timeout`). Served on one of fuser's few threads, a handful of them
//! on a server that stalls would hold all of those threads, and lookups,
//! `stat`s and listings, which the manifest in memory answers, would
//! queue behind them: one hanging object would freeze the mount for every
//! user. So fuser's threads only hand each of them, with its reply, to
//! these workers and go back to the kernel. Below, "reads" are both.
//!
//! Everything is bounded:
//! - at most the number of threads the mount gives ([`IMAGE_WORKERS`]
//!   for an image), started as reads come and ended after [`IDLE`]
//!   without one;
//! - each worker owns one buffer, reused for every read it serves: no
//!   allocation per read once it has grown to the largest read (1 MiB);
//!   a read waiting for a worker has no buffer yet;
//! - at most [`MAX_WAITING`] reads wait for a worker (a few dozen bytes
//!   each, plus a handed-over write's data); beyond that the thread
//!   handing one over waits for room. Only thousands of reads at once get
//!   there, each a user's thread blocked in the kernel; at most
//!   [`MAX_PARKED`] of them for one file (see below), further ones fail at
//!   once.
//!
//! Fairness: reads are taken in arrival order, but at most [`PER_FILE`]
//! workers serve one file at a time; its further reads wait, in order,
//! for one of them. Reads of other files (in memory, in the disk cache,
//! on a server that answers) thus find a worker unless enough files have
//! [`PER_FILE`] reads stuck at once to take every worker (two, on an
//! image's mount). The cap is not smaller because a read's deadline
//! starts when a worker runs it: with a cap of `c`, the `n`-th reader of
//! a stalled file fails after `⌈n/c⌉` deadlines. With half an image's
//! workers, 64 readers of a stalled file all fail after one, while a plain
//! stream (at most 16 reads in flight, the kernel's limit on read-ahead)
//! never meets the cap.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The most worker threads of an image's mount.
pub(crate) const IMAGE_WORKERS: usize = 128;
/// The most workers serving one file at a time.
pub(crate) const PER_FILE: usize = IMAGE_WORKERS / 2;
/// The most reads waiting for a worker.
const MAX_WAITING: usize = 4096;
/// The most reads of one file waiting for one of its workers: beyond, a
/// read fails at once (`EIO`), so that one stalled file never fills the
/// room every file waits in, nor memory with what its requests carry (a
/// directory mount's writes hand over their data, up to 1 MiB each).
const MAX_PARKED: usize = PER_FILE;
/// How long a worker waits for a read before it ends (and frees its
/// buffer).
const IDLE: Duration = Duration::from_secs(30);

/// A read (or first open) handed to the workers.
pub(crate) trait Job: Send + 'static {
    /// Serves it, with the worker's buffer.
    fn run(self, buf: &mut Vec<u8>);
}

/// The workers of one mount. Dropping it stops them: reads still waiting
/// are dropped unserved (a FUSE reply dropped unsent fails its request
/// with `EIO`), reads being served end at their deadline, unwaited for.
pub(crate) struct Readers<J: Job> {
    shared: Arc<Shared<J>>,
}

struct Shared<J> {
    state: Mutex<State<J>>,
    /// The most worker threads.
    max_workers: usize,
    /// Signalled when a read can be taken, or the workers stop.
    work: Condvar,
    /// Signalled when a read stops waiting, or the workers stop.
    room: Condvar,
}

/// The reads of one file being served, and those waiting for them.
struct FileReads<J> {
    running: usize,
    /// Reads of the file in the queue.
    queued: usize,
    /// Reads arrived while [`PER_FILE`] were running; never empty unless
    /// fewer are.
    parked: VecDeque<J>,
}

impl<J> FileReads<J> {
    fn new() -> Self {
        FileReads {
            running: 0,
            queued: 0,
            parked: VecDeque::new(),
        }
    }
}

struct State<J> {
    /// Reads not taken yet, in arrival order, with their file.
    queue: VecDeque<(u64, J)>,
    /// Each file with reads running.
    files: HashMap<u64, FileReads<J>>,
    /// The reads in `queue` and parked.
    waiting: usize,
    workers: usize,
    /// Workers waiting for a read.
    idle: usize,
    stopped: bool,
}

impl<J: Job> Readers<J> {
    /// No workers yet: they start with the first reads, up to
    /// `max_workers` (at least [`PER_FILE`]).
    pub(crate) fn new(max_workers: usize) -> Self {
        Readers {
            shared: Arc::new(Shared {
                max_workers: max_workers.max(PER_FILE),
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    files: HashMap::new(),
                    waiting: 0,
                    workers: 0,
                    idle: 0,
                    stopped: false,
                }),
                work: Condvar::new(),
                room: Condvar::new(),
            }),
        }
    }

    /// Hands `job`, a read of file `file`, to a worker; gives it back if
    /// none can serve it (no worker could be started, or they stopped).
    pub(crate) fn submit(&self, file: u64, job: J) -> Result<(), J> {
        self.offer(file, job, true)
    }

    /// [`Readers::submit`], but `job` fails at once (dropped unserved)
    /// rather than wait for one of its file's workers.
    pub(crate) fn submit_unless_busy(&self, file: u64, job: J) -> Result<(), J> {
        self.offer(file, job, false)
    }

    fn offer(&self, file: u64, job: J, may_wait: bool) -> Result<(), J> {
        let mut state = self.shared.lock();
        while state.waiting >= MAX_WAITING && !state.stopped {
            state = wait(&self.shared.room, state);
        }
        if state.stopped {
            return Err(job);
        }
        let reads = state.files.entry(file).or_insert_with(FileReads::new);
        // Those queued ahead of it are taken first: with fewer than
        // [`PER_FILE`] running and queued, it will not wait for them.
        let busy = reads.running + reads.queued >= PER_FILE;
        if reads.running + reads.queued + reads.parked.len() >= PER_FILE + MAX_PARKED
            || (busy && !may_wait)
        {
            drop(state);
            // Outside the lock: dropping a FUSE reply sends it.
            drop(job);
            return Ok(());
        }
        if reads.running == PER_FILE {
            // It waits for one of its file's workers: no other is woken.
            reads.parked.push_back(job);
            state.waiting += 1;
            return Ok(());
        }
        reads.queued += 1;
        state.waiting += 1;
        if state.queue.len() >= state.idle && state.workers < self.shared.max_workers {
            match self.spawn() {
                Ok(()) => state.workers += 1,
                Err(e) if state.workers == 0 => {
                    tracing::warn!("cannot start a read worker: {e}");
                    state.waiting -= 1;
                    state.unqueue(file);
                    return Err(job);
                }
                // The running workers take it in turn.
                Err(e) => tracing::debug!("cannot start another read worker: {e}"),
            }
        }
        state.queue.push_back((file, job));
        self.shared.work.notify_one();
        Ok(())
    }

    fn spawn(&self) -> std::io::Result<()> {
        let shared = self.shared.clone();
        std::thread::Builder::new()
            .name("verityfs-read".into())
            .spawn(move || shared.serve())
            .map(drop)
    }
}

impl<J: Job> Drop for Readers<J> {
    fn drop(&mut self) {
        let (queue, files) = {
            let mut state = self.shared.lock();
            state.stopped = true;
            state.waiting = 0;
            (
                std::mem::take(&mut state.queue),
                std::mem::take(&mut state.files),
            )
        };
        self.shared.work.notify_all();
        self.shared.room.notify_all();
        // Outside the lock: dropping a FUSE reply sends it.
        drop((queue, files));
    }
}

impl<J: Job> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A worker: serves reads until stopped or idle for [`IDLE`].
    fn serve(&self) {
        let mut buf = Vec::new();
        let mut state = self.lock();
        let mut done = None;
        while !state.stopped {
            let Some((file, job)) = state.next(done.take()) else {
                state.idle += 1;
                let (guard, waited) = self
                    .work
                    .wait_timeout(state, IDLE)
                    .unwrap_or_else(|p| p.into_inner());
                state = guard;
                state.idle -= 1;
                if waited.timed_out() && state.queue.is_empty() {
                    break;
                }
                continue;
            };
            self.room.notify_one();
            drop(state);
            // A read that panics fails alone (its reply, dropped unsent,
            // fails it) and its worker and file's count of workers go on.
            let run = std::panic::AssertUnwindSafe(|| job.run(&mut buf));
            if std::panic::catch_unwind(run).is_err() {
                tracing::error!("a read panicked");
            }
            done = Some(file);
            state = self.lock();
        }
        state.workers -= 1;
    }
}

impl<J> State<J> {
    /// The next read for a worker that has just served one of file `done`
    /// (if it has): the next waiting for that file, else the first in the
    /// queue whose file has fewer than [`PER_FILE`] running (those that
    /// have as many are parked with them on the way).
    fn next(&mut self, done: Option<u64>) -> Option<(u64, J)> {
        let served = done.and_then(|file| Some((file, self.files.get_mut(&file)?)));
        if let Some((file, served)) = served {
            if let Some(job) = served.parked.pop_front() {
                self.waiting -= 1;
                return Some((file, job));
            }
            served.running -= 1;
            self.forget_if_idle(file);
        }
        while let Some((file, job)) = self.queue.pop_front() {
            // Counted at `submit`: the entry is there.
            let entry = self.files.entry(file).or_insert_with(FileReads::new);
            entry.queued = entry.queued.saturating_sub(1);
            if entry.running < PER_FILE {
                entry.running += 1;
                self.waiting -= 1;
                return Some((file, job));
            }
            entry.parked.push_back(job);
        }
        None
    }

    /// Takes back a read of `file` counted as queued but never queued.
    fn unqueue(&mut self, file: u64) {
        if let Some(reads) = self.files.get_mut(&file) {
            reads.queued -= 1;
        }
        self.forget_if_idle(file);
    }

    /// Forgets `file` once none of its reads runs or waits.
    fn forget_if_idle(&mut self, file: u64) {
        if let Some(reads) = self.files.get(&file) {
            if reads.running == 0 && reads.queued == 0 {
                self.files.remove(&file);
            }
        }
    }
}

fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar.wait(guard).unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{self, RecvTimeoutError};
    use std::time::Instant;

    /// Longer than anything here takes unless it hangs.
    const LONG: Duration = Duration::from_secs(10);

    /// A read that waits at its gate, then sends its number.
    struct Task {
        gate: Gate,
        done: mpsc::Sender<usize>,
        number: usize,
    }

    /// The number of a read that panics.
    const PANICS: usize = usize::MAX;

    impl Job for Task {
        fn run(self, _: &mut Vec<u8>) {
            assert_ne!(self.number, PANICS, "a read that panics");
            self.gate.wait();
            let _ = self.done.send(self.number);
        }
    }

    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<bool>, Condvar)>);

    impl Gate {
        fn wait(&self) {
            let (open, opened) = &*self.0;
            let mut open = open.lock().unwrap();
            while !*open {
                open = opened.wait(open).unwrap();
            }
        }

        fn open(&self) {
            *self.0 .0.lock().unwrap() = true;
            self.0 .1.notify_all();
        }
    }

    /// Submits reads `numbers` of `file`, waiting at `gate`.
    fn submit(
        readers: &Readers<Task>,
        file: u64,
        gate: &Gate,
        done: &mpsc::Sender<usize>,
        numbers: std::ops::Range<usize>,
    ) {
        for number in numbers {
            let (gate, done) = (gate.clone(), done.clone());
            let task = Task { gate, done, number };
            assert!(readers.submit(file, task).is_ok());
        }
    }

    /// The next `n` numbers sent, sorted.
    fn received(finished: &mpsc::Receiver<usize>, n: usize) -> Vec<usize> {
        let mut got: Vec<usize> = (0..n)
            .map(|_| finished.recv_timeout(LONG).expect("a read served"))
            .collect();
        got.sort_unstable();
        got
    }

    /// Waits until the workers' state passes `check`.
    fn wait_until(readers: &Readers<Task>, check: impl Fn(&State<Task>) -> bool) {
        let start = Instant::now();
        while !check(&readers.shared.lock()) {
            assert!(start.elapsed() < LONG, "the workers never got there");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether file 1 has `running` reads running and `parked` parked.
    fn file_1(running: usize, parked: usize) -> impl Fn(&State<Task>) -> bool {
        move |state| {
            let file = state.files.get(&1);
            file.is_some_and(|f| (f.running, f.parked.len()) == (running, parked))
        }
    }

    #[test]
    fn reads_stuck_on_one_file_leave_workers_for_the_others() {
        let readers = Readers::new(IMAGE_WORKERS);
        let (stuck, free) = (Gate::default(), Gate::default());
        free.open();
        let (done, finished) = mpsc::channel();
        submit(&readers, 1, &stuck, &done, 0..2 * PER_FILE);
        wait_until(&readers, file_1(PER_FILE, PER_FILE));
        submit(&readers, 2, &free, &done, 1000..1000 + PER_FILE);
        assert_eq!(
            received(&finished, PER_FILE),
            (1000..1000 + PER_FILE).collect::<Vec<_>>()
        );
        assert!(finished.try_recv().is_err(), "a stuck read ended");
        stuck.open();
        assert_eq!(
            received(&finished, 2 * PER_FILE),
            (0..2 * PER_FILE).collect::<Vec<_>>()
        );
        wait_until(&readers, |state| {
            state.files.is_empty() && state.waiting == 0
        });
        assert!(readers.shared.lock().workers <= IMAGE_WORKERS);
    }

    #[test]
    fn stopping_drops_waiting_reads_and_waits_for_none() {
        let readers = Readers::new(IMAGE_WORKERS);
        let stuck = Gate::default();
        let (done, finished) = mpsc::channel();
        submit(&readers, 1, &stuck, &done, 0..2 * PER_FILE);
        drop(done);
        wait_until(&readers, file_1(PER_FILE, PER_FILE));
        let start = Instant::now();
        drop(readers);
        assert!(start.elapsed() < LONG, "stopping waited for running reads");
        stuck.open();
        // The running reads end; those waiting were dropped unserved.
        assert_eq!(served(finished), PER_FILE);
    }

    /// How many reads are served before all are served or dropped.
    fn served(finished: mpsc::Receiver<usize>) -> usize {
        let served = std::iter::from_fn(|| match finished.recv_timeout(LONG) {
            Ok(number) => Some(number),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("a read neither served nor dropped"),
        });
        served.count()
    }

    /// At most [`MAX_PARKED`] reads wait for a stuck file's workers; the
    /// next ones fail at once (dropped unserved), whether they come while
    /// the file's workers run or while no worker is free (here all are
    /// taken by two other stuck files).
    #[test]
    fn a_stuck_file_keeps_a_bounded_number_of_reads_waiting() {
        let readers = Readers::new(IMAGE_WORKERS);
        let (stuck, others) = (Gate::default(), Gate::default());
        let (done, finished) = mpsc::channel();
        let (others_done, _others_finished) = mpsc::channel();
        submit(&readers, 2, &others, &others_done, 0..PER_FILE);
        submit(&readers, 3, &others, &others_done, 0..PER_FILE);
        let running = |state: &State<Task>, file| state.files.get(&file).map(|f| f.running);
        wait_until(&readers, |state| {
            running(state, 2) == Some(PER_FILE) && running(state, 3) == Some(PER_FILE)
        });
        let accepted = PER_FILE + MAX_PARKED;
        submit(&readers, 1, &stuck, &done, 0..accepted + 10);
        drop(done);
        assert_eq!(readers.shared.lock().waiting, accepted);
        others.open();
        wait_until(&readers, file_1(PER_FILE, MAX_PARKED));
        stuck.open();
        assert_eq!(served(finished), accepted);
    }

    /// A read that may not wait fails at once when its file's workers are
    /// all busy, and is served when one is free.
    #[test]
    fn a_read_that_may_not_wait_fails_when_its_file_is_busy() {
        let readers = Readers::new(IMAGE_WORKERS);
        let stuck = Gate::default();
        let (done, finished) = mpsc::channel();
        submit(&readers, 1, &stuck, &done, 0..PER_FILE);
        wait_until(&readers, file_1(PER_FILE, 0));
        let open = Gate::default();
        open.open();
        let task = |number| Task {
            gate: open.clone(),
            done: done.clone(),
            number,
        };
        assert!(readers.submit_unless_busy(1, task(1000)).is_ok());
        assert!(readers.submit_unless_busy(2, task(2000)).is_ok());
        assert_eq!(received(&finished, 1), [2000]);
        assert_eq!(readers.shared.lock().waiting, 0, "a busy file's read waits");
        stuck.open();
        assert_eq!(
            received(&finished, PER_FILE),
            (0..PER_FILE).collect::<Vec<_>>()
        );
        wait_until(&readers, |state| state.files.is_empty());
        assert!(readers.submit_unless_busy(1, task(1001)).is_ok());
        assert_eq!(received(&finished, 1), [1001]);
    }

    /// A file's count of workers is kept right through panics: as many
    /// as may serve it at once panic, and the next read of it is served.
    #[test]
    fn a_read_that_panics_fails_alone() {
        let readers = Readers::new(IMAGE_WORKERS);
        let gate = Gate::default();
        gate.open();
        let (done, finished) = mpsc::channel();
        for _ in 0..PER_FILE {
            let task = Task {
                gate: gate.clone(),
                done: done.clone(),
                number: PANICS,
            };
            assert!(readers.submit(1, task).is_ok());
        }
        submit(&readers, 1, &gate, &done, 0..1);
        assert_eq!(received(&finished, 1), [0]);
    }
}
