//! Restoring snapshots of one store into a fresh one: data, revisions, expiries, locks,
//! idempotency records and exactly-once state come back; the Raft identity and membership
//! are new; the meta range is written for the new cluster; a second restore is refused.

use keel_types::coordination::idempotency_key;
use keel_types::{
    Acquirer, BatchOp, Command, Coordination, CoordinationOp, Mutation, NodeAddr, NodeDescriptor,
    RangeId, RequestId, Split,
};
use openraft::entry::RaftEntry;
use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};

use crate::error::StorageError;
use crate::op::{Op, Outcome};
use crate::raft_types::{Entry, Membership, TypeConfig};
use crate::snapshot_file::SnapshotFile;
use crate::split::initial_log_id;
use crate::store::Store;

const NOW_MS: u64 = 5_000;

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("keel.redb"), &dir.path().join("snapshots")).unwrap();
    (dir, store)
}

async fn apply(store: &Store, range: RangeId, index: u64, command: Command) {
    let log_id = openraft::testing::log_id::<TypeConfig>(3, 2, index);
    let entries = vec![Entry::new_normal(log_id, command)];
    let outcome = store.call(Op::Apply { range, entries }).await.unwrap();
    assert!(matches!(outcome, Outcome::Applied(_)));
}

fn put(key: &str, value: &str, ttl_ms: Option<u64>, sequence: u64) -> Command {
    Command::Mutate(Mutation {
        request: Some(RequestId {
            client_id: 0x77,
            client_started_ms: 1_000,
            sequence,
            completed_below: 1,
        }),
        now_ms: NOW_MS,
        ops: vec![BatchOp::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            condition: None,
            return_previous: false,
            ttl_ms,
        }],
    })
}

fn coordinate(op: CoordinationOp) -> Command {
    Command::Coordinate(Coordination {
        request: None,
        now_ms: NOW_MS,
        op,
    })
}

/// A source store: range 1 with voters 1-3 split at "m" into range 4; keys on both sides
/// (one with a TTL), a lock and an idempotency record. Returns the snapshots of both ranges.
async fn source() -> (tempfile::TempDir, Vec<(RangeId, SnapshotFile)>) {
    let (dir, store) = open();
    let first = RangeId::FIRST;
    let membership = Membership::new_with_defaults(vec![[1, 2, 3].into()], []);
    let log_id = openraft::testing::log_id::<TypeConfig>(3, 2, 1);
    let entries = vec![Entry::new_membership(log_id, membership)];
    store
        .call(Op::Apply {
            range: first,
            entries,
        })
        .await
        .unwrap();
    apply(&store, first, 2, put("apple", "red", None, 1)).await;
    apply(&store, first, 3, put("pear", "green", Some(60_000), 2)).await;
    let acquirer = Acquirer {
        owner: b"worker-1".to_vec(),
        ttl_ms: 30_000,
        lock_delay_ms: 0,
    };
    let name = b"jobs".to_vec();
    apply(
        &store,
        first,
        4,
        coordinate(CoordinationOp::Acquire { name, acquirer }),
    )
    .await;
    let key = idempotency_key(b"pay", b"o-1");
    let (owner, ttl_ms) = (b"worker-2".to_vec(), 30_000);
    let begin = CoordinationOp::Begin { key, owner, ttl_ms };
    apply(&store, first, 5, coordinate(begin)).await;
    let split = Split {
        at: b"m".to_vec(),
        child: RangeId(4),
        expected_epoch: 0,
    };
    apply(&store, first, 6, Command::Split(split)).await;
    let mut snapshots = Vec::new();
    for range in [first, RangeId(4)] {
        let mut builder = store.state_machine(range).get_snapshot_builder().await;
        snapshots.push((range, builder.build_snapshot().await.unwrap().snapshot));
    }
    store.shutdown();
    (dir, snapshots)
}

fn voter() -> NodeDescriptor {
    NodeDescriptor {
        id: 7,
        addr: NodeAddr::new("127.0.0.1:7007"),
    }
}

#[tokio::test]
async fn a_restored_range_keeps_its_state_under_a_new_raft_identity() {
    let (_source, snapshots) = source().await;
    let (_dir, store) = open();
    let mut restored = Vec::new();
    for (range, snapshot) in &snapshots {
        let summary = snapshot.summary(*range).await.unwrap();
        assert_eq!(summary.descriptor.replicas, [1, 2, 3]);
        let descriptor = store
            .restore_range(*range, snapshot, &voter())
            .await
            .unwrap();
        assert_eq!(descriptor.replicas, [7]);
        assert_eq!(descriptor.conf_version, summary.descriptor.conf_version + 1);
        assert_eq!(
            (&descriptor.start, &descriptor.end, descriptor.epoch),
            (
                &summary.descriptor.start,
                &summary.descriptor.end,
                summary.descriptor.epoch
            )
        );
        restored.push(descriptor);
    }
    let first = store.state_machine(RangeId::FIRST);
    let (apple, revision) = first.get(b"apple", 0).await.unwrap();
    let apple = apple.unwrap();
    assert_eq!(
        (apple.value.as_slice(), apple.create_revision),
        (&b"red"[..], 1)
    );
    assert_eq!(revision, 4, "the source's revision after its writes");
    assert_eq!(first.applied().await.unwrap(), (4, Some(initial_log_id())));
    let (hold, _) = first.lock(b"jobs", 0).await.unwrap();
    assert_eq!(hold.unwrap().token, 3, "the lock keeps its token");
    let child = store.state_machine(RangeId(4));
    let key = idempotency_key(b"pay", b"o-1");
    assert!(child.idempotency_record(&key, 0).await.unwrap().0.is_some());
    let (pear, child_revision) = child.get(b"pear", 0).await.unwrap();
    let pear = pear.unwrap();
    assert_eq!(pear.expires_at_ms, Some(NOW_MS + 60_000));
    assert_eq!((pear.mod_revision, child_revision), (2, 4));
    assert_eq!(
        child.counts().await.unwrap().sessions,
        1,
        "sessions come along"
    );

    let mut log = store.log_store(RangeId::FIRST);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(initial_log_id()));
    assert_eq!(state.last_log_id, Some(initial_log_id()));

    // The next write takes the next revision.
    let next = put("banana", "yellow", None, 3);
    let log_id = openraft::testing::log_id::<TypeConfig>(1, 7, 1);
    let entries = vec![Entry::new_normal(log_id, next)];
    let op = Op::Apply {
        range: RangeId::FIRST,
        entries,
    };
    store.call(op).await.unwrap();
    let (banana, _) = first.get(b"banana", 0).await.unwrap();
    assert_eq!(banana.unwrap().create_revision, 5);

    store.restore_meta(&restored, &voter()).await.unwrap();
    let meta = store.state_machine(RangeId::META);
    let mut recorded = meta.meta_ranges().await.unwrap();
    recorded.sort_by_key(|range| range.id);
    assert_eq!(recorded, restored);
    assert_eq!(meta.meta_nodes().await.unwrap(), [voter()]);
    assert_eq!(meta.descriptor().await.unwrap().replicas, [7]);
    let mut ranges = tokio::task::spawn_blocking({
        let store = store.clone();
        move || store.ranges().unwrap()
    })
    .await
    .unwrap();
    ranges.sort();
    assert_eq!(ranges, [RangeId::META, RangeId::FIRST, RangeId(4)]);
}

#[tokio::test]
async fn a_range_is_restored_once_and_the_meta_range_never() {
    let (_source, snapshots) = source().await;
    let (_dir, store) = open();
    let (range, snapshot) = &snapshots[0];
    store
        .restore_range(*range, snapshot, &voter())
        .await
        .unwrap();
    for (range, expected) in [
        (*range, "already holds it"),
        (RangeId::META, "written anew"),
    ] {
        let error = store
            .restore_range(range, snapshot, &voter())
            .await
            .unwrap_err();
        assert!(
            matches!(&error, StorageError::Restore { .. }) && error.to_string().contains(expected),
            "{error}"
        );
    }
    store.restore_meta(&[], &voter()).await.unwrap();
    let error = store.restore_meta(&[], &voter()).await.unwrap_err();
    assert!(error.to_string().contains("already holds it"), "{error}");
}
