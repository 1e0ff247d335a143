//! The fetched ranges kept in memory: fixed, aligned chunks of objects,
//! each either on its way or arrived, shared by every reader of the store,
//! with least-recently-used eviction under a fixed budget.
//!
//! A chunk is claimed before it is fetched, so that a reader needing it
//! waits for the request in flight instead of sending a second one. A
//! failed fetch is forgotten at once: the next read asks again (a transient
//! fault is not sticky), and a wrong byte is caught by verification.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use crate::runtime::timed_out;

/// The size of a chunk: a request's worth when reading ahead (large enough
/// that a request's latency is paid once per 2 MiB; small enough that many
/// are in flight within the memory budget).
pub(crate) const CHUNK: u64 = 2 << 20;

/// A chunk's key: the object (by the store's number for it) and the chunk's
/// index in it.
pub(crate) type Key = (u64, u64);

/// One chunk: fetched, or being fetched.
pub(crate) struct Slot {
    state: Mutex<State>,
    arrived: Condvar,
}

enum State {
    Pending,
    Ready(Bytes),
    Failed(io::ErrorKind, String),
}

impl Slot {
    fn pending() -> Self {
        Slot {
            state: Mutex::new(State::Pending),
            arrived: Condvar::new(),
        }
    }

    /// The chunk's bytes once they arrive (fewer than [`CHUNK`] at the end
    /// of an object), or its fetch's error; a timeout error at `deadline`.
    pub(crate) fn wait(&self, deadline: Instant) -> io::Result<Bytes> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match &*state {
                State::Ready(bytes) => return Ok(bytes.clone()),
                State::Failed(kind, msg) => return Err(io::Error::new(*kind, msg.clone())),
                State::Pending => {}
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(timed_out)?;
            state = self
                .arrived
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The chunk's bytes if they have arrived.
    pub(crate) fn ready(&self) -> Option<Bytes> {
        match &*self.state.lock().unwrap_or_else(|e| e.into_inner()) {
            State::Ready(bytes) => Some(bytes.clone()),
            _ => None,
        }
    }

    /// Whether the chunk is still on its way.
    fn is_pending(&self) -> bool {
        matches!(
            *self.state.lock().unwrap_or_else(|e| e.into_inner()),
            State::Pending
        )
    }

    fn finish(&self, result: &io::Result<Bytes>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *state = match result {
            Ok(bytes) => State::Ready(bytes.clone()),
            Err(e) => State::Failed(e.kind(), e.to_string()),
        };
        self.arrived.notify_all();
    }
}

/// The chunks in memory.
pub(crate) struct Chunks {
    lru: Mutex<Lru>,
    /// The most chunks kept (arrived or in flight).
    capacity: usize,
    /// Buffers of chunks given back, filled again by the next fetches: a
    /// stream then writes into memory it already has, instead of paying
    /// for fresh pages (a fault, zeroing, accounting) per chunk.
    spare: Mutex<Vec<BytesMut>>,
}

/// The most spare buffers kept.
const SPARE: usize = 8;

struct Lru {
    slots: HashMap<Key, (Arc<Slot>, u64)>,
    clock: u64,
}

impl Chunks {
    /// Room for `memory` bytes of chunks (at least a few, so that a stream
    /// and the tree can both be in memory).
    pub(crate) fn new(memory: u64) -> Self {
        Chunks {
            lru: Mutex::new(Lru {
                slots: HashMap::new(),
                clock: 0,
            }),
            capacity: (memory / CHUNK).max(4) as usize,
            spare: Mutex::new(Vec::new()),
        }
    }

    /// An empty buffer for a chunk's bytes.
    pub(crate) fn buffer(&self) -> BytesMut {
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop();
        spare.unwrap_or_else(|| BytesMut::with_capacity(CHUNK as usize))
    }

    /// Keeps `buffer` for a later chunk, if it is a chunk's and there is
    /// room.
    pub(crate) fn recycle(&self, mut buffer: BytesMut) {
        if buffer.capacity() >= CHUNK as usize {
            buffer.clear();
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            if spare.len() < SPARE {
                spare.push(buffer);
            }
        }
    }

    /// Recycles the buffer of a chunk dropped from the cache, if nobody
    /// holds it any more: a reader still copying out of it keeps it alive
    /// (and unchanged) as long as it needs it.
    fn recycle_slot(&self, slot: Arc<Slot>) {
        let Some(slot) = Arc::into_inner(slot) else {
            return;
        };
        if let State::Ready(bytes) = slot.state.into_inner().unwrap_or_else(|e| e.into_inner()) {
            if let Ok(buffer) = bytes.try_into_mut() {
                self.recycle(buffer);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The chunk `key` if it has arrived or is on its way.
    pub(crate) fn get(&self, key: Key) -> Option<Arc<Slot>> {
        let mut lru = self.lock();
        lru.clock += 1;
        let clock = lru.clock;
        lru.slots.get_mut(&key).map(|(slot, used)| {
            *used = clock;
            slot.clone()
        })
    }

    /// The chunk `key`, and whether the caller must fetch it (it was
    /// neither arrived nor on its way): then the caller calls
    /// [`Chunks::finish`] with the result. `None` when the budget is all in
    /// flight: the caller fetches without the cache.
    pub(crate) fn claim(&self, key: Key) -> Option<(Arc<Slot>, bool)> {
        let mut lru = self.lock();
        lru.clock += 1;
        let clock = lru.clock;
        if let Some((slot, used)) = lru.slots.get_mut(&key) {
            *used = clock;
            return Some((slot.clone(), false));
        }
        if lru.slots.len() >= self.capacity {
            let evicted = lru.evict_one()?;
            self.recycle_slot(evicted);
        }
        let slot = Arc::new(Slot::pending());
        lru.slots.insert(key, (slot.clone(), clock));
        Some((slot, true))
    }

    /// Records the fetch of chunk `key` into `slot`: a failure is
    /// forgotten, so that the next read fetches again.
    pub(crate) fn finish(&self, key: Key, slot: &Arc<Slot>, result: &io::Result<Bytes>) {
        slot.finish(result);
        if result.is_err() {
            let mut lru = self.lock();
            if lru
                .slots
                .get(&key)
                .is_some_and(|(s, _)| Arc::ptr_eq(s, slot))
            {
                lru.slots.remove(&key);
            }
        }
    }

    /// Drops chunk `key` (its bytes failed verification, or its reader is
    /// done with it); returns whether it was there.
    pub(crate) fn forget(&self, key: Key) -> bool {
        let removed = self.lock().slots.remove(&key);
        removed.map(|(slot, _)| self.recycle_slot(slot)).is_some()
    }

    /// How many more chunks may be fetched ahead now: read-ahead takes at
    /// most half the budget, so that what readers wait for always fits.
    pub(crate) fn room_ahead(&self) -> usize {
        let lru = self.lock();
        let in_flight = lru.slots.values().filter(|(s, _)| s.is_pending()).count();
        (self.capacity / 2).saturating_sub(in_flight)
    }
}

impl Lru {
    /// Drops the least recently used chunk that has arrived, and returns
    /// it: `None` if all are in flight.
    fn evict_one(&mut self) -> Option<Arc<Slot>> {
        let oldest = self
            .slots
            .iter()
            .filter(|(_, (slot, _))| !slot.is_pending())
            .min_by_key(|(_, (_, used))| *used)
            .map(|(key, _)| *key)?;
        self.slots.remove(&oldest).map(|(slot, _)| slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn a_claimed_chunk_is_fetched_once_and_shared() {
        let chunks = Chunks::new(8 * CHUNK);
        let (slot, fetch) = chunks.claim((1, 0)).unwrap();
        assert!(fetch);
        let (again, fetch_again) = chunks.claim((1, 0)).unwrap();
        assert!(!fetch_again && Arc::ptr_eq(&slot, &again));
        chunks.finish((1, 0), &slot, &Ok(Bytes::from_static(b"abc")));
        assert_eq!(
            &chunks.get((1, 0)).unwrap().wait(soon()).unwrap()[..],
            b"abc"
        );
    }

    #[test]
    fn a_failed_fetch_is_forgotten_and_its_waiters_get_the_error() {
        let chunks = Chunks::new(8 * CHUNK);
        let (slot, _) = chunks.claim((1, 0)).unwrap();
        chunks.finish((1, 0), &slot, &Err(io::ErrorKind::ConnectionReset.into()));
        assert_eq!(
            slot.wait(soon()).unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );
        assert!(chunks.get((1, 0)).is_none());
        assert!(chunks.claim((1, 0)).unwrap().1);
    }

    #[test]
    fn the_budget_holds_evicting_the_least_recently_used() {
        let chunks = Chunks::new(4 * CHUNK);
        for i in 0..4 {
            let (slot, _) = chunks.claim((1, i)).unwrap();
            chunks.finish((1, i), &slot, &Ok(Bytes::new()));
        }
        chunks.get((1, 0));
        chunks.claim((1, 4)).unwrap();
        assert!(chunks.get((1, 0)).is_some());
        assert!(chunks.get((1, 1)).is_none());
        assert_eq!(chunks.lock().slots.len(), 4);
    }

    #[test]
    fn when_all_is_in_flight_nothing_more_is_claimed() {
        let chunks = Chunks::new(4 * CHUNK);
        for i in 0..4 {
            chunks.claim((1, i)).unwrap();
        }
        assert_eq!(chunks.room_ahead(), 0);
        assert!(chunks.claim((1, 9)).is_none());
    }

    /// A chunk filled into a buffer of `chunks`, and the buffer's address.
    fn filled(chunks: &Chunks, key: Key) -> *const u8 {
        let mut buffer = chunks.buffer();
        buffer.extend_from_slice(&[1; CHUNK as usize]);
        let (slot, _) = chunks.claim(key).unwrap();
        let bytes = buffer.freeze();
        let address = bytes.as_ptr();
        chunks.finish(key, &slot, &Ok(bytes));
        address
    }

    #[test]
    fn a_dropped_chunk_lends_its_buffer_to_the_next_fetch() {
        let chunks = Chunks::new(8 * CHUNK);
        let address = filled(&chunks, (1, 0));
        assert!(chunks.forget((1, 0)));
        let buffer = chunks.buffer();
        assert_eq!(buffer.as_ptr(), address);
        assert!(buffer.is_empty() && buffer.capacity() >= CHUNK as usize);
    }

    #[test]
    fn a_dropped_chunk_still_being_read_keeps_its_bytes() {
        let chunks = Chunks::new(8 * CHUNK);
        let address = filled(&chunks, (1, 0));
        let held = chunks.get((1, 0)).unwrap().wait(soon()).unwrap();
        assert!(chunks.forget((1, 0)));
        let mut buffer = chunks.buffer();
        assert_ne!(buffer.as_ptr(), address);
        buffer.extend_from_slice(&[2; CHUNK as usize]);
        assert!(held.iter().all(|&b| b == 1));
    }

    #[test]
    fn a_wait_ends_at_its_deadline() {
        let chunks = Chunks::new(4 * CHUNK);
        let (slot, _) = chunks.claim((1, 0)).unwrap();
        let err = slot
            .wait(Instant::now() + Duration::from_millis(50))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
