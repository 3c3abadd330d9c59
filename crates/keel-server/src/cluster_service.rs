//! The `keel.v1.Cluster` service: this node's view of itself and of each range it hosts.
//! Knows nothing of Kv request handling.

use std::sync::Arc;

use keel_proto::v1::cluster_server::Cluster;
use keel_proto::v1::{Member, RangeStatus, StatusRequest, StatusResponse};
use keel_raft::GroupStatus;
use tonic::{Request, Response, Status};

use crate::shared::Shared;

pub(crate) struct ClusterService {
    shared: Arc<Shared>,
}

impl ClusterService {
    pub fn new(shared: Arc<Shared>) -> ClusterService {
        ClusterService { shared }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let (mut healthy, mut message) = self.shared.health.summary();
        let mut ranges = Vec::new();
        for group in self.shared.groups.all() {
            match group.status().await {
                Ok(status) => ranges.push(range_status(status)),
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

fn range_status(status: GroupStatus) -> RangeStatus {
    RangeStatus {
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
