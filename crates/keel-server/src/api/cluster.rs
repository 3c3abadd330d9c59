//! The `keel.v1.Cluster` service: this node's view of itself and of each range it hosts, the
//! range table (from the meta range's leader), splits (on the leader of the range holding the
//! split key) and leader transfer (forwarded once to the range's leader). Knows nothing of Kv
//! request handling.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keel_meta::RangeTable;
use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::cluster_server::Cluster;
use keel_proto::v1::{
    AddNodeRequest, AddNodeResponse, BackupRequest, CheckRequest, CheckResponse, LeaderRequest,
    LeaderResponse, Member, MembersRequest, MembersResponse, RangeCheck, RangeInfo, RangeStatus,
    RangesRequest, RangesResponse, RemoveNodeRequest, RemoveNodeResponse, SplitRequest,
    SplitResponse, StatusRequest, StatusResponse, TransferLeaderRequest, TransferLeaderResponse,
};
use keel_raft::{GroupStatus, RaftGroup};
use keel_storage::{RangeCounts, StorageError};
use keel_types::validate::{check_key, check_split_key};
use keel_types::{
    Consistency, CoordinationCounts, KvError, NodeAddr, NodeDescriptor, NodeId, RangeDescriptor,
    RangeId, limits,
};
use tonic::{Request, Response, Status};

use crate::access::Call;
use crate::api::backup::{self, BackupStream};
use crate::api::health;
use crate::cluster::nodes;
use crate::cluster::placement::{self, ClusterView};
use crate::peer::channels::PeerChannel;
use crate::ranges::{check, lookup, split};
use crate::requests::router::{Audience, Hop, Router};
use crate::shared::Shared;
use crate::status::to_status;

pub(crate) struct ClusterService {
    shared: Arc<Shared>,
    router: Router,
}

impl ClusterService {
    pub fn new(shared: Arc<Shared>, audience: Audience) -> ClusterService {
        ClusterService {
            router: Router::new(shared.clone(), audience),
            shared,
        }
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
            return Err(self.router.status(&error));
        };
        let transfer =
            |mut leader: ClusterClient<_>| async move { leader.transfer_leader(request).await };
        let answer = nodes::remote(&self.shared, leader_id, leader_addr, false, transfer).await;
        answer
            .map(Response::new)
            .map_err(|e| self.router.status(&e))
    }

    /// The range table, answered by the meta range's leader (this node, or forwarded once).
    pub(crate) async fn serve_ranges(
        &self,
        request: &RangesRequest,
    ) -> Result<RangesResponse, KvError> {
        let shared = &self.shared;
        let here = |meta: Arc<RaftGroup>| async move { self.ranges_here(&meta).await };
        let remote = |node, addr| {
            nodes::remote(shared, node, addr, false, |mut cluster| async move {
                cluster.ranges(RangesRequest { no_forward: true }).await
            })
        };
        nodes::on_meta_leader(shared, request.no_forward, false, here, remote).await
    }

    /// The range table on the meta range's leader: its descriptors read linearizably (with
    /// this node's own, newer ones where it has them), the registered nodes, and each range's
    /// leader, size and load as its leader last reported them (or this node's replica knows).
    async fn ranges_here(&self, meta: &RaftGroup) -> Result<RangesResponse, KvError> {
        meta.read_barrier(Consistency::Linearizable).await?;
        let state_machine = meta.state_machine();
        let recorded = state_machine.meta_ranges().await.map_err(stored)?;
        let registered = state_machine.meta_nodes().await.map_err(stored)?;
        let local = self.shared.store.descriptors().await.map_err(stored)?;
        let view = placement::gather(&self.shared, meta).await?;
        let table = RangeTable::from_descriptors(recorded.into_iter().chain(local).collect());
        let mut ranges = Vec::with_capacity(table.len());
        for range in table.ranges() {
            ranges.push(self.range_info(range.clone(), &view).await);
        }
        Ok(RangesResponse {
            ranges,
            nodes: self.nodes(registered),
            meta_leader_id: self.shared.node_id,
        })
    }

    /// A range with its leader and load as the leader last reported them, and its size and
    /// keys read from this node's replica when it hosts one (so they are fresh right after
    /// writes), else from that report, with the report's age.
    async fn range_info(&self, range: RangeDescriptor, view: &ClusterView) -> RangeInfo {
        let group = self.shared.groups.get(range.id);
        let local = match &group {
            Some(group) => group.state_machine().counts().await.ok(),
            None => None,
        };
        let reported = view.leader_of(range.id).zip(view.led.get(&range.id));
        let leader_id = match reported {
            Some((leader, _)) => Some(leader),
            None => group
                .as_ref()
                .and_then(|group| group.leader())
                .map(|(id, _)| id),
        };
        let requests_per_sec =
            reported.map_or(0.0, |(_, led)| led.requests_per_sec_milli as f64 / 1000.0);
        let (size_bytes, keys, counts_age_ms) = match (local, reported) {
            (Some(counts), _) => (counts.size_bytes, counts.keys, 0),
            (None, Some((leader, led))) => {
                let age = view.nodes.get(&leader).and_then(|node| node.heartbeat_age);
                let age_ms = age.map_or(0, |age| age.as_millis() as u64);
                (led.size_bytes, led.keys, age_ms)
            }
            (None, None) => (0, 0, 0),
        };
        RangeInfo {
            descriptor: Some(range.into()),
            leader_id,
            size_bytes,
            keys,
            requests_per_sec,
            counts_age_ms,
        }
    }

    async fn serve_add_node(&self, request: AddNodeRequest) -> Result<AddNodeResponse, KvError> {
        let shared = &self.shared;
        let no_forward = request.no_forward;
        let forwarded = AddNodeRequest {
            no_forward: true,
            ..request.clone()
        };
        let request = &request;
        let here =
            |meta: Arc<RaftGroup>| async move { nodes::add_node(shared, &meta, request).await };
        let remote = |node, addr| {
            let forwarded = forwarded.clone();
            nodes::remote(shared, node, addr, true, |mut cluster| async move {
                cluster.add_node(forwarded).await
            })
        };
        nodes::on_meta_leader(shared, no_forward, true, here, remote).await
    }

    async fn serve_remove_node(
        &self,
        request: RemoveNodeRequest,
    ) -> Result<RemoveNodeResponse, KvError> {
        let shared = &self.shared;
        let forwarded = RemoveNodeRequest {
            no_forward: true,
            ..request
        };
        let here =
            |meta: Arc<RaftGroup>| async move { nodes::remove_node(shared, &meta, &request).await };
        let remote = |node, addr| {
            nodes::remote(shared, node, addr, true, move |mut cluster| async move {
                cluster.remove_node(forwarded).await
            })
        };
        nodes::on_meta_leader(shared, request.no_forward, true, here, remote).await
    }

    pub(crate) async fn serve_members(
        &self,
        request: MembersRequest,
    ) -> Result<MembersResponse, KvError> {
        let shared = &self.shared;
        let here =
            |meta: Arc<RaftGroup>| async move { nodes::members(shared, &meta, &request).await };
        let remote = |node, addr| {
            nodes::remote(shared, node, addr, false, |mut cluster| async move {
                cluster.members(MembersRequest { no_forward: true }).await
            })
        };
        nodes::on_meta_leader(shared, request.no_forward, false, here, remote).await
    }

    /// The registered nodes, and the initial cluster's nodes not registered yet, by id.
    fn nodes(&self, registered: Vec<NodeDescriptor>) -> Vec<Member> {
        let mut nodes: BTreeMap<NodeId, NodeAddr> = self
            .shared
            .cluster
            .iter()
            .map(|(id, addr)| (*id, NodeAddr::new(addr)))
            .collect();
        nodes.extend(registered.into_iter().map(|node| (node.id, node.addr)));
        nodes
            .into_iter()
            .map(|(node_id, addr)| Member {
                node_id,
                peer_addr: addr.addr.clone(),
                addr: addr.addr,
                voter: true,
            })
            .collect()
    }

    /// The leader of the local range holding `key`, as its replica here knows it.
    async fn serve_leader(&self, key: &[u8]) -> Result<LeaderResponse, KvError> {
        check_key(key)?;
        let group = lookup::route(&self.shared, key).await?;
        let leader = group.leader();
        let leader_addr = leader
            .as_ref()
            .map(|(id, addr)| self.dialled(*id, &addr.addr, "").0)
            .unwrap_or_default();
        Ok(LeaderResponse {
            range_id: group.range().0,
            leader_id: leader.map(|(id, _)| id),
            leader_addr,
            term: group.term(),
        })
    }

    /// Names `members` by the addresses this service's audience dials (`Router::audience`).
    fn for_audience(&self, members: &mut [Member]) {
        for member in members {
            (member.addr, member.peer_addr) =
                self.dialled(member.node_id, &member.addr, &member.peer_addr);
        }
    }

    /// The address to dial `node` by and its peer address, for this service's audience,
    /// given its `addr` and `peer_addr` as an answer named them (an answer from a release
    /// before the peer port has no `peer_addr`: `addr` is that then). Clients get the
    /// node's client address, or none while it is unknown here.
    fn dialled(&self, node: NodeId, addr: &str, peer_addr: &str) -> (String, String) {
        let peer_addr = match peer_addr.is_empty() {
            true => addr.to_string(),
            false => peer_addr.to_string(),
        };
        match self.router.audience() {
            Audience::Peers => (peer_addr.clone(), peer_addr),
            Audience::Clients => {
                let client = self.shared.client_addr(node).map(|addr| addr.addr);
                (client.unwrap_or_default(), peer_addr)
            }
        }
    }

    async fn serve_split(&self, request: &SplitRequest) -> Result<SplitResponse, KvError> {
        check_split_key(&request.at)?;
        let split = |group| self.split_on(group, &request.at);
        self.router.on_range(&request.at, split).await
    }

    /// Splits `group`'s range at `at`. A split already made there (a retry whose answer was
    /// lost, or whose first attempt was still running when it came) is answered with the
    /// two ranges it made.
    async fn split_on(&self, group: Arc<RaftGroup>, at: &[u8]) -> Result<SplitResponse, KvError> {
        let range = group.descriptor().await?;
        let made = match range.start == at {
            true => self.halves_at(at).await?,
            false => None,
        };
        let (left, right) = match made {
            Some(halves) => halves,
            None => match split::split_range(&self.shared, &group, at.to_vec()).await {
                Err(error) if split_there(&error, at) => self.halves_at(at).await?.ok_or(error)?,
                split => split?,
            },
        };
        Ok(SplitResponse {
            left: Some(left.into()),
            right: Some(right.into()),
        })
    }

    /// The local ranges on either side of `at`, when a split made there is applied here:
    /// the one ending at `at` and the one starting there.
    async fn halves_at(
        &self,
        at: &[u8],
    ) -> Result<Option<(RangeDescriptor, RangeDescriptor)>, KvError> {
        lookup::refresh_local(&self.shared).await?;
        let local = self.shared.ranges.local_ranges();
        let left = local.iter().find(|range| range.end() == Some(at));
        let right = local.iter().find(|range| range.start == at);
        Ok(left.cloned().zip(right.cloned()))
    }
}

/// Whether `error` says the range was split at `at` by another request first.
fn split_there(error: &KvError, at: &[u8]) -> bool {
    matches!(error, KvError::EpochMismatch { range, .. } if range.end() == Some(at))
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    type BackupStream = BackupStream;

    async fn backup(
        &self,
        request: Request<BackupRequest>,
    ) -> Result<Response<BackupStream>, Status> {
        self.shared.admit(&request, Call::Admin)?;
        let request = request.into_inner();
        tracing::Span::current().record("range_id", request.range_id);
        let served = backup::backup(&self.shared, request);
        // The leader's hint in a refusal names the address this service's audience dials.
        served
            .await
            .map(Response::new)
            .map_err(|status| self.router.relayed(status))
    }

    async fn check(
        &self,
        request: Request<CheckRequest>,
    ) -> Result<Response<CheckResponse>, Status> {
        self.shared.admit(&request, Call::Admin)?;
        self.shared.health.check().map_err(|e| to_status(&e))?;
        let ranges: Vec<RangeId> = match request.get_ref().range_id {
            Some(range) => vec![RangeId(range)],
            None => {
                // The range table as the meta range's leader reads it (linearizably).
                let all = RangesRequest { no_forward: false };
                let table = self.serve_ranges(&all).await.map_err(|e| to_status(&e))?;
                let data = table.ranges.iter().filter_map(|r| r.descriptor.as_ref());
                std::iter::once(RangeId::META)
                    .chain(data.map(|d| RangeId(d.range_id)))
                    .take(limits::CHECK_RANGES_MAX)
                    .collect()
            }
        };
        let mut checked = Vec::with_capacity(ranges.len());
        for range in ranges {
            let report = check::check_through_leader(&self.shared, range).await;
            checked.push(match report {
                Ok(report) => RangeCheck::from(&report),
                Err(error) => RangeCheck {
                    range_id: range.0,
                    error: error.to_string(),
                    ..RangeCheck::default()
                },
            });
        }
        Ok(Response::new(CheckResponse { ranges: checked }))
    }

    async fn transfer_leader(
        &self,
        request: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        self.shared.admit(&request, Call::Admin)?;
        let mut request = request.into_inner();
        self.shared.health.check().map_err(|e| to_status(&e))?;
        let range = RangeId(request.range_id);
        // A node without a replica of the range sends it to one that has.
        let transferred = match self.shared.groups.get(range) {
            Some(group) => group.transfer_leader(request.node_id).await,
            None => Err(KvError::NotLeader {
                range_id: range,
                leader: self.shared.replica_hint(range),
            }),
        };
        match transferred {
            Ok(()) => Ok(Response::new(TransferLeaderResponse {})),
            Err(error) if request.no_forward => Err(self.router.status(&error)),
            Err(error) => {
                request.no_forward = true;
                self.forward_transfer(error, request).await
            }
        }
    }

    async fn add_node(
        &self,
        request: Request<AddNodeRequest>,
    ) -> Result<Response<AddNodeResponse>, Status> {
        self.shared.admit(&request, Call::Admin)?;
        let served = self.serve_add_node(request.into_inner()).await;
        served
            .map(Response::new)
            .map_err(|e| self.router.status(&e))
    }

    async fn remove_node(
        &self,
        request: Request<RemoveNodeRequest>,
    ) -> Result<Response<RemoveNodeResponse>, Status> {
        self.shared.admit(&request, Call::Admin)?;
        let served = self.serve_remove_node(request.into_inner()).await;
        served
            .map(Response::new)
            .map_err(|e| self.router.status(&e))
    }

    async fn members(
        &self,
        request: Request<MembersRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Listing)?;
        let served = self.serve_members(request.into_inner()).await;
        let served = served.map(|mut members| {
            for node in &mut members.nodes {
                (node.addr, node.peer_addr) =
                    self.dialled(node.node_id, &node.addr, &node.peer_addr);
            }
            members
        });
        caller.reveal(
            served
                .map(Response::new)
                .map_err(|e| self.router.status(&e)),
        )
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.shared.admit(&request, Call::Admin)?;
        let ready = health::verdict(&self.shared);
        let (mut healthy, mut message) = self.shared.health.summary();
        let hosted = self.shared.groups.all().iter().map(|g| g.range()).collect();
        let alarms = self.shared.checks.alarms(&hosted);
        let consistency_alarms = alarms.iter().map(RangeCheck::from).collect();
        let mut ranges = Vec::new();
        for group in self.shared.groups.all() {
            match range_status(&group).await {
                Ok(mut status) => {
                    self.for_audience(&mut status.members);
                    ranges.push(status);
                }
                Err(error) => {
                    healthy = false;
                    message = error.to_string();
                }
            }
        }
        Ok(Response::new(StatusResponse {
            node_id: self.shared.node_id,
            addr: self.shared.client_addr.clone(),
            healthy,
            message,
            ranges,
            version: env!("CARGO_PKG_VERSION").to_string(),
            peer_addr: self.shared.addr.clone(),
            ready: ready.is_ok(),
            ready_message: ready.err().unwrap_or_default(),
            consistency_alarms,
        }))
    }

    async fn ranges(
        &self,
        request: Request<RangesRequest>,
    ) -> Result<Response<RangesResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Listing)?;
        let served = self.serve_ranges(request.get_ref()).await;
        let served = served.map(|mut ranges| {
            self.for_audience(&mut ranges.nodes);
            ranges
        });
        caller.reveal(
            served
                .map(Response::new)
                .map_err(|e| self.router.status(&e)),
        )
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let caller = self.shared.admit(&request, Call::Listing)?;
        let request = caller.confine(request.into_inner());
        let answer = self.serve_leader(&request.key).await;
        caller.reveal(
            answer
                .map(Response::new)
                .map_err(|e| self.router.status(&e)),
        )
    }

    async fn split(
        &self,
        request: Request<SplitRequest>,
    ) -> Result<Response<SplitResponse>, Status> {
        self.shared.admit(&request, Call::Admin)?;
        let request = request.into_inner();
        let forward =
            |mut cluster: ClusterClient<PeerChannel>, r| async move { cluster.split(r).await };
        // A split proposes up to three commands: the id allocation, the split, the publish.
        let wait = Duration::from_millis(2 * self.shared.timings.write_timeout_ms);
        let hop = Hop { write: true, wait };
        let serve = || self.serve_split(&request);
        self.router.answer(&request, hop, serve, forward).await
    }
}

fn stored(error: StorageError) -> KvError {
    KvError::fatal(error.to_string())
}

/// This replica's view of `group`'s range, with what its state machine keeps (nothing while
/// it installs a snapshot).
async fn range_status(group: &RaftGroup) -> Result<RangeStatus, KvError> {
    let state_machine = group.state_machine();
    let kept = async {
        let counts = state_machine.counts().await?;
        let coordination = state_machine.coordination_counts().await?;
        let descriptor = state_machine.descriptor().await?;
        Ok::<_, StorageError>((counts, coordination, Some(descriptor)))
    };
    let (counts, coordination, descriptor) = match kept.await {
        Ok(kept) => kept,
        Err(StorageError::SnapshotInstalling { .. }) => Default::default(),
        Err(error) => return Err(stored(error)),
    };
    let status = group.status().await?;
    Ok(status_message(status, descriptor, counts, coordination))
}

fn status_message(
    status: GroupStatus,
    descriptor: Option<RangeDescriptor>,
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
                peer_addr: member.addr.addr.clone(),
                addr: member.addr.addr,
                voter: member.voter,
            })
            .collect(),
        descriptor: descriptor.map(Into::into),
        keys: counts.keys,
        size_bytes: counts.size_bytes,
        quiesced: status.quiesced,
    }
}
