//! Per-range request load on this node: requests per second over the last minute and a
//! bounded sample of the keys requested, per range (`keel_meta::LoadWindow`), for the split
//! driver and `Cluster.Ranges`. Thread-safe, fixed memory per range, at most
//! `keel_meta::limits::LOAD_RANGES_MAX` ranges. Time comes from the node's clock seam.
//! Knows nothing of gRPC, Raft or storage.
//!
//! Wiring (keel-server):
//! - `Shared` holds `pub load: LoadTracker`, built in `Node::start_on` with
//!   `LoadTracker::new(config.clock.clone())`.
//! - The Kv, Lock and Idempotency services call `shared.load.record(range, key)` once per
//!   request they serve from a local range, with the key the request was routed by (scan:
//!   its start; batch: its first key; lock: the name; idempotency: `idempotency_key(scope,
//!   id)`). A node that forwards a request does not count it; the node serving it does.
//! - `Cluster.Ranges` reports `shared.load.requests_per_sec(range)`.
//! - The split driver reads `history` and `split_key`, calls `forget` after it split a range
//!   and `retain` with the ranges the node hosts every round.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use keel_meta::limits::{LOAD_RANGES_MAX, LOAD_WINDOW_SECS};
use keel_meta::{LoadWindow, SplitMix64};
use keel_types::{RangeDescriptor, RangeId, SharedClock};

/// Request counts and sampled keys of the ranges this node serves.
pub(crate) struct LoadTracker {
    clock: SharedClock,
    /// Held for a few counter updates and, when a key is sampled, a copy of at most
    /// `LOAD_SAMPLE_KEY_BYTES_MAX` bytes.
    inner: Mutex<Inner>,
}

struct Inner {
    windows: HashMap<RangeId, LoadWindow>,
    /// Draws for reservoir sampling; seeded per node, never a global generator.
    random: SplitMix64,
}

impl LoadTracker {
    /// A tracker reading time from `clock`, with a randomly seeded sampler.
    pub(crate) fn new(clock: SharedClock) -> LoadTracker {
        LoadTracker::with_random(clock, SplitMix64::new(rand::random()))
    }

    /// A tracker sampling with `random` (tests seed it).
    pub(crate) fn with_random(clock: SharedClock, random: SplitMix64) -> LoadTracker {
        LoadTracker {
            clock,
            inner: Mutex::new(Inner {
                windows: HashMap::new(),
                random,
            }),
        }
    }

    /// Counts one request to `range` for `key`. Not counted when the tracker already follows
    /// `LOAD_RANGES_MAX` other ranges.
    pub(crate) fn record(&self, range: RangeId, key: &[u8]) {
        let now_sec = self.now_sec();
        let mut inner = self.lock();
        let Inner { windows, random } = &mut *inner;
        if !windows.contains_key(&range) && windows.len() >= LOAD_RANGES_MAX {
            return;
        }
        let window = windows
            .entry(range)
            .or_insert_with(|| LoadWindow::new(now_sec));
        window.record(now_sec, key, random);
    }

    /// Mean requests per second `range` served over the last completed seconds
    /// (`keel_meta::limits::LOAD_RATE_SECS`); 0 for a range without requests.
    pub(crate) fn requests_per_sec(&self, range: RangeId) -> f64 {
        let now_sec = self.now_sec();
        self.lock()
            .windows
            .get(&range)
            .map_or(0.0, |window| window.requests_per_sec(now_sec))
    }

    /// Requests `range` served in each of the last completed seconds, oldest first
    /// (`keel_meta::limits::LOAD_WINDOW_SECS` of them): `RangeLoad::requests_per_sec_history`.
    pub(crate) fn history(&self, range: RangeId) -> Vec<u64> {
        let now_sec = self.now_sec();
        match self.lock().windows.get(&range) {
            Some(window) => window.history(now_sec),
            None => vec![0; LOAD_WINDOW_SECS],
        }
    }

    /// Where to split `span` (the range's current descriptor) for load, from the keys sampled
    /// from its recent requests (`keel_meta::load_split_key`).
    pub(crate) fn split_key(&self, span: &RangeDescriptor) -> Option<Vec<u8>> {
        let now_sec = self.now_sec();
        let inner = self.lock();
        let window = inner.windows.get(&span.id)?;
        keel_meta::load_split_key(window.samples(now_sec), span)
    }

    /// Drops what was counted for `range` (after a split, its load belongs to two ranges).
    pub(crate) fn forget(&self, range: RangeId) {
        self.lock().windows.remove(&range);
    }

    /// Keeps the ranges for which `keep` holds, drops the others (ranges no longer hosted).
    pub(crate) fn retain(&self, keep: impl Fn(RangeId) -> bool) {
        self.lock().windows.retain(|range, _| keep(*range));
    }

    fn now_sec(&self) -> u64 {
        self.clock.now_ms() / 1_000
    }

    /// The state; a panic elsewhere while it was held left counters, which are still usable.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use keel_meta::limits::LOAD_RATE_SECS;
    use keel_types::ManualClock;

    use super::*;

    fn tracker() -> (Arc<ManualClock>, LoadTracker) {
        let clock = ManualClock::new(1_000_000);
        let tracker = LoadTracker::with_random(clock.clone(), SplitMix64::new(3));
        (clock, tracker)
    }

    fn span(id: u64, start: &str, end: Option<&str>) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(id),
            start: start.as_bytes().to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
            epoch: 1,
            conf_version: 0,
            replicas: vec![1],
        }
    }

    #[test]
    fn requests_are_counted_per_range_and_second_of_the_clock() {
        let (clock, tracker) = tracker();
        for _ in 0..30 {
            tracker.record(RangeId(1), b"a");
        }
        tracker.record(RangeId(2), b"b");
        assert_eq!(
            tracker.requests_per_sec(RangeId(1)),
            0.0,
            "the second is not over"
        );
        clock.advance_ms(1_000);
        let per_sec = 30.0 / LOAD_RATE_SECS as f64;
        assert_eq!(tracker.requests_per_sec(RangeId(1)), per_sec);
        assert_eq!(
            tracker.requests_per_sec(RangeId(2)),
            1.0 / LOAD_RATE_SECS as f64
        );
        assert_eq!(tracker.requests_per_sec(RangeId(3)), 0.0);
        let history = tracker.history(RangeId(1));
        assert_eq!(history.len(), LOAD_WINDOW_SECS);
        assert_eq!(history.last(), Some(&30));
        assert_eq!(tracker.history(RangeId(3)), vec![0; LOAD_WINDOW_SECS]);
        clock.advance_ms(LOAD_RATE_SECS as u64 * 1_000);
        assert_eq!(
            tracker.requests_per_sec(RangeId(1)),
            0.0,
            "the load has passed"
        );
    }

    #[test]
    fn split_keys_come_from_the_sampled_keys() {
        let (_clock, tracker) = tracker();
        for key in ["b", "c", "d", "e", "f", "g", "h", "i", "j", "k"] {
            tracker.record(RangeId(1), key.as_bytes());
        }
        let at = tracker.split_key(&span(1, "a", None));
        assert_eq!(at, Some(b"g".to_vec()));
        assert_eq!(
            tracker.split_key(&span(2, "a", None)),
            None,
            "nothing sampled"
        );
        assert_eq!(
            tracker.split_key(&span(1, "m", None)),
            None,
            "no sample in the span"
        );
    }

    #[test]
    fn forgotten_and_unhosted_ranges_are_dropped() {
        let (clock, tracker) = tracker();
        for range in 1..=3 {
            tracker.record(RangeId(range), b"k");
        }
        clock.advance_ms(1_000);
        tracker.forget(RangeId(1));
        tracker.retain(|range| range != RangeId(2));
        assert_eq!(tracker.history(RangeId(1)).last(), Some(&0));
        assert_eq!(tracker.history(RangeId(2)).last(), Some(&0));
        assert_eq!(tracker.history(RangeId(3)).last(), Some(&1));
    }

    #[test]
    fn at_most_load_ranges_max_ranges_are_tracked() {
        let (clock, tracker) = tracker();
        for range in 0..LOAD_RANGES_MAX as u64 {
            tracker.record(RangeId(range), b"k");
        }
        tracker.record(RangeId(LOAD_RANGES_MAX as u64), b"k");
        tracker.record(RangeId(0), b"k");
        clock.advance_ms(1_000);
        let last = |range: u64| tracker.history(RangeId(range)).last().copied();
        assert_eq!(last(LOAD_RANGES_MAX as u64), Some(0), "one range too many");
        assert_eq!(last(0), Some(2), "tracked ranges still count");
        tracker.forget(RangeId(5));
        tracker.record(RangeId(LOAD_RANGES_MAX as u64), b"k");
        clock.advance_ms(1_000);
        assert_eq!(
            last(LOAD_RANGES_MAX as u64),
            Some(1),
            "room again after a forget"
        );
    }

    #[test]
    fn concurrent_records_are_all_counted() {
        let (clock, tracker) = tracker();
        std::thread::scope(|scope| {
            for thread in 0..4u8 {
                let tracker = &tracker;
                scope.spawn(move || {
                    for i in 0..1_000u32 {
                        tracker.record(RangeId(1), &[thread, (i % 256) as u8]);
                    }
                });
            }
        });
        clock.advance_ms(1_000);
        assert_eq!(tracker.history(RangeId(1)).last(), Some(&4_000));
    }
}
