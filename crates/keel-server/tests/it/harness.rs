//! An in-process cluster of keel-server nodes on loopback ports, with data in temporary
//! directories, and raw gRPC clients of each node's services.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{RangeStatus, StatusRequest, StatusResponse};
use keel_server::{
    Faults, KvSettings, LogSettings, Node, NodeConfig, PlacementSettings, RaftTimings,
};
use keel_types::{NodeId, RangeId, SystemClock};
use tokio::net::TcpListener;
use tonic::transport::Channel;

/// How long a test waits for a condition (an election, replication) before it fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub struct Cluster {
    nodes: BTreeMap<NodeId, Node>,
    initial_cluster: BTreeMap<NodeId, String>,
    dirs: BTreeMap<NodeId, tempfile::TempDir>,
    timings: RaftTimings,
}

/// Quick elections for tests on loopback.
pub fn quick_timings() -> RaftTimings {
    RaftTimings {
        heartbeat_ms: 50,
        election_timeout_ms_min: 300,
        election_timeout_ms_max: 600,
        ..RaftTimings::default()
    }
}

impl Cluster {
    pub async fn start(size: u64) -> Cluster {
        Cluster::start_with(size, quick_timings()).await
    }

    pub async fn start_with(size: u64, timings: RaftTimings) -> Cluster {
        let mut listeners = BTreeMap::new();
        for id in 1..=size {
            listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let initial_cluster: BTreeMap<NodeId, String> = listeners
            .iter()
            .map(|(id, l)| (*id, l.local_addr().unwrap().to_string()))
            .collect();
        let mut cluster = Cluster {
            nodes: BTreeMap::new(),
            initial_cluster,
            dirs: (1..=size)
                .map(|id| (id, tempfile::tempdir().unwrap()))
                .collect(),
            timings,
        };
        for (id, listener) in listeners {
            let node = Node::start_on(cluster.config(id), listener).await.unwrap();
            cluster.nodes.insert(id, node);
        }
        cluster
    }

    fn config(&self, id: NodeId) -> NodeConfig {
        NodeConfig {
            node_id: id,
            listen: self.initial_cluster[&id].parse().unwrap(),
            data_dir: self.dirs[&id].path().to_path_buf(),
            initial_cluster: self.initial_cluster.clone(),
            join: Vec::new(),
            advertise: None,
            placement: PlacementSettings::default(),
            raft: self.timings.clone(),
            kv: KvSettings::default(),
            clock: SystemClock::shared(),
            faults: Faults::default(),
            metrics_listen: None,
            log: LogSettings::default(),
            access: None,
            tls: None,
        }
    }

    /// Stops every node and starts them again on the same addresses and data dirs.
    pub async fn restart(mut self) -> Cluster {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in &ids {
            self.stop_node(*id).await;
        }
        for id in ids {
            self.start_node(id).await;
        }
        self
    }

    pub async fn stop_node(&mut self, id: NodeId) {
        let node = self.nodes.remove(&id).expect("the node runs");
        node.shutdown().await.unwrap();
    }

    pub async fn start_node(&mut self, id: NodeId) {
        assert!(!self.nodes.contains_key(&id), "node {id} runs");
        let node = Node::start(self.config(id)).await.unwrap();
        self.nodes.insert(id, node);
    }

    /// The running nodes' ids.
    pub fn running(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[&id]
    }

    pub async fn kv(&self, id: NodeId) -> KvClient<Channel> {
        KvClient::connect(format!("http://{}", self.node(id).addr()))
            .await
            .unwrap()
    }

    pub async fn cluster_client(&self, id: NodeId) -> ClusterClient<Channel> {
        ClusterClient::connect(format!("http://{}", self.node(id).addr()))
            .await
            .unwrap()
    }

    pub async fn status(&self, id: NodeId) -> StatusResponse {
        let mut client = self.cluster_client(id).await;
        client.status(StatusRequest {}).await.unwrap().into_inner()
    }

    /// Node `id`'s view of `range`, if it runs a group for it.
    pub async fn range_status(&self, id: NodeId, range: RangeId) -> Option<RangeStatus> {
        let status = self.status(id).await;
        status.ranges.into_iter().find(|r| r.range_id == range.0)
    }

    /// Waits until every running node names the same leader of the first range and routes
    /// keys to it: a follower learns the leader from the first append, before it applies
    /// the range's first entries and puts the range in its local table.
    pub async fn leader(&self) -> NodeId {
        let leader = self.leader_of(RangeId::FIRST).await;
        eventually("every node routes keys to the first range", || async {
            let routes = |id: &NodeId| {
                let local = self.node(*id).local_ranges();
                local.iter().any(|range| range.id == RangeId::FIRST)
            };
            self.running().iter().all(routes).then_some(())
        })
        .await;
        leader
    }

    /// Waits until every running node names the same leader of `range`.
    pub async fn leader_of(&self, range: RangeId) -> NodeId {
        eventually("an agreed leader", || async {
            let mut seen = Vec::new();
            for id in self.running() {
                let status = self.status(id).await;
                assert!(status.healthy, "{status:?}");
                let found = status.ranges.iter().find(|r| r.range_id == range.0);
                seen.push(found?.leader_id?);
            }
            let leader = *seen.first()?;
            seen.iter().all(|id| *id == leader).then_some(leader)
        })
        .await
    }

    pub async fn shutdown(self) {
        for node in self.nodes.into_values() {
            node.shutdown().await.unwrap();
        }
    }
}

/// A node's view of the first data range.
pub fn first_range(status: &StatusResponse) -> &RangeStatus {
    let first = status
        .ranges
        .iter()
        .find(|range| range.range_id == RangeId::FIRST.0);
    first.expect("every node runs the first range")
}

/// Polls `probe` every 20 ms until it returns `Some`; fails the test after `DEADLINE`.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
