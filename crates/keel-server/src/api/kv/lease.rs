//! `keel.v1.Kv.Lease`: one call on the leases of a lease namespace (etcd's leases; the
//! namespace must start a pinned span, so a lease and its keys share one range). Grants,
//! keep-alives and revokes are proposed on the range's leader as `Command::Lease`, stamped
//! with its clock and deduplicated by request id; time-to-live and list read the leader's
//! replica after a linearizable barrier. Knows nothing of etcd's wire format.

use std::sync::Arc;

use keel_proto::convert;
use keel_proto::v1::lease_request::Op;
use keel_proto::v1::lease_response::Result as Answer;
use keel_proto::v1::{self, LeaseRequest, LeaseResponse};
use keel_raft::RaftGroup;
use keel_types::validate::{check_lease, check_lease_id, check_lease_namespace};
use keel_types::{
    Command, CommandOutcome, Consistency, KvError, LeaseInfo, LeaseMutation, LeaseOp, LeaseResult,
    RequestId,
};

use super::KvService;
use crate::requests::coordinated::unexpected;

/// A checked lease call.
enum LeaseCall {
    /// Changes a lease: proposed.
    Change(LeaseOp),
    /// Reads one lease, with its keys or not.
    TimeToLive { id: i64, keys: bool },
    /// Lists the namespace's leases.
    List,
}

impl LeaseCall {
    fn check(request: &LeaseRequest) -> Result<LeaseCall, KvError> {
        let namespace = request.namespace.clone();
        check_lease_namespace(&namespace)?;
        let call = match &request.op {
            Some(Op::Grant(grant)) => LeaseCall::Change(LeaseOp::Grant {
                namespace,
                id: grant.id,
                ttl_ms: grant.ttl_ms,
            }),
            Some(Op::KeepAlive(kept)) => LeaseCall::Change(LeaseOp::KeepAlive {
                namespace,
                id: kept.id,
            }),
            Some(Op::Revoke(revoke)) => LeaseCall::Change(LeaseOp::Revoke {
                namespace,
                id: revoke.id,
            }),
            Some(Op::TimeToLive(asked)) => {
                check_lease_id(asked.id)?;
                LeaseCall::TimeToLive {
                    id: asked.id,
                    keys: asked.keys,
                }
            }
            Some(Op::List(_)) => LeaseCall::List,
            None => {
                return Err(KvError::invalid(
                    "lease request has no op; set one of grant, revoke, keep_alive, time_to_live, list",
                ));
            }
        };
        if let LeaseCall::Change(op) = &call {
            check_lease(op)?;
        }
        Ok(call)
    }
}

impl KvService {
    /// Validates the lease call and serves it on the range holding its namespace, whose
    /// replica here must lead.
    pub(super) async fn serve_lease(
        &self,
        request: &LeaseRequest,
    ) -> Result<LeaseResponse, KvError> {
        let call = LeaseCall::check(request)?;
        let id = convert::request_id(request.request_id)?;
        let namespace = request.namespace.as_slice();
        let serve = |group| self.local_lease(group, &call, namespace, id);
        self.router.on_range(namespace, serve).await
    }

    async fn local_lease(
        &self,
        group: Arc<RaftGroup>,
        call: &LeaseCall,
        namespace: &[u8],
        request: Option<RequestId>,
    ) -> Result<LeaseResponse, KvError> {
        match call {
            LeaseCall::Change(op) => self.change_lease(&group, op.clone(), request).await,
            LeaseCall::TimeToLive { id, keys } => {
                group.read_barrier(Consistency::Linearizable).await?;
                let read = group.state_machine().lease(namespace, *id, *keys).await;
                let (info, revision) = read.map_err(|e| self.router.storage_failed(e))?;
                self.router.check_span(&group, namespace).await?;
                let info = info.ok_or(KvError::LeaseNotFound { id: *id })?;
                let now_ms = self.shared.clock.now_ms();
                Ok(LeaseResponse {
                    header: self.router.header(&group, revision, false),
                    result: Some(Answer::Info(lease_info(info, now_ms))),
                })
            }
            LeaseCall::List => {
                group.read_barrier(Consistency::Linearizable).await?;
                let read = group.state_machine().leases(namespace).await;
                let (ids, revision) = read.map_err(|e| self.router.storage_failed(e))?;
                self.router.check_span(&group, namespace).await?;
                Ok(LeaseResponse {
                    header: self.router.header(&group, revision, false),
                    result: Some(Answer::Leases(v1::LeaseIds { ids })),
                })
            }
        }
    }

    /// Proposes `op` on `group`, stamped with this node's clock, and reads its outcome.
    async fn change_lease(
        &self,
        group: &RaftGroup,
        op: LeaseOp,
        request: Option<RequestId>,
    ) -> Result<LeaseResponse, KvError> {
        let id = op.id();
        let command = Command::Lease(LeaseMutation {
            request,
            now_ms: self.shared.clock.now_ms(),
            op,
        });
        let (outcome, replayed) = match group.write(command).await? {
            CommandOutcome::Replayed(first) => (*first, true),
            outcome => (outcome, false),
        };
        let result = match outcome {
            CommandOutcome::Leased(result) => result,
            CommandOutcome::Rejected(rejection) => return Err(rejection.into()),
            _ => return Err(unexpected(replayed)),
        };
        let (revision, answer) = match result {
            LeaseResult::Granted { id, ttl_ms } => {
                (0, Answer::Granted(v1::LeaseGranted { id, ttl_ms }))
            }
            LeaseResult::KeptAlive { ttl_ms } => {
                (0, Answer::KeptAlive(v1::LeaseKeptAlive { id, ttl_ms }))
            }
            LeaseResult::Revoked { revision, deleted } => {
                (revision, Answer::Revoked(v1::LeaseRevoked { deleted }))
            }
        };
        Ok(LeaseResponse {
            header: self.router.header(group, revision, replayed),
            result: Some(answer),
        })
    }
}

/// A lease as sent by a node whose clock reads `now_ms`.
fn lease_info(info: LeaseInfo, now_ms: u64) -> v1::LeaseInfo {
    v1::LeaseInfo {
        id: info.id,
        granted_ttl_ms: info.ttl_ms,
        remaining_ms: info.expires_at_ms.saturating_sub(now_ms),
        keys: info.keys,
    }
}
