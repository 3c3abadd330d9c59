//! Calls that go round a range's replicas one by one after one answered `Compacted`: a
//! replica that received the range by snapshot (a new one, or one that fell far behind)
//! keeps less history than the others, so a watch from a revision, or a read at one, that it
//! cannot serve may be served by another. The state at a revision, and the events after it,
//! are the same on every replica that keeps them.

use std::future::Future;

use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::KvError;

use super::Client;
use crate::attempt;
use crate::range_table::Picked;
use crate::retry;
use crate::stub::{Stub, Transport};

/// Replicas of a range asked after one answered `Compacted`, before the caller gives up.
pub(super) const REPLICAS_ASKED_MAX: usize = 7;

impl Client {
    /// `send` on the `index`th replica the range table names for the range holding `key`,
    /// within the request timeout. `None` past the last replica.
    pub(super) async fn call_replica<S, T, F, Fut>(
        &self,
        key: &[u8],
        index: usize,
        send: F,
    ) -> Option<Result<T, KvError>>
    where
        S: Stub,
        F: FnOnce(S) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let (picked, _, _) = self.inner.ranges.pick(Some(key), &[], &[], 0);
        let Picked::Range(range) = picked else {
            return None;
        };
        let uri = self
            .inner
            .ranges
            .replica_uris(range)
            .into_iter()
            .nth(index)?;
        let called = async {
            let channel = self.inner.pool.channel(&uri)?;
            let stub = S::on(channel, self.inner.credentials.clone());
            let timeout = self.inner.options.request_timeout;
            match tokio::time::timeout(timeout, send(stub)).await {
                Ok(Ok(answer)) => Ok(answer.into_inner()),
                Ok(Err(status)) => Err(retry::final_error(&attempt::from_status(&status))),
                Err(_) => Err(KvError::Timeout {
                    message: format!("calling {uri}"),
                }),
            }
        };
        Some(called.await)
    }

    /// A read at a revision of the range holding `key` that failed with `error`: when that is
    /// `Compacted`, the same read as a follower read (`send` with the consistency it is
    /// given) on each replica of the range in turn, and the first answer that is not an
    /// error. Otherwise, or when no replica answers, `error`.
    pub(super) async fn read_at_elsewhere<T, F, Fut>(
        &self,
        key: &[u8],
        error: KvError,
        mut send: F,
    ) -> Result<T, KvError>
    where
        F: FnMut(KvClient<Transport>, v1::Consistency) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        if !matches!(error, KvError::Compacted { .. }) {
            return Err(error);
        }
        for index in 0..REPLICAS_ASKED_MAX {
            let follower = |kv| send(kv, v1::Consistency::Follower);
            match self.call_replica(key, index, follower).await {
                Some(Ok(answer)) => return Ok(answer),
                // Compacted there too, or not reachable: the next.
                Some(Err(_)) => continue,
                None => break,
            }
        }
        Err(error)
    }
}
