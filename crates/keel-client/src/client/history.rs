//! A key's history: its changes, page by page, from the history its range keeps.

use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::{Consistency, KvError, ReadBound, Revision, validate};

use super::{Client, bounded_staleness_ms, read, read_route};
use crate::results::{self, HistoryResult};
use crate::stub::Transport;

impl Client {
    /// One page of `key`'s changes (puts, deletes, increments, removals of an expired key),
    /// oldest first, from revision `from` on (0 = from the oldest kept), at most `limit`
    /// (0 = 100; at most 1,000); follow `next_revision` while `more`. Read like `get_within`
    /// reads the key. `Compacted` when events from `from` on may be gone from the serving
    /// replica (older than its retention, or from before its history began).
    pub async fn history(
        &self,
        key: &[u8],
        from: Revision,
        limit: u32,
        consistency: Consistency,
        bound: ReadBound,
    ) -> Result<HistoryResult, KvError> {
        validate::check_key(key)?;
        validate::check_history_limit(limit)?;
        let request = v1::HistoryRequest {
            key: key.to_vec(),
            start_revision: from,
            limit,
            consistency: v1::Consistency::from(consistency).into(),
            no_forward: true,
            max_staleness_ms: bounded_staleness_ms(bound)?,
            min_revision: bound.min_revision,
        };
        let timeout = self.inner.options.request_timeout;
        let by = read_route(key, consistency);
        let response = self
            .call(
                read(consistency),
                by,
                timeout,
                |mut kv: KvClient<Transport>| {
                    let request = request.clone();
                    async move { kv.history(request).await }
                },
            )
            .await?;
        results::history(response)
    }
}
