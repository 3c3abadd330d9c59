//! Format fixture: `tests/fixtures/v1/` holds a store file (`keel.redb.fixture`) and a
//! snapshot written by format version 1. Every later build must read them. `write_v1` made them once; it is kept (and
//! checked against the same expectations) so the fixture can be understood and, for a new
//! format version, a `v2` written next to it. Set `KEEL_WRITE_FIXTURES=1` to rewrite the v1
//! files (only ever needed if they are lost).

use std::path::{Path, PathBuf};

use keel_storage::raft_types::{Membership, Vote};
use keel_storage::{StateMachine, Store};
use keel_types::{BatchOp, Command, Condition, RangeId};
use openraft::entry::RaftEntry;
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};

use super::{append, apply, blank, log_id, open_in, puts};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

/// The store file's name in the fixture directory: the repository ignores `*.redb`.
const FIXTURE_STORE_FILE: &str = "keel.redb.fixture";

fn membership() -> Membership {
    Membership::new_with_defaults(vec![[1, 2, 3].into()], [])
}

/// Writes the v1 fixture: range 1 with a vote, a partly purged log, a committed log id,
/// applied data and a snapshot; range 2 with only a vote.
async fn write_v1(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let delete_a = Entry::new_normal(
        log_id(2, 1, 4),
        Command::Write {
            ops: vec![BatchOp::Delete {
                key: b"a".to_vec(),
                condition: Some(Condition::Revision(1)),
                return_previous: false,
            }],
        },
    );
    let entries = vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        puts(1, 2, &[(b"a", b"1"), (b"b", b"2")]),
        puts(2, 3, &[(b"b", b"3")]),
        delete_a,
    ];
    append(&mut log, entries.clone()).await.unwrap();
    log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
    log.save_committed(Some(log_id(2, 1, 4))).await.unwrap();
    let mut sm = store.state_machine(RangeId(1));
    apply(&mut sm, entries).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    log.purge(log_id(1, 1, 1)).await.unwrap();
    store
        .log_store(RangeId(2))
        .save_vote(&Vote::new(5, 2))
        .await
        .unwrap();
    store.shutdown();
}

use keel_storage::raft_types::Entry;

/// What every build must read from the v1 fixture.
async fn check_v1(store: &Store) {
    assert_eq!(store.ranges().unwrap(), vec![RangeId(1), RangeId(2)]);
    let mut log = store.log_store(RangeId(1));
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(Vote::new_committed(2, 1))
    );
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2, 1, 4)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 1)));
    assert_eq!(state.last_log_id, Some(log_id(2, 1, 4)));
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    let indexes: Vec<u64> = entries.iter().map(|entry| entry.log_id.index).collect();
    assert_eq!(indexes, vec![2, 3, 4]);
    assert_eq!(entries[1], puts(2, 3, &[(b"b", b"3")]));
    let mut other = store.log_store(RangeId(2));
    assert_eq!(other.read_vote().await.unwrap(), Some(Vote::new(5, 2)));

    let mut sm = store.state_machine(RangeId(1));
    check_v1_data(&mut sm).await;
    let snapshot = sm
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("v1 snapshot");
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(2, 1, 4)));
    assert_eq!(snapshot.meta.last_membership.membership(), &membership());

    // The v1 snapshot installs into a fresh store with the same data.
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = open_in(fresh_dir.path());
    let mut fresh_sm = fresh.state_machine(RangeId(1));
    fresh_sm
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    check_v1_data(&mut fresh_sm).await;
}

async fn check_v1_data(sm: &mut StateMachine) {
    let (applied, stored_membership) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(2, 1, 4)));
    assert_eq!(stored_membership.log_id(), &Some(log_id(1, 1, 1)));
    assert_eq!(sm.applied().await.unwrap(), (3, Some(log_id(2, 1, 4))));
    let page = sm.scan(b"", b"", 0).await.unwrap();
    let rows: Vec<(&[u8], &[u8], u64, u64)> = page
        .kvs
        .iter()
        .map(|kv| {
            (
                kv.key.as_slice(),
                kv.value.as_slice(),
                kv.create_revision,
                kv.mod_revision,
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![(&b"b"[..], &b"3"[..], 1, 2)],
        "a was deleted at revision 3"
    );
    assert_eq!(page.revision, 3);
}

/// Copies the committed fixture into a temporary directory (opening may repair or update
/// the file) and reads it back.
#[tokio::test]
async fn v1_fixture_reads_back() {
    let source = fixture_dir();
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&source, dir.path());
    std::fs::rename(
        dir.path().join(FIXTURE_STORE_FILE),
        dir.path().join("keel.redb"),
    )
    .unwrap();
    let store = open_in(dir.path());
    check_v1(&store).await;
}

#[tokio::test]
async fn v1_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v1(dir.path()).await;
    if std::env::var_os("KEEL_WRITE_FIXTURES").is_some() {
        let target = fixture_dir();
        let _ = std::fs::remove_dir_all(&target);
        copy_dir(dir.path(), &target);
        std::fs::rename(target.join("keel.redb"), target.join(FIXTURE_STORE_FILE)).unwrap();
    }
    let store = open_in(dir.path());
    check_v1(&store).await;
}

fn copy_dir(source: &Path, target: &Path) {
    std::fs::create_dir_all(target).unwrap();
    for entry in std::fs::read_dir(source).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &target.join(entry.file_name()));
        } else {
            std::fs::copy(&path, target.join(entry.file_name())).unwrap();
        }
    }
}
