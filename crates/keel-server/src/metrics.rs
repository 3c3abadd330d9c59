//! The node's metrics: what is counted as it happens (requests, by the gRPC layer in
//! `requests.rs`; storage commits, by the store's commit observer; hot keys, by the router)
//! and what is read at scrape time (`scrape.rs`: Raft state, range counts, store counters),
//! served in the Prometheus text format (`text.rs`) by the `--metrics-listen` endpoint
//! (`endpoint.rs`). Metric names start with `keel_` and end with their unit. Knows nothing
//! of request semantics.

mod endpoint;
mod histogram;
mod hot_keys;
mod requests;
mod scrape;
mod storage;
mod text;

use std::sync::Arc;

pub(crate) use endpoint::serve;
pub(crate) use hot_keys::HotKeys;
pub(crate) use requests::{MeteredLayer, RequestMetrics};
pub(crate) use storage::StorageMetrics;

/// What the node counts as it runs.
pub(crate) struct Metrics {
    pub requests: Arc<RequestMetrics>,
    pub storage: Arc<StorageMetrics>,
    pub hot_keys: HotKeys,
    /// When the node started, by its clock.
    pub started_at_ms: u64,
}

impl Metrics {
    pub fn new(clock: keel_types::SharedClock) -> Metrics {
        Metrics {
            requests: Arc::new(RequestMetrics::from_descriptor_set(
                keel_proto::FILE_DESCRIPTOR_SET,
                &crate::reflection::served(),
            )),
            storage: Arc::new(StorageMetrics::new()),
            started_at_ms: clock.now_ms(),
            hot_keys: HotKeys::new(clock),
        }
    }
}
