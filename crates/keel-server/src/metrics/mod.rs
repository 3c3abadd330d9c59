//! The node's metrics as they are counted: requests, by the gRPC layer in `requests.rs`;
//! storage commits, by the store's commit observer; hot keys, by the router; watch streams,
//! by the watch service (`watches.rs`); and the Prometheus text format (`text.rs`) they are
//! written in. What is read at scrape time and
//! the `--metrics-listen` endpoint are `api/metrics.rs`, which reads the node. Metric names
//! start with `keel_` and end with their unit. Knows nothing of request semantics, and never
//! names the node context.

mod histogram;
mod hot_keys;
mod requests;
mod storage;
pub(crate) mod text;
mod watches;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

pub(crate) use hot_keys::HotKeys;
pub(crate) use requests::{MeteredLayer, RequestMetrics};
pub(crate) use storage::StorageMetrics;
pub(crate) use watches::{WatchEnd, WatchMetrics, WatchSlot};

/// What the node counts as it runs.
pub(crate) struct Metrics {
    pub requests: Arc<RequestMetrics>,
    pub storage: Arc<StorageMetrics>,
    pub hot_keys: HotKeys,
    /// When the node started, by its clock.
    pub started_at_ms: u64,
    /// Load splits the split driver declined: every live node held the range already.
    pub load_splits_declined: AtomicU64,
    /// Requests this node sent on to a leader on the `Raft.Forward` stream.
    pub forwarded_on_stream: AtomicU64,
    /// Requests this node sent on to a leader as calls of their own.
    pub forwarded_as_calls: AtomicU64,
    /// The watch streams this node serves.
    pub watches: Arc<WatchMetrics>,
}

impl Metrics {
    /// Metrics of a node that serves the gRPC services `served` (fully qualified names).
    pub fn new(clock: keel_types::SharedClock, served: &[&str]) -> Metrics {
        Metrics {
            requests: Arc::new(RequestMetrics::from_descriptor_set(
                keel_proto::FILE_DESCRIPTOR_SET,
                served,
            )),
            storage: Arc::new(StorageMetrics::new()),
            started_at_ms: clock.now_ms(),
            hot_keys: HotKeys::new(clock),
            load_splits_declined: AtomicU64::new(0),
            forwarded_on_stream: AtomicU64::new(0),
            forwarded_as_calls: AtomicU64::new(0),
            watches: Arc::default(),
        }
    }
}
