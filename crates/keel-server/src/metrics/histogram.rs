//! A histogram with fixed bucket bounds and atomic counters: observing takes no lock, so the
//! request path and the storage writer thread record into it directly. Knows nothing of
//! the text format.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bounds of latency histograms, in seconds: 100 µs to 10 s.
pub(crate) const LATENCY_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Bounds of the storage batch size histogram (requests in one commit), up to
/// `STORAGE_COMMIT_BATCH_MAX` + 1.
pub(crate) const BATCH_REQUESTS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1025.0,
];

pub(crate) struct Histogram {
    bounds: &'static [f64],
    /// One counter per bound (observations at most that bound and above the one before),
    /// then one for observations above the last bound.
    counts: Box<[AtomicU64]>,
    /// The sum of the observations, as the bits of an f64.
    sum_bits: AtomicU64,
}

/// A histogram's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistogramSnapshot {
    pub bounds: &'static [f64],
    /// Per bucket, not cumulative: one per bound, then the count above the last bound.
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        assert!(
            bounds.windows(2).all(|pair| pair[0] < pair[1]),
            "histogram bounds must rise: {bounds:?}"
        );
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, value: f64) {
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    pub fn observe_duration(&self, duration: Duration) {
        self.observe(duration.as_secs_f64());
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.bounds,
            counts: self
                .counts
                .iter()
                .map(|count| count.load(Ordering::Relaxed))
                .collect(),
            sum: f64::from_bits(self.sum_bits.load(Ordering::Relaxed)),
        }
    }
}

impl HistogramSnapshot {
    /// Observations in all buckets.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_at_least_their_value() {
        let cases: &[(f64, usize)] = &[
            (0.0, 0),
            (0.001, 0),
            (0.0011, 1),
            (1.0, 1),
            (1.5, 2),
            (f64::INFINITY, 2),
        ];
        for (value, bucket) in cases {
            let histogram = Histogram::new(&[0.001, 1.0]);
            histogram.observe(*value);
            let snapshot = histogram.snapshot();
            let mut expected = vec![0; 3];
            expected[*bucket] = 1;
            assert_eq!(snapshot.counts, expected, "{value}");
            assert_eq!(snapshot.count(), 1);
        }
    }

    #[test]
    fn the_sum_adds_every_observation() {
        let histogram = Histogram::new(LATENCY_SECONDS);
        histogram.observe_duration(Duration::from_millis(250));
        histogram.observe_duration(Duration::from_millis(1_250));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.sum, 1.5);
        assert_eq!(snapshot.count(), 2);
        assert_eq!(snapshot.counts.len(), LATENCY_SECONDS.len() + 1);
    }

    #[test]
    fn concurrent_observations_are_all_counted() {
        let histogram = Histogram::new(BATCH_REQUESTS);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for i in 0..1_000 {
                        histogram.observe(f64::from(i % 8));
                    }
                });
            }
        });
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count(), 4_000);
        assert_eq!(snapshot.sum, 4.0 * 125.0 * 28.0);
    }
}
