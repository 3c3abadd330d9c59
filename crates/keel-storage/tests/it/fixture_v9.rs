//! The format-9 fixture, `tests/fixtures/v9/`: a range whose history holds a key's event and
//! a lock's reclaim. Range 1 grants the lock `l` (revision 1), puts `a` (2) and reclaims the
//! free lock (3). `write_v9` made the files; set `KEEL_WRITE_FIXTURES=1` to rewrite them
//! (only ever needed if they are lost). Every later build must read them.

use std::path::Path;

use keel_storage::raft_types::{Entry, Vote};
use keel_storage::{RangeRead, Store};
use keel_types::{
    Acquirer, Command, Coordination, CoordinationOp, EventCursor, EventKind, ExpiredRecord,
    RangeId, Reclaim, Revision,
};
use openraft::entry::RaftEntry;

use super::fixture::persist_range_1;
use super::fixture::{FIXTURE_STORE_FILE, copy_dir, fixture_dir, membership, open_fixture};
use super::{blank, log_id, open_in, puts};

fn v9_entries() -> Vec<Entry> {
    let acquire = Command::Coordinate(Coordination {
        request: None,
        now_ms: 1_000,
        op: CoordinationOp::Acquire {
            name: b"l".to_vec(),
            acquirer: Acquirer {
                owner: b"o".to_vec(),
                ttl_ms: 100,
                lock_delay_ms: 0,
            },
        },
    });
    let reclaim = Command::Reclaim(Reclaim {
        now_ms: 2_000,
        locks: vec![ExpiredRecord {
            key: b"l".to_vec(),
            at_ms: 1_100,
        }],
        records: Vec::new(),
    });
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        Entry::new_normal(log_id(1, 1, 2), acquire),
        puts(1, 3, &[(b"a", b"v")]),
        Entry::new_normal(log_id(1, 1, 4), reclaim),
    ]
}

async fn write_v9(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 4));
    persist_range_1(&store, &mut log, v9_entries(), vote, committed).await;
    store.shutdown();
}

/// What every build must read from the v9 fixture.
async fn check_v9(store: &Store) {
    let sm = store.state_machine(RangeId(1));
    assert_eq!(sm.applied().await.unwrap(), (3, Some(log_id(1, 1, 4))));
    let RangeRead::Events(page) = sm
        .range_events(EventCursor::at(1), (10, u64::MAX))
        .await
        .unwrap()
    else {
        panic!("range 1 holds its events");
    };
    let events: Vec<(Revision, &[u8], EventKind)> = page
        .page
        .events
        .iter()
        .map(|event| (event.revision, event.key.as_slice(), event.kind))
        .collect();
    let expected: Vec<(Revision, &[u8], EventKind)> = vec![
        (2, b"a", EventKind::Key),
        (3, b"l", EventKind::LockReclaimed { token: 1 }),
    ];
    assert_eq!(events, expected);
    let counts = sm.history_counts().await.unwrap();
    // Keys and values: a (1+1), l (1).
    assert_eq!((counts.floor, counts.bytes), (0, 2 + 1));
    assert_eq!(
        sm.coordination_counts().await.unwrap().locks,
        0,
        "the lock is gone"
    );
}

#[tokio::test]
async fn v9_fixture_reads_back() {
    let (_dir, store) = open_fixture(9);
    check_v9(&store).await;
}

#[tokio::test]
async fn v9_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v9(dir.path()).await;
    if std::env::var_os("KEEL_WRITE_FIXTURES").is_some() {
        let target = fixture_dir(9);
        let _ = std::fs::remove_dir_all(&target);
        copy_dir(dir.path(), &target);
        std::fs::rename(target.join("keel.redb"), target.join(FIXTURE_STORE_FILE)).unwrap();
    }
    let store = open_in(dir.path());
    check_v9(&store).await;
}
