//! The `keel.v1.Kv` service: validates every request, serves it on this node's replica when
//! it can (writes and consistent reads on the leader, follower reads anywhere) and otherwise
//! forwards it once to the leader or answers `NotLeader` (`router.rs`). Errors leave through
//! `status.rs`. The leader stamps its clock into every mutation it proposes (TTLs count from
//! there), and reads hide keys expired by this node's clock. A write with a fence is proposed
//! as a fenced mutation. Knows nothing of openraft types: groups speak `KvError`.

use std::sync::Arc;

use keel_proto::convert;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::kv_server::Kv;
use keel_proto::v1::{
    BatchOpResult, BatchRequest, BatchResponse, DeleteRequest, DeleteResponse, GetRequest,
    GetResponse, IncrementRequest, IncrementResponse, OpenSessionRequest, OpenSessionResponse,
    PutRequest, PutResponse, ResponseHeader, ScanRequest, ScanResponse,
};
use keel_raft::RaftGroup;
use keel_types::validate::{check_key, check_op_count, check_ops, check_scan};
use keel_types::{
    BatchOp, Command, CommandOutcome, Fence, KvError, Mutation, OpResult, RangeId, RequestId,
    Revision,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::{Instrument, info_span};

use crate::coordinated::unexpected;
use crate::router::{Hop, Router};
use crate::shared::Shared;
use crate::status::to_status;

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
    pub fn new(shared: Arc<Shared>) -> KvService {
        KvService {
            router: Router::new(shared.clone()),
            shared,
        }
    }

    fn span(&self, op: &'static str) -> tracing::Span {
        info_span!(
            "kv",
            op,
            node_id = self.shared.node_id,
            range_id = RangeId::FIRST.0
        )
    }

    fn write_header(&self, applied: &Applied) -> Option<ResponseHeader> {
        self.router
            .header(&applied.group, applied.revision, applied.replayed)
    }

    async fn local_get(&self, request: &GetRequest) -> Result<GetResponse, KvError> {
        self.shared.health.check()?;
        check_key(&request.key)?;
        let consistency = convert::consistency(request.consistency)?;
        let group = self.shared.group(RangeId::FIRST)?;
        group.read_barrier(consistency).await?;
        let now_ms = self.shared.clock.now_ms();
        let (kv, revision) = group
            .state_machine()
            .get(&request.key, now_ms)
            .await
            .map_err(|e| self.router.storage_failed(e))?;
        Ok(GetResponse {
            header: self.router.header(&group, revision, false),
            kv: kv.map(|kv| convert::key_value(kv, now_ms)),
        })
    }

    async fn local_scan(&self, request: &ScanRequest) -> Result<ScanResponse, KvError> {
        self.shared.health.check()?;
        let limit = check_scan(&request.start, &request.end, request.limit)?;
        let consistency = convert::consistency(request.consistency)?;
        let group = self.shared.group(RangeId::FIRST)?;
        group.read_barrier(consistency).await?;
        let now_ms = self.shared.clock.now_ms();
        let page = group
            .state_machine()
            .scan(&request.start, &request.end, limit, now_ms)
            .await
            .map_err(|e| self.router.storage_failed(e))?;
        Ok(ScanResponse {
            header: self.router.header(&group, page.revision, false),
            kvs: page
                .kvs
                .into_iter()
                .map(|kv| convert::key_value(kv, now_ms))
                .collect(),
            more: page.next_start.is_some(),
            next_start: page.next_start.unwrap_or_default(),
        })
    }

    /// Validates `ops` and proposes them, stamped with this node's clock, on this node's
    /// replica, which must lead; guarded by `fence` when there is one.
    async fn local_write(
        &self,
        ops: Vec<BatchOp>,
        request: Option<RequestId>,
        fence: Option<Fence>,
    ) -> Result<Applied, KvError> {
        self.shared.health.check()?;
        check_ops(&ops)?;
        let op_count = ops.len();
        let group = self.shared.group(RangeId::FIRST)?;
        let mutation = Mutation {
            request,
            now_ms: self.shared.clock.now_ms(),
            ops,
        };
        let command = match fence {
            Some(fence) => Command::FencedMutate { fence, mutation },
            None => Command::Mutate(mutation),
        };
        let (outcome, replayed) = match group.write(command).await? {
            CommandOutcome::Replayed(first) => (*first, true),
            outcome => (outcome, false),
        };
        match outcome {
            CommandOutcome::Applied { revision, results } => {
                assert_eq!(
                    results.len(),
                    op_count,
                    "an applied write has one result per op"
                );
                Ok(Applied {
                    group,
                    revision,
                    results,
                    replayed,
                })
            }
            CommandOutcome::ConditionFailed(failed) => Err(KvError::ConditionFailed(failed)),
            CommandOutcome::Rejected(rejection) => Err(rejection.into()),
            CommandOutcome::Internal | CommandOutcome::Replayed(_) => {
                Err(KvError::OutcomeUnknown {
                    message: "write was applied as an internal entry".to_string(),
                })
            }
            outcome @ CommandOutcome::Coordinated { .. } => Err(unexpected(&outcome)),
        }
    }
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
        let mut applied = self.local_write(vec![put_op(request)?], id, fence).await?;
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
        let mut applied = self
            .local_write(vec![delete_op(request)?], id, fence)
            .await?;
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
        let applied = self.local_write(batch_ops(request)?, id, fence).await?;
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
        let mut applied = self.local_write(vec![op], id, None).await?;
        let value = applied
            .results
            .remove(0)
            .counter
            .expect("an applied increment reports its new value");
        Ok(IncrementResponse {
            header: self.write_header(&applied),
            value,
        })
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let request = request.into_inner();
        let forward = |mut kv: KvClient<Channel>, r| async move { kv.get(r).await };
        async move {
            let served = self.local_get(&request).await;
            self.router
                .answer(served, request, Hop::READ, forward)
                .await
        }
        .instrument(self.span("get"))
        .await
    }

    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        let request = request.into_inner();
        let forward = |mut kv: KvClient<Channel>, r| async move { kv.scan(r).await };
        async move {
            let served = self.local_scan(&request).await;
            self.router
                .answer(served, request, Hop::READ, forward)
                .await
        }
        .instrument(self.span("scan"))
        .await
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let request = request.into_inner();
        let forward = |mut kv: KvClient<Channel>, r| async move { kv.put(r).await };
        async move {
            let served = self.serve_put(&request).await;
            let answer = self
                .router
                .answer(served, request, Hop::WRITE, forward)
                .await;
            self.router.deliver(answer)
        }
        .instrument(self.span("put"))
        .await
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let request = request.into_inner();
        let forward = |mut kv: KvClient<Channel>, r| async move { kv.delete(r).await };
        async move {
            let served = self.serve_delete(&request).await;
            let answer = self
                .router
                .answer(served, request, Hop::WRITE, forward)
                .await;
            self.router.deliver(answer)
        }
        .instrument(self.span("delete"))
        .await
    }

    async fn batch(
        &self,
        request: Request<BatchRequest>,
    ) -> Result<Response<BatchResponse>, Status> {
        let request = request.into_inner();
        let forward = |mut kv: KvClient<Channel>, r| async move { kv.batch(r).await };
        async move {
            let served = self.serve_batch(&request).await;
            let answer = self
                .router
                .answer(served, request, Hop::WRITE, forward)
                .await;
            self.router.deliver(answer)
        }
        .instrument(self.span("batch"))
        .await
    }

    async fn increment(
        &self,
        request: Request<IncrementRequest>,
    ) -> Result<Response<IncrementResponse>, Status> {
        let request = request.into_inner();
        let forward = |mut kv: KvClient<Channel>, r| async move { kv.increment(r).await };
        async move {
            let served = self.serve_increment(&request).await;
            let answer = self
                .router
                .answer(served, request, Hop::WRITE, forward)
                .await;
            self.router.deliver(answer)
        }
        .instrument(self.span("increment"))
        .await
    }

    /// Answered by any node from its own clock; nothing is written. The id is random: two
    /// clients share one with probability about n²/2⁶⁵.
    async fn open_session(
        &self,
        _request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        self.shared.health.check().map_err(|e| to_status(&e))?;
        let client_id = loop {
            let id = rand::random::<u64>();
            if id != 0 {
                break id;
            }
        };
        Ok(Response::new(OpenSessionResponse {
            client_id,
            client_started_ms: self.shared.clock.now_ms(),
        }))
    }
}

fn op_result(result: OpResult, now_ms: u64) -> BatchOpResult {
    BatchOpResult {
        existed: result.existed,
        previous: result.previous.map(|kv| convert::key_value(kv, now_ms)),
        counter: result.counter,
    }
}
