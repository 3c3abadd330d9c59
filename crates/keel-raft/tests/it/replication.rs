//! Election, replication, error mapping and snapshot streaming over the loopback transport.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keel_raft::{InboundError, wire};
use keel_storage::StorageError;
use keel_types::{
    BatchOp, Command, CommandOutcome, Consistency, KvError, Mutation, NodeId, RangeId,
};
use openraft::async_runtime::WatchReceiver;

use crate::loopback::{Loopback, TestNode};

const DEADLINE: Duration = Duration::from_secs(20);

pub fn put(key: &str, value: &str) -> Command {
    Command::Mutate(Mutation {
        request: None,
        now_ms: 0,
        ops: vec![BatchOp::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            condition: None,
            return_previous: false,
            ttl_ms: None,
        }],
    })
}

pub async fn cluster(size: u64) -> (Arc<Loopback>, Vec<TestNode>) {
    cluster_on(&Arc::new(Loopback::default()), size).await
}

/// `size` nodes on `network`, their first range initialized with all of them.
pub async fn cluster_on(network: &Arc<Loopback>, size: u64) -> (Arc<Loopback>, Vec<TestNode>) {
    let mut nodes = Vec::new();
    for id in 1..=size {
        nodes.push(TestNode::start(id, network).await);
    }
    let members: BTreeMap<NodeId, _> = (1..=size).map(|id| (id, TestNode::addr(id))).collect();
    nodes[0].group().initialize(members).await.unwrap();
    (network.clone(), nodes)
}

pub async fn leader(nodes: &[TestNode]) -> NodeId {
    let metrics = nodes[0]
        .group()
        .raft()
        .wait(Some(DEADLINE))
        .metrics(|m| m.current_leader.is_some(), "a leader")
        .await
        .unwrap();
    metrics.current_leader.unwrap()
}

async fn revision_on(node: &TestNode, key: &str) -> u64 {
    let (kv, _) = node
        .group()
        .state_machine()
        .get(key.as_bytes(), 0)
        .await
        .unwrap();
    kv.map_or(0, |kv| kv.mod_revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_replicate_and_followers_name_the_leader() {
    let (_network, nodes) = cluster(3).await;
    let leader = leader(&nodes).await;
    let on_leader = nodes.iter().find(|n| n.id == leader).unwrap();
    let follower = nodes.iter().find(|n| n.id != leader).unwrap();

    let outcome = on_leader.group().write(put("a", "1")).await.unwrap();
    let CommandOutcome::Applied { revision, .. } = outcome else {
        panic!("not applied: {outcome:?}");
    };
    assert!(revision > 0);

    match follower.group().write(put("a", "2")).await {
        Err(KvError::NotLeader {
            leader: Some((id, addr)),
            ..
        }) => {
            assert_eq!(id, leader);
            assert_eq!(addr, TestNode::addr(leader));
        }
        other => panic!("expected NotLeader with a hint, got {other:?}"),
    }
    // A follower serves linearizable reads (ReadIndex), never lease reads.
    follower
        .group()
        .read_barrier(Consistency::Linearizable)
        .await
        .unwrap();
    assert_eq!(revision_on(follower, "a").await, revision);
    assert!(matches!(
        follower.group().read_barrier(Consistency::Lease).await,
        Err(KvError::NotLeader { .. })
    ));

    on_leader
        .group()
        .read_barrier(Consistency::Linearizable)
        .await
        .unwrap();
    on_leader
        .group()
        .read_barrier(Consistency::Lease)
        .await
        .unwrap();
    assert_eq!(revision_on(on_leader, "a").await, revision);

    let status = follower.group().status().await.unwrap();
    assert_eq!(status.leader, Some(leader));
    assert_eq!(status.members.len(), 3);
    for node in nodes {
        node.stop().await;
    }
}

/// A snapshot damaged on the leader's disk or on its way is refused before openraft sees it
/// (a failed install would stop the group), and the receiving group goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_refused_and_the_group_goes_on() {
    let (_network, source) = cluster(1).await;
    leader(&source).await;
    let group = source[0].group();
    group.write(put("k", "v")).await.unwrap();
    group.raft().trigger().snapshot().await.unwrap();
    group
        .raft()
        .wait(Some(DEADLINE))
        .metrics(|m| m.snapshot.is_some(), "a snapshot")
        .await
        .unwrap();
    let snapshot = group.raft().get_snapshot().await.unwrap().unwrap();
    let mut bytes = tokio::fs::read(snapshot.snapshot.path()).await.unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;

    let (_, target) = cluster_on(&Arc::new(Loopback::default()), 1).await;
    leader(&target).await;
    let vote = group.raft().metrics().borrow_watched().vote;
    let header = wire::encode(&(vote, snapshot.meta.clone())).unwrap();
    let chunks = futures::stream::iter(vec![Ok::<_, String>(bytes)]);
    let refused = target[0]
        .groups
        .install_snapshot(RangeId::FIRST, &header, chunks)
        .await;
    assert!(
        matches!(
            refused,
            Err(InboundError::Storage(StorageError::SnapshotDamaged { .. }))
        ),
        "{refused:?}"
    );
    target[0].group().write(put("after", "x")).await.unwrap();
    for node in source.into_iter().chain(target) {
        node.stop().await;
    }
}

/// A node that joins after the log was purged catches up from a streamed snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_learner_catches_up_from_a_snapshot() {
    let (network, nodes) = cluster(1).await;
    let leader = leader(&nodes).await;
    let group = nodes[0].group();
    assert_eq!(leader, 1);
    let mut last = 0;
    for i in 0..30 {
        if let CommandOutcome::Applied { revision, .. } =
            group.write(put(&format!("k{i}"), "v")).await.unwrap()
        {
            last = revision;
        }
    }
    group.raft().trigger().snapshot().await.unwrap();
    let metrics = group
        .raft()
        .wait(Some(DEADLINE))
        .metrics(|m| m.snapshot.is_some(), "a snapshot")
        .await
        .unwrap();
    let snapshot_index = metrics.snapshot.unwrap().index;
    group
        .raft()
        .trigger()
        .purge_log(snapshot_index)
        .await
        .unwrap();
    group
        .raft()
        .wait(Some(DEADLINE))
        .metrics(|m| m.purged.is_some(), "purged log")
        .await
        .unwrap();

    let learner = TestNode::start(2, &network).await;
    group
        .raft()
        .add_learner(2, TestNode::addr(2), true)
        .await
        .unwrap();
    learner
        .group()
        .raft()
        .wait(Some(DEADLINE))
        .applied_index_at_least(Some(snapshot_index), "snapshot installed")
        .await
        .unwrap();
    assert_eq!(revision_on(&learner, "k29").await, last);

    network.set_down(2, true);
    learner.stop().await;
    for node in nodes {
        node.stop().await;
    }
}

/// A group retired while a health check still holds it (the node's health watcher takes the
/// list of groups, then asks each for a failure) has not failed: its Raft stopped on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_stopped_on_purpose_reports_no_failure() {
    let (_network, nodes) = cluster(3).await;
    let held = nodes[0].group();
    assert_eq!(held.failure(), None);
    nodes[0].groups.retire(RangeId::FIRST).await;
    assert!(nodes[0].groups.get(RangeId::FIRST).is_none());
    assert_eq!(held.failure(), None, "a retired group reported a failure");
    for node in nodes {
        node.stop().await;
    }
}
