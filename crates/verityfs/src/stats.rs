//! Counters of the verified read path, per file and in total.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters, updated with relaxed atomics.
        #[derive(Debug, Default)]
        pub struct Counters {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A copy of [`Counters`] at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Snapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            /// The current values.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot { $($name: self.$name.load(Relaxed),)* }
            }
        }

        impl Snapshot {
            /// Field names and values, in declaration order (for reports).
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }
        }
    };
}

counters! {
    /// Data blocks hashed and checked against the tree.
    data_blocks_verified,
    /// Tree blocks read from the backing file.
    tree_blocks_read,
    /// Read requests issued for tree blocks (one per contiguous run).
    tree_read_requests,
    /// Asynchronous readahead requests issued for tree blocks.
    readahead_requests,
    /// Tree blocks covered by readahead (asynchronous hints and the extra
    /// blocks of synchronous reads).
    readahead_blocks,
    /// Tree block lookups answered by the cache.
    cache_hits,
    /// Tree block lookups that had to read the backing file.
    cache_misses,
    /// Hash mismatches found (data or tree).
    verification_failures,
}

/// Adds `n` to one counter of a file and to the same counter of the total.
pub(crate) fn bump(
    file: &Counters,
    total: &Counters,
    counter: fn(&Counters) -> &AtomicU64,
    n: u64,
) {
    counter(file).fetch_add(n, Relaxed);
    counter(total).fetch_add(n, Relaxed);
}
