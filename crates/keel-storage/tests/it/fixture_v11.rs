//! The format-11 fixture, `tests/fixtures/v11/`: keys with etcd's versions. Range 1 puts `a`
//! and `b` (revision 1), puts `a` again under a request id, returning its state before (2),
//! increments `a` (3), deletes `b` (4) and puts it again (5): `a` is at version 3, `b` at
//! version 1 with create revision 5, and the request's record holds `a` at version 1.
//! `write_v11` made the files; set `KEEL_WRITE_FIXTURES=1` to rewrite them (only ever needed
//! if they are lost). Every later build must read them.

use std::path::Path;

use keel_storage::raft_types::{Entry, Vote};
use keel_storage::{HistoryRead, StateMachine, Store};
use keel_types::{BatchOp, Command, KeyValue, Mutation, RangeId, RequestId, Revision};
use openraft::entry::RaftEntry;

use super::fixture::{
    FIXTURE_STORE_FILE, copy_dir, current_snapshot, fixture_dir, installed_fresh, membership,
    open_fixture, persist_range_1,
};
use super::{apply, blank, log_id, open_in, puts};

fn mutate(index: u64, request: Option<RequestId>, op: BatchOp) -> Entry {
    let mutation = Mutation {
        request,
        now_ms: 1_000,
        ops: vec![op],
    };
    Entry::new_normal(log_id(1, 1, index), Command::Mutate(mutation))
}

/// `a` = "2" under request 1 of client 0xb11, returning `a`'s state before.
fn put_a(index: u64) -> Entry {
    let request = RequestId {
        client_id: 0xb11,
        client_started_ms: 1_000,
        sequence: 1,
        completed_below: 1,
    };
    let put = BatchOp::Put {
        key: b"a".to_vec(),
        value: b"2".to_vec(),
        condition: None,
        return_previous: true,
        ttl_ms: None,
    };
    mutate(index, Some(request), put)
}

fn v11_entries() -> Vec<Entry> {
    let increment = BatchOp::Increment {
        key: b"a".to_vec(),
        delta: 1,
    };
    let delete = BatchOp::Delete {
        key: b"b".to_vec(),
        condition: None,
        return_previous: false,
    };
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        puts(1, 2, &[(b"a", b"1"), (b"b", b"x")]),
        put_a(3),
        mutate(4, None, increment),
        mutate(5, None, delete),
        puts(1, 6, &[(b"b", b"y")]),
    ]
}

async fn write_v11(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 6));
    persist_range_1(&store, &mut log, v11_entries(), vote, committed).await;
    store.shutdown();
}

/// `key`'s value, create and mod revision and version; `None` if absent.
async fn lineage(sm: &StateMachine, key: &[u8]) -> Option<(Vec<u8>, Revision, Revision, u64)> {
    let kv = sm.get(key, 0).await.unwrap().0?;
    Some((kv.value, kv.create_revision, kv.mod_revision, kv.version))
}

/// The rows of the v11 state: `a` at version 3, `b` created anew at version 1.
async fn check_v11_rows(sm: &StateMachine) {
    assert_eq!(lineage(sm, b"a").await, Some((b"3".to_vec(), 1, 3, 3)));
    assert_eq!(lineage(sm, b"b").await, Some((b"y".to_vec(), 5, 5, 1)));
}

/// What every build must read from the v11 fixture.
async fn check_v11(store: &Store) {
    let mut sm = store.state_machine(RangeId(1));
    assert_eq!(sm.applied().await.unwrap(), (5, Some(log_id(1, 1, 6))));
    check_v11_rows(&sm).await;
    let HistoryRead::Events(page) = sm.key_history(b"a", 0, 0).await.unwrap() else {
        panic!("range 1 holds the events of a");
    };
    let version = |kv: &Option<KeyValue>| kv.as_ref().map(|kv| kv.version);
    let versions: Vec<(Revision, Option<u64>, Option<u64>)> = page
        .events
        .iter()
        .map(|event| {
            (
                event.revision,
                version(&event.before),
                version(&event.after),
            )
        })
        .collect();
    let expected = vec![
        (1, None, Some(1)),
        (2, Some(1), Some(2)),
        (3, Some(2), Some(3)),
    ];
    assert_eq!(versions, expected);

    // The snapshot installs into a fresh store with the same versions.
    let snapshot = current_snapshot(&mut sm, log_id(1, 1, 6)).await;
    let (_fresh_dir, fresh_sm) = installed_fresh(snapshot).await;
    check_v11_rows(&fresh_sm).await;
    // A retry of the request is answered from its record: nothing changes.
    apply(&mut sm, vec![put_a(7)]).await.unwrap();
    assert_eq!(sm.applied().await.unwrap(), (5, Some(log_id(1, 1, 7))));
    check_v11_rows(&sm).await;
}

#[tokio::test]
async fn v11_fixture_reads_back() {
    let (_dir, store) = open_fixture(11);
    check_v11(&store).await;
}

#[tokio::test]
async fn v11_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v11(dir.path()).await;
    if std::env::var_os("KEEL_WRITE_FIXTURES").is_some() {
        let target = fixture_dir(11);
        let _ = std::fs::remove_dir_all(&target);
        copy_dir(dir.path(), &target);
        std::fs::rename(target.join("keel.redb"), target.join(FIXTURE_STORE_FILE)).unwrap();
    }
    let store = open_in(dir.path());
    check_v11(&store).await;
}
