//! The format-3 fixture, `tests/fixtures/v3/`: range 1 with a lock fencing a key, a lock free
//! at the range clock and a completed idempotency record, each written by a request with an
//! id. `write_v3` made the files with a format-3 build; it is kept (and checked against the
//! same expectations, now written in the current format) so the fixture can be understood.
//! Every later build must read them.

use std::path::Path;

use keel_storage::raft_types::{Entry, Vote};
use keel_storage::{RangeCounts, StateMachine, Store};
use keel_types::coordination::idempotency_key;
use keel_types::{
    Acquirer, BatchOp, Command, Coordination, CoordinationCounts, CoordinationOp, ExpiredRecord,
    Fence, IdempotencyRecord, LockHold, Mutation, RangeId, RequestId,
};
use openraft::entry::RaftEntry;
use openraft::storage::RaftLogReader;

use super::fixture::{
    current_snapshot, installed_fresh, membership, open_fixture, persist_range_1,
};
use super::{apply, blank, log_id, open_in};

/// The client of the v3 fixture's session.
const CLIENT: u64 = 0xf3;

fn request_id(sequence: u64) -> Option<RequestId> {
    Some(RequestId {
        client_id: CLIENT,
        client_started_ms: 1_000,
        sequence,
        completed_below: 1,
    })
}

fn coordinate(index: u64, sequence: Option<u64>, now_ms: u64, op: CoordinationOp) -> Entry {
    let coordination = Coordination {
        request: sequence.and_then(request_id),
        now_ms,
        op,
    };
    Entry::new_normal(log_id(1, 1, index), Command::Coordinate(coordination))
}

/// A write of `k` fenced by lock `L` with `token`.
fn fenced_put(index: u64, sequence: u64, token: u64, value: &[u8]) -> Entry {
    let command = Command::FencedMutate {
        fence: Fence {
            lock: b"L".to_vec(),
            token,
        },
        mutation: Mutation {
            request: request_id(sequence),
            now_ms: 1_000,
            ops: vec![BatchOp::Put {
                key: b"k".to_vec(),
                value: value.to_vec(),
                condition: None,
                return_previous: false,
                ttl_ms: None,
            }],
        },
    };
    Entry::new_normal(log_id(1, 1, index), command)
}

fn acquire(name: &[u8], owner: &[u8], ttl_ms: u64) -> CoordinationOp {
    CoordinationOp::Acquire {
        name: name.to_vec(),
        acquirer: Acquirer {
            owner: owner.to_vec(),
            ttl_ms,
            lock_delay_ms: 0,
        },
    }
}

fn record_key() -> Vec<u8> {
    idempotency_key(b"pay", b"order-1")
}

/// At clock 1_000: request 1 takes lock `L` (token 1, until 61_000), request 2 writes `k`
/// fenced by it, and `short` is taken until 1_100. At clock 2_000: request 3 begins the
/// record (token 4) and request 4 completes it (kept until 62_000).
fn v3_entries() -> Vec<Entry> {
    let begin = CoordinationOp::Begin {
        key: record_key(),
        owner: b"w".to_vec(),
        ttl_ms: 500,
    };
    let complete = CoordinationOp::Complete {
        key: record_key(),
        token: 4,
        result: b"r".to_vec(),
        result_ttl_ms: 60_000,
    };
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        coordinate(2, Some(1), 1_000, acquire(b"L", b"a", 60_000)),
        fenced_put(3, 2, 1, b"v"),
        coordinate(4, None, 1_000, acquire(b"short", b"b", 100)),
        coordinate(5, Some(3), 2_000, begin),
        coordinate(6, Some(4), 2_000, complete),
    ]
}

async fn write_v3(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 6));
    persist_range_1(&store, &mut log, v3_entries(), vote, committed).await;
    store.shutdown();
}

/// What every build must read from the v3 fixture.
async fn check_v3(store: &Store) {
    let mut log = store.log_store(RangeId(1));
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    assert_eq!(entries, v3_entries());
    let mut sm = store.state_machine(RangeId(1));
    let snapshot = current_snapshot(&mut sm, log_id(1, 1, 6)).await;

    // The v3 snapshot installs into a fresh store with the same state.
    let (_fresh_dir, mut fresh_sm) = installed_fresh(snapshot).await;
    check_v3_data(&mut fresh_sm).await;
    check_v3_data(&mut sm).await;
}

/// Checks the v3 state, then retries request 1 and writes `k` with a stale token (log
/// indexes 7 and 8): neither changes anything.
async fn check_v3_data(sm: &mut StateMachine) {
    assert_eq!(sm.applied().await.unwrap(), (5, Some(log_id(1, 1, 6))));
    let hold = LockHold {
        owner: b"a".to_vec(),
        token: 1,
        expires_at_ms: 61_000,
        lock_delay_ms: 0,
    };
    assert_eq!(sm.lock(b"L", 0).await.unwrap(), (Some(hold), 5));
    assert_eq!(
        sm.lock(b"short", 0).await.unwrap().0,
        None,
        "free at the clock"
    );
    let record = IdempotencyRecord::Completed {
        result: b"r".to_vec(),
        token: 4,
        expires_at_ms: 62_000,
    };
    let (stored, _) = sm.idempotency_record(&record_key(), 0).await.unwrap();
    assert_eq!(stored, Some(record));
    let counts = CoordinationCounts {
        locks: 2,
        fenced_keys: 1,
        idempotency_records: 1,
    };
    assert_eq!(sm.coordination_counts().await.unwrap(), counts);
    // The file has no byte count of its locks, fences and records: the store counts them
    // when it opens the file, and an install from its snapshot.
    let recorded = sm.quota_counts().await.unwrap();
    let everything = sm.quota_counts_within(Vec::new(), vec![0xFF; 8192]);
    assert_eq!(recorded, everything.await.unwrap());
    assert!(recorded.bytes > 0, "{recorded:?}");
    let sessions = RangeCounts {
        sessions: 1,
        requests: 4,
        keys_with_ttl: 0,
        keys: 1,
        size_bytes: 2,
    };
    assert_eq!(sm.counts().await.unwrap(), sessions);
    let reclaim = sm.plan_reclaim(0).await.unwrap();
    let short = ExpiredRecord {
        key: b"short".to_vec(),
        at_ms: 1_100,
    };
    assert_eq!((reclaim.locks, reclaim.records), (vec![short], vec![]));

    let retry = coordinate(7, Some(1), 3_000, acquire(b"L", b"other", 10));
    apply(sm, vec![retry, fenced_put(8, 5, 0, b"stale")])
        .await
        .unwrap();
    assert_eq!(sm.applied().await.unwrap(), (5, Some(log_id(1, 1, 8))));
    assert_eq!(sm.lock(b"L", 0).await.unwrap().0.unwrap().owner, b"a");
    let k = sm.get(b"k", 0).await.unwrap().0.unwrap();
    assert_eq!(k.value, b"v", "the stale fenced write is refused");
}

#[tokio::test]
async fn v3_fixture_reads_back() {
    let (_dir, store) = open_fixture(3);
    check_v3(&store).await;
}

#[tokio::test]
async fn v3_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v3(dir.path()).await;
    let store = open_in(dir.path());
    check_v3(&store).await;
}
