//! The `keel.v1.Idempotency` service: validates every request, routes it by its idempotency
//! key (`scope + 0x00 + id`) to the range holding it, proposes begins, completes and aborts on
//! that range's leader (stamped with its clock), reads records for Get, and
//! otherwise forwards once or answers `NotLeader` (`requests/router.rs`). Expiries leave as
//! milliseconds remaining by this node's clock. Knows nothing of openraft or redb.

use std::sync::Arc;

use keel_proto::convert;
use keel_proto::v1::idempotency_client::IdempotencyClient;
use keel_proto::v1::idempotency_server::Idempotency;
use keel_proto::v1::{
    AbortRequest, AbortResponse, BeginRequest, BeginResponse, CompleteRequest, CompleteResponse,
    Completed, IdempotencyGetRequest, IdempotencyGetResponse, InProgress, Started, begin_response,
    idempotency_get_response,
};
use keel_raft::RaftGroup;
use keel_types::validate::{
    check_duration_ms, check_idempotency_key, check_idempotency_result, check_owner, show_key,
};
use keel_types::{
    Consistency, CoordinationOp, CoordinationResult, IdempotencyRecord, KvError, RequestId,
    Revision, limits,
};
use tonic::{Request, Response, Status};

use crate::access::Call;
use crate::peer::channels::PeerChannel;
use crate::requests::coordinated::{self, Coordinated, unexpected};
use crate::requests::router::{Audience, Hop, Router};
use crate::shared::Shared;

pub(crate) struct IdempotencyService {
    shared: Arc<Shared>,
    router: Router,
}

impl IdempotencyService {
    pub fn new(shared: Arc<Shared>, audience: Audience) -> IdempotencyService {
        IdempotencyService {
            router: Router::new(shared.clone(), audience),
            shared,
        }
    }

    /// Milliseconds from this node's clock until `at_ms`.
    fn remaining_ms(&self, at_ms: u64) -> u64 {
        at_ms.saturating_sub(self.shared.clock.now_ms())
    }

    /// Proposes `op` on the range holding idempotency key `key`.
    async fn propose(
        &self,
        key: &[u8],
        id: Option<RequestId>,
        op: CoordinationOp,
    ) -> Result<(Arc<RaftGroup>, Coordinated), KvError> {
        let propose = |group: Arc<RaftGroup>| {
            let op = op.clone();
            async move {
                let done = coordinated::propose(&self.shared, &group, id, op).await?;
                Ok((group, done))
            }
        };
        self.router.on_range(key, propose).await
    }

    /// The record of `key` on `group`'s replica, read as `consistency` asks.
    async fn read_record(
        &self,
        group: Arc<RaftGroup>,
        key: &[u8],
        consistency: Consistency,
    ) -> Result<(Arc<RaftGroup>, Option<IdempotencyRecord>, Revision), KvError> {
        group.read_barrier(consistency).await?;
        let (record, revision) = group
            .state_machine()
            .idempotency_record(key, self.shared.clock.now_ms())
            .await
            .map_err(|e| self.router.storage_failed(e))?;
        self.router.check_span(&group, key).await?;
        Ok((group, record, revision))
    }

    async fn serve_begin(&self, request: &BeginRequest) -> Result<BeginResponse, KvError> {
        let key = check_idempotency_key(&request.scope, &request.id)?;
        check_owner(&request.owner)?;
        let what = format!("TTL of idempotency record {}", show_key(&request.id));
        let ttl_ms = check_duration_ms(&what, request.ttl_ms, 1, limits::TTL_MS_MAX)?;
        let id = convert::request_id(request.request_id)?;
        let op = CoordinationOp::Begin {
            key: key.clone(),
            owner: request.owner.clone(),
            ttl_ms,
        };
        let (group, begun) = self.propose(&key, id, op).await?;
        let state = match begun.result {
            CoordinationResult::Started {
                token,
                expires_at_ms,
            } => begin_response::State::Started(Started {
                token,
                ttl_remaining_ms: self.remaining_ms(expires_at_ms),
            }),
            CoordinationResult::InProgress {
                owner,
                expires_at_ms,
            } => begin_response::State::InProgress(InProgress {
                owner,
                ttl_remaining_ms: self.remaining_ms(expires_at_ms),
            }),
            CoordinationResult::Completed {
                result,
                expires_at_ms,
            } => begin_response::State::Completed(Completed {
                result,
                ttl_remaining_ms: self.remaining_ms(expires_at_ms),
            }),
            _ => return Err(unexpected(begun.replayed)),
        };
        Ok(BeginResponse {
            header: self.router.header(&group, begun.revision, begun.replayed),
            state: Some(state),
        })
    }

    async fn serve_complete(&self, request: &CompleteRequest) -> Result<CompleteResponse, KvError> {
        let key = check_idempotency_key(&request.scope, &request.id)?;
        check_idempotency_result(&request.id, &request.result)?;
        let what = format!("result TTL of idempotency record {}", show_key(&request.id));
        let result_ttl_ms = check_duration_ms(&what, request.result_ttl_ms, 1, limits::TTL_MS_MAX)?;
        let id = convert::request_id(request.request_id)?;
        let op = CoordinationOp::Complete {
            key: key.clone(),
            token: request.token,
            result: request.result.clone(),
            result_ttl_ms,
        };
        let (group, completed) = self.propose(&key, id, op).await?;
        let CoordinationResult::Completed {
            result,
            expires_at_ms,
        } = completed.result
        else {
            return Err(unexpected(completed.replayed));
        };
        Ok(CompleteResponse {
            header: self
                .router
                .header(&group, completed.revision, completed.replayed),
            completed: Some(Completed {
                result,
                ttl_remaining_ms: self.remaining_ms(expires_at_ms),
            }),
        })
    }

    async fn serve_abort(&self, request: &AbortRequest) -> Result<AbortResponse, KvError> {
        let key = check_idempotency_key(&request.scope, &request.id)?;
        let id = convert::request_id(request.request_id)?;
        let op = CoordinationOp::Abort {
            key: key.clone(),
            token: request.token,
        };
        let (group, aborted) = self.propose(&key, id, op).await?;
        if aborted.result != CoordinationResult::Aborted {
            return Err(unexpected(aborted.replayed));
        }
        Ok(AbortResponse {
            header: self
                .router
                .header(&group, aborted.revision, aborted.replayed),
        })
    }

    async fn serve_get(
        &self,
        request: &IdempotencyGetRequest,
    ) -> Result<IdempotencyGetResponse, KvError> {
        let key = check_idempotency_key(&request.scope, &request.id)?;
        let consistency = convert::consistency(request.consistency)?;
        let read = |group| self.read_record(group, &key, consistency);
        let (group, record, revision) = self.router.on_range(&key, read).await?;
        let state = record.map(|record| match record {
            IdempotencyRecord::InProgress {
                owner,
                expires_at_ms,
                ..
            } => idempotency_get_response::State::InProgress(InProgress {
                owner,
                ttl_remaining_ms: self.remaining_ms(expires_at_ms),
            }),
            IdempotencyRecord::Completed {
                result,
                expires_at_ms,
                ..
            } => idempotency_get_response::State::Completed(Completed {
                result,
                ttl_remaining_ms: self.remaining_ms(expires_at_ms),
            }),
        });
        Ok(IdempotencyGetResponse {
            header: self.router.header(&group, revision, false),
            state,
        })
    }
}

#[tonic::async_trait]
impl Idempotency for IdempotencyService {
    async fn begin(
        &self,
        request: Request<BeginRequest>,
    ) -> Result<Response<BeginResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        let forward =
            |mut idem: IdempotencyClient<PeerChannel>, r| async move { idem.begin(r).await };
        let serve = || self.serve_begin(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn complete(
        &self,
        request: Request<CompleteRequest>,
    ) -> Result<Response<CompleteResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        let forward =
            |mut idem: IdempotencyClient<PeerChannel>, r| async move { idem.complete(r).await };
        let serve = || self.serve_complete(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn abort(
        &self,
        request: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        let forward =
            |mut idem: IdempotencyClient<PeerChannel>, r| async move { idem.abort(r).await };
        let serve = || self.serve_abort(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn get(
        &self,
        request: Request<IdempotencyGetRequest>,
    ) -> Result<Response<IdempotencyGetResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Read)?;
        let request = caller.confine(request.into_inner());
        let forward =
            |mut idem: IdempotencyClient<PeerChannel>, r| async move { idem.get(r).await };
        let serve = || self.serve_get(&request);
        let answer = self
            .router
            .answer(&request, Hop::READ, serve, forward)
            .await;
        caller.reveal(answer)
    }
}
