//! Linearizable reads on followers (ReadIndex) over the loopback transport: a follower's
//! read sees every write the leader acknowledged before it, concurrent reads share read
//! index calls, and a follower that cannot reach the leader or apply its index refuses.

use futures::future::join_all;
use keel_types::{CommandOutcome, Consistency, KvError, ReadBound};

use crate::loopback::TestNode;
use crate::replication::{cluster, leader, put};

/// Put-then-read pairs the ordering test makes.
const PAIRS: u64 = 200;
/// Reads the batching test sends at once.
const CONCURRENT_READS: usize = 64;

async fn value_on(node: &TestNode, key: &str) -> Option<(Vec<u8>, u64)> {
    let (kv, _) = node
        .group()
        .state_machine()
        .get(key.as_bytes(), 0)
        .await
        .unwrap();
    kv.map(|kv| (kv.value, kv.mod_revision))
}

/// The leader's node and one follower's.
async fn leader_and_follower(nodes: &[TestNode]) -> (&TestNode, &TestNode) {
    let leader = leader(nodes).await;
    let on_leader = nodes.iter().find(|n| n.id == leader).unwrap();
    let follower = nodes.iter().find(|n| n.id != leader).unwrap();
    (on_leader, follower)
}

async fn write(node: &TestNode, key: &str, value: &str) -> u64 {
    match node.group().write(put(key, value)).await.unwrap() {
        CommandOutcome::Applied { revision, .. } => revision,
        other => panic!("not applied: {other:?}"),
    }
}

/// Every write the leader acknowledged is visible at once to a follower's linearizable read:
/// the follower waits until it applied the leader's read index. Without that wait, the
/// follower reads before the commit reaches it and this fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_reads_see_every_acknowledged_write() {
    let (_network, nodes) = cluster(3).await;
    let leader = leader(&nodes).await;
    let on_leader = nodes.iter().find(|n| n.id == leader).unwrap();
    let followers: Vec<&TestNode> = nodes.iter().filter(|n| n.id != leader).collect();
    for i in 0..PAIRS {
        let value = i.to_string();
        let revision = write(on_leader, "k", &value).await;
        let follower = followers[i as usize % followers.len()];
        let group = follower.group();
        group.read_barrier(Consistency::Linearizable).await.unwrap();
        let seen = value_on(follower, "k").await;
        assert_eq!(
            seen,
            Some((value.into_bytes(), revision)),
            "pair {i}: node {} read an older value",
            follower.id
        );
    }
    for node in nodes {
        node.stop().await;
    }
}

/// Reads arriving together on one follower share read index calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_follower_reads_share_read_index_calls() {
    let (_network, nodes) = cluster(3).await;
    let (on_leader, follower) = leader_and_follower(&nodes).await;
    write(on_leader, "k", "1").await;
    let group = follower.group();
    let reads = (0..CONCURRENT_READS).map(|_| group.read_barrier(Consistency::Linearizable));
    for read in join_all(reads).await {
        read.unwrap();
    }
    let counts = group.read_index_counts();
    assert_eq!(counts.reads, CONCURRENT_READS as u64);
    assert!(
        counts.calls >= 1 && counts.calls < counts.reads,
        "{counts:?}: reads did not share calls"
    );
    assert_eq!(on_leader.group().read_index_counts().served, counts.calls);
    for node in nodes {
        node.stop().await;
    }
}

/// A follower that cannot reach the leader, or that the leader's appends no longer reach,
/// answers `NotLeader` instead of its own, older state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_followers_refuse_linearizable_reads() {
    let (network, nodes) = cluster(3).await;
    let (on_leader, follower) = leader_and_follower(&nodes).await;
    let leader = on_leader.id;
    write(on_leader, "k", "1").await;
    let group = follower.group();
    group.read_barrier(Consistency::Linearizable).await.unwrap();

    // The leader cannot be reached: the call fails, the follower names the leader.
    network.set_down(leader, true);
    match group.read_barrier(Consistency::Linearizable).await {
        Err(KvError::NotLeader {
            leader: Some((id, _)),
            ..
        }) => assert_eq!(id, leader),
        other => panic!("expected NotLeader naming node {leader}, got {other:?}"),
    }
    network.set_down(leader, false);

    // The follower gets no more appends: it may get a read index but cannot apply it.
    network.set_down(follower.id, true);
    write(on_leader, "k", "2").await;
    let refused = group.read_barrier(Consistency::Linearizable).await;
    assert!(
        matches!(refused, Err(KvError::NotLeader { .. })),
        "expected NotLeader, got {refused:?}"
    );
    let local = value_on(follower, "k").await.map(|(value, _)| value);
    assert_eq!(local, Some(b"1".to_vec()), "the follower's state was older");
    network.set_down(follower.id, false);
    for node in nodes {
        node.stop().await;
    }
}

fn within(max_staleness_ms: Option<u64>, min_revision: Option<u64>) -> ReadBound {
    ReadBound {
        max_staleness_ms,
        min_revision,
    }
}

/// A follower read within a staleness bound is served from the replica's own state while
/// the replica was known current recently enough, even with the leader unreachable, and
/// catches up with a read index call otherwise; one that cannot catch up refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_reads_within_a_staleness_bound_catch_up_only_when_older() {
    let (network, nodes) = cluster(3).await;
    let (on_leader, follower) = leader_and_follower(&nodes).await;
    let leader = on_leader.id;
    write(on_leader, "k", "1").await;
    let group = follower.group();
    let a_day = within(Some(86_400_000), None);

    // Never known current yet: the first bounded read asks the leader.
    group
        .read_barrier_within(Consistency::Follower, a_day)
        .await
        .unwrap();
    assert_eq!(group.read_index_counts().calls, 1);

    // Known current a moment ago: served here without a call, the leader unreachable.
    network.set_down(leader, true);
    group
        .read_barrier_within(Consistency::Follower, a_day)
        .await
        .unwrap();
    assert_eq!(group.read_index_counts().calls, 1, "a call was made");
    // A bound of 0 always catches up first, which fails while the leader is unreachable.
    let now = group
        .read_barrier_within(Consistency::Follower, within(Some(0), None))
        .await;
    assert!(
        matches!(now, Err(KvError::NotLeader { .. })),
        "expected NotLeader, got {now:?}"
    );
    network.set_down(leader, false);
    for node in nodes {
        node.stop().await;
    }
}

/// A read with `min_revision` on a follower sees that revision: a replica behind it catches
/// up first, and refuses while it cannot; a revision no write made answers `FutureRevision`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_reads_at_a_revision_see_it_or_refuse() {
    let (network, nodes) = cluster(3).await;
    let (on_leader, follower) = leader_and_follower(&nodes).await;
    let first = write(on_leader, "k", "1").await;
    let group = follower.group();
    group
        .read_barrier_within(Consistency::Follower, within(None, Some(first)))
        .await
        .unwrap();
    assert_eq!(value_on(follower, "k").await, Some((b"1".to_vec(), first)));

    // The follower gets no appends: the new revision is refused, a plain follower read is
    // still served from the older state.
    network.set_down(follower.id, true);
    let second = write(on_leader, "k", "2").await;
    let refused = group
        .read_barrier_within(Consistency::Follower, within(None, Some(second)))
        .await;
    assert!(
        matches!(refused, Err(KvError::NotLeader { .. })),
        "expected NotLeader, got {refused:?}"
    );
    group
        .read_barrier_within(Consistency::Follower, ReadBound::default())
        .await
        .unwrap();
    assert_eq!(value_on(follower, "k").await, Some((b"1".to_vec(), first)));

    network.set_down(follower.id, false);
    group
        .read_barrier_within(Consistency::Follower, within(None, Some(second)))
        .await
        .unwrap();
    assert_eq!(value_on(follower, "k").await, Some((b"2".to_vec(), second)));
    let ahead = second + 100;
    match group
        .read_barrier_within(Consistency::Follower, within(None, Some(ahead)))
        .await
    {
        Err(KvError::FutureRevision { requested, current }) => {
            assert_eq!((requested, current), (ahead, second));
        }
        other => panic!("expected FutureRevision, got {other:?}"),
    }
    for node in nodes {
        node.stop().await;
    }
}
