//! Storage metrics the writer thread reports as it commits (`keel_storage::CommitObserver`):
//! commit latency by durability and requests per commit. Counts only; knows nothing of
//! redb or the text format.

use std::time::Duration;

use keel_storage::{Commit, CommitObserver};

use super::histogram::{BATCH_REQUESTS, Histogram, HistogramSnapshot, LATENCY_SECONDS};

pub(crate) struct StorageMetrics {
    /// Commits with `Durability::Immediate` (one fsync each).
    durable: Histogram,
    /// Commits with `Durability::None`.
    lazy: Histogram,
    batch: Histogram,
}

/// The storage histograms at one moment.
pub(crate) struct StorageSnapshot {
    pub durable: HistogramSnapshot,
    pub lazy: HistogramSnapshot,
    pub batch: HistogramSnapshot,
}

impl StorageMetrics {
    pub fn new() -> StorageMetrics {
        StorageMetrics {
            durable: Histogram::new(LATENCY_SECONDS),
            lazy: Histogram::new(LATENCY_SECONDS),
            batch: Histogram::new(BATCH_REQUESTS),
        }
    }

    pub fn snapshot(&self) -> StorageSnapshot {
        StorageSnapshot {
            durable: self.durable.snapshot(),
            lazy: self.lazy.snapshot(),
            batch: self.batch.snapshot(),
        }
    }

    fn record(&self, durable: bool, requests: usize, duration: Duration) {
        let latency = match durable {
            true => &self.durable,
            false => &self.lazy,
        };
        latency.observe_duration(duration);
        self.batch.observe(requests as f64);
    }
}

impl CommitObserver for StorageMetrics {
    fn committed(&self, commit: &Commit) {
        self.record(commit.durable, commit.requests, commit.duration);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_are_counted_by_durability_and_batch() {
        let metrics = StorageMetrics::new();
        let commits = [(true, 1, 3), (true, 700, 5), (false, 2, 1)];
        for (durable, requests, ms) in commits {
            metrics.committed(&Commit {
                durable,
                requests,
                duration: Duration::from_millis(ms),
            });
        }
        let snapshot = metrics.snapshot();
        assert_eq!(snapshot.durable.count(), 2);
        assert!(
            (snapshot.durable.sum - 0.008).abs() < 1e-12,
            "{}",
            snapshot.durable.sum
        );
        assert_eq!(snapshot.lazy.count(), 1);
        assert_eq!(snapshot.batch.count(), 3);
        let last = snapshot.batch.counts.len() - 2;
        assert_eq!(
            snapshot.batch.counts[last], 1,
            "700 requests: the 1025 bucket"
        );
    }
}
