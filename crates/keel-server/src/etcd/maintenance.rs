//! etcd's `Maintenance` service on Keel: `Status` (what `etcdctl endpoint status` shows) of
//! the range holding the etcd namespace, as a linearizable read of it finds it, and
//! `Alarm` (Keel raises no etcd alarm). The calls that act on etcd's own storage (defragment,
//! hashes, snapshots, leader moves, downgrades) answer `Unimplemented` saying what Keel offers
//! instead.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use keel_proto::etcd::etcdserverpb::maintenance_server::Maintenance;
use keel_proto::etcd::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, ResponseHeader, SnapshotRequest, SnapshotResponse, StatusRequest,
    StatusResponse,
};
use keel_proto::v1::GetRequest;
use keel_proto::v1::kv_server::Kv;
use keel_types::RangeId;
use tonic::{Request, Response, Status};

use super::ETCD_VERSION;
use super::convert::{self, unsupported};
use crate::api::kv::KvService;
use crate::shared::Shared;

pub(crate) struct EtcdMaintenance {
    shared: Arc<Shared>,
    kv: KvService,
}

impl EtcdMaintenance {
    pub fn new(shared: Arc<Shared>, kv: KvService) -> EtcdMaintenance {
        EtcdMaintenance { shared, kv }
    }

    fn header(&self, revision: u64, term: u64) -> ResponseHeader {
        convert::header(self.shared.node_id, revision, term)
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for EtcdMaintenance {
    /// Keel raises no etcd alarm: a full disk or quota refuses writes with its own errors.
    async fn alarm(&self, _: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        Ok(Response::new(AlarmResponse {
            header: Some(self.header(0, 0)),
            alarms: Vec::new(),
        }))
    }

    /// The namespace's range as a linearizable read finds it: its revision and term; its
    /// leader and log indexes as this node's replica knows them (without one, the node that
    /// served the read is taken for the leader and the indexes are 0).
    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let (metadata, _, _) = request.into_parts();
        let mut get = Request::new(GetRequest {
            key: convert::key(b"\0"),
            ..GetRequest::default()
        });
        *get.metadata_mut() = metadata;
        let answer = self
            .kv
            .get(get)
            .await
            .map_err(convert::status)?
            .into_inner();
        let header = answer.header.unwrap_or_default();
        // Any replica may serve a linearizable read: the leader is the local replica's
        // knowledge when there is one, else the node that served.
        let group = self.shared.groups.get(RangeId(header.range_id));
        let applied = group.as_ref().map_or(0, |group| group.applied_index());
        let leader = match &group {
            Some(group) => group.leader().map_or(0, |(id, _)| id),
            None => header.served_by,
        };
        let db_size = self.shared.store.file_bytes().unwrap_or(0);
        let db_size = i64::try_from(db_size).unwrap_or(i64::MAX);
        Ok(Response::new(StatusResponse {
            header: Some(self.header(header.revision, header.term)),
            version: ETCD_VERSION.to_string(),
            db_size,
            leader,
            raft_index: applied,
            raft_term: header.term,
            raft_applied_index: applied,
            errors: Vec::new(),
            db_size_in_use: db_size,
            is_learner: false,
        }))
    }

    async fn defragment(
        &self,
        _: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        Err(unsupported(
            "defragment",
            "Keel's store reuses freed pages itself",
        ))
    }

    async fn hash(&self, _: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(unsupported(
            "hash",
            "`keel cluster check` compares the replicas of every range",
        ))
    }

    async fn hash_kv(&self, _: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        Err(unsupported(
            "hash_kv",
            "`keel cluster check` compares the replicas of every range",
        ))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        _: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        Err(unsupported(
            "snapshot",
            "`keel backup` takes a backup of the cluster",
        ))
    }

    async fn move_leader(
        &self,
        _: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(unsupported(
            "move_leader",
            "`keel cluster transfer-leader` moves a range's leadership",
        ))
    }

    async fn downgrade(
        &self,
        _: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(unsupported(
            "downgrade",
            "Keel's data dirs migrate on upgrade",
        ))
    }
}
