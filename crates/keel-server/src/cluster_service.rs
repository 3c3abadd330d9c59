//! The `keel.v1.Cluster` service: this node's view of itself and of each range it hosts, and
//! leader transfer (forwarded once to the range's leader). Knows nothing of Kv request
//! handling.

use std::sync::Arc;

use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::cluster_server::Cluster;
use keel_proto::v1::{
    Member, RangeStatus, StatusRequest, StatusResponse, TransferLeaderRequest,
    TransferLeaderResponse,
};
use keel_raft::{GroupStatus, RaftGroup};
use keel_storage::{RangeCounts, StorageError};
use keel_types::{CoordinationCounts, KvError, RangeId};
use tonic::{Request, Response, Status};

use crate::shared::Shared;
use crate::status::to_status;

pub(crate) struct ClusterService {
    shared: Arc<Shared>,
}

impl ClusterService {
    pub fn new(shared: Arc<Shared>) -> ClusterService {
        ClusterService { shared }
    }
}

impl ClusterService {
    /// Sends a transfer the caller marked `no_forward` to the leader's Cluster service.
    async fn forward_transfer(
        &self,
        error: KvError,
        request: TransferLeaderRequest,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let KvError::NotLeader {
            leader: Some((leader_id, leader_addr)),
            ..
        } = error
        else {
            return Err(to_status(&error));
        };
        let unreachable = |message: String| {
            to_status(&KvError::unavailable(format!(
                "leader node {leader_id}: {message}"
            )))
        };
        let channel = self
            .shared
            .peers
            .channel(leader_id, &leader_addr.addr)
            .map_err(|e| unreachable(e.to_string()))?;
        let deadline = self.shared.forward_deadline(false);
        let mut leader = ClusterClient::new(channel);
        match tokio::time::timeout(deadline, leader.transfer_leader(request)).await {
            Ok(answer) => answer,
            Err(_) => Err(unreachable(format!("no answer within {deadline:?}"))),
        }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let mut request = request.into_inner();
        self.shared.health.check().map_err(|e| to_status(&e))?;
        let group = self
            .shared
            .group(RangeId(request.range_id))
            .map_err(|e| to_status(&e))?;
        match group.transfer_leader(request.node_id).await {
            Ok(()) => Ok(Response::new(TransferLeaderResponse {})),
            Err(error) if request.no_forward => Err(to_status(&error)),
            Err(error) => {
                request.no_forward = true;
                self.forward_transfer(error, request).await
            }
        }
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let (mut healthy, mut message) = self.shared.health.summary();
        let mut ranges = Vec::new();
        for group in self.shared.groups.all() {
            match range_status(&group).await {
                Ok(status) => ranges.push(status),
                Err(error) => {
                    healthy = false;
                    message = error.to_string();
                }
            }
        }
        Ok(Response::new(StatusResponse {
            node_id: self.shared.node_id,
            addr: self.shared.addr.clone(),
            healthy,
            message,
            ranges,
            version: env!("CARGO_PKG_VERSION").to_string(),
        }))
    }
}

/// This replica's view of `group`'s range, with what its state machine keeps.
async fn range_status(group: &RaftGroup) -> Result<RangeStatus, KvError> {
    let state_machine = group.state_machine();
    let stored = |e: StorageError| KvError::fatal(e.to_string());
    let counts = state_machine.counts().await.map_err(stored)?;
    let coordination = state_machine.coordination_counts().await.map_err(stored)?;
    let status = group.status().await?;
    Ok(status_message(status, counts, coordination))
}

fn status_message(
    status: GroupStatus,
    counts: RangeCounts,
    coordination: CoordinationCounts,
) -> RangeStatus {
    RangeStatus {
        keys_with_ttl: counts.keys_with_ttl,
        client_sessions: counts.sessions,
        request_records: counts.requests,
        locks: coordination.locks,
        fenced_keys: coordination.fenced_keys,
        idempotency_records: coordination.idempotency_records,
        range_id: status.range.0,
        leader_id: status.leader,
        term: status.term,
        commit_index: status.commit_index,
        applied_index: status.applied_index,
        last_log_index: status.last_log_index,
        snapshot_index: status.snapshot_index,
        purged_index: status.purged_index,
        revision: status.revision,
        role: status.role.name().to_string(),
        members: status
            .members
            .into_iter()
            .map(|member| Member {
                node_id: member.id,
                addr: member.addr.addr,
                voter: member.voter,
            })
            .collect(),
    }
}
