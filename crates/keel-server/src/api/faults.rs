//! `keel.test.v1.Faults` (built with the `fault-injection` feature only): run-time control of
//! this node's test faults: its clock offset, its split thresholds, and replica moves on any
//! range (carried out by the range's leader, the rebalancer's way:
//! `rebalancer::change_through`), and a row of this node's replica changed behind Raft's back. The faults set at start are `config::faults`. Knows nothing
//! of request semantics.

use std::sync::Arc;

use keel_proto::test::v1::faults_server::Faults;
use keel_proto::test::v1::{
    CorruptRowRequest, CorruptRowResponse, MoveReplicaRequest, MoveReplicaResponse,
    SetClockOffsetRequest, SetClockOffsetResponse, SetSplitThresholdsRequest,
    SetSplitThresholdsResponse,
};
use keel_types::{KvError, NodeAddr, NodeId, RangeDescriptor, RangeId, ReplicaChange};
use tonic::{Request, Response, Status};
use tracing::{debug, info};

use crate::cluster::rebalancer;
use crate::config::SplitSettings;
use crate::ranges::{lookup as ranges, replicas};
use crate::shared::Shared;
use crate::status::to_status;

pub(crate) struct FaultsService {
    shared: Arc<Shared>,
}

impl FaultsService {
    pub fn new(shared: Arc<Shared>) -> FaultsService {
        FaultsService { shared }
    }
}

#[tonic::async_trait]
impl Faults for FaultsService {
    async fn corrupt_row(
        &self,
        request: Request<CorruptRowRequest>,
    ) -> Result<Response<CorruptRowResponse>, Status> {
        let key = request.into_inner().key;
        let group = match self.shared.ranges.local(&key) {
            Some(range) => self.shared.ensure_group(range.id).await,
            None => Err(KvError::invalid(
                "this node holds no replica of the key's range",
            )),
        };
        let group = group.map_err(|e| to_status(&e))?;
        let corrupted = group.state_machine().corrupt_row(&key).await;
        corrupted.map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(CorruptRowResponse {
            range_id: group.range().0,
        }))
    }

    async fn set_clock_offset(
        &self,
        request: Request<SetClockOffsetRequest>,
    ) -> Result<Response<SetClockOffsetResponse>, Status> {
        let offset_ms = request.into_inner().offset_ms;
        info!(offset_ms, "fault injection: clock offset set");
        self.shared.clock.set_offset_ms(offset_ms);
        Ok(Response::new(SetClockOffsetResponse {}))
    }

    async fn set_split_thresholds(
        &self,
        request: Request<SetSplitThresholdsRequest>,
    ) -> Result<Response<SetSplitThresholdsResponse>, Status> {
        let request = request.into_inner();
        let (previous, settings) = self
            .shared
            .split
            .update(|settings| thresholds(settings, &request))
            .map_err(|error| Status::invalid_argument(error.to_string()))?;
        info!(
            range_split_bytes = settings.range_bytes_max,
            range_split_requests_per_sec = settings.requests_per_sec_max,
            range_split_load_secs = settings.load_secs,
            "fault injection: split thresholds set"
        );
        Ok(Response::new(SetSplitThresholdsResponse {
            range_split_bytes: previous.range_bytes_max,
            range_split_requests_per_sec: previous.requests_per_sec_max,
            range_split_load_secs: previous.load_secs,
        }))
    }

    async fn move_replica(
        &self,
        request: Request<MoveReplicaRequest>,
    ) -> Result<Response<MoveReplicaResponse>, Status> {
        let request = request.into_inner();
        let range = RangeId(request.range_id);
        let (from, to) = (request.from_node, request.to_node);
        let change = replacement(&self.shared, from, to)
            .await
            .map_err(Status::invalid_argument)?;
        info!(%range, from, to, "fault injection: moving a replica");
        let after = change_on_leader(&self.shared, range, &change)
            .await
            .map_err(change_status)?;
        info!(%range, from, to, %after, "fault injection: replica moved");
        Ok(Response::new(MoveReplicaResponse {}))
    }
}

/// `settings` with each threshold `request` sets (not 0) in its place.
fn thresholds(settings: SplitSettings, request: &SetSplitThresholdsRequest) -> SplitSettings {
    let or_kept = |asked: u64, kept: u64| if asked == 0 { kept } else { asked };
    SplitSettings {
        range_bytes_max: or_kept(request.range_split_bytes, settings.range_bytes_max),
        requests_per_sec_max: or_kept(
            request.range_split_requests_per_sec,
            settings.requests_per_sec_max,
        ),
        load_secs: or_kept(request.range_split_load_secs, settings.load_secs),
        check_interval_ms: settings.check_interval_ms,
    }
}

/// The change that replaces voter `from` by `to`, with `to`'s address (the meta range is
/// read again once when this node does not know it: a node that joined a moment ago); why
/// the request is invalid otherwise.
async fn replacement(shared: &Shared, from: NodeId, to: NodeId) -> Result<ReplicaChange, String> {
    if from == 0 || to == 0 {
        return Err("from_node and to_node must name nodes (node ids start at 1)".to_string());
    }
    if from == to {
        return Err(format!(
            "from_node and to_node are both node {from}; a move needs two nodes"
        ));
    }
    let known = match to == shared.node_id {
        true => Some(NodeAddr::new(shared.addr.clone())),
        false => shared.node_addr(to),
    };
    let addr = match known {
        Some(addr) => Some(addr),
        None => {
            if let Err(error) = ranges::refresh_meta(shared).await {
                debug!(%error, "reading the meta range for a node's address");
            }
            shared.node_addr(to)
        }
    };
    let addr = addr.ok_or_else(|| {
        format!(
            "node {to} is unknown to node {} (neither the meta range nor the initial cluster names it)",
            shared.node_id
        )
    })?;
    Ok(ReplicaChange::Replace { from, to, addr })
}

/// Carries out `change` of `range`'s replicas on this node when it leads the range, else
/// sends it to the leader it knows (or to a replica, which forwards it once), the way the
/// rebalancer sends its changes.
async fn change_on_leader(
    shared: &Shared,
    range: RangeId,
    change: &ReplicaChange,
) -> Result<RangeDescriptor, KvError> {
    match replicas::change(shared, range, change).await {
        Err(KvError::NotLeader {
            leader: Some((leader, addr)),
            ..
        }) if leader != shared.node_id => {
            rebalancer::change_through(shared, leader, &addr, range, change).await
        }
        Err(KvError::NotLeader { leader: None, .. }) => Err(KvError::unavailable(format!(
            "node {} knows no leader or replica of range {range}",
            shared.node_id
        ))),
        changed => changed,
    }
}

/// The status of a change that failed. The leader refuses a change the range's membership
/// does not allow now (`from` not a voter or leading the range, `to` a voter already) as
/// an invalid argument; the request itself was checked, so here that is a failed
/// precondition.
fn change_status(error: KvError) -> Status {
    match error {
        KvError::InvalidArgument { message } => Status::failed_precondition(message),
        error => to_status(&error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_keeps_a_threshold() {
        let settings = SplitSettings::default();
        let check = |bytes, rate, secs, expected: SplitSettings| {
            let request = SetSplitThresholdsRequest {
                range_split_bytes: bytes,
                range_split_requests_per_sec: rate,
                range_split_load_secs: secs,
            };
            assert_eq!(thresholds(settings, &request), expected, "{request:?}");
        };
        check(0, 0, 0, settings);
        let bytes = SplitSettings {
            range_bytes_max: 4_096,
            ..settings
        };
        check(4_096, 0, 0, bytes);
        let load = SplitSettings {
            requests_per_sec_max: 50,
            load_secs: 2,
            ..settings
        };
        check(0, 50, 2, load);
    }
}
