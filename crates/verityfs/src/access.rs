//! How a file is being read: a few sequential streams, and how many reads
//! belonged to none of them.
//!
//! The kernel keeps one readahead state per open file. Behind a filesystem
//! daemon every reader of a file shares one open file, and one stream's
//! requests arrive out of order (the kernel keeps several in flight, served
//! by several threads), so a file remembers several streams, each with its
//! own tree readahead window: readers of different parts of one file do not
//! break each other's streams.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The streams remembered per file: the least recently used one makes room
/// for a new one.
const STREAMS: usize = 8;

/// How far from where a stream's previous read ended a read may start and
/// still belong to it, in reads of its size: requests of one stream arrive
/// out of order, by about as many requests as the kernel keeps in flight.
const STREAM_SLACK_READS: u64 = 64;

/// The same for the second read of a stream: a lone read (a random one, or
/// the first of a stream) is followed only by reads close to it, so that
/// the reads of a random pattern rarely pass for streams.
const NEW_STREAM_SLACK_READS: u64 = 8;

/// The most slack, whatever the size of the reads.
const MAX_SLACK: u64 = 8 << 20;

/// One sequential stream of reads.
#[derive(Debug)]
pub(crate) struct Stream {
    /// Where its latest read ended; `u64::MAX` while the slot is unused.
    end: AtomicU64,
    /// When it was last read (the file's read count then).
    used: AtomicU64,
    /// Whether a read followed the first one.
    confirmed: AtomicBool,
    /// Level-0 tree blocks below this index have had readahead issued for
    /// this stream.
    pub(crate) readahead_until: AtomicU64,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            end: AtomicU64::new(u64::MAX),
            used: AtomicU64::new(0),
            confirmed: AtomicBool::new(false),
            readahead_until: AtomicU64::new(0),
        }
    }
}

impl Stream {
    /// Whether a read of `len` bytes at `offset` continues this stream.
    fn continued_by(&self, offset: u64, len: u64) -> bool {
        let end = self.end.load(Relaxed);
        let reads = match self.confirmed.load(Relaxed) {
            true => STREAM_SLACK_READS,
            false => NEW_STREAM_SLACK_READS,
        };
        end != u64::MAX && offset.abs_diff(end) <= len.saturating_mul(reads).min(MAX_SLACK)
    }

    /// Records a read ending at `end` at time `now`.
    fn advance(&self, end: u64, now: u64) {
        self.end.store(end, Relaxed);
        self.used.store(now, Relaxed);
        self.confirmed.store(true, Relaxed);
    }

    /// Makes this slot a new stream whose first read ends at `end`.
    /// Concurrent readers may race for a slot: the loser's stream is simply
    /// not remembered, which costs readahead, never correctness.
    fn restart(&self, end: u64, now: u64, confirmed: bool) {
        self.readahead_until.store(0, Relaxed);
        self.confirmed.store(confirmed, Relaxed);
        self.end.store(end, Relaxed);
        self.used.store(now, Relaxed);
    }
}

/// What a read is part of.
pub(crate) enum Pattern<'a> {
    /// A sequential stream.
    Sequential(&'a Stream),
    /// No stream: the file's `n`th such read.
    Random(u64),
}

/// The access pattern of one file.
#[derive(Debug, Default)]
pub(crate) struct Access {
    streams: [Stream; STREAMS],
    reads: AtomicU64,
    random_reads: AtomicU64,
}

impl Access {
    /// Files the read of `offset..end` under a stream it continues, or
    /// under a new stream in place of the least recently used one. A read
    /// from the start of the file starts a stream, as in the kernel.
    pub(crate) fn observe(&self, offset: u64, end: u64) -> Pattern<'_> {
        let now = self.reads.fetch_add(1, Relaxed) + 1;
        if let Some(stream) = self
            .streams
            .iter()
            .find(|s| s.continued_by(offset, end - offset))
        {
            stream.advance(end, now);
            return Pattern::Sequential(stream);
        }
        let oldest = self
            .streams
            .iter()
            .min_by_key(|s| s.used.load(Relaxed))
            .expect("STREAMS > 0");
        oldest.restart(end, now, offset == 0);
        match offset {
            0 => Pattern::Sequential(oldest),
            _ => Pattern::Random(self.random_reads.fetch_add(1, Relaxed) + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequential(access: &Access, offset: u64, len: u64) -> bool {
        matches!(access.observe(offset, offset + len), Pattern::Sequential(_))
    }

    #[test]
    fn interleaved_streams_are_each_sequential() {
        let access = Access::default();
        let starts = [0, 100 << 20, 50 << 20, 150 << 20];
        for (i, &s) in starts.iter().enumerate() {
            // The first read of a stream away from the start is a lone read.
            assert_eq!(sequential(&access, s, 128 << 10), i == 0, "stream {i}");
        }
        for step in 1..100 {
            for (i, &s) in starts.iter().enumerate() {
                let offset = s + step * (128 << 10);
                assert!(sequential(&access, offset, 128 << 10), "stream {i} {step}");
            }
        }
    }

    #[test]
    fn out_of_order_requests_stay_in_their_stream() {
        let access = Access::default();
        assert!(sequential(&access, 0, 128 << 10));
        for step in [2u64, 1, 4, 3, 6, 5, 40, 39] {
            assert!(sequential(&access, step * (128 << 10), 128 << 10));
        }
    }

    #[test]
    fn random_reads_are_random() {
        let access = Access::default();
        let mut state = 1u64;
        let mut random = 0;
        for _ in 0..1000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            let offset = ((state >> 33) % (200 << 20)) & !4095;
            random += u32::from(!sequential(&access, offset | 4096, 4096));
        }
        assert!(random > 900, "{random} of 1000 random reads seen as random");
    }

    #[test]
    fn the_least_recently_used_stream_makes_room() {
        let access = Access::default();
        let far = |i: u64| (i + 1) * (1 << 30);
        for i in 0..STREAMS as u64 {
            access.observe(far(i), far(i) + 4096);
            assert!(sequential(&access, far(i) + 4096, 4096));
        }
        // Stream 0 is read again, so stream 1 is the one replaced.
        assert!(sequential(&access, far(0) + 8192, 4096));
        assert!(!sequential(&access, far(99), 4096));
        assert!(sequential(&access, far(0) + 12288, 4096));
        assert!(!sequential(&access, far(1) + 8192, 4096));
    }
}
