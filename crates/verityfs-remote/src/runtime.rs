//! The async runtime the HTTP clients run on: the file system's threads are
//! plain threads that wait for a request's result, with a hard deadline.

use std::future::Future;
use std::io;
use std::time::Duration;

/// A small multi-threaded tokio runtime of the store's own (the network
/// work is I/O, not computation: two threads are plenty).
pub(crate) struct Runtime(tokio::runtime::Runtime);

impl Runtime {
    pub(crate) fn new() -> io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("verityfs-net")
            .enable_all()
            .build()?;
        Ok(Runtime(rt))
    }

    /// Runs `fut` to completion on the calling thread, failing with
    /// [`io::ErrorKind::TimedOut`] after `limit`.
    pub(crate) fn block_on<T>(
        &self,
        limit: Duration,
        fut: impl Future<Output = io::Result<T>>,
    ) -> io::Result<T> {
        self.0.block_on(within(limit, fut))
    }

    /// Runs `fut` to completion on the calling thread, however long it
    /// takes (an upload: each of its requests has its own timeout).
    pub(crate) fn run<T>(&self, fut: impl Future<Output = T>) -> T {
        self.0.block_on(fut)
    }

    /// Runs `fut` in the background.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.0.spawn(fut);
    }
}

/// `fut`'s result, or a timeout error after `limit`.
pub(crate) async fn within<T>(
    limit: Duration,
    fut: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// The error of a read that the network did not answer in time.
pub(crate) fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the server did not answer in time")
}
