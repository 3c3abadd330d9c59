//! The `keel.v1.Kv` service: validates every request, serves it on this node's replica when
//! it can (writes and consistent reads on the leader, follower reads anywhere) and otherwise
//! forwards it once to the leader or answers `NotLeader`. Errors leave through `status.rs`.
//! The leader stamps its clock into every mutation it proposes (TTLs count from there), and
//! reads hide keys expired by this node's clock. Knows nothing of openraft types: groups
//! speak `KvError`.

use std::future::Future;
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
use keel_storage::StorageError;
use keel_types::validate::{check_key, check_op_count, check_ops, check_scan};
use keel_types::{
    BatchOp, Command, CommandOutcome, KvError, Mutation, NodeAddr, NodeId, OpResult, RangeId,
    RequestId, Revision, limits,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info, info_span};

use crate::shared::Shared;
use crate::status::{kv_error, never_sent, to_status};

pub(crate) struct KvService {
    shared: Arc<Shared>,
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
        KvService { shared }
    }

    fn span(&self, op: &'static str) -> tracing::Span {
        info_span!(
            "kv",
            op,
            node_id = self.shared.node_id,
            range_id = RangeId::FIRST.0
        )
    }

    fn header(&self, group: &RaftGroup, revision: Revision) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            served_by: self.shared.node_id,
            range_id: group.range().0,
            term: group.term(),
            replayed: false,
        })
    }

    fn write_header(&self, applied: &Applied) -> Option<ResponseHeader> {
        let header = self.header(&applied.group, applied.revision)?;
        Some(ResponseHeader {
            replayed: applied.replayed,
            ..header
        })
    }

    /// A storage failure on a read: the node may be poisoned now, so recheck its health.
    fn storage_failed(&self, error: StorageError) -> KvError {
        self.shared
            .health
            .check()
            .err()
            .unwrap_or_else(|| KvError::fatal(error.to_string()))
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
            .map_err(|e| self.storage_failed(e))?;
        Ok(GetResponse {
            header: self.header(&group, revision),
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
            .map_err(|e| self.storage_failed(e))?;
        Ok(ScanResponse {
            header: self.header(&group, page.revision),
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
    /// replica, which must lead.
    async fn local_write(
        &self,
        ops: Vec<BatchOp>,
        request: Option<RequestId>,
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
        let (outcome, replayed) = match group.write(Command::Mutate(mutation)).await? {
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
        }
    }

    /// A mutation's answer as it leaves the node; with a response-loss fault configured,
    /// some answers are lost after the mutation was applied.
    fn deliver<T>(&self, answer: Result<Response<T>, Status>) -> Result<Response<T>, Status> {
        if self.shared.faults.drop_response() {
            info!("fault injection: dropping the response of a served mutation");
            return Err(Status::unknown("fault injection: response dropped"));
        }
        answer
    }

    /// What to do when serving here failed: forward a `NotLeader` to the known leader (once),
    /// or answer with the error.
    async fn route<T, F, Fut>(
        &self,
        error: KvError,
        no_forward: bool,
        write: bool,
        call: F,
    ) -> Result<Response<T>, Status>
    where
        F: FnOnce(KvClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        match error {
            KvError::NotLeader {
                leader: Some(leader),
                ..
            } if !no_forward => self.forward(leader, write, call).await,
            KvError::NotLeader {
                range_id,
                leader: None,
            } => Err(to_status(&KvError::unavailable(format!(
                "range {range_id} has no known leader"
            )))),
            error => Err(to_status(&error)),
        }
    }

    /// Sends the request to the leader's Kv service (the caller set `no_forward`) and relays
    /// its answer. A failure of the hop itself becomes `Unavailable` when nothing was sent,
    /// and `OutcomeUnknown` for a write that may have reached the leader.
    async fn forward<T, F, Fut>(
        &self,
        leader: (NodeId, NodeAddr),
        write: bool,
        call: F,
    ) -> Result<Response<T>, Status>
    where
        F: FnOnce(KvClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let (leader_id, leader_addr) = leader;
        debug!(leader_id, %leader_addr, "forwarding to leader");
        let channel = self
            .shared
            .peers
            .channel(leader_id, &leader_addr.addr)
            .map_err(|e| {
                to_status(&KvError::unavailable(format!(
                    "leader node {leader_id}: {e}"
                )))
            })?;
        let client = KvClient::new(channel)
            .max_decoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(limits::GRPC_MESSAGE_BYTES_MAX);
        let deadline = self.shared.forward_deadline(write);
        let error = match tokio::time::timeout(deadline, call(client)).await {
            Ok(Ok(response)) => return Ok(response),
            Ok(Err(status)) if kv_error(&status).is_some() => return Err(relayed(&status)),
            Ok(Err(status)) if never_sent(&status) => KvError::unavailable(format!(
                "leader node {leader_id} is unreachable: {}",
                status.message()
            )),
            Ok(Err(status)) if write => KvError::OutcomeUnknown {
                message: format!(
                    "connection to leader node {leader_id} failed after sending: {}",
                    status.message()
                ),
            },
            Ok(Err(status)) => KvError::unavailable(format!(
                "leader node {leader_id} failed: {}",
                status.message()
            )),
            Err(_) if write => KvError::OutcomeUnknown {
                message: format!("leader node {leader_id} did not answer within {deadline:?}"),
            },
            Err(_) => KvError::Timeout {
                message: format!("leader node {leader_id} did not answer within {deadline:?}"),
            },
        };
        Err(to_status(&error))
    }
}

/// The leader's error status as this node's answer: code, message and detail, without the
/// hop's transport metadata.
fn relayed(status: &Status) -> Status {
    Status::with_details(
        status.code(),
        status.message(),
        status.details().to_vec().into(),
    )
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

/// A request that can be forwarded to the leader once.
trait Forwardable {
    /// Marks the request as forwarded and returns whether it was already marked.
    fn mark_forwarded(&mut self) -> bool;
}

macro_rules! forwardable {
    ($($request:ty),*) => {$(
        impl Forwardable for $request {
            fn mark_forwarded(&mut self) -> bool {
                std::mem::replace(&mut self.no_forward, true)
            }
        }
    )*};
}

forwardable!(
    GetRequest,
    ScanRequest,
    PutRequest,
    DeleteRequest,
    BatchRequest,
    IncrementRequest
);

impl KvService {
    /// The answer to a request: what this node served, or else the request routed on
    /// (forwarded once to the leader, or the error).
    async fn answer<R, T, F, Fut>(
        &self,
        served: Result<T, KvError>,
        mut request: R,
        write: bool,
        call: F,
    ) -> Result<Response<T>, Status>
    where
        R: Forwardable,
        F: FnOnce(KvClient<Channel>, R) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        match served {
            Ok(response) => Ok(Response::new(response)),
            Err(error) => {
                let no_forward = request.mark_forwarded();
                let call = |client| call(client, request);
                self.route(error, no_forward, write, call).await
            }
        }
    }

    async fn serve_put(&self, request: &PutRequest) -> Result<PutResponse, KvError> {
        let id = convert::request_id(request.request_id)?;
        let mut applied = self.local_write(vec![put_op(request)?], id).await?;
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
        let mut applied = self.local_write(vec![delete_op(request)?], id).await?;
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
        let applied = self.local_write(batch_ops(request)?, id).await?;
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
        let mut applied = self.local_write(vec![op], id).await?;
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
            self.answer(served, request, false, forward).await
        }
        .instrument(self.span("get"))
        .await
    }

    async fn scan(&self, request: Request<ScanRequest>) -> Result<Response<ScanResponse>, Status> {
        let request = request.into_inner();
        let forward = |mut kv: KvClient<Channel>, r| async move { kv.scan(r).await };
        async move {
            let served = self.local_scan(&request).await;
            self.answer(served, request, false, forward).await
        }
        .instrument(self.span("scan"))
        .await
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let request = request.into_inner();
        let forward = |mut kv: KvClient<Channel>, r| async move { kv.put(r).await };
        async move {
            let served = self.serve_put(&request).await;
            self.deliver(self.answer(served, request, true, forward).await)
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
            self.deliver(self.answer(served, request, true, forward).await)
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
            self.deliver(self.answer(served, request, true, forward).await)
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
            self.deliver(self.answer(served, request, true, forward).await)
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
