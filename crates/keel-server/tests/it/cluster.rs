//! A three-node cluster in one process: election, a write forwarded by a follower,
//! linearizable reads from every node, follower reads, and NotLeader with no_forward.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keel_proto::v1::cluster_client::ClusterClient;
use keel_proto::v1::kv_client::KvClient;
use keel_proto::v1::{Consistency, GetRequest, PutRequest, StatusRequest, StatusResponse};
use keel_server::{Faults, KvSettings, Node, NodeConfig, RaftTimings, status};
use keel_types::{KvError, NodeId, SystemClock};
use tokio::net::TcpListener;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(30);

struct Cluster {
    nodes: Vec<Node>,
    initial_cluster: BTreeMap<NodeId, String>,
    dirs: Vec<tempfile::TempDir>,
}

impl Cluster {
    async fn start(size: u64) -> Cluster {
        let mut listeners = BTreeMap::new();
        for id in 1..=size {
            listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let initial_cluster: BTreeMap<NodeId, String> = listeners
            .iter()
            .map(|(id, l)| (*id, l.local_addr().unwrap().to_string()))
            .collect();
        let dirs: Vec<_> = (1..=size).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut nodes = Vec::new();
        for (id, listener) in listeners {
            let config = config(id, &initial_cluster, &dirs[id as usize - 1]);
            nodes.push(Node::start_on(config, listener).await.unwrap());
        }
        Cluster {
            nodes,
            initial_cluster,
            dirs,
        }
    }

    /// Stops every node and starts them again on the same addresses and data dirs.
    async fn restart(self) -> Cluster {
        let Cluster {
            nodes,
            initial_cluster,
            dirs,
        } = self;
        for node in nodes {
            node.shutdown().await.unwrap();
        }
        let mut nodes = Vec::new();
        for id in initial_cluster.keys() {
            let config = config(*id, &initial_cluster, &dirs[*id as usize - 1]);
            nodes.push(Node::start(config).await.unwrap());
        }
        Cluster {
            nodes,
            initial_cluster,
            dirs,
        }
    }

    async fn kv(&self, id: NodeId) -> KvClient<Channel> {
        KvClient::connect(format!("http://{}", self.node(id).addr()))
            .await
            .unwrap()
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes.iter().find(|n| n.node_id() == id).unwrap()
    }

    async fn status(&self, id: NodeId) -> StatusResponse {
        let mut client = ClusterClient::connect(format!("http://{}", self.node(id).addr()))
            .await
            .unwrap();
        client.status(StatusRequest {}).await.unwrap().into_inner()
    }

    /// Waits until every node names the same leader of range 1.
    async fn leader(&self) -> NodeId {
        let start = Instant::now();
        loop {
            let mut seen = Vec::new();
            for node in &self.nodes {
                let status = self.status(node.node_id()).await;
                assert!(status.healthy, "{status:?}");
                seen.push(status.ranges[0].leader_id);
            }
            if let Some(Some(leader)) = seen.first()
                && seen.iter().all(|s| *s == Some(*leader))
            {
                return *leader;
            }
            assert!(start.elapsed() < DEADLINE, "no agreed leader: {seen:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown(self) {
        for node in self.nodes {
            node.shutdown().await.unwrap();
        }
    }
}

fn config(id: NodeId, cluster: &BTreeMap<NodeId, String>, dir: &tempfile::TempDir) -> NodeConfig {
    NodeConfig {
        node_id: id,
        listen: cluster[&id].parse().unwrap(),
        data_dir: dir.path().to_path_buf(),
        initial_cluster: cluster.clone(),
        raft: RaftTimings {
            heartbeat_ms: 50,
            election_timeout_ms_min: 300,
            election_timeout_ms_max: 600,
            ..RaftTimings::default()
        },
        kv: KvSettings::default(),
        clock: SystemClock::shared(),
        faults: Faults::default(),
    }
}

fn get(key: &[u8], consistency: Consistency) -> GetRequest {
    GetRequest {
        key: key.to_vec(),
        consistency: consistency.into(),
        no_forward: false,
    }
}

fn put(key: &[u8], value: &[u8], no_forward: bool) -> PutRequest {
    PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        condition: None,
        return_previous: false,
        no_forward,
        ttl_ms: None,
        request_id: None,
        fence: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_forward_writes_and_serve_reads() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    let written = cluster
        .kv(follower)
        .await
        .put(put(b"greeting", b"hello", false))
        .await
        .unwrap()
        .into_inner();
    let header = written.header.unwrap();
    assert!(header.revision > 0);
    assert_eq!(
        header.served_by, leader,
        "a follower forwards writes to the leader"
    );

    for id in 1..=3 {
        let read = cluster
            .kv(id)
            .await
            .get(get(b"greeting", Consistency::Linearizable))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(read.kv.unwrap().value, b"hello");
        assert!(read.header.unwrap().revision >= header.revision);
    }

    let start = Instant::now();
    loop {
        let read = cluster
            .kv(follower)
            .await
            .get(get(b"greeting", Consistency::Follower))
            .await
            .unwrap()
            .into_inner();
        let read_header = read.header.unwrap();
        assert_eq!(read_header.served_by, follower, "follower reads stay local");
        if read_header.revision >= header.revision {
            assert_eq!(read.kv.unwrap().value, b"hello");
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "follower never applied the write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let refused = cluster
        .kv(follower)
        .await
        .put(put(b"greeting", b"again", true))
        .await
        .unwrap_err();
    match status::kv_error(&refused) {
        Some(KvError::NotLeader {
            leader: Some((id, addr)),
            ..
        }) => {
            assert_eq!(id, leader);
            assert_eq!(addr.addr, cluster.node(leader).addr().to_string());
        }
        other => panic!("expected NotLeader with a hint, got {other:?} ({refused:?})"),
    }

    let invalid = cluster
        .kv(follower)
        .await
        .put(put(b"", b"v", false))
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument);

    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_data_and_does_not_reinitialize() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let written = cluster
        .kv(leader)
        .await
        .put(put(b"durable", b"yes", false))
        .await
        .unwrap()
        .into_inner();
    let revision = written.header.unwrap().revision;
    let before = cluster.status(leader).await.ranges[0].clone();

    let cluster = cluster.restart().await;
    let leader = cluster.leader().await;
    let read = cluster
        .kv(leader)
        .await
        .get(get(b"durable", Consistency::Linearizable))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.kv.unwrap().mod_revision, revision);
    let after = cluster.status(leader).await.ranges[0].clone();
    // openraft may restore the old leader in its old term; nothing goes backwards.
    assert!(after.term >= before.term, "{before:?} -> {after:?}");
    assert!(
        after.last_log_index >= before.last_log_index,
        "{before:?} -> {after:?}"
    );
    assert_eq!(
        after.revision, before.revision,
        "no write happened: {after:?}"
    );
    assert_eq!(after.members.len(), 3);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_failure_stops_serving() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let node = cluster.node(leader);
    node.inject_storage_failure();
    let failed = cluster
        .kv(leader)
        .await
        .put(put(b"k", b"v", true))
        .await
        .unwrap_err();
    assert!(
        matches!(
            status::kv_error(&failed),
            Some(KvError::OutcomeUnknown { .. } | KvError::Fatal { .. })
        ),
        "{failed:?}"
    );
    let reason = tokio::time::timeout(DEADLINE, node.failed()).await.unwrap();
    assert!(!reason.is_empty());

    let refused = cluster
        .kv(leader)
        .await
        .get(get(b"k", Consistency::Follower))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Internal);
    assert!(matches!(
        status::kv_error(&refused),
        Some(KvError::Fatal { .. })
    ));
    assert!(!cluster.status(leader).await.healthy);
    cluster.shutdown().await;
}
