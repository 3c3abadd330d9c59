//! The `keel.v1.Kv` service: validates every request, routes it by key (a scan by its start, a
//! batch by its first key) to the local range holding it, serves it on that range's replica
//! when it can (writes and consistent reads on the leader, follower reads anywhere) and
//! otherwise forwards it once to the leader or answers `NotLeader` (`requests/router.rs`). A scan page
//! ends at the serving range's end. A key's history is read like the key (`History`). Errors leave through
//! `status.rs`. The leader stamps its clock into every mutation it proposes (TTLs count from
//! there), and reads hide keys expired by this node's clock. A write with a fence is proposed
//! as a fenced mutation. Knows nothing of openraft types: groups speak `KvError`.

use std::sync::Arc;

use futures::StreamExt;
use keel_proto::convert;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::kv_server::Kv;
use keel_proto::v1::{
    BatchOpResult, BatchRequest, BatchResponse, DeleteRequest, DeleteResponse, GetRequest,
    GetResponse, HistoryRequest, HistoryResponse, IncrementRequest, IncrementResponse,
    LeaseRequest, LeaseResponse, OpenSessionRequest, OpenSessionResponse, PutRequest, PutResponse,
    ResponseHeader, ScanRequest, ScanResponse, TxnRequest, TxnResponse, WatchProgressRequest,
    WatchProgressResponse, WatchRequest,
};
use keel_raft::RaftGroup;
use keel_storage::{HistoryRead, KeyRead, Unreadable};
use keel_types::txn::{Txn, TxnMutation};
use keel_types::validate::{
    check_history_limit, check_key, check_op_count, check_ops, check_read_bound,
    check_read_revision, check_scan, check_txn,
};
use keel_types::{
    BatchOp, Command, CommandOutcome, Consistency, Fence, KeyValue, KvError, Mutation, OpResult,
    RangeDescriptor, ReadBound, RequestId, Revision, limits,
};
use tonic::{Request, Response, Status};

use crate::access::Call;
use crate::access::quota;
use crate::api::watch::{self, WatchStream};
use crate::peer::channels::PeerChannel;
use crate::requests::admission;
use crate::requests::coordinated::unexpected;
use crate::requests::router::{Audience, Hop, Router};
use crate::shared::Shared;

pub(crate) struct KvService {
    shared: Arc<Shared>,
    router: Router,
}

/// A write applied on this node's replica.
struct Applied {
    group: Arc<RaftGroup>,
    revision: Revision,
    results: Vec<OpResult>,
    /// The request had been applied before; this is its first outcome.
    replayed: bool,
}

impl KvService {
    pub fn new(shared: Arc<Shared>, audience: Audience) -> KvService {
        KvService {
            router: Router::new(shared.clone(), audience),
            shared,
        }
    }

    fn write_header(&self, applied: &Applied) -> Option<ResponseHeader> {
        self.router
            .header(&applied.group, applied.revision, applied.replayed)
    }

    async fn serve_get(&self, request: &GetRequest) -> Result<GetResponse, KvError> {
        check_key(&request.key)?;
        let consistency = convert::consistency(request.consistency)?;
        let (bound, at) = read_bound(
            request.max_staleness_ms,
            request.min_revision,
            request.revision,
        )?;
        let get = |group| self.local_get(group, request, consistency, bound, at);
        self.router.on_range(&request.key, get).await
    }

    async fn local_get(
        &self,
        group: Arc<RaftGroup>,
        request: &GetRequest,
        consistency: Consistency,
        bound: ReadBound,
        at: Option<Revision>,
    ) -> Result<GetResponse, KvError> {
        group.read_barrier_within(consistency, bound).await?;
        let now_ms = self.shared.clock.now_ms();
        if let Some(revision) = at {
            let read = group
                .state_machine()
                .read_key_at(&request.key, revision)
                .await
                .map_err(|e| self.router.storage_failed(e))?;
            let kv = read.map_err(|why| unreadable(why, revision, &request.key))?;
            return Ok(GetResponse {
                header: self.router.header(&group, revision, false),
                kv: kv.map(|kv| convert::key_value(kv, now_ms)),
            });
        }
        let read = group
            .state_machine()
            .read_key(&request.key, now_ms)
            .await
            .map_err(|e| self.router.storage_failed(e))?;
        let (kv, revision) = match read {
            KeyRead::Inside { kv, revision } => (kv, revision),
            KeyRead::Outside { descriptor, .. } => {
                return Err(KvError::KeyOutOfRange {
                    key: request.key.clone(),
                    range: Box::new(descriptor),
                });
            }
        };
        Ok(GetResponse {
            header: self.router.header(&group, revision, false),
            kv: kv.map(|kv| convert::key_value(kv, now_ms)),
        })
    }

    async fn serve_scan(&self, request: &ScanRequest) -> Result<ScanResponse, KvError> {
        let limit = check_scan(&request.start, &request.end, request.limit)?;
        let consistency = convert::consistency(request.consistency)?;
        let (bound, at) = read_bound(
            request.max_staleness_ms,
            request.min_revision,
            request.revision,
        )?;
        let scan = |group| self.local_scan(group, request, limit, consistency, (bound, at));
        self.router.on_range(&request.start, scan).await
    }

    /// One page of the scan from the range holding its start. The page ends at the range's
    /// end: when the range has no more rows but the scan goes on beyond it, the answer says
    /// `more` with `next_start` = the range's end, so a client pages on into the next range.
    async fn local_scan(
        &self,
        group: Arc<RaftGroup>,
        request: &ScanRequest,
        limit: u32,
        consistency: Consistency,
        (bound, at): (ReadBound, Option<Revision>),
    ) -> Result<ScanResponse, KvError> {
        group.read_barrier_within(consistency, bound).await?;
        let now_ms = self.shared.clock.now_ms();
        let state_machine = group.state_machine();
        let (start, end) = (&request.start, &request.end);
        let storage_failed = |e| self.router.storage_failed(e);
        let page = match at {
            None => state_machine
                .scan(start, end, limit, now_ms)
                .await
                .map_err(storage_failed)?,
            Some(revision) => state_machine
                .scan_at(start, end, limit, revision)
                .await
                .map_err(storage_failed)?
                .map_err(|why| unreadable(why, revision, start))?,
        };
        // Read after the page: the span only shrinks, so rows up to this end were the range's.
        let range = group.descriptor().await?;
        if !range.contains(&request.start) {
            return Err(KvError::KeyOutOfRange {
                key: request.start.clone(),
                range: Box::new(range),
            });
        }
        let (kvs, next_start) = page_in_range(page.kvs, page.next_start, &range, &request.end);
        Ok(ScanResponse {
            header: self.router.header(&group, page.revision, false),
            kvs: kvs
                .into_iter()
                .map(|kv| convert::key_value(kv, now_ms))
                .collect(),
            more: next_start.is_some(),
            next_start: next_start.unwrap_or_default(),
        })
    }

    async fn serve_history(&self, request: &HistoryRequest) -> Result<HistoryResponse, KvError> {
        check_key(&request.key)?;
        let limit = check_history_limit(request.limit)?;
        let consistency = convert::consistency(request.consistency)?;
        let bound = check_read_bound(request.max_staleness_ms, request.min_revision)?;
        let history = |group| self.local_history(group, request, limit, consistency, bound);
        self.router.on_range(&request.key, history).await
    }

    /// One page of the key's history, from this node's replica of its range.
    async fn local_history(
        &self,
        group: Arc<RaftGroup>,
        request: &HistoryRequest,
        limit: u32,
        consistency: Consistency,
        bound: ReadBound,
    ) -> Result<HistoryResponse, KvError> {
        group.read_barrier_within(consistency, bound).await?;
        let read = group
            .state_machine()
            .key_history(&request.key, request.start_revision, limit)
            .await
            .map_err(|e| self.router.storage_failed(e))?;
        let page = match read {
            HistoryRead::Events(page) => page,
            HistoryRead::Compacted { compact_revision } => {
                return Err(KvError::Compacted {
                    requested: request.start_revision,
                    compact_revision,
                });
            }
            HistoryRead::Outside { descriptor } => {
                return Err(KvError::KeyOutOfRange {
                    key: request.key.clone(),
                    range: Box::new(descriptor),
                });
            }
        };
        Ok(HistoryResponse {
            header: self.router.header(&group, page.revision, false),
            events: page.events.into_iter().map(convert::event).collect(),
            compact_revision: page.compact_revision,
            more: page.next_revision.is_some(),
            next_revision: page.next_revision.unwrap_or_default(),
        })
    }

    /// Validates `ops` and proposes them, stamped with this node's clock, on the range
    /// holding their first key, whose replica here must lead; guarded by `fence` when there
    /// is one.
    async fn write(
        &self,
        ops: Vec<BatchOp>,
        request: Option<RequestId>,
        fence: Option<Fence>,
    ) -> Result<Applied, KvError> {
        check_ops(&ops)?;
        let key = ops.first().map(|op| op.key().to_vec()).unwrap_or_default();
        let write = |group| self.local_write(group, &ops, request, fence.as_ref());
        self.router.on_range(&key, write).await
    }

    async fn local_write(
        &self,
        group: Arc<RaftGroup>,
        ops: &[BatchOp],
        request: Option<RequestId>,
        fence: Option<&Fence>,
    ) -> Result<Applied, KvError> {
        let mutation = Mutation {
            request,
            now_ms: self.shared.clock.now_ms(),
            ops: ops.to_vec(),
        };
        let key = ops.first().map(BatchOp::key).unwrap_or_default();
        let growth = quota::mutation_growth(ops, fence.map(|fence| fence.lock.as_slice()));
        let _reserved = admission::reserve(&self.shared, &group, key, growth).await?;
        let command = match fence {
            Some(fence) => Command::FencedMutate {
                fence: fence.clone(),
                mutation,
            },
            None => Command::Mutate(mutation),
        };
        let (outcome, replayed) = match group.write(command).await? {
            CommandOutcome::Replayed(first) => (*first, true),
            outcome => (outcome, false),
        };
        match outcome {
            CommandOutcome::Applied { revision, results } if results_fit(ops, &results) => {
                Ok(Applied {
                    group,
                    revision,
                    results,
                    replayed,
                })
            }
            CommandOutcome::ConditionFailed(failed) => Err(failed.into()),
            CommandOutcome::Rejected(rejection) => Err(rejection.into()),
            CommandOutcome::Applied { .. }
            | CommandOutcome::Internal
            | CommandOutcome::Replayed(_)
            | CommandOutcome::Coordinated { .. }
            | CommandOutcome::Split { .. }
            | CommandOutcome::Checked { .. }
            | CommandOutcome::Transacted { .. }
            | CommandOutcome::Leased(_)
            | CommandOutcome::Meta(_) => Err(unexpected(replayed)),
        }
    }

    /// Validates the transaction and proposes it, stamped with this node's clock, on the
    /// range holding its first key or span, whose replica here must lead.
    async fn serve_txn(&self, request: &TxnRequest) -> Result<TxnResponse, KvError> {
        let id = convert::request_id(request.request_id)?;
        let txn = request.txn.clone().unwrap_or_default();
        let txn = convert::txn::txn(txn)?;
        check_txn(&txn)?;
        let Some(first) = txn.spans().into_iter().next() else {
            return Err(KvError::invalid(
                "transaction is empty; it needs a compare or an op",
            ));
        };
        let apply = |group| self.local_txn(group, &txn, &first.key, id);
        self.router.on_range(&first.key, apply).await
    }

    /// Proposes `txn`, whose first key or span starts at `key`, on `group`.
    async fn local_txn(
        &self,
        group: Arc<RaftGroup>,
        txn: &Txn,
        key: &[u8],
        request: Option<RequestId>,
    ) -> Result<TxnResponse, KvError> {
        let growth = quota::txn_growth(txn);
        let _reserved = admission::reserve(&self.shared, &group, key, growth).await?;
        let command = Command::Txn(TxnMutation {
            request,
            now_ms: self.shared.clock.now_ms(),
            txn: txn.clone(),
        });
        let (outcome, replayed) = match group.write(command).await? {
            CommandOutcome::Replayed(first) => (*first, true),
            outcome => (outcome, false),
        };
        match outcome {
            CommandOutcome::Transacted { revision, result } => Ok(TxnResponse {
                header: self.router.header(&group, revision, replayed),
                result: Some(convert::txn::txn_result(result, self.shared.clock.now_ms())),
            }),
            CommandOutcome::Rejected(rejection) => Err(rejection.into()),
            CommandOutcome::Applied { .. }
            | CommandOutcome::ConditionFailed(_)
            | CommandOutcome::Internal
            | CommandOutcome::Replayed(_)
            | CommandOutcome::Coordinated { .. }
            | CommandOutcome::Split { .. }
            | CommandOutcome::Checked { .. }
            | CommandOutcome::Leased(_)
            | CommandOutcome::Meta(_) => Err(unexpected(replayed)),
        }
    }
}

/// Whether `results` can be what applying `ops` produced: one result per op, a new value for
/// every increment. The answers below read them so; a replayed record of another request
/// (one kept before records had a digest) may not fit.
fn results_fit(ops: &[BatchOp], results: &[OpResult]) -> bool {
    results.len() == ops.len()
        && ops.iter().zip(results).all(|(op, result)| {
            !matches!(op, BatchOp::Increment { .. }) || result.counter.is_some()
        })
}

/// The rows of a page read from `range` that lie inside it, and where the next page starts:
/// where the storage stopped, or the range's end when the range is exhausted but the scan
/// (`[.., end)`, empty `end` = unbounded) goes on beyond it.
fn page_in_range(
    mut kvs: Vec<KeyValue>,
    next_start: Option<Vec<u8>>,
    range: &RangeDescriptor,
    end: &[u8],
) -> (Vec<KeyValue>, Option<Vec<u8>>) {
    let Some(range_end) = range.end() else {
        return (kvs, next_start);
    };
    kvs.retain(|kv| kv.key.as_slice() < range_end);
    let next_start = next_start.filter(|next| next.as_slice() < range_end);
    if next_start.is_some() {
        return (kvs, next_start);
    }
    let beyond = end.is_empty() || end > range_end;
    (kvs, beyond.then(|| range_end.to_vec()))
}

fn put_op(request: &PutRequest) -> Result<BatchOp, KvError> {
    Ok(BatchOp::Put {
        key: request.key.clone(),
        value: request.value.clone(),
        condition: convert::condition(request.condition.clone())?,
        return_previous: request.return_previous,
        ttl_ms: convert::ttl_ms(&request.key, request.ttl_ms)?,
    })
}

fn delete_op(request: &DeleteRequest) -> Result<BatchOp, KvError> {
    Ok(BatchOp::Delete {
        key: request.key.clone(),
        condition: convert::condition(request.condition.clone())?,
        return_previous: request.return_previous,
    })
}

fn batch_ops(request: &BatchRequest) -> Result<Vec<BatchOp>, KvError> {
    check_op_count(request.ops.len())?;
    request.ops.iter().cloned().map(convert::batch_op).collect()
}

impl KvService {
    async fn serve_put(&self, request: &PutRequest) -> Result<PutResponse, KvError> {
        let id = convert::request_id(request.request_id)?;
        let fence = convert::fence(request.fence.clone())?;
        let mut applied = self.write(vec![put_op(request)?], id, fence).await?;
        let now_ms = self.shared.clock.now_ms();
        Ok(PutResponse {
            header: self.write_header(&applied),
            previous: applied
                .results
                .remove(0)
                .previous
                .map(|kv| convert::key_value(kv, now_ms)),
        })
    }

    async fn serve_delete(&self, request: &DeleteRequest) -> Result<DeleteResponse, KvError> {
        let id = convert::request_id(request.request_id)?;
        let fence = convert::fence(request.fence.clone())?;
        let mut applied = self.write(vec![delete_op(request)?], id, fence).await?;
        let result = applied.results.remove(0);
        let now_ms = self.shared.clock.now_ms();
        Ok(DeleteResponse {
            header: self.write_header(&applied),
            deleted: result.existed,
            previous: result.previous.map(|kv| convert::key_value(kv, now_ms)),
        })
    }

    async fn serve_batch(&self, request: &BatchRequest) -> Result<BatchResponse, KvError> {
        let id = convert::request_id(request.request_id)?;
        let fence = convert::fence(request.fence.clone())?;
        let applied = self.write(batch_ops(request)?, id, fence).await?;
        let now_ms = self.shared.clock.now_ms();
        Ok(BatchResponse {
            header: self.write_header(&applied),
            results: applied
                .results
                .into_iter()
                .map(|result| op_result(result, now_ms))
                .collect(),
        })
    }

    async fn serve_increment(
        &self,
        request: &IncrementRequest,
    ) -> Result<IncrementResponse, KvError> {
        let id = convert::request_id(request.request_id)?;
        let op = BatchOp::Increment {
            key: request.key.clone(),
            delta: request.delta,
        };
        let mut applied = self.write(vec![op], id, None).await?;
        // `results_fit` checked the result has the new value.
        let value = applied
            .results
            .remove(0)
            .counter
            .ok_or_else(|| unexpected(applied.replayed))?;
        Ok(IncrementResponse {
            header: self.write_header(&applied),
            value,
        })
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Read)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.get(r).await };
        let serve = || self.serve_get(&request);
        let answer = self
            .router
            .answer(&request, Hop::READ, serve, forward)
            .await;
        caller.reveal(answer)
    }

    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Read)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.scan(r).await };
        let serve = || self.serve_scan(&request);
        let answer = self
            .router
            .answer(&request, Hop::READ, serve, forward)
            .await;
        caller.reveal(answer)
    }

    async fn history(
        &self,
        request: Request<HistoryRequest>,
    ) -> Result<Response<HistoryResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Read)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.history(r).await };
        let serve = || self.serve_history(&request);
        let answer = self
            .router
            .answer(&request, Hop::READ, serve, forward)
            .await;
        caller.reveal(answer)
    }

    type WatchStream = WatchStream;

    /// Served here, never forwarded (`api/watch.rs`).
    async fn watch(&self, request: Request<WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let caller = self.shared.admit(&request, Call::Read)?;
        let request = caller.confine(request.into_inner());
        let router = self.router.clone();
        let namespace = caller.namespace().cloned();
        let stream = match watch::open(self.shared.clone(), request, namespace).await {
            Ok(stream) => stream,
            Err(error) => return Err(caller.reveal_status(router.status(&error))),
        };
        let stream = stream
            .map(move |sent| caller.reveal_message(sent.map_err(|error| router.status(&error))));
        Ok(Response::new(Box::pin(stream)))
    }

    /// Served here, never forwarded: the stream lives on this node.
    async fn watch_progress(
        &self,
        request: Request<WatchProgressRequest>,
    ) -> Result<Response<WatchProgressResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Read)?;
        let id = request.get_ref().watch_id;
        let asked = self
            .shared
            .watch_ids
            .ask(id, caller.namespace(), self.shared.node_id);
        match asked {
            Ok(()) => Ok(Response::new(WatchProgressResponse {})),
            Err(error) => Err(caller.reveal_status(self.router.status(&error))),
        }
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.put(r).await };
        let serve = || self.serve_put(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.delete(r).await };
        let serve = || self.serve_delete(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn batch(
        &self,
        request: Request<BatchRequest>,
    ) -> Result<Response<BatchResponse>, Status> {
        let ops = request.get_ref().ops.len();
        let caller = self.shared.admit(&request, Call::Batch { ops })?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.batch(r).await };
        let serve = || self.serve_batch(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn increment(
        &self,
        request: Request<IncrementRequest>,
    ) -> Result<Response<IncrementResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.increment(r).await };
        let serve = || self.serve_increment(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    /// Changes (grant, keep-alive, revoke) go to the leader; reads are served as reads.
    async fn lease(
        &self,
        request: Request<LeaseRequest>,
    ) -> Result<Response<LeaseResponse>, Status> {
        use keel_proto::v1::lease_request::Op;
        let reads = matches!(request.get_ref().op, Some(Op::TimeToLive(_) | Op::List(_)));
        let (call, hop) = match reads {
            true => (Call::Read, Hop::READ),
            false => (Call::Write, Hop::WRITE),
        };
        let caller = self.shared.admit(&request, call)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.lease(r).await };
        let serve = || self.serve_lease(&request);
        let answer = self.router.answer(&request, hop, serve, forward).await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let ops = request.get_ref().txn.as_ref().map_or(0, wire_ops);
        let caller = self.shared.admit(&request, Call::Batch { ops })?;
        let request = caller.confine(request.into_inner());
        let forward = |mut kv: KvClient<PeerChannel>, r| async move { kv.txn(r).await };
        let serve = || self.serve_txn(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    /// Answered by any node from its own clock; nothing is written. The id is random: two
    /// clients share one with probability about n²/2⁶⁵.
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Listing)?;
        let opened = self.shared.health.check().map(|()| {
            let client_id = loop {
                let id = rand::random::<u64>();
                if id != 0 {
                    break id;
                }
            };
            Response::new(OpenSessionResponse {
                client_id,
                client_started_ms: self.shared.clock.now_ms(),
            })
        });
        caller.reveal(opened.map_err(|e| self.router.status(&e)))
    }
}

/// The ops of a wire transaction, both branches and nested ones included: the request
/// tokens it draws, one per op, as a batch does.
fn wire_ops(txn: &keel_proto::v1::Txn) -> usize {
    use keel_proto::v1::txn_op::Op;
    txn.success
        .iter()
        .chain(&txn.failure)
        .map(|op| match &op.op {
            Some(Op::Txn(nested)) => 1 + wire_ops(nested),
            _ => 1,
        })
        .sum()
}

fn op_result(result: OpResult, now_ms: u64) -> BatchOpResult {
    BatchOpResult {
        existed: result.existed,
        previous: result.previous.map(|kv| convert::key_value(kv, now_ms)),
        counter: result.counter,
    }
}

/// A read's bound and the revision it reads at (`revision`), which the state read must
/// include: a replica behind it catches up as for `min_revision`.
fn read_bound(
    max_staleness_ms: Option<i64>,
    min_revision: Option<u64>,
    revision: Option<u64>,
) -> Result<(ReadBound, Option<Revision>), KvError> {
    let mut bound = check_read_bound(max_staleness_ms, min_revision)?;
    let at = check_read_revision(revision)?;
    bound.min_revision = bound.min_revision.max(at);
    Ok((bound, at))
}

/// Why a read at `revision` starting at `key` could not be served, as its caller's error.
fn unreadable(why: Unreadable, revision: Revision, key: &[u8]) -> KvError {
    match why {
        Unreadable::Outside { descriptor } => KvError::KeyOutOfRange {
            key: key.to_vec(),
            range: Box::new(descriptor),
        },
        Unreadable::Compacted { compact_revision } => KvError::Compacted {
            requested: revision,
            compact_revision,
        },
        Unreadable::Future { current } => KvError::FutureRevision {
            requested: revision,
            current,
        },
        Unreadable::TooFarBack { current } => KvError::InvalidArgument {
            message: format!(
                "revision {revision} is too far back: the range, at revision {current}, has \
                 recorded more than {} events since; read at a later revision",
                limits::REVISION_READ_EXAMINED_MAX
            ),
        },
    }
}

mod lease;

#[cfg(test)]
mod tests {
    use keel_types::RangeId;

    use super::*;

    fn row(key: &str) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            expires_at_ms: None,
            lease: 0,
        }
    }

    fn range(end: Option<&str>) -> RangeDescriptor {
        RangeDescriptor {
            id: RangeId(2),
            start: b"c".to_vec(),
            end: end.map(|end| end.as_bytes().to_vec()),
            epoch: 1,
            conf_version: 0,
            replicas: vec![1],
        }
    }

    /// (rows read, storage's next start, range end, scan end) -> (rows kept, next start).
    #[test]
    fn pages_end_at_the_serving_ranges_end() {
        type Case<'a> = (
            Vec<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            &'a str,
            Vec<&'a str>,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            // The last range: the storage decides.
            (vec!["c", "d"], None, None, "", vec!["c", "d"], None),
            (
                vec!["c", "d"],
                Some("e"),
                None,
                "",
                vec!["c", "d"],
                Some("e"),
            ),
            // The range ends before the scan does: go on at the range's end.
            (
                vec!["c", "d"],
                None,
                Some("m"),
                "",
                vec!["c", "d"],
                Some("m"),
            ),
            (
                vec!["c", "d"],
                None,
                Some("m"),
                "z",
                vec!["c", "d"],
                Some("m"),
            ),
            (vec![], None, Some("m"), "z", vec![], Some("m")),
            // The scan ends inside the range, or at its end: done.
            (vec!["c", "d"], None, Some("m"), "k", vec!["c", "d"], None),
            (vec!["c", "d"], None, Some("m"), "m", vec!["c", "d"], None),
            // More rows in the range: the storage's next start.
            (
                vec!["c", "d"],
                Some("e"),
                Some("m"),
                "",
                vec!["c", "d"],
                Some("e"),
            ),
            // Rows read past a split that shrank the range meanwhile are left to the next page.
            (
                vec!["c", "m", "n"],
                Some("o"),
                Some("m"),
                "",
                vec!["c"],
                Some("m"),
            ),
            (
                vec!["c", "l"],
                Some("m"),
                Some("m"),
                "",
                vec!["c", "l"],
                Some("m"),
            ),
        ];
        for (rows, next, end, scan_end, kept, expected_next) in cases {
            let rows: Vec<KeyValue> = rows.into_iter().map(row).collect();
            let (got, got_next) = page_in_range(
                rows,
                next.map(|next| next.as_bytes().to_vec()),
                &range(end),
                scan_end.as_bytes(),
            );
            let got: Vec<String> = got
                .iter()
                .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
                .collect();
            let got_next = got_next.map(|next| String::from_utf8(next).unwrap());
            assert_eq!(got, kept, "{next:?} {end:?} {scan_end:?}");
            assert_eq!(
                got_next.as_deref(),
                expected_next,
                "{next:?} {end:?} {scan_end:?}"
            );
        }
    }
}
