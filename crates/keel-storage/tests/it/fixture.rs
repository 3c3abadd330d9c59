//! Format fixtures: `tests/fixtures/v{N}/` holds a store file (`keel.redb.fixture`) and a
//! snapshot written by format version N. Every later build must read them all.
//!
//! `write_v1` made the v1 files with a format-1 build; it is kept (and checked against the
//! same expectations, now written in the current format) so the fixture can be understood.
//! `write_v2` made the v2 files (exactly-once sessions, request records, TTL keys, the range
//! clock) and is kept the same way. `fixture_v3` checks the v3 files (locks, fences,
//! idempotency records) and `fixture_v4` the v4 files (a split range, the meta range) the
//! same way. `fixture_v5` checks the v5 files (node states, a learner, a removed replica) the
//! same way. `fixture_v6` checks the v6 files (a tenant's session with its owner, request
//! records with digests, the bytes of an idempotency record) the same way, and `fixture_v7`
//! the v7 files (a sealed snapshot). `fixture_v8` to `fixture_v11` make and check the files
//! of their formats (history, reclaims, consistency checks, keys' versions; the keys of
//! files older than format 11 read version 1). With `KEEL_WRITE_FIXTURES=1` each of their
//! writer tests rewrites its files in this build's format, so run only the one of the
//! current format, v11 (only ever needed if its files are lost); older formats cannot be
//! written by this build. Files of formats 1-3 have no key and byte counts: the store
//! counts them when it opens the file, and the checks here see the result.

use std::path::{Path, PathBuf};

use keel_storage::raft_types::{Entry, LogId, Membership, Snapshot, Vote};
use keel_storage::{LogStore, RangeCounts, StateMachine, Store};
use keel_types::command::legacy::BatchOpV1;
use keel_types::{
    BatchOp, Command, Condition, CoordinationCounts, ExpiredKey, Mutation, RangeId, RequestId,
};
use openraft::entry::RaftEntry;
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};

use super::{append, apply, blank, log_id, open_in};

pub(super) fn fixture_dir(version: u8) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/v{version}"))
}

/// A format-1 entry writing `key=value` for every pair.
fn puts_v1(term: u64, index: u64, pairs: &[(&[u8], &[u8])]) -> Entry {
    let ops = pairs
        .iter()
        .map(|(key, value)| BatchOpV1::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            condition: None,
            return_previous: false,
        })
        .collect();
    Entry::new_normal(log_id(term, 1, index), Command::Write { ops })
}

/// The store file's name in the fixture directory: the repository ignores `*.redb`.
pub(super) const FIXTURE_STORE_FILE: &str = "keel.redb.fixture";

pub(super) fn membership() -> Membership {
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
            ops: vec![BatchOpV1::Delete {
                key: b"a".to_vec(),
                condition: Some(Condition::Revision(1)),
                return_previous: false,
            }],
        },
    );
    let entries = vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        puts_v1(1, 2, &[(b"a", b"1"), (b"b", b"2")]),
        puts_v1(2, 3, &[(b"b", b"3")]),
        delete_a,
    ];
    let (vote, committed) = (Vote::new_committed(2, 1), log_id(2, 1, 4));
    persist_range_1(&store, &mut log, entries, vote, committed).await;
    log.purge(log_id(1, 1, 1)).await.unwrap();
    store
        .log_store(RangeId(2))
        .save_vote(&Vote::new(5, 2))
        .await
        .unwrap();
    store.shutdown();
}

/// Range 1's current snapshot, which must end at `last_log_id`.
pub(super) async fn current_snapshot(sm: &mut StateMachine, last_log_id: LogId) -> Snapshot {
    let snapshot = sm
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("the fixture has a snapshot");
    assert_eq!(snapshot.meta.last_log_id, Some(last_log_id));
    snapshot
}

/// Range 1 of a fresh store that installed `snapshot` (the store lives in the returned dir).
pub(super) async fn installed_fresh(snapshot: Snapshot) -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open_in(dir.path()).state_machine(RangeId(1));
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    (dir, sm)
}

/// What every build must read from the v1 fixture.
async fn check_v1(store: &Store) {
    assert_eq!(store.ranges().unwrap(), vec![RangeId(1), RangeId(2)]);
    let mut log = store.log_store(RangeId(1));
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(Vote::new_committed(2, 1))
    );
    // The fixture holds a committed log id (2, 1, 4); it is no longer read.
    assert_eq!(log.read_committed().await.unwrap(), None);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 1)));
    assert_eq!(state.last_log_id, Some(log_id(2, 1, 4)));
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    let indexes: Vec<u64> = entries.iter().map(|entry| entry.log_id.index).collect();
    assert_eq!(indexes, vec![2, 3, 4]);
    assert_eq!(entries[1], puts_v1(2, 3, &[(b"b", b"3")]));
    let mut other = store.log_store(RangeId(2));
    assert_eq!(other.read_vote().await.unwrap(), Some(Vote::new(5, 2)));

    let mut sm = store.state_machine(RangeId(1));
    check_v1_data(&mut sm).await;
    let snapshot = current_snapshot(&mut sm, log_id(2, 1, 4)).await;
    assert_eq!(snapshot.meta.last_membership.membership(), &membership());

    // The v1 snapshot installs into a fresh store with the same state.
    let (_fresh_dir, mut fresh_sm) = installed_fresh(snapshot).await;
    check_v1_data(&mut fresh_sm).await;
}

async fn check_v1_data(sm: &mut StateMachine) {
    let (applied, stored_membership) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(2, 1, 4)));
    assert_eq!(stored_membership.log_id(), &Some(log_id(1, 1, 1)));
    assert_eq!(sm.applied().await.unwrap(), (3, Some(log_id(2, 1, 4))));
    let page = sm.scan(b"", b"", 0, 0).await.unwrap();
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
    let counts = RangeCounts {
        keys: 1,
        size_bytes: 2,
        ..RangeCounts::default()
    };
    assert_eq!(
        sm.counts().await.unwrap(),
        counts,
        "counted when the store opened"
    );
}

/// Copies the committed fixture of `version` into a temporary directory (opening may repair
/// or update the file) and opens it.
pub(super) fn open_fixture(version: u8) -> (tempfile::TempDir, Store) {
    let source = fixture_dir(version);
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&source, dir.path());
    std::fs::rename(
        dir.path().join(FIXTURE_STORE_FILE),
        dir.path().join("keel.redb"),
    )
    .unwrap();
    let store = open_in(dir.path());
    (dir, store)
}

#[tokio::test]
async fn v1_fixture_reads_back() {
    let (_dir, store) = open_fixture(1);
    check_v1(&store).await;
}

/// A file of format 12 or older keeps its log in its `raft_log` table; the first open moves
/// the entries into the node-wide log, and the file keeps only the purged id.
#[tokio::test]
async fn v1_fixture_log_moves_into_the_node_wide_log() {
    let (dir, store) = open_fixture(1);
    assert!(store.log_bytes() > 0);
    store.shutdown();
    let store = open_in(dir.path());
    check_v1(&store).await;
    store.shutdown();
    std::fs::remove_dir_all(dir.path().join("keel.raft-log")).unwrap();
    let store = open_in(dir.path());
    let mut log = store.log_store(RangeId(1));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(
        state.last_log_id,
        Some(log_id(1, 1, 1)),
        "no entry left in the file"
    );
    assert!(log.try_get_log_entries(0..10).await.unwrap().is_empty());
}

#[tokio::test]
async fn v1_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v1(dir.path()).await;
    let store = open_in(dir.path());
    check_v1(&store).await;
}

/// The client of the v2 fixture's session.
const CLIENT: u64 = 0xfeed;

fn request(term: u64, index: u64, sequence: u64, now_ms: u64, ops: Vec<BatchOp>) -> Entry {
    let mutation = Mutation {
        request: Some(RequestId {
            client_id: CLIENT,
            client_started_ms: 1_000,
            sequence,
            completed_below: 1,
        }),
        now_ms,
        ops,
    };
    Entry::new_normal(log_id(term, 1, index), Command::Mutate(mutation))
}

fn put(key: &[u8], value: &[u8], ttl_ms: Option<u64>) -> BatchOp {
    BatchOp::Put {
        key: key.to_vec(),
        value: value.to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms,
    }
}

/// The entries of range 1 in the v2 fixture: at clock 1_000 a request puts `short` (expires
/// at 1_500), `long` (expires at 11_000) and `plain`; at clock 2_000 a second request
/// increments `n`, so `short` is expired at the range clock.
fn v2_entries() -> Vec<Entry> {
    vec![
        blank(1, 0),
        Entry::new_membership(log_id(1, 1, 1), membership()),
        request(
            1,
            2,
            1,
            1_000,
            vec![
                put(b"short", b"s", Some(500)),
                put(b"long", b"l", Some(10_000)),
                put(b"plain", b"p", None),
            ],
        ),
        request(
            1,
            3,
            2,
            2_000,
            vec![BatchOp::Increment {
                key: b"n".to_vec(),
                delta: 5,
            }],
        ),
    ]
}

/// Writes the v2 fixture: range 1 with a vote, a committed log id, applied data with a
/// session, two request records, TTL keys and a snapshot.
async fn write_v2(dir: &Path) {
    let store = open_in(dir);
    let mut log = store.log_store(RangeId(1));
    let entries = v2_entries();
    let (vote, committed) = (Vote::new_committed(1, 1), log_id(1, 1, 3));
    persist_range_1(&store, &mut log, entries, vote, committed).await;
    store.shutdown();
}

/// Appends `entries` to range 1's log, saves `vote` and `committed`, applies every entry and
/// builds a snapshot: the state both fixture writers leave behind.
pub(super) async fn persist_range_1(
    store: &Store,
    log: &mut LogStore,
    entries: Vec<Entry>,
    vote: Vote,
    committed: LogId,
) {
    append(log, entries.clone()).await.unwrap();
    log.save_vote(&vote).await.unwrap();
    log.save_committed(Some(committed)).await.unwrap();
    let mut sm = store.state_machine(RangeId(1));
    apply(&mut sm, entries).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
}

/// What every build must read from the v2 fixture.
async fn check_v2(store: &Store) {
    let mut log = store.log_store(RangeId(1));
    // The fixture holds a committed log id (1, 1, 3); it is no longer read.
    assert_eq!(log.read_committed().await.unwrap(), None);
    let entries = log.try_get_log_entries(0..10).await.unwrap();
    assert_eq!(entries, v2_entries());
    let mut sm = store.state_machine(RangeId(1));
    let snapshot = current_snapshot(&mut sm, log_id(1, 1, 3)).await;

    // The v2 snapshot installs into a fresh store with the same state.
    let (_fresh_dir, mut fresh_sm) = installed_fresh(snapshot).await;
    check_v2_data(&mut fresh_sm).await;
    check_v2_data(&mut sm).await;
}

/// Checks the v2 state, then replays request 1 (at log index 4).
async fn check_v2_data(sm: &mut StateMachine) {
    assert_eq!(sm.applied().await.unwrap(), (2, Some(log_id(1, 1, 3))));
    assert_eq!(
        sm.get(b"short", 0).await.unwrap().0,
        None,
        "expired at the range clock"
    );
    let long = sm.get(b"long", 0).await.unwrap().0.expect("long is live");
    assert_eq!(
        (long.value.as_slice(), long.expires_at_ms),
        (&b"l"[..], Some(11_000))
    );
    assert_eq!(sm.get(b"long", 11_000).await.unwrap().0, None);
    let n = sm.get(b"n", 0).await.unwrap().0.expect("n was incremented");
    assert_eq!((n.value.as_slice(), n.expires_at_ms), (&b"5"[..], None));
    let counts = RangeCounts {
        sessions: 1,
        requests: 2,
        keys_with_ttl: 2,
        keys: 4,
        size_bytes: "shortslonglplainpn5".len() as u64,
    };
    assert_eq!(sm.counts().await.unwrap(), counts);
    // A file from before locks and idempotency records has none, and reads of them work.
    let none = CoordinationCounts::default();
    assert_eq!(sm.coordination_counts().await.unwrap(), none);
    assert_eq!(sm.lock(b"plain", 0).await.unwrap(), (None, 2));
    assert!(sm.plan_reclaim(u64::MAX).await.unwrap().is_empty());
    let cleanup = sm.plan_cleanup(0, 0).await.unwrap();
    let short = ExpiredKey {
        key: b"short".to_vec(),
        expires_at_ms: 1_500,
    };
    assert_eq!((cleanup.keys, cleanup.sessions), (vec![short], vec![]));

    // A retry of request 1 is answered from its record: nothing changes. A record of format 2
    // has no digest of its request, so even a retry with other ops is (`session`).
    let retry = request(1, 4, 1, 3_000, vec![put(b"plain", b"changed", None)]);
    apply(sm, vec![retry]).await.unwrap();
    assert_eq!(sm.applied().await.unwrap(), (2, Some(log_id(1, 1, 4))));
    let plain = sm.get(b"plain", 0).await.unwrap().0.unwrap();
    assert_eq!(plain.value, b"p", "a replay applies nothing");
}

#[tokio::test]
async fn v2_fixture_reads_back() {
    let (_dir, store) = open_fixture(2);
    check_v2(&store).await;
}

#[tokio::test]
async fn v2_fixture_writer_matches_expectations() {
    let dir = tempfile::tempdir().unwrap();
    write_v2(dir.path()).await;
    let store = open_in(dir.path());
    check_v2(&store).await;
}

pub(super) fn copy_dir(source: &Path, target: &Path) {
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
