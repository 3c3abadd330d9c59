//! Batches. An atomic batch is applied by one range, at one revision: one whose keys the
//! range table places in more than one range is refused before it is sent. A non-atomic
//! batch is split by range into parts, each sent as its own atomic batch with its own request
//! id; a part refused because a split moved some of its keys elsewhere is split again.

use std::sync::Arc;

use keel_proto::v1;
use keel_proto::v1::kv_client::KvClient;
use keel_types::validate;
use keel_types::{BatchOp, KvError, OpResult};
use tokio::task::JoinSet;

use super::route::RouteBy;
use super::write::WriteError;
use super::{Client, WRITE, checked_fence};
use crate::options::BatchOptions;
use crate::results::{self, BatchPart, BatchResult, NonAtomicBatchResult};
use crate::stub::Transport;

/// A part's indexes into the caller's ops, and what became of it.
type PartOutcome = (Vec<usize>, Result<BatchResult, WriteError>);

impl Client {
    /// Applies `ops` (puts, deletes, increments) atomically at one revision, or none of them.
    /// The keys must lie in one range: see `batch_with`.
    pub async fn batch(&self, ops: Vec<BatchOp>) -> Result<BatchResult, KvError> {
        self.batch_with(ops, BatchOptions::default()).await
    }

    /// Like `batch`, with the options of the whole batch (a fence guarding every key it
    /// writes). A batch is applied by the one range holding its keys: one whose keys the
    /// client's range table places in more than one range is refused before it is sent,
    /// with `InvalidArgument` naming two of the ranges; `batch_non_atomic` sends such ops
    /// in parts instead.
    pub async fn batch_with(
        &self,
        ops: Vec<BatchOp>,
        options: BatchOptions,
    ) -> Result<BatchResult, KvError> {
        validate::check_ops(&ops)?;
        let keys: Vec<Vec<u8>> = ops.iter().map(|op| op.key().to_vec()).collect();
        let request = v1::BatchRequest {
            ops: ops.into_iter().map(Into::into).collect(),
            no_forward: true,
            request_id: None,
            fence: checked_fence(options.fence)?,
        };
        self.send_batch(&keys, request).await.map_err(KvError::from)
    }

    /// Applies `ops` range by range: the ops of each range (in the caller's order) go as one
    /// atomic batch, with its own request id and `options`, retried as a batch is. The parts
    /// are atomic each but **not together**: one may be applied while another fails, and a
    /// reader may see one part applied before another. A part refused because its range
    /// split meanwhile (`KeyOutOfRange`) is split again by the refreshed table. Each part is
    /// retried within `write_deadline`.
    ///
    /// `Err` only for input refused before anything was sent; each op's outcome is in the
    /// result, in the caller's order.
    pub async fn batch_non_atomic(
        &self,
        ops: Vec<BatchOp>,
        options: BatchOptions,
    ) -> Result<NonAtomicBatchResult, KvError> {
        validate::check_ops(&ops)?;
        let fence = checked_fence(options.fence)?;
        let keys: Arc<Vec<Vec<u8>>> = Arc::new(ops.iter().map(|op| op.key().to_vec()).collect());
        let count = ops.len();
        let ops: Arc<Vec<v1::BatchOp>> = Arc::new(ops.into_iter().map(Into::into).collect());
        let deadline = tokio::time::Instant::now() + self.inner.options.write_deadline;
        self.prepare_routing(&RouteBy::Key(&keys[0]), deadline)
            .await;
        let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let mut tasks: JoinSet<PartOutcome> = JoinSet::new();
        let spawn = |tasks: &mut JoinSet<PartOutcome>, indexes: Vec<usize>| {
            let (client, keys, ops) = (self.clone(), keys.clone(), ops.clone());
            let fence = fence.clone();
            tasks.spawn(async move { client.batch_part(&keys, &ops, fence, indexes).await });
        };
        for group in self.inner.ranges.group(&key_refs) {
            spawn(&mut tasks, group);
        }
        let mut parts = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (indexes, outcome) = joined.unwrap_or_else(|error| match error.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(error) => panic!("a batch part was cancelled: {error}"),
            });
            match outcome {
                // Each group of a `Spans` is smaller than the part: this ends.
                Err(WriteError::Spans(spans)) => {
                    for group in spans.groups {
                        spawn(&mut tasks, group.iter().map(|&i| indexes[i]).collect());
                    }
                }
                Err(WriteError::Kv(error)) => parts.push((indexes, Err(error))),
                Ok(result) => parts.push((indexes, Ok(result))),
            }
        }
        Ok(non_atomic_result(count, &keys, parts))
    }

    /// Sends the ops at `indexes` as one atomic batch.
    async fn batch_part(
        &self,
        keys: &[Vec<u8>],
        ops: &[v1::BatchOp],
        fence: Option<v1::Fence>,
        indexes: Vec<usize>,
    ) -> PartOutcome {
        let part_keys: Vec<Vec<u8>> = indexes.iter().map(|&i| keys[i].clone()).collect();
        let request = v1::BatchRequest {
            ops: indexes.iter().map(|&i| ops[i].clone()).collect(),
            no_forward: true,
            request_id: None,
            fence,
        };
        let outcome = self.send_batch(&part_keys, request).await;
        (indexes, outcome)
    }

    /// One atomic batch of `request` (without its request id), whose op keys are `keys`.
    async fn send_batch(
        &self,
        keys: &[Vec<u8>],
        request: v1::BatchRequest,
    ) -> Result<BatchResult, WriteError> {
        let count = request.ops.len();
        let by = RouteBy::Keys(keys);
        let response = self
            .write_routed(WRITE, by, |mut kv: KvClient<Transport>, id| {
                let request = v1::BatchRequest {
                    request_id: Some(id.into()),
                    ..request.clone()
                };
                async move { kv.batch(request).await }
            })
            .await?;
        Ok(results::batch(response, count)?)
    }
}

/// The answer of a non-atomic batch of `count` ops whose keys are `keys`, from its parts
/// (in any order): per op in the caller's order, and the parts in key order of their first
/// keys.
fn non_atomic_result(
    count: usize,
    keys: &[Vec<u8>],
    mut parts: Vec<(Vec<usize>, Result<BatchResult, KvError>)>,
) -> NonAtomicBatchResult {
    let smallest_key = |indexes: &[usize]| indexes.iter().map(|&i| keys[i].clone()).min();
    parts.sort_by_cached_key(|(indexes, _)| smallest_key(indexes));
    let mut results: Vec<Option<Result<OpResult, KvError>>> = vec![None; count];
    let mut summary = Vec::with_capacity(parts.len());
    for (indexes, outcome) in parts {
        match &outcome {
            Ok(batch) => {
                for (&index, result) in indexes.iter().zip(&batch.results) {
                    results[index] = Some(Ok(result.clone()));
                }
            }
            Err(error) => {
                for &index in &indexes {
                    results[index] = Some(Err(error.clone()));
                }
            }
        }
        summary.push(BatchPart {
            ops: indexes,
            revision: outcome
                .as_ref()
                .map(|batch| batch.revision)
                .map_err(Clone::clone),
            replayed: outcome.as_ref().is_ok_and(|batch| batch.replayed),
        });
    }
    let results = results
        .into_iter()
        .map(|result| result.expect("every op belongs to exactly one part"))
        .collect();
    NonAtomicBatchResult {
        results,
        parts: summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(revision: u64, counters: &[Option<i64>]) -> Result<BatchResult, KvError> {
        Ok(BatchResult {
            revision,
            results: counters
                .iter()
                .map(|counter| OpResult {
                    previous: None,
                    existed: false,
                    counter: *counter,
                })
                .collect(),
            replayed: revision == 9,
        })
    }

    #[test]
    fn parts_are_put_back_in_the_callers_order() {
        let keys: Vec<Vec<u8>> = ["q", "a", "z", "b"]
            .iter()
            .map(|key| key.as_bytes().to_vec())
            .collect();
        let failed = KvError::unavailable("no quorum");
        let parts = vec![
            (vec![0, 2], applied(9, &[Some(1), Some(2)])),
            (vec![1], Err(failed.clone())),
            (vec![3], applied(4, &[Some(3)])),
        ];
        let result = non_atomic_result(4, &keys, parts);
        let counters: Vec<Result<Option<i64>, KvError>> = result
            .results
            .iter()
            .map(|result| result.as_ref().map(|op| op.counter).map_err(Clone::clone))
            .collect();
        assert_eq!(
            counters,
            vec![Ok(Some(1)), Err(failed.clone()), Ok(Some(2)), Ok(Some(3))]
        );
        // Parts in key order of their smallest key: "a", "b", "q".
        let parts: Vec<(Vec<usize>, Result<u64, KvError>, bool)> = result
            .parts
            .iter()
            .map(|part| (part.ops.clone(), part.revision.clone(), part.replayed))
            .collect();
        assert_eq!(
            parts,
            vec![
                (vec![1], Err(failed.clone()), false),
                (vec![3], Ok(4), false),
                (vec![0, 2], Ok(9), true),
            ]
        );
        assert!(!result.applied());
        assert_eq!(result.into_results().unwrap_err(), failed);
    }
}
