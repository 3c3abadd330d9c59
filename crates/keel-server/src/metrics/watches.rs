//! The node's watch streams as counted: how many are open (at most `WATCHES_PER_NODE_MAX`;
//! a stream holds a `WatchSlot` while it lives), the events they sent, the history reads
//! they made (shared by the streams of a range at one cursor) and why they ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use keel_types::limits::WATCHES_PER_NODE_MAX;

/// Why a watch stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchEnd {
    /// The client closed it or went away.
    Closed,
    /// The range no longer holds the covered span (it split).
    Split,
    /// Its events were compacted before it could send them: it fell out of retention.
    Compacted,
    /// The replica stopped (removed, or the node is closing) or failed to read.
    Unavailable,
}

impl WatchEnd {
    pub const ALL: [WatchEnd; 4] = [
        WatchEnd::Closed,
        WatchEnd::Split,
        WatchEnd::Compacted,
        WatchEnd::Unavailable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            WatchEnd::Closed => "closed",
            WatchEnd::Split => "split",
            WatchEnd::Compacted => "compacted",
            WatchEnd::Unavailable => "unavailable",
        }
    }
}

#[derive(Default)]
pub(crate) struct WatchMetrics {
    open: AtomicUsize,
    events_sent: AtomicU64,
    history_reads: AtomicU64,
    ended: [AtomicU64; WatchEnd::ALL.len()],
    refused: AtomicU64,
}

/// One open watch stream; counted out when dropped.
pub(crate) struct WatchSlot {
    metrics: Arc<WatchMetrics>,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.metrics.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WatchMetrics {
    /// A slot for one more stream; `None` (and counted as refused) when the node serves
    /// `WATCHES_PER_NODE_MAX` already.
    pub fn open(self: &Arc<Self>) -> Option<WatchSlot> {
        let taken = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
                (open < WATCHES_PER_NODE_MAX).then_some(open + 1)
            });
        match taken {
            Ok(_) => Some(WatchSlot {
                metrics: self.clone(),
            }),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    pub fn sent(&self, events: usize) {
        self.events_sent.fetch_add(events as u64, Ordering::Relaxed);
    }

    /// A read of a range's history for its streams (one that others may share).
    pub fn history_read(&self) {
        self.history_reads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn history_reads(&self) -> u64 {
        self.history_reads.load(Ordering::Relaxed)
    }

    pub fn ended(&self, end: WatchEnd) {
        self.ended[end as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn open_now(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn events_sent(&self) -> u64 {
        self.events_sent.load(Ordering::Relaxed)
    }

    pub fn ended_by(&self, end: WatchEnd) -> u64 {
        self.ended[end as usize].load(Ordering::Relaxed)
    }

    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_given_back_when_its_stream_ends() {
        let metrics = Arc::new(WatchMetrics::default());
        let first = metrics.open().unwrap();
        let second = metrics.open().unwrap();
        assert_eq!(metrics.open_now(), 2);
        drop(first);
        assert_eq!(metrics.open_now(), 1);
        drop(second);
        assert_eq!(metrics.open_now(), 0);
    }

    #[test]
    fn no_slot_past_the_limit() {
        let metrics = Arc::new(WatchMetrics::default());
        let slots: Vec<_> = (0..WATCHES_PER_NODE_MAX)
            .map(|_| metrics.open().unwrap())
            .collect();
        assert!(metrics.open().is_none());
        assert_eq!(metrics.refused(), 1);
        drop(slots);
        assert!(metrics.open().is_some());
    }
}
