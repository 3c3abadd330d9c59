//! The `keel.v1.Kv` service: validates every request, serves it on this node's replica when
//! it can (writes and consistent reads on the leader, follower reads anywhere) and otherwise
//! forwards it once to the leader or answers `NotLeader`. Errors leave through `status.rs`.
//! Knows nothing of openraft types: groups speak `KvError`.

use std::future::Future;
use std::sync::Arc;

use keel_proto::convert;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::kv_server::Kv;
use keel_proto::v1::{
    BatchOpResult, BatchRequest, BatchResponse, DeleteRequest, DeleteResponse, GetRequest,
    GetResponse, PutRequest, PutResponse, ResponseHeader, ScanRequest, ScanResponse,
};
use keel_raft::RaftGroup;
use keel_storage::StorageError;
use keel_types::validate::{check_key, check_op_count, check_ops, check_scan};
use keel_types::{
    BatchOp, Command, CommandOutcome, KvError, NodeAddr, NodeId, OpResult, RangeId, Revision,
    limits,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info_span};

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
        let (kv, revision) = group
            .state_machine()
            .get(&request.key)
            .await
            .map_err(|e| self.storage_failed(e))?;
        Ok(GetResponse {
            header: self.header(&group, revision),
            kv: kv.map(Into::into),
        })
    }

    async fn local_scan(&self, request: &ScanRequest) -> Result<ScanResponse, KvError> {
        self.shared.health.check()?;
        let limit = check_scan(&request.start, &request.end, request.limit)?;
        let consistency = convert::consistency(request.consistency)?;
        let group = self.shared.group(RangeId::FIRST)?;
        group.read_barrier(consistency).await?;
        let page = group
            .state_machine()
            .scan(&request.start, &request.end, limit)
            .await
            .map_err(|e| self.storage_failed(e))?;
        Ok(ScanResponse {
            header: self.header(&group, page.revision),
            kvs: page.kvs.into_iter().map(Into::into).collect(),
            more: page.next_start.is_some(),
            next_start: page.next_start.unwrap_or_default(),
        })
    }

    /// Validates and proposes `ops` on this node's replica, which must lead.
    async fn local_write(&self, ops: Vec<BatchOp>) -> Result<Applied, KvError> {
        self.shared.health.check()?;
        check_ops(&ops)?;
        let op_count = ops.len();
        let group = self.shared.group(RangeId::FIRST)?;
        match group.write(Command::Write { ops }).await? {
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
                })
            }
            CommandOutcome::ConditionFailed(failed) => Err(KvError::ConditionFailed(failed)),
            CommandOutcome::Internal => Err(KvError::OutcomeUnknown {
                message: "write was applied as an internal entry".to_string(),
            }),
        }
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
    BatchRequest
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
        let mut applied = self.local_write(vec![put_op(request)?]).await?;
        Ok(PutResponse {
            header: self.header(&applied.group, applied.revision),
            previous: applied.results.remove(0).previous.map(Into::into),
        })
    }

    async fn serve_delete(&self, request: &DeleteRequest) -> Result<DeleteResponse, KvError> {
        let mut applied = self.local_write(vec![delete_op(request)?]).await?;
        let result = applied.results.remove(0);
        Ok(DeleteResponse {
            header: self.header(&applied.group, applied.revision),
            deleted: result.existed,
            previous: result.previous.map(Into::into),
        })
    }

    async fn serve_batch(&self, request: &BatchRequest) -> Result<BatchResponse, KvError> {
        let applied = self.local_write(batch_ops(request)?).await?;
        Ok(BatchResponse {
            header: self.header(&applied.group, applied.revision),
            results: applied.results.into_iter().map(op_result).collect(),
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
            self.answer(served, request, true, forward).await
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
            self.answer(served, request, true, forward).await
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
            self.answer(served, request, true, forward).await
        }
        .instrument(self.span("batch"))
        .await
    }
}

fn op_result(result: OpResult) -> BatchOpResult {
    BatchOpResult {
        existed: result.existed,
        previous: result.previous.map(Into::into),
    }
}
