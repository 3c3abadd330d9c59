//! The fake as a cluster of ranges: several nodes (one listener each, told apart by the port
//! a request arrived on) share one store whose keyspace is split into ranges, each led by one
//! node and replicated on all. A keyed request is routed as a Keel node routes it with
//! `no_forward`: the range holding its (first) key by the node's view of the table; a node
//! that does not lead it answers `NotLeader{range, hint}`; a range that does not hold every
//! key of the request answers `KeyOutOfRange` with its descriptor. A node's view lags a split
//! made with `split_lagging` until it has refused one request that way, as a node whose
//! table is refreshed by that refusal. Serves `Cluster.Ranges` (counted), `Cluster.Leader` (the truth) and `Cluster.Split`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use keel_proto::v1;
use keel_proto::v1::cluster_server::{Cluster, ClusterServer};
use keel_types::{KvError, NodeAddr, RangeDescriptor, RangeId};
use tonic::{Request, Response, Status};

use super::{Fake, status};

/// The ranges of the fake cluster.
pub struct Ranged {
    /// The truth, in key order.
    ranges: Vec<FakeRange>,
    /// Addresses by node id.
    nodes: BTreeMap<u64, String>,
    /// Node ids by listener port.
    ports: HashMap<u16, u64>,
    /// Nodes that route by an older table, until they refuse a request with `KeyOutOfRange`.
    lagging: HashMap<u64, Vec<FakeRange>>,
    ranges_calls: usize,
    /// A split (at, child's leader) to make when this many writes have arrived.
    split_at_write: Option<(usize, Vec<u8>, u64)>,
}

#[derive(Debug, Clone)]
struct FakeRange {
    descriptor: RangeDescriptor,
    leader: u64,
}

fn lookup<'a>(ranges: &'a [FakeRange], key: &[u8]) -> &'a FakeRange {
    ranges
        .iter()
        .find(|range| range.descriptor.contains(key))
        .expect("the fake's ranges cover the keyspace")
}

impl Fake {
    /// A cluster of `nodes` nodes (ids 1 to `nodes`, each on its own port) whose keyspace is
    /// split at `splits` (ascending): range `i + 1` (in key order) is led by node
    /// `i % nodes + 1`, and every node holds a replica of every range. Returns the nodes'
    /// addresses, by node id from 1.
    pub async fn cluster(nodes: u64, splits: &[&[u8]]) -> (Arc<Fake>, Vec<String>) {
        let fake = Fake::new(0, vec![]);
        let mut listeners = Vec::new();
        let mut addrs = BTreeMap::new();
        let mut ports = HashMap::new();
        for id in 1..=nodes {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            addrs.insert(id, addr.to_string());
            ports.insert(addr.port(), id);
            listeners.push(listener);
        }
        let bounds: Vec<Option<&[u8]>> = splits.iter().map(|at| Some(*at)).collect();
        let starts = std::iter::once(&b""[..]).chain(splits.iter().copied());
        let ends = bounds.into_iter().chain(std::iter::once(None));
        let ranges = starts
            .zip(ends)
            .enumerate()
            .map(|(index, (start, end))| FakeRange {
                descriptor: RangeDescriptor {
                    id: RangeId(index as u64 + 1),
                    start: start.to_vec(),
                    end: end.map(<[u8]>::to_vec),
                    epoch: 1,
                    conf_version: 1,
                    replicas: (1..=nodes).collect(),
                },
                leader: index as u64 % nodes + 1,
            })
            .collect();
        *fake.ranged.lock().unwrap() = Some(Ranged {
            ranges,
            nodes: addrs.clone(),
            ports,
            lagging: HashMap::new(),
            ranges_calls: 0,
            split_at_write: None,
        });
        for listener in listeners {
            fake.serve_on(listener).await;
        }
        (fake, addrs.into_values().collect())
    }

    /// Splits the range holding `at` so that `at` starts a new range led by `child_leader`;
    /// returns both halves. Every node routes by the new table at once.
    pub fn split(&self, at: &[u8], child_leader: u64) -> (RangeDescriptor, RangeDescriptor) {
        let mut ranged = self.ranged.lock().unwrap();
        ranged.as_mut().unwrap().split(at, child_leader).unwrap()
    }

    /// `split`, but every node keeps routing by the table as it was until it has refused a
    /// request with `KeyOutOfRange`.
    pub fn split_lagging(&self, at: &[u8], child_leader: u64) {
        let mut ranged = self.ranged.lock().unwrap();
        let ranged = ranged.as_mut().unwrap();
        for node in ranged.nodes.keys() {
            ranged.lagging.insert(*node, ranged.ranges.clone());
        }
        ranged.split(at, child_leader).unwrap();
    }

    /// Splits at `at` (the new range led by `child_leader`) when the `arrived`-th write
    /// arrives, before it is routed.
    pub fn split_at_write(&self, arrived: usize, at: &[u8], child_leader: u64) {
        let mut ranged = self.ranged.lock().unwrap();
        ranged.as_mut().unwrap().split_at_write = Some((arrived, at.to_vec(), child_leader));
    }

    /// Makes `node` the leader of range `range`.
    pub fn set_leader(&self, range: u64, node: u64) {
        let mut ranged = self.ranged.lock().unwrap();
        let ranged = ranged.as_mut().unwrap();
        let range = ranged
            .ranges
            .iter_mut()
            .find(|r| r.descriptor.id.0 == range);
        range.expect("no such range").leader = node;
    }

    /// `Cluster.Ranges` calls served.
    pub fn ranges_calls(&self) -> usize {
        self.ranged.lock().unwrap().as_ref().unwrap().ranges_calls
    }

    /// The ranges as they are, in key order.
    pub fn descriptors(&self) -> Vec<RangeDescriptor> {
        let ranged = self.ranged.lock().unwrap();
        let ranges = &ranged.as_ref().unwrap().ranges;
        ranges
            .iter()
            .map(|range| range.descriptor.clone())
            .collect()
    }

    /// (method, node id) of every call, in arrival order.
    pub fn node_calls(&self) -> Vec<(&'static str, u64)> {
        let ports = self.ranged.lock().unwrap().as_ref().unwrap().ports.clone();
        let calls = self.calls();
        calls
            .into_iter()
            .map(|(method, port)| (method, ports[&port]))
            .collect()
    }

    /// Every key and value stored.
    pub fn data(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.store.lock().unwrap().data.clone()
    }

    pub(super) fn is_ranged(&self) -> bool {
        self.ranged.lock().unwrap().is_some()
    }

    /// The node that took `request`.
    pub(super) fn node_of<R>(&self, request: &Request<R>) -> u64 {
        let port = request.local_addr().map(|addr| addr.port()).unwrap_or(0);
        match self.ranged.lock().unwrap().as_ref() {
            Some(ranged) => ranged.ports[&port],
            None => self.node_id,
        }
    }

    /// Routes a request whose keys are `keys` (the first routes it) at the node that took
    /// it: the id of the range that serves it, or the refusal. A plain fake serves every
    /// key from range 1.
    pub(super) fn route<R>(&self, request: &Request<R>, keys: &[&[u8]]) -> Result<u64, KvError> {
        let node = self.node_of(request);
        let mut ranged = self.ranged.lock().unwrap();
        let Some(ranged) = ranged.as_mut() else {
            return Ok(RangeId::FIRST.0);
        };
        let view = ranged.lagging.get(&node).unwrap_or(&ranged.ranges);
        let range = lookup(view, keys.first().copied().unwrap_or_default()).clone();
        if range.leader != node {
            let addr = NodeAddr::new(ranged.nodes[&range.leader].clone());
            return Err(KvError::NotLeader {
                range_id: range.descriptor.id,
                leader: Some((range.leader, addr)),
            });
        }
        let truth = ranged
            .ranges
            .iter()
            .find(|r| r.descriptor.id == range.descriptor.id)
            .expect("ranges are never removed")
            .descriptor
            .clone();
        if let Some(key) = keys.iter().find(|key| !truth.contains(key)) {
            ranged.lagging.remove(&node);
            return Err(KvError::KeyOutOfRange {
                key: key.to_vec(),
                range: Box::new(truth),
            });
        }
        Ok(range.descriptor.id.0)
    }

    /// Makes the split `split_at_write` asked for, if `arrived` writes is its time.
    pub(super) fn split_if_due(&self, arrived: usize) {
        let mut ranged = self.ranged.lock().unwrap();
        let Some(ranged) = ranged.as_mut() else {
            return;
        };
        if let Some((when, at, leader)) = ranged.split_at_write.take() {
            match when == arrived {
                true => drop(ranged.split(&at, leader).unwrap()),
                false => ranged.split_at_write = Some((when, at, leader)),
            }
        }
    }

    /// The stored key `key`.
    pub(super) fn stored(&self, key: &[u8]) -> Option<v1::KeyValue> {
        let store = self.store.lock().unwrap();
        store.data.get(key).map(|value| v1::KeyValue {
            expires_at_ms: None,
            key: key.to_vec(),
            value: value.clone(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
            ttl_remaining_ms: None,
        })
    }

    /// The rows of a scan page as the range holding its start serves it, and where the next
    /// page starts: after the limit, the next row; at the range's end, when the request
    /// reaches beyond it, the range's end.
    pub(super) fn scan_rows(
        &self,
        request: &v1::ScanRequest,
    ) -> (Vec<v1::KeyValue>, Option<Vec<u8>>) {
        let range_end = match self.ranged.lock().unwrap().as_ref() {
            Some(ranged) => lookup(&ranged.ranges, &request.start)
                .descriptor
                .end
                .clone(),
            None => None,
        };
        let request_end = (!request.end.is_empty()).then(|| request.end.clone());
        let stop = match (&range_end, &request_end) {
            (Some(range), Some(request)) => Some(range.min(request).clone()),
            (range, request) => range.clone().or(request.clone()),
        };
        let limit = if request.limit == 0 {
            1_000
        } else {
            request.limit as usize
        };
        let store = self.store.lock().unwrap();
        let mut rows: Vec<v1::KeyValue> = store
            .data
            .range(request.start.clone()..)
            .take_while(|(key, _)| stop.as_ref().is_none_or(|stop| *key < stop))
            .take(limit + 1)
            .map(|(key, value)| v1::KeyValue {
                expires_at_ms: None,
                key: key.clone(),
                value: value.clone(),
                create_revision: 1,
                mod_revision: 1,
                version: 1,
                lease: 0,
                ttl_remaining_ms: None,
            })
            .collect();
        if rows.len() > limit {
            let next = rows.pop().map(|kv| kv.key);
            return (rows, next);
        }
        let beyond = |end: &Vec<u8>| request_end.as_ref().is_none_or(|request| end < request);
        (rows, range_end.filter(beyond))
    }
}

impl Ranged {
    fn split(
        &mut self,
        at: &[u8],
        child_leader: u64,
    ) -> Result<(RangeDescriptor, RangeDescriptor), KvError> {
        let child_id = self.ranges.iter().map(|r| r.descriptor.id.0).max().unwrap() + 1;
        let index = self
            .ranges
            .iter()
            .position(|range| range.descriptor.contains(at))
            .expect("the fake's ranges cover the keyspace");
        let parent = &mut self.ranges[index];
        if parent.descriptor.start.as_slice() >= at {
            return Err(KvError::EpochMismatch {
                expected_epoch: parent.descriptor.epoch,
                range: Box::new(parent.descriptor.clone()),
            });
        }
        parent.descriptor.epoch += 1;
        let right = RangeDescriptor {
            id: RangeId(child_id),
            start: at.to_vec(),
            ..parent.descriptor.clone()
        };
        parent.descriptor.end = Some(at.to_vec());
        let left = parent.descriptor.clone();
        let child = FakeRange {
            descriptor: right.clone(),
            leader: child_leader,
        };
        self.ranges.insert(index + 1, child);
        Ok((left, right))
    }
}

pub fn cluster_server(fake: Arc<Fake>) -> ClusterServer<Service> {
    ClusterServer::new(Service(fake))
}

pub struct Service(Arc<Fake>);

#[tonic::async_trait]
impl Cluster for Service {
    /// Never produced: the fake refuses backups.
    type BackupStream = tonic::Streaming<v1::BackupChunk>;

    async fn backup(
        &self,
        _request: Request<v1::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        Err(Status::unimplemented("the fake has no snapshots"))
    }

    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        Err(Status::unimplemented("the fake has no status"))
    }

    async fn transfer_leader(
        &self,
        _request: Request<v1::TransferLeaderRequest>,
    ) -> Result<Response<v1::TransferLeaderResponse>, Status> {
        Err(Status::unimplemented("the fake does not transfer leaders"))
    }

    async fn add_node(
        &self,
        _request: Request<v1::AddNodeRequest>,
    ) -> Result<Response<v1::AddNodeResponse>, Status> {
        Err(Status::unimplemented("the fake has fixed nodes"))
    }

    async fn remove_node(
        &self,
        _request: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::RemoveNodeResponse>, Status> {
        Err(Status::unimplemented("the fake has fixed nodes"))
    }

    async fn members(
        &self,
        _request: Request<v1::MembersRequest>,
    ) -> Result<Response<v1::MembersResponse>, Status> {
        Err(Status::unimplemented("the fake has no members list"))
    }

    async fn check(
        &self,
        _: Request<v1::CheckRequest>,
    ) -> Result<Response<v1::CheckResponse>, Status> {
        Err(Status::unimplemented("the fake keeps no replicas to check"))
    }

    async fn ranges(
        &self,
        request: Request<v1::RangesRequest>,
    ) -> Result<Response<v1::RangesResponse>, Status> {
        self.0.hold_if_paused("ranges", &request).await;
        let (ranges, nodes) = {
            let mut ranged = self.0.ranged.lock().unwrap();
            let ranged = ranged.as_mut().unwrap();
            ranged.ranges_calls += 1;
            (ranged.ranges.clone(), ranged.nodes.clone())
        };
        let data = self.0.data();
        let info = |range: FakeRange| {
            let rows = data
                .iter()
                .filter(|(key, _)| range.descriptor.contains(key));
            let (keys, size_bytes) = rows.fold((0, 0), |(keys, bytes), (key, value)| {
                (keys + 1, bytes + (key.len() + value.len()) as u64)
            });
            v1::RangeInfo {
                descriptor: Some(range.descriptor.into()),
                leader_id: Some(range.leader),
                size_bytes,
                keys,
                requests_per_sec: 0.0,
                counts_age_ms: 0,
            }
        };
        let nodes = nodes.into_iter().map(|(node_id, addr)| v1::Member {
            node_id,
            addr,
            voter: true,
            ..v1::Member::default()
        });
        Ok(Response::new(v1::RangesResponse {
            ranges: ranges.into_iter().map(info).collect(),
            nodes: nodes.collect(),
            meta_leader_id: 1,
        }))
    }

    /// Every node knows the true leader of every range.
    async fn leader(
        &self,
        request: Request<v1::LeaderRequest>,
    ) -> Result<Response<v1::LeaderResponse>, Status> {
        self.0.record("leader", &request);
        let ranged = self.0.ranged.lock().unwrap();
        let ranged = ranged.as_ref().unwrap();
        let range = lookup(&ranged.ranges, &request.get_ref().key);
        Ok(Response::new(v1::LeaderResponse {
            range_id: range.descriptor.id.0,
            leader_id: Some(range.leader),
            leader_addr: ranged.nodes[&range.leader].clone(),
            term: 1,
        }))
    }

    /// Any node splits (as if it forwarded to the leader); the new range keeps the parent's
    /// leader.
    async fn split(
        &self,
        request: Request<v1::SplitRequest>,
    ) -> Result<Response<v1::SplitResponse>, Status> {
        let at = &request.get_ref().at;
        let mut ranged = self.0.ranged.lock().unwrap();
        let ranged = ranged.as_mut().unwrap();
        let leader = lookup(&ranged.ranges, at).leader;
        let (left, right) = ranged.split(at, leader).map_err(|error| status(&error))?;
        Ok(Response::new(v1::SplitResponse {
            left: Some(left.into()),
            right: Some(right.into()),
        }))
    }
}
