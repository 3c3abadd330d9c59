//! A joint membership change whose leader stopped between the two steps: the next leader
//! keeps the joint configuration, refuses other changes, and `ReplicaChange::Finish` moves
//! the group to the change's new voters.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use keel_types::{KvError, NodeId, RangeDescriptor, RangeId, ReplicaChange};

use crate::loopback::{Loopback, TestNode};
use crate::replication::{leader, put};

const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `done` every 20 ms until it holds; panics after `DEADLINE`.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `change` on whichever of `nodes` leads, tried again while leadership moves or the new
/// leader has not yet committed the membership it found (`settling` tells those errors).
async fn on_leader(
    nodes: &[TestNode],
    change: &ReplicaChange,
    settling: impl Fn(&KvError) -> bool,
) -> Result<RangeDescriptor, KvError> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let leading = nodes.iter().find(|node| node.group().is_leader());
        let outcome = match leading {
            Some(node) => node.group().change_replicas(change, DEADLINE, 1).await,
            None => Err(KvError::NotLeader {
                range_id: RangeId::FIRST,
                leader: None,
            }),
        };
        match outcome {
            Err(error) if settling(&error) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            outcome => return outcome,
        }
    }
}

fn not_leader(error: &KvError) -> bool {
    matches!(error, KvError::NotLeader { .. })
}

fn settling(error: &KvError) -> bool {
    not_leader(error)
        || matches!(error, KvError::Unavailable { message } if message.contains("undergoing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_left_joint_by_a_stopped_leader_is_finished_by_the_next() {
    let network = Arc::new(Loopback::default());
    let mut nodes = Vec::new();
    for id in 1..=4 {
        nodes.push(TestNode::start(id, &network).await);
    }
    let members: BTreeMap<NodeId, _> = (1..=3).map(|id| (id, TestNode::addr(id))).collect();
    nodes[0].group().initialize(members).await.unwrap();
    let first = leader(&nodes[..3]).await;
    let from = (1..=3).find(|&id| id != first).unwrap();
    let group = nodes[first as usize - 1].group();
    group.write(put("k", "v")).await.unwrap();
    let after: BTreeSet<NodeId> = [1, 2, 3, 4].into_iter().filter(|&id| id != from).collect();

    // The joint step commits; the step to `after` never leaves the leader.
    network.hold_membership(Some(after.clone()));
    let change = ReplicaChange::Replace {
        from,
        to: 4,
        addr: TestNode::addr(4),
    };
    let changing = tokio::spawn({
        let group = group.clone();
        async move { group.change_replicas(&change, DEADLINE, 1).await }
    });
    // The leader's membership is its log's last one: the held step, once the joint one
    // committed.
    let voters: Vec<NodeId> = after.iter().copied().collect();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while group.membership().voters != voters {
        if changing.is_finished() || tokio::time::Instant::now() > deadline {
            panic!("{:?} {:?}", group.membership(), changing.await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    changing.abort();
    let stopped = nodes.remove(first as usize - 1);
    network.set_down(first, true);
    stopped.stop().await;
    network.hold_membership(None);

    let refused = on_leader(&nodes, &ReplicaChange::Remove { node: from }, not_leader).await;
    assert!(
        matches!(&refused, Err(KvError::Unavailable { message }) if message.contains("middle")),
        "{refused:?}"
    );
    for node in &nodes {
        let half_done = node.group().membership();
        assert!(half_done.joint, "node {}: {half_done:?}", node.id);
        assert_eq!(half_done.voters, vec![1, 2, 3, 4]);
    }

    let finished = on_leader(&nodes, &ReplicaChange::Finish, settling)
        .await
        .unwrap();
    assert_eq!(finished.replicas, voters);
    let again = on_leader(&nodes, &ReplicaChange::Finish, settling).await;
    assert_eq!(
        again.unwrap(),
        finished,
        "finishing a uniform membership changes nothing"
    );
    for node in nodes.iter().filter(|node| after.contains(&node.id)) {
        let group = node.group();
        until("the new voters everywhere", || {
            group.membership().voters == voters
        })
        .await;
        let membership = group.membership();
        assert!(!membership.joint, "node {}: {membership:?}", node.id);
    }

    for node in nodes {
        node.stop().await;
    }
}

/// Two removals planned from one view of a range with a voter too many (as two rebalancers
/// did when the meta range's leadership moved) must not both happen: the second finds the
/// range at its floor and is refused, so the range keeps `voters_min` voters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_below_the_voter_floor_is_refused() {
    let network = Arc::new(Loopback::default());
    let mut nodes = Vec::new();
    for id in 1..=4 {
        nodes.push(TestNode::start(id, &network).await);
    }
    let members: BTreeMap<NodeId, _> = (1..=4).map(|id| (id, TestNode::addr(id))).collect();
    nodes[0].group().initialize(members).await.unwrap();
    let first = leader(&nodes).await;
    let group = nodes[first as usize - 1].group();
    // A write commits the first membership, so changes may begin.
    group.write(put("k", "v")).await.unwrap();
    let others: Vec<NodeId> = (1..=4).filter(|&id| id != first).collect();

    let removed = group
        .change_replicas(&ReplicaChange::Remove { node: others[0] }, DEADLINE, 3)
        .await
        .unwrap();
    assert_eq!(removed.replicas.len(), 3, "{removed:?}");
    let refused = group
        .change_replicas(&ReplicaChange::Remove { node: others[1] }, DEADLINE, 3)
        .await;
    assert!(
        matches!(&refused, Err(KvError::InvalidArgument { message }) if message.contains("fewer than 3")),
        "{refused:?}"
    );
    assert_eq!(group.membership().voters.len(), 3);
    // Below a floor of 2 the same removal is allowed.
    let removed = group
        .change_replicas(&ReplicaChange::Remove { node: others[1] }, DEADLINE, 2)
        .await
        .unwrap();
    assert_eq!(removed.replicas.len(), 2, "{removed:?}");
    for node in nodes {
        node.stop().await;
    }
}
