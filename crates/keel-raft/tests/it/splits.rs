//! Splitting a group over the loopback transport: the child starts on every replica, the
//! parent's leader makes it campaign, both halves refuse keys of the other, and a snapshot
//! that would overwrite a local range is refused.

use std::sync::Arc;
use std::time::Duration;

use keel_raft::{InboundError, wire};
use keel_storage::raft_types::TypeConfig;
use keel_types::{
    BatchOp, Command, CommandOutcome, KvError, Mutation, RangeDescriptor, RangeId, Rejection,
};
use openraft::alias::SnapshotMetaOf;
use openraft::async_runtime::WatchReceiver;

use crate::loopback::{Loopback, TestNode};
use crate::replication::{cluster, leader};

const DEADLINE: Duration = Duration::from_secs(20);
const CHILD: RangeId = RangeId(2);

fn put(key: &str) -> Command {
    Command::Mutate(Mutation {
        request: None,
        now_ms: 0,
        ops: vec![BatchOp::Put {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            condition: None,
            return_previous: false,
            ttl_ms: None,
        }],
    })
}

fn revision(outcome: CommandOutcome) -> u64 {
    match outcome {
        CommandOutcome::Applied { revision, .. } => revision,
        other => panic!("not applied: {other:?}"),
    }
}

/// Polls `probe` every 20 ms until it returns `Some`.
async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Splits FIRST at "m" on `on` (its leader) into `CHILD`.
async fn split(on: &TestNode) -> (RangeDescriptor, RangeDescriptor) {
    let parent = on.group();
    let epoch = parent.descriptor().await.unwrap().epoch;
    on.groups
        .split(&parent, b"m".to_vec(), CHILD, epoch)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_child_starts_everywhere_and_serves_its_half() {
    let (_network, nodes) = cluster(3).await;
    let leader_id = leader(&nodes).await;
    let on_leader = nodes.iter().find(|n| n.id == leader_id).unwrap();
    let before = revision(on_leader.group().write(put("n")).await.unwrap());

    let (left, right) = split(on_leader).await;
    assert_eq!(left.id, RangeId::FIRST);
    assert_eq!(left.end.as_deref(), Some(&b"m"[..]));
    assert_eq!((right.id, right.start.as_slice()), (CHILD, &b"m"[..]));
    assert_eq!(right.end, None);
    assert_eq!(left.epoch, right.epoch);
    assert_eq!(right.replicas, vec![1, 2, 3]);

    // Every replica applies the split; the node starts the child's group (as keel-server's
    // range watcher does on the store's range event).
    for node in &nodes {
        let applied = || async {
            let epoch = node.group().descriptor().await.ok()?.epoch;
            (epoch == left.epoch).then_some(())
        };
        eventually("the split applied", applied).await;
        node.groups.ensure(CHILD).await.unwrap();
    }
    let child_leader = eventually("the child elects a leader", || async {
        nodes[0].group_of(CHILD).leader().map(|(id, _)| id)
    })
    .await;
    let on_child_leader = nodes.iter().find(|n| n.id == child_leader).unwrap();
    let child = on_child_leader.group_of(CHILD);
    let after = revision(child.write(put("z")).await.unwrap());
    assert!(
        after > before,
        "the child's revisions go on from the parent's"
    );

    let moved = child.write(put("a")).await.unwrap();
    let refused_by = |outcome: &CommandOutcome| match outcome {
        CommandOutcome::Rejected(Rejection::KeyOutOfRange { range, .. }) => Some(range.clone()),
        _ => None,
    };
    assert_eq!(refused_by(&moved), Some(right.clone()), "{moved:?}");
    let stale = on_leader.group().write(put("q")).await.unwrap();
    assert_eq!(refused_by(&stale), Some(left.clone()), "{stale:?}");
    let again = on_leader
        .group()
        .split(b"c".to_vec(), RangeId(3), right.epoch - 1)
        .await;
    assert!(
        matches!(again, Err(KvError::EpochMismatch { .. })),
        "{again:?}"
    );
    for node in nodes {
        node.stop().await;
    }
}

/// A node whose first range still spans the whole keyspace refuses a snapshot of a range
/// split off it elsewhere: installing it would overwrite the first range's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_overlapping_a_local_range_is_refused() {
    let (_network, source) = cluster(1).await;
    leader(&source).await;
    let (_, right) = split(&source[0]).await;
    source[0].groups.ensure(CHILD).await.unwrap();
    let child = source[0].group_of(CHILD);
    eventually("the child leads", || async {
        child.is_leader().then_some(())
    })
    .await;
    child.write(put("x")).await.unwrap();
    let written = child.status().await.unwrap().applied_index;
    child.raft().trigger().snapshot().await.unwrap();
    // Ask for the snapshot once it is built: asking while one is being built can race the
    // store's removal of the older file (a keel-storage race, reported).
    child
        .raft()
        .wait(Some(DEADLINE))
        .metrics(
            |m| m.snapshot.is_some_and(|id| id.index >= written),
            "a snapshot of the child",
        )
        .await
        .unwrap();
    let snapshot = child.raft().get_snapshot().await.unwrap().unwrap();
    let bytes = tokio::fs::read(snapshot.snapshot.path()).await.unwrap();
    assert_eq!(right.start, b"m");

    let other = Arc::new(Loopback::default());
    let (_, target) = crate::replication::cluster_on(&other, 1).await;
    leader(&target).await;
    eventually("the first range has applied state", || async {
        let ranges = target[0].store.descriptors().await.unwrap();
        ranges.iter().any(|r| r.id == RangeId::FIRST).then_some(())
    })
    .await;
    target[0].groups.ensure(CHILD).await.unwrap();
    let vote = child.raft().metrics().borrow_watched().vote;
    let meta: SnapshotMetaOf<TypeConfig> = snapshot.meta.clone();
    let header = wire::encode(&(vote, meta)).unwrap();
    let chunks = futures::stream::iter(vec![Ok::<_, String>(bytes)]);
    let refused = target[0]
        .groups
        .install_snapshot(CHILD, &header, chunks)
        .await;
    assert!(
        matches!(
            refused,
            Err(InboundError::Overlap {
                range: CHILD,
                other: RangeId::FIRST
            })
        ),
        "{refused:?}"
    );
    for node in source.into_iter().chain(target) {
        node.stop().await;
    }
}
