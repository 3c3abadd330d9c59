//! The format-7 fixture, `tests/fixtures/v7/`: sealed snapshot files. Range 1 holds a few
//! rows (one with an expiry) and a snapshot that ends with its checksum. `write_v7` made the
//! files with a format-7 build and is kept, checked against the same expectations. Every
//! later build must read them, and must refuse the fixture's snapshot with a byte changed.
//! The file has no history: opening it starts range 1's history at its revision.

use std::path::Path;

use keel_storage::raft_types::{Entry, Vote};
use keel_storage::{HistoryRead, StateMachine, StorageError, Store};
use keel_types::{BatchOp, Command, Mutation, RangeId};
use openraft::entry::RaftEntry;

use super::fixture::{
    current_snapshot, installed_fresh, membership, open_fixture, persist_range_1,
};
use super::{blank, log_id, open_in, puts};

fn put_with_ttl(index: u64, key: &[u8], value: &[u8]) -> Entry {
    let mutation = Mutation {
        request: None,
        now_ms: 1_000,
        ops: vec![BatchOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            condition: None,
            return_previous: false,
            ttl_ms: Some(3_600_000),
        }],
    };
    Entry::new_normal(log_id(1, 1, index), Command::Mutate(mutation))
}

fn v7_entries() -> Vec<Entry> {
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        puts(1, 2, &[(b"a", b"sealed"), (b"b", b"snapshot")]),
        put_with_ttl(3, b"c", b"expires"),
    ]
}

async fn write_v7(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 3));
    persist_range_1(&store, &mut log, v7_entries(), vote, committed).await;
    store.shutdown();
}

/// What every build must read from the v7 fixture.
async fn check_v7(store: &Store) {
    let mut sm = store.state_machine(RangeId(1));
    let snapshot = current_snapshot(&mut sm, log_id(1, 1, 3)).await;
    snapshot.snapshot.verify().await.unwrap();
    refuses_changed_bytes(store, &std::fs::read(snapshot.snapshot.path()).unwrap()).await;
    // The v7 snapshot installs into a fresh store with the same state.
    let (_fresh_dir, fresh_sm) = installed_fresh(snapshot).await;
    check_v7_data(&fresh_sm).await;
    check_v7_data(&sm).await;
}

/// The history of range 1 in the v7 fixture: it starts at the range's revision.
async fn check_v7_history(sm: &StateMachine) {
    let counts = sm.history_counts().await.unwrap();
    assert_eq!((counts.floor, counts.bytes), (2, 0));
    let compacted = sm.key_history(b"a", 1, 0).await.unwrap();
    assert_eq!(
        compacted,
        HistoryRead::Compacted {
            compact_revision: 2
        }
    );
}

/// The sealed snapshot `bytes` with one byte changed fails its check, for bytes all over the
/// file (`snapshot::tests` changes every byte of a file this build writes).
async fn refuses_changed_bytes(store: &Store, bytes: &[u8]) {
    for at in (0..bytes.len()).step_by(13).chain([bytes.len() - 1]) {
        let mut damaged = bytes.to_vec();
        damaged[at] ^= 0x01;
        let mut incoming = store.incoming_snapshot(RangeId(1)).await.unwrap();
        incoming.write_chunk(&damaged).await.unwrap();
        let file = incoming.finish().await.unwrap();
        let verdict = file.verify().await;
        std::fs::remove_file(file.path()).unwrap();
        assert!(
            matches!(verdict, Err(StorageError::SnapshotDamaged { .. })),
            "byte {at}: {verdict:?}"
        );
    }
}

async fn check_v7_data(sm: &StateMachine) {
    assert_eq!(sm.applied().await.unwrap(), (2, Some(log_id(1, 1, 3))));
    let page = sm.scan(b"", b"", 0, 1_000).await.unwrap();
    let rows: Vec<(&[u8], &[u8], Option<u64>)> = page
        .kvs
        .iter()
        .map(|kv| (kv.key.as_slice(), kv.value.as_slice(), kv.expires_at_ms))
        .collect();
    let expected: Vec<(&[u8], &[u8], Option<u64>)> = vec![
        (b"a", b"sealed", None),
        (b"b", b"snapshot", None),
        (b"c", b"expires", Some(3_601_000)),
    ];
    assert_eq!(rows, expected);
}

#[tokio::test]
async fn v7_fixture_reads_back() {
    let (_dir, store) = open_fixture(7);
    check_v7(&store).await;
    check_v7_history(&store.state_machine(RangeId(1))).await;
}

#[tokio::test]
async fn v7_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v7(dir.path()).await;
    let store = open_in(dir.path());
    check_v7(&store).await;
}
