//! The format-4 fixture, `tests/fixtures/v4/`: range 1 split at `m` into range 2 (both with
//! writes after the split, snapshots of both) and the meta range with descriptors, a node and
//! allocated range ids (and its snapshot). `write_v4` made the files with a format-4 build;
//! it is kept (and checked against the same expectations, now written in the current format)
//! so the fixture can be understood. Every later build must read them.

use std::path::Path;

use keel_storage::raft_types::{Entry, LogId, Vote};
use keel_storage::{RangeCounts, StateMachine, Store};
use keel_types::{
    BatchOp, Command, MetaCommand, Mutation, NodeAddr, NodeDescriptor, RangeDescriptor, RangeId,
    RequestId, Split,
};
use openraft::entry::RaftEntry;
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};

use super::fixture::{membership, open_fixture};
use super::{append, apply, blank, log_id, open_in};

/// The client of the v4 fixture's session.
const CLIENT: u64 = 0xf4;

fn request(index: u64, sequence: u64, ops: Vec<BatchOp>) -> Entry {
    let mutation = Mutation {
        request: Some(RequestId {
            client_id: CLIENT,
            client_started_ms: 1_000,
            sequence,
            completed_below: 1,
        }),
        now_ms: 2_000,
        ops,
    };
    Entry::new_normal(log_id(1, 1, index), Command::Mutate(mutation))
}

fn put(key: &str, value: &str, ttl_ms: Option<u64>) -> BatchOp {
    BatchOp::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms,
    }
}

/// Range 1: request 1 writes `a` and `q` (at clock 2_000), request 2 writes `t` (expiring at
/// 12_000); the split at `m` into range 2; request 3 writes `b`.
fn range_1_entries() -> Vec<Entry> {
    let split = Split {
        at: b"m".to_vec(),
        child: RangeId(2),
        expected_epoch: 0,
    };
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        request(2, 1, vec![put("a", "1", None), put("q", "2", None)]),
        request(3, 2, vec![put("t", "3", Some(10_000))]),
        Entry::new_normal(log_id(1, 1, 4), Command::Split(split)),
        request(5, 3, vec![put("b", "4", None)]),
    ]
}

/// Range 2 after the split: its first leader's blank entry, then request 4 writes `z`.
fn range_2_entries() -> Vec<Entry> {
    vec![blank(1, 1), request(2, 4, vec![put("z", "5", None)])]
}

fn descriptor(id: u64, start: &str, end: Option<&str>) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(id),
        start: start.as_bytes().to_vec(),
        end: end.map(|end| end.as_bytes().to_vec()),
        epoch: 1,
        conf_version: 1,
        replicas: vec![1, 2, 3],
    }
}

fn node() -> NodeDescriptor {
    NodeDescriptor {
        id: 1,
        addr: NodeAddr::new("127.0.0.1:7001"),
    }
}

/// The meta range: both halves' descriptors, range ids 3 and 4 allocated, node 1.
fn meta_entries() -> Vec<Entry> {
    let meta = |index, command| Entry::new_normal(log_id(1, 1, index), Command::Meta(command));
    let ranges = vec![descriptor(1, "", Some("m")), descriptor(2, "m", None)];
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        meta(2, MetaCommand::UpdateRanges { ranges }),
        meta(3, MetaCommand::AllocateRangeIds { count: 2 }),
        meta(4, MetaCommand::RegisterNode(node())),
    ]
}

/// Appends and applies `entries` to `range`, saves a vote and the committed log id, and
/// builds a snapshot.
async fn persist(store: &Store, range: RangeId, entries: Vec<Entry>) {
    let mut log = store.log_store(range);
    let last = entries.last().unwrap().log_id;
    append(&mut log, entries.clone()).await.unwrap();
    log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
    log.save_committed(Some(last)).await.unwrap();
    let mut sm = store.state_machine(range);
    apply(&mut sm, entries).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
}

async fn write_v4(dir: &Path) {
    let store = open_in(dir);
    persist(&store, RangeId(1), range_1_entries()).await;
    persist(&store, RangeId(2), range_2_entries()).await;
    persist(&store, RangeId::META, meta_entries()).await;
    store.shutdown();
}

fn last_log_id(entries: &[Entry]) -> LogId {
    entries.last().unwrap().log_id
}

/// What every build must read from the v4 fixture.
async fn check_v4(store: &Store) {
    assert_eq!(
        store.ranges().unwrap(),
        vec![RangeId::META, RangeId(1), RangeId(2)]
    );
    let entries = [
        (RangeId(1), range_1_entries()),
        (RangeId(2), range_2_entries()),
        (RangeId::META, meta_entries()),
    ];
    for (range, expected) in &entries {
        let mut log = store.log_store(*range);
        let read = log.try_get_log_entries(0..10).await.unwrap();
        assert_eq!(&read, expected, "{range}");
    }
    let meta_descriptor = RangeDescriptor {
        id: RangeId::META,
        start: vec![],
        end: Some(vec![]),
        epoch: 0,
        conf_version: 1,
        replicas: vec![1, 2, 3],
    };
    let all = vec![
        meta_descriptor,
        descriptor(1, "", Some("m")),
        descriptor(2, "m", None),
    ];
    assert_eq!(store.descriptors().await.unwrap(), all);

    // Each snapshot installs into a fresh store with the same state.
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = open_in(fresh_dir.path());
    for (range, expected) in &entries {
        let mut sm = store.state_machine(*range);
        let snapshot = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(snapshot.meta.last_log_id, Some(last_log_id(expected)));
        let mut target = fresh.state_machine(*range);
        target
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
    }
    assert_eq!(fresh.descriptors().await.unwrap(), all);
    check_v4_data(store).await;
    check_v4_data(&fresh).await;
}

/// Checks the data of the three ranges, then retries request 1 on range 2 (log index 3):
/// it is answered from the record the child copied.
async fn check_v4_data(store: &Store) {
    let (left, right) = (
        store.state_machine(RangeId(1)),
        store.state_machine(RangeId(2)),
    );
    assert_eq!(keys(&left).await, ["a", "b"]);
    assert_eq!(keys(&right).await, ["q", "t", "z"]);
    let counts = |requests, keys_with_ttl, keys| RangeCounts {
        sessions: 1,
        requests,
        keys_with_ttl,
        keys,
        size_bytes: 2 * keys,
    };
    assert_eq!(left.counts().await.unwrap(), counts(3, 0, 2));
    assert_eq!(right.counts().await.unwrap(), counts(3, 1, 3));
    assert_eq!(left.applied().await.unwrap().0, 3);
    assert_eq!(right.applied().await.unwrap().0, 3);
    assert_eq!(right.split_key().await.unwrap(), Some(b"z".to_vec()));

    let meta = store.state_machine(RangeId::META);
    let ranges = vec![descriptor(1, "", Some("m")), descriptor(2, "m", None)];
    assert_eq!(meta.meta_ranges().await.unwrap(), ranges);
    assert_eq!(meta.meta_nodes().await.unwrap(), vec![node()]);

    let mut right = right;
    let retry = request(3, 1, vec![put("q", "changed", None)]);
    apply(&mut right, vec![retry]).await.unwrap();
    let q = right.get(b"q", 0).await.unwrap().0.unwrap();
    assert_eq!(q.value, b"2", "a replay applies nothing");
}

async fn keys(sm: &StateMachine) -> Vec<String> {
    let page = sm.scan(b"", b"", 0, 0).await.unwrap();
    page.kvs
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect()
}

#[tokio::test]
async fn v4_fixture_reads_back() {
    let (_dir, store) = open_fixture(4);
    check_v4(&store).await;
}

#[tokio::test]
async fn v4_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v4(dir.path()).await;
    let store = open_in(dir.path());
    check_v4(&store).await;
}
