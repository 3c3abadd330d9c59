//! The format-8 fixture, `tests/fixtures/v8/`: a range with history. Range 1 holds the events
//! of a key put, overwritten and deleted, and a snapshot (which carries no events).
//! `write_v8` made the files; set `KEEL_WRITE_FIXTURES=1` to rewrite them (only ever needed
//! if they are lost). Every later build must read them.

use std::path::Path;

use keel_storage::raft_types::{Entry, Vote};
use keel_storage::{HistoryRead, StateMachine, Store};
use keel_types::{BatchOp, Command, KeyValue, Mutation, RangeId, Revision};
use openraft::entry::RaftEntry;

use super::fixture::{
    FIXTURE_STORE_FILE, copy_dir, current_snapshot, fixture_dir, installed_fresh, membership,
    open_fixture, persist_range_1,
};
use super::{blank, log_id, open_in, puts};

fn delete(index: u64, key: &[u8]) -> Entry {
    let mutation = Mutation {
        request: None,
        now_ms: 2_000,
        ops: vec![BatchOp::Delete {
            key: key.to_vec(),
            condition: None,
            return_previous: false,
        }],
    };
    Entry::new_normal(log_id(1, 1, index), Command::Mutate(mutation))
}

fn v8_entries() -> Vec<Entry> {
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        puts(1, 2, &[(b"a", b"first")]),
        puts(1, 3, &[(b"a", b"second"), (b"b", b"kept")]),
        delete(4, b"a"),
    ]
}

async fn write_v8(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 4));
    persist_range_1(&store, &mut log, v8_entries(), vote, committed).await;
    store.shutdown();
}

fn kv(key: &[u8], value: &[u8], revisions: (Revision, Revision), version: u64) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value: value.to_vec(),
        create_revision: revisions.0,
        mod_revision: revisions.1,
        version,
        expires_at_ms: None,
        lease: 0,
    }
}

/// The version of `a`'s second state: events of format 8 store none, so the fixture's reads
/// 1; this build writes the true one.
const SECOND_VERSION_V8: u64 = 1;
const SECOND_VERSION_NOW: u64 = 2;

/// What every build must read from the v8 fixture, or from the same entries applied by this
/// build (`second_version` tells them apart).
async fn check_v8(store: &Store, second_version: u64) {
    let mut sm = store.state_machine(RangeId(1));
    assert_eq!(sm.applied().await.unwrap(), (3, Some(log_id(1, 1, 4))));
    check_v8_history(&sm, second_version).await;
    // The snapshot installs into a fresh store whose history starts at it.
    let snapshot = current_snapshot(&mut sm, log_id(1, 1, 4)).await;
    let (_fresh_dir, fresh_sm) = installed_fresh(snapshot).await;
    assert_eq!(
        fresh_sm.get(b"b", 0).await.unwrap().0,
        Some(kv(b"b", b"kept", (2, 2), 1))
    );
    let counts = fresh_sm.history_counts().await.unwrap();
    assert_eq!((counts.floor, counts.bytes), (3, 0));
}

async fn check_v8_history(sm: &StateMachine, second_version: u64) {
    let HistoryRead::Events(page) = sm.key_history(b"a", 0, 0).await.unwrap() else {
        panic!("range 1 holds the events of a");
    };
    let states: Vec<(Revision, Option<KeyValue>, Option<KeyValue>)> = page
        .events
        .into_iter()
        .map(|event| (event.revision, event.before, event.after))
        .collect();
    let first = kv(b"a", b"first", (1, 1), 1);
    let second = kv(b"a", b"second", (1, 2), second_version);
    let expected = vec![
        (1, None, Some(first.clone())),
        (2, Some(first), Some(second.clone())),
        (3, Some(second), None),
    ];
    assert_eq!(states, expected);
    assert_eq!((page.compact_revision, page.revision), (0, 3));
    let counts = sm.history_counts().await.unwrap();
    // Keys and values before and after: a (1+5), (1+5+6), (1+6); b (1+4).
    assert_eq!((counts.floor, counts.bytes), (0, 6 + 12 + 7 + 5));
}

#[tokio::test]
async fn v8_fixture_reads_back() {
    let (_dir, store) = open_fixture(8);
    check_v8(&store, SECOND_VERSION_V8).await;
}

#[tokio::test]
async fn v8_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v8(dir.path()).await;
    if std::env::var_os("KEEL_WRITE_FIXTURES").is_some() {
        let target = fixture_dir(8);
        let _ = std::fs::remove_dir_all(&target);
        copy_dir(dir.path(), &target);
        std::fs::rename(target.join("keel.redb"), target.join(FIXTURE_STORE_FILE)).unwrap();
    }
    let store = open_in(dir.path());
    check_v8(&store, SECOND_VERSION_NOW).await;
}
