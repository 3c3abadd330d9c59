//! The format-5 fixture, `tests/fixtures/v5/`: nodes with recorded states and replicas that
//! come and go. Range 1 has a learner (node 4) and refuses a split while it does; range 2
//! split at `x` into range 3, whose replica was then removed from this store (a tombstone
//! left, its rows gone); the meta range records node 4 as active and node 2 as draining.
//! `write_v5` made the files with a build of format 5; it is kept so the fixture can be
//! understood, and no longer rewrites them (this build writes format 6). Every later build
//! must read them.

use std::collections::BTreeMap;
use std::path::Path;

use keel_storage::raft_types::{Entry, Membership, Vote};
use keel_storage::{StateMachine, Store};
use keel_types::{Command, MetaCommand, NodeAddr, NodeDescriptor, NodeState, RangeId, Split};
use openraft::entry::RaftEntry;
use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};

use super::fixture::{membership, open_fixture};
use super::{append, apply, blank, log_id, open_in, puts};

fn split(at: &str, child: u64, expected_epoch: u64) -> Command {
    Command::Split(Split {
        at: at.as_bytes().to_vec(),
        child: RangeId(child),
        expected_epoch,
    })
}

/// Voters 1, 2, 3 and learner 4.
fn with_learner() -> Membership {
    Membership::new_with_defaults(vec![[1, 2, 3].into()], [4])
}

/// Range 1: writes `a`, `m` and `y`, splits at `m` into range 2, takes learner 4, then
/// refuses a split at `c` (its membership is changing).
fn range_1_entries() -> Vec<Entry> {
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        puts(1, 2, &[(b"a", b"1"), (b"m", b"2"), (b"y", b"3")]),
        Entry::new_normal(log_id(1, 1, 3), split("m", 2, 0)),
        Entry::new_membership(log_id(1, 1, 4), with_learner()),
        Entry::new_normal(log_id(1, 1, 5), split("c", 5, 1)),
    ]
}

/// Range 2 after the split: splits at `x` into range 3.
fn range_2_entries() -> Vec<Entry> {
    vec![
        blank(1, 1),
        Entry::new_normal(log_id(1, 1, 2), split("x", 3, 1)),
    ]
}

/// The meta range: nodes 1 and 4 registered, node 4 active, node 2 draining.
fn meta_entries() -> Vec<Entry> {
    let meta = |index, command| Entry::new_normal(log_id(1, 1, index), Command::Meta(command));
    let state = |node, state| MetaCommand::SetNodeState { node, state };
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        meta(2, MetaCommand::RegisterNode(node(1))),
        meta(3, MetaCommand::RegisterNode(node(4))),
        meta(4, state(4, NodeState::Active)),
        meta(5, state(2, NodeState::Draining)),
    ]
}

fn node(id: u64) -> NodeDescriptor {
    NodeDescriptor {
        id,
        addr: NodeAddr::new(format!("127.0.0.1:700{id}")),
    }
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

async fn write_v5(dir: &Path) {
    let store = open_in(dir);
    persist(&store, RangeId(1), range_1_entries()).await;
    persist(&store, RangeId(2), range_2_entries()).await;
    persist(&store, RangeId::META, meta_entries()).await;
    store.remove_range(RangeId(3)).await.unwrap();
    store.shutdown();
}

/// What every build must read from the v5 fixture.
async fn check_v5(store: &Store) {
    assert_eq!(
        store.ranges().unwrap(),
        vec![RangeId::META, RangeId(1), RangeId(2)]
    );
    assert!(store.removals().unwrap().is_empty());
    assert!(store.was_removed(RangeId(3)).await.unwrap());
    assert!(!store.was_removed(RangeId(2)).await.unwrap());
    let spans: Vec<(RangeId, String, u64)> = store
        .descriptors()
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.id, d.span_text(), d.conf_version))
        .collect();
    let expected = vec![
        (RangeId::META, r#"["", "")"#.to_string(), 1),
        (RangeId(1), r#"["", "m")"#.to_string(), 2),
        (RangeId(2), r#"["m", "x")"#.to_string(), 1),
    ];
    assert_eq!(spans, expected);
    // The split at `c` was refused while range 1 had a learner: it spans ["", "m") still,
    // at epoch 1, and no range 5 exists.
    let left = store.state_machine(RangeId(1));
    let membership = left.replica_membership().await.unwrap();
    assert_eq!(
        (membership.range.replicas, membership.learners),
        (vec![1, 2, 3], vec![4])
    );
    assert_eq!(membership.range.epoch, 1);
    assert_eq!(keys(&left).await, ["a"]);
    assert_eq!(keys(&store.state_machine(RangeId(2))).await, ["m"]);
    let meta = store.state_machine(RangeId::META);
    assert_eq!(meta.meta_nodes().await.unwrap(), vec![node(1), node(4)]);
    let states = BTreeMap::from([(2, NodeState::Draining), (4, NodeState::Active)]);
    assert_eq!(meta.meta_node_states().await.unwrap(), states);
}

async fn keys(sm: &StateMachine) -> Vec<String> {
    let page = sm.scan(b"", b"", 0, 0).await.unwrap();
    page.kvs
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect()
}

#[tokio::test]
async fn v5_fixture_reads_back() {
    let (_dir, store) = open_fixture(5);
    check_v5(&store).await;
}

#[tokio::test]
async fn v5_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v5(dir.path()).await;
    let store = open_in(dir.path());
    check_v5(&store).await;
}
