//! How patient a remote store is, and how much memory it may use.

use std::time::Duration;

/// Limits of a [`RemoteStore`](crate::RemoteStore).
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// The longest one request of a read waits for the network, retries
    /// included: then the read fails with `EIO` (a server that stalls must
    /// not hang the mount).
    pub timeout: Duration,
    /// The most bytes of fetched ranges kept in memory (read ahead, or
    /// fetched for the tree), whatever the image's size.
    pub memory: u64,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            timeout: Duration::from_secs(30),
            memory: 128 << 20,
        }
    }
}

impl RemoteOptions {
    /// How long one connection attempt may take.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.timeout.min(Duration::from_secs(2))
    }

    /// How long one request may take: a third of the limit, so that a
    /// request that timed out can be retried within it.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.timeout / 3
    }
}
