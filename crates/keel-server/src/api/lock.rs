//! The `keel.v1.Lock` service: validates every request, routes it by the lock's name to the
//! range holding it, proposes acquires, renews and releases on that range's leader (stamped
//! with its clock), lets an acquire that finds the lock busy wait in the queue of that
//! range's leader (`locks/queues.rs`), reads holders for Inspect, and otherwise forwards once
//! or answers `NotLeader` (`requests/router.rs`). Times leave as milliseconds remaining by this node's
//! clock. Knows nothing of openraft or redb.

use std::sync::Arc;
use std::time::Duration;

use keel_proto::convert;
use keel_proto::v1::lock_client::LockClient;
use keel_proto::v1::lock_server::Lock;
use keel_proto::v1::{
    AcquireRequest, AcquireResponse, InspectRequest, InspectResponse, ReleaseRequest,
    ReleaseResponse, RenewRequest, RenewResponse,
};
use keel_raft::RaftGroup;
use keel_types::validate::{
    check_lock_delay_ms, check_lock_name, check_lock_ttl_ms, check_lock_wait_ms, check_owner,
};
use keel_types::{
    Acquirer, Consistency, CoordinationOp, CoordinationResult, KvError, LockHold, LockPhase,
    RequestId, Revision,
};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::access::Call;
use crate::locks::queues::LockQueues;
use crate::peer::channels::PeerChannel;
use crate::requests::coordinated::{self, unexpected};
use crate::requests::router::{Audience, Hop, Router};
use crate::shared::Shared;

pub(crate) struct LockService {
    shared: Arc<Shared>,
    router: Router,
    queues: Arc<LockQueues>,
}

/// A checked acquire.
struct AcquireArgs {
    name: Vec<u8>,
    acquirer: Acquirer,
    wait: Duration,
    request: Option<RequestId>,
}

impl AcquireArgs {
    fn check(request: &AcquireRequest) -> Result<AcquireArgs, KvError> {
        let name = &request.name;
        check_lock_name(name)?;
        check_owner(&request.owner)?;
        let acquirer = Acquirer {
            owner: request.owner.clone(),
            ttl_ms: check_lock_ttl_ms(name, request.ttl_ms)?,
            lock_delay_ms: check_lock_delay_ms(name, request.lock_delay_ms)?,
        };
        let wait = Duration::from_millis(check_lock_wait_ms(name, request.wait_ms)?);
        Ok(AcquireArgs {
            name: name.clone(),
            acquirer,
            wait,
            request: convert::request_id(request.request_id)?,
        })
    }

    fn op(&self) -> CoordinationOp {
        CoordinationOp::Acquire {
            name: self.name.clone(),
            acquirer: self.acquirer.clone(),
        }
    }
}

impl LockService {
    /// The service answering `audience`, waiting and releasing in the node's `queues`.
    pub fn new(shared: Arc<Shared>, audience: Audience, queues: Arc<LockQueues>) -> LockService {
        LockService {
            router: Router::new(shared.clone(), audience),
            queues,
            shared,
        }
    }

    /// Takes the lock, or waits for it until `started + wait` in the leader's queue.
    async fn serve_acquire(
        &self,
        request: &AcquireRequest,
        started: Instant,
    ) -> Result<AcquireResponse, KvError> {
        let args = AcquireArgs::check(request)?;
        let acquire = |group| self.local_acquire(group, &args, started);
        self.router.on_range(&args.name, acquire).await
    }

    async fn local_acquire(
        &self,
        group: Arc<RaftGroup>,
        args: &AcquireArgs,
        started: Instant,
    ) -> Result<AcquireResponse, KvError> {
        let mut attempt =
            coordinated::propose(&self.shared, &group, args.request, args.op()).await?;
        let busy = matches!(attempt.result, CoordinationResult::Busy(_));
        if busy && attempt.replayed && !args.wait.is_zero() {
            // A retry of an acquire that found the lock busy and then waited: the queue's
            // grant carries no request id, so ask again (an owner holding the lock keeps its
            // token).
            attempt = coordinated::propose(&self.shared, &group, None, args.op()).await?;
        }
        match attempt.result {
            CoordinationResult::Acquired(hold) => {
                Ok(self.acquired(&group, hold, attempt.revision, attempt.replayed))
            }
            CoordinationResult::Busy(hold) if args.wait.is_zero() => {
                Ok(self.busy(&group, Some(hold), attempt.revision, attempt.replayed))
            }
            CoordinationResult::Busy(_) => self.wait(&group, args, started).await,
            _ => Err(unexpected(attempt.replayed)),
        }
    }

    /// Waits in the lock's queue; when the wait ends, answers with the holder as this
    /// replica sees it.
    async fn wait(
        &self,
        group: &Arc<RaftGroup>,
        args: &AcquireArgs,
        started: Instant,
    ) -> Result<AcquireResponse, KvError> {
        let mut waiting = self.queues.wait(group, &args.name, args.acquirer.clone())?;
        if let Some(answer) = waiting.until(started + args.wait).await {
            let grant = answer?;
            return Ok(self.acquired(group, grant.hold, grant.revision, false));
        }
        let (hold, revision) = group
            .state_machine()
            .lock(&args.name, self.shared.clock.now_ms())
            .await
            .map_err(|e| self.router.storage_failed(e))?;
        self.router.check_span(group, &args.name).await?;
        Ok(self.busy(group, hold, revision, false))
    }

    fn acquired(
        &self,
        group: &RaftGroup,
        hold: LockHold,
        revision: Revision,
        replayed: bool,
    ) -> AcquireResponse {
        AcquireResponse {
            header: self.router.header(group, revision, replayed),
            acquired: true,
            holder: Some(convert::lock_holder(hold, self.shared.clock.now_ms())),
            available_in_ms: 0,
        }
    }

    /// Not acquired: the holder (none in the lock-delay) and when the lock frees.
    fn busy(
        &self,
        group: &RaftGroup,
        hold: Option<LockHold>,
        revision: Revision,
        replayed: bool,
    ) -> AcquireResponse {
        let (holder, available_in_ms) = self.holder(hold);
        AcquireResponse {
            header: self.router.header(group, revision, replayed),
            acquired: false,
            holder,
            available_in_ms,
        }
    }

    /// A hold as clients see it by this node's clock: the holder while its TTL runs, and the
    /// milliseconds until the lock frees.
    fn holder(&self, hold: Option<LockHold>) -> (Option<keel_proto::v1::LockHolder>, u64) {
        let now_ms = self.shared.clock.now_ms();
        let Some(hold) = hold else { return (None, 0) };
        let available_in_ms = hold.available_at_ms().saturating_sub(now_ms);
        let holder =
            (hold.phase(now_ms) == LockPhase::Held).then(|| convert::lock_holder(hold, now_ms));
        (holder, available_in_ms)
    }

    async fn serve_renew(&self, request: &RenewRequest) -> Result<RenewResponse, KvError> {
        check_lock_name(&request.name)?;
        let ttl_ms = check_lock_ttl_ms(&request.name, request.ttl_ms)?;
        let id = convert::request_id(request.request_id)?;
        let renew = |group| self.local_renew(group, request, ttl_ms, id);
        self.router.on_range(&request.name, renew).await
    }

    async fn local_renew(
        &self,
        group: Arc<RaftGroup>,
        request: &RenewRequest,
        ttl_ms: u64,
        id: Option<RequestId>,
    ) -> Result<RenewResponse, KvError> {
        let op = CoordinationOp::Renew {
            name: request.name.clone(),
            token: request.token,
            ttl_ms,
        };
        let renewed = coordinated::propose(&self.shared, &group, id, op).await?;
        let CoordinationResult::Renewed(hold) = renewed.result else {
            return Err(unexpected(renewed.replayed));
        };
        Ok(RenewResponse {
            header: self
                .router
                .header(&group, renewed.revision, renewed.replayed),
            holder: Some(convert::lock_holder(hold, self.shared.clock.now_ms())),
        })
    }

    async fn serve_release(&self, request: &ReleaseRequest) -> Result<ReleaseResponse, KvError> {
        check_lock_name(&request.name)?;
        let id = convert::request_id(request.request_id)?;
        let release = |group| self.local_release(group, request, id);
        self.router.on_range(&request.name, release).await
    }

    async fn local_release(
        &self,
        group: Arc<RaftGroup>,
        request: &ReleaseRequest,
        id: Option<RequestId>,
    ) -> Result<ReleaseResponse, KvError> {
        let done = self
            .queues
            .release(&group, &request.name, request.token, id)
            .await?;
        let now_ms = self.shared.clock.now_ms();
        Ok(ReleaseResponse {
            header: self.router.header(&group, done.revision, done.replayed),
            successor: done
                .successor
                .map(|hold| convert::lock_holder(hold, now_ms)),
        })
    }

    async fn serve_inspect(&self, request: &InspectRequest) -> Result<InspectResponse, KvError> {
        check_lock_name(&request.name)?;
        let consistency = convert::consistency(request.consistency)?;
        let inspect = |group| self.local_inspect(group, request, consistency);
        self.router.on_range(&request.name, inspect).await
    }

    async fn local_inspect(
        &self,
        group: Arc<RaftGroup>,
        request: &InspectRequest,
        consistency: Consistency,
    ) -> Result<InspectResponse, KvError> {
        group.read_barrier(consistency).await?;
        let (hold, revision) = group
            .state_machine()
            .lock(&request.name, self.shared.clock.now_ms())
            .await
            .map_err(|e| self.router.storage_failed(e))?;
        self.router.check_span(&group, &request.name).await?;
        let (holder, available_in_ms) = self.holder(hold);
        Ok(InspectResponse {
            header: self.router.header(&group, revision, false),
            holder,
            available_in_ms,
        })
    }
}

/// What is left of an acquire's wait after `started`, for the leader it is forwarded to.
fn remaining_wait_ms(wait_ms: i64, started: Instant) -> i64 {
    if wait_ms <= 0 {
        return wait_ms;
    }
    let spent = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    wait_ms.saturating_sub(spent).max(0)
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        let started = Instant::now();
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        // A forwarded acquire waits for the lock only as long as this one has left to.
        let forward = |mut lock: LockClient<PeerChannel>, mut r: AcquireRequest| {
            r.wait_ms = remaining_wait_ms(r.wait_ms, started);
            async move { lock.acquire(r).await }
        };
        let hop = Hop {
            write: true,
            wait: Duration::from_millis(u64::try_from(request.wait_ms).unwrap_or(0)),
        };
        let serve = || self.serve_acquire(&request, started);
        let answer = self.router.answer(&request, hop, serve, forward).await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut lock: LockClient<PeerChannel>, r| async move { lock.renew(r).await };
        let serve = || self.serve_renew(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Write)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut lock: LockClient<PeerChannel>, r| async move { lock.release(r).await };
        let serve = || self.serve_release(&request);
        let answer = self
            .router
            .answer(&request, Hop::WRITE, serve, forward)
            .await;
        caller.reveal(self.router.deliver(answer))
    }

    async fn inspect(
        &self,
        request: Request<InspectRequest>,
    ) -> Result<Response<InspectResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Read)?;
        let request = caller.confine(request.into_inner());
        let forward = |mut lock: LockClient<PeerChannel>, r| async move { lock.inspect(r).await };
        let serve = || self.serve_inspect(&request);
        let answer = self
            .router
            .answer(&request, Hop::READ, serve, forward)
            .await;
        caller.reveal(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_acquire_waits_only_what_is_left() {
        let started = Instant::now() - Duration::from_millis(300);
        for (wait_ms, left_max, left_min) in [(0, 0, 0), (-5, -5, -5), (200, 0, 0)] {
            let left = remaining_wait_ms(wait_ms, started);
            assert!((left_min..=left_max).contains(&left), "{wait_ms}: {left}");
        }
        let left = remaining_wait_ms(10_000, started);
        assert!((9_000..=9_700).contains(&left), "{left}");
    }
}
