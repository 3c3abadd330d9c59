//! The format-6 fixture, `tests/fixtures/v6/`: request ids that belong to their sender. Range
//! 1 holds a session of a tenant's client (its owner recorded), its request records (each
//! with the digest of its request: two puts, the second returning the first's value, and
//! an idempotency record begun and completed), and the byte count of that record. `write_v6`
//! made the files with a format-6 build; it is kept (writing the current format now) and
//! checked against the same expectations, but for the version of `k`, which format 6 does
//! not store (it reads 1). Every later build must read them.

use std::path::Path;

use keel_storage::raft_types::{Entry, Vote};
use keel_storage::{RangeCounts, StateMachine, Store};
use keel_types::coordination::idempotency_key;
use keel_types::{BatchOp, Command, Coordination, CoordinationOp, Mutation, RangeId, RequestId};
use openraft::entry::RaftEntry;

use super::fixture::{
    current_snapshot, installed_fresh, membership, open_fixture, persist_range_1,
};
use super::{apply, blank, log_id, open_in};

/// The client of the v6 fixture's session.
const CLIENT: u64 = 0xf6;

/// `name` in tenant `tenant`'s namespace.
fn stored(tenant: &str, name: &[u8]) -> Vec<u8> {
    [b"\xffT".as_slice(), tenant.as_bytes(), b"\x01", name].concat()
}

fn request_id(sequence: u64) -> Option<RequestId> {
    Some(RequestId {
        client_id: CLIENT,
        client_started_ms: 1_000,
        sequence,
        completed_below: 1,
    })
}

fn put(index: u64, sequence: u64, key: &[u8], value: &[u8]) -> Entry {
    let mutation = Mutation {
        request: request_id(sequence),
        now_ms: 1_000,
        ops: vec![BatchOp::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            condition: None,
            return_previous: true,
            ttl_ms: None,
        }],
    };
    Entry::new_normal(log_id(1, 1, index), Command::Mutate(mutation))
}

fn coordinate(index: u64, sequence: u64, op: CoordinationOp) -> Entry {
    let coordination = Coordination {
        request: request_id(sequence),
        now_ms: 1_000,
        op,
    };
    Entry::new_normal(log_id(1, 1, index), Command::Coordinate(coordination))
}

fn record_key() -> Vec<u8> {
    idempotency_key(&stored("alice", b"pay"), b"order-1")
}

/// Alice's client writes `k` twice and begins and completes a record (revisions 1 to 4).
fn v6_entries() -> Vec<Entry> {
    let key = stored("alice", b"k");
    let begin = CoordinationOp::Begin {
        key: record_key(),
        owner: b"w".to_vec(),
        ttl_ms: 60_000,
    };
    let complete = CoordinationOp::Complete {
        key: record_key(),
        token: 3,
        result: b"paid".to_vec(),
        result_ttl_ms: 60_000,
    };
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        put(2, 1, &key, b"first"),
        put(3, 2, &key, b"second"),
        coordinate(4, 3, begin),
        coordinate(5, 4, complete),
    ]
}

async fn write_v6(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 5));
    persist_range_1(&store, &mut log, v6_entries(), vote, committed).await;
    store.shutdown();
}

/// The version of alice's `k` after its two puts: rows of format 6 store none, so the
/// fixture's reads 1; this build writes the true one. Either counts on from there.
const K_VERSION_V6: u64 = 1;
const K_VERSION_NOW: u64 = 2;

/// What every build must read from the v6 fixture, or from the same entries applied by this
/// build (`k_version` tells them apart).
async fn check_v6(store: &Store, k_version: u64) {
    let mut sm = store.state_machine(RangeId(1));
    let snapshot = current_snapshot(&mut sm, log_id(1, 1, 5)).await;
    // The v6 snapshot installs into a fresh store with the same state.
    let (_fresh_dir, mut fresh_sm) = installed_fresh(snapshot).await;
    check_v6_data(&mut fresh_sm, k_version).await;
    check_v6_data(&mut sm, k_version).await;
}

async fn version(sm: &StateMachine, key: &[u8]) -> Option<u64> {
    sm.get(key, 0).await.unwrap().0.map(|kv| kv.version)
}

async fn value(sm: &StateMachine, key: &[u8]) -> Option<Vec<u8>> {
    sm.get(key, 0).await.unwrap().0.map(|kv| kv.value)
}

/// Checks the v6 state, then sends (log indexes 6 to 9) an exact retry of request 1,
/// another put under request 2's id, bob's put under alice's client id, and alice's next
/// request: only the last is applied.
async fn check_v6_data(sm: &mut StateMachine, k_version: u64) {
    assert_eq!(sm.applied().await.unwrap(), (4, Some(log_id(1, 1, 5))));
    let counts = RangeCounts {
        sessions: 1,
        requests: 4,
        keys_with_ttl: 0,
        keys: 1,
        size_bytes: (stored("alice", b"k").len() + "second".len()) as u64,
    };
    assert_eq!(sm.counts().await.unwrap(), counts);
    let recorded = sm.quota_counts().await.unwrap();
    let everything = sm.quota_counts_within(Vec::new(), vec![0xFF; 8192]);
    assert_eq!(recorded, everything.await.unwrap());
    assert!(recorded.bytes > counts.size_bytes, "{recorded:?}");

    let key = stored("alice", b"k");
    assert_eq!(version(sm, &key).await, Some(k_version));
    let entries = vec![
        put(6, 1, &key, b"first"),
        put(7, 2, &stored("alice", b"other"), b"x"),
        put(8, 5, &stored("bob", b"k"), b"x"),
        put(9, 5, &key, b"third"),
    ];
    apply(sm, entries).await.unwrap();
    assert_eq!(value(sm, &stored("alice", b"other")).await, None);
    assert_eq!(value(sm, &stored("bob", b"k")).await, None);
    assert_eq!(value(sm, &key).await.unwrap(), b"third");
    assert_eq!(version(sm, &key).await, Some(k_version + 1));
    assert_eq!(sm.applied().await.unwrap().0, 5);
}

#[tokio::test]
async fn v6_fixture_reads_back() {
    let (_dir, store) = open_fixture(6);
    check_v6(&store, K_VERSION_V6).await;
}

#[tokio::test]
async fn v6_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v6(dir.path()).await;
    let store = open_in(dir.path());
    check_v6(&store, K_VERSION_NOW).await;
}
