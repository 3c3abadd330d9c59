//! An in-process cluster for tests: real `keel_server::Node`s with real gRPC on loopback
//! ports, data in a temporary directory, and clients that talk to them.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_client::{Client, ClientOptions, GetResult};
use keel_proto::v1::kv_client::KvClient;
use keel_server::{Faults, KvSettings, Node, NodeConfig, RaftTimings};
use keel_types::{Consistency, ManualClock, NodeId, RangeId};
use tonic::transport::Channel;

/// How long a test waits for a condition (an election, replication) before it fails.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

pub struct Cluster {
    dir: tempfile::TempDir,
    timings: RaftTimings,
    addrs: BTreeMap<NodeId, SocketAddr>,
    nodes: BTreeMap<NodeId, Node>,
    /// Each node's wall clock (TTLs, sessions); they move only when a test moves them.
    clocks: BTreeMap<NodeId, Arc<ManualClock>>,
    kv: KvSettings,
    faults: Faults,
}

impl Cluster {
    /// Starts `size` nodes and waits until they agree on a leader.
    pub async fn start(size: u64) -> Cluster {
        Cluster::start_with(size, RaftTimings::default()).await
    }

    /// Starts `size` nodes with `timings` and waits until they agree on a leader.
    pub async fn start_with(size: u64, timings: RaftTimings) -> Cluster {
        Cluster::start_configured(size, timings, KvSettings::default(), Faults::default()).await
    }

    /// Starts `size` nodes with every setting given and waits until they agree on a leader.
    pub async fn start_configured(
        size: u64,
        timings: RaftTimings,
        kv: KvSettings,
        faults: Faults,
    ) -> Cluster {
        let addrs = (1..=size).map(|id| (id, free_addr())).collect();
        let start_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let mut cluster = Cluster {
            dir: tempfile::tempdir().unwrap(),
            timings,
            addrs,
            nodes: BTreeMap::new(),
            clocks: (1..=size)
                .map(|id| (id, ManualClock::new(start_ms)))
                .collect(),
            kv,
            faults,
        };
        for id in 1..=size {
            cluster.start_node(id).await;
        }
        cluster.leader().await;
        cluster
    }

    pub fn ids(&self) -> Vec<NodeId> {
        self.addrs.keys().copied().collect()
    }

    pub fn endpoint(&self, id: NodeId) -> String {
        self.addrs[&id].to_string()
    }

    /// A client that knows every node.
    pub fn client(&self) -> Client {
        let endpoints = self.ids().iter().map(|id| self.endpoint(*id)).collect();
        Client::new(endpoints, ClientOptions::default()).unwrap()
    }

    /// A raw gRPC client of node `id`'s Kv service, for tests that control every field of a
    /// request (request ids, retries).
    pub async fn kv(&self, id: NodeId) -> KvClient<Channel> {
        KvClient::connect(format!("http://{}", self.endpoint(id)))
            .await
            .unwrap()
    }

    /// A client that knows only node `id` (it may still follow leader hints elsewhere).
    pub fn client_of(&self, id: NodeId) -> Client {
        Client::new(vec![self.endpoint(id)], ClientOptions::default()).unwrap()
    }

    pub fn config(&self, id: NodeId) -> NodeConfig {
        NodeConfig {
            node_id: id,
            listen: self.addrs[&id],
            data_dir: self.dir.path().join(format!("node-{id}")),
            initial_cluster: self
                .addrs
                .iter()
                .map(|(id, addr)| (*id, addr.to_string()))
                .collect(),
            raft: self.timings.clone(),
            kv: self.kv,
            clock: self.clocks[&id].clone(),
            faults: self.faults,
        }
    }

    /// Moves every node's wall clock forward by `ms`.
    pub fn advance_clocks_ms(&self, ms: u64) {
        for clock in self.clocks.values() {
            clock.advance_ms(ms);
        }
    }

    pub async fn start_node(&mut self, id: NodeId) {
        assert!(!self.nodes.contains_key(&id), "node {id} is running");
        let node = Node::start(self.config(id)).await.unwrap();
        self.nodes.insert(id, node);
    }

    pub async fn stop_node(&mut self, id: NodeId) {
        let node = self.nodes.remove(&id).expect("node is running");
        node.shutdown().await.unwrap();
    }

    pub fn running(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    /// Node `id`'s view of the first data range.
    pub async fn range_status(&self, id: NodeId) -> keel_proto::v1::RangeStatus {
        let status = self.client().status(&self.endpoint(id)).await.unwrap();
        first_range(status.ranges).expect("the node serves the first data range")
    }

    /// Waits until node `id` has applied some write of `key`, and returns its follower read.
    pub async fn applied_on(&self, id: NodeId, key: &[u8]) -> GetResult {
        let client = self.client_of(id);
        eventually("the node applies the write", || async {
            let got = client.get(key, Consistency::Follower).await.ok()?;
            got.kv.is_some().then_some(got)
        })
        .await
    }

    /// Waits until every running node names the same leader, and returns it.
    pub async fn leader(&self) -> NodeId {
        let client = self.client();
        eventually("the running nodes agree on a leader", || async {
            let mut leaders = Vec::new();
            for id in self.running() {
                let status = client.status(&self.endpoint(id)).await.ok()?;
                leaders.push(first_range(status.ranges)?.leader_id?);
            }
            let leader = *leaders.first()?;
            let agreed = leaders.iter().all(|other| *other == leader);
            (agreed && self.nodes.contains_key(&leader)).then_some(leader)
        })
        .await
    }

    pub async fn shutdown(mut self) {
        for id in self.running() {
            self.stop_node(id).await;
        }
    }
}

/// The status of the first data range (`RangeId::FIRST`) among a node's ranges.
fn first_range(ranges: Vec<keel_proto::v1::RangeStatus>) -> Option<keel_proto::v1::RangeStatus> {
    ranges
        .into_iter()
        .find(|range| range.range_id == RangeId::FIRST.0)
}

/// Polls `probe` until it returns `Some`, failing the test after `WAIT_LIMIT`.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
    let mut ticks = tokio::time::interval(Duration::from_millis(25));
    loop {
        ticks.tick().await;
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting after {WAIT_LIMIT:?}: {what}"
        );
    }
}

fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}
