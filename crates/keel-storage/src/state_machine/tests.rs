//! Apply semantics through the real writer and redb: outcomes, revisions, atomicity, and
//! scan paging. The helpers here are shared with the tests of the state machine as a whole
//! in `tests/`: exactly-once state, coordination, splits, the meta range, upkeep plans,
//! keys' versions and the planted bugs.

use keel_types::{
    BatchOp, Command, CommandOutcome, Condition, KeyValue, Mutation, RangeId, Revision,
};
use openraft::entry::RaftEntry;

use crate::op::{Op, Outcome};
use crate::raft_types::{Entry, TypeConfig};
use crate::store::Store;

mod at_revision;
mod coordination;
mod exactly_once;
mod history;
mod lease;
mod meta;
mod planted_bugs;
mod split;
mod txn;
mod upkeep;
mod version;

pub(crate) fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("keel.redb"), &dir.path().join("snapshots")).unwrap();
    (dir, store)
}

pub(crate) fn put(key: &str, value: &str, condition: Option<Condition>) -> BatchOp {
    BatchOp::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        condition,
        return_previous: false,
        ttl_ms: None,
    }
}

/// The stored state of `key`: `value`, its revisions and version, no TTL.
pub(super) fn kv(
    key: &str,
    value: &str,
    create_revision: Revision,
    mod_revision: Revision,
    version: u64,
) -> KeyValue {
    KeyValue {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        create_revision,
        mod_revision,
        version,
        expires_at_ms: None,
        lease: 0,
    }
}

pub(super) fn delete(key: &str, condition: Option<Condition>) -> BatchOp {
    BatchOp::Delete {
        key: key.as_bytes().to_vec(),
        condition,
        return_previous: false,
    }
}

/// A mutation without a request id at time 0 (so at the range's clock).
pub(crate) fn mutate(ops: Vec<BatchOp>) -> Command {
    Command::Mutate(Mutation {
        request: None,
        now_ms: 0,
        ops,
    })
}

/// Applies one command per item to range 1 at consecutive log indexes; returns the outcomes.
pub(crate) async fn apply_commands(
    store: &Store,
    first_index: u64,
    commands: Vec<Command>,
) -> Vec<CommandOutcome> {
    apply_commands_to(store, RangeId(1), first_index, commands).await
}

/// Applies one command per item to `range` at consecutive log indexes; returns the outcomes.
pub(super) async fn apply_commands_to(
    store: &Store,
    range: RangeId,
    first_index: u64,
    commands: Vec<Command>,
) -> Vec<CommandOutcome> {
    let entries: Vec<Entry> = commands
        .into_iter()
        .enumerate()
        .map(|(offset, command)| {
            let log_id = openraft::testing::log_id::<TypeConfig>(1, 1, first_index + offset as u64);
            Entry::new_normal(log_id, command)
        })
        .collect();
    let op = Op::Apply { range, entries };
    match store.call(op).await.unwrap() {
        Outcome::Applied(outcomes) => outcomes,
        _ => panic!("apply yields outcomes"),
    }
}

/// Applies one write per item at consecutive log indexes; returns the outcomes.
async fn apply_writes(
    store: &Store,
    first_index: u64,
    writes: Vec<Vec<BatchOp>>,
) -> Vec<CommandOutcome> {
    let commands = writes.into_iter().map(mutate).collect();
    apply_commands(store, first_index, commands).await
}

/// `(key, value, create_revision, mod_revision)` of every row, and the range revision.
async fn contents(store: &Store) -> (Vec<(String, String, Revision, Revision)>, Revision) {
    let page = store
        .state_machine(RangeId(1))
        .scan(b"", b"", 0, 0)
        .await
        .unwrap();
    let rows = page
        .kvs
        .into_iter()
        .map(|kv: KeyValue| {
            let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
            (
                text(kv.key),
                text(kv.value),
                kv.create_revision,
                kv.mod_revision,
            )
        })
        .collect();
    (rows, page.revision)
}

fn applied_at(outcome: &CommandOutcome) -> Option<Revision> {
    match outcome {
        CommandOutcome::Applied { revision, .. } => Some(*revision),
        _ => None,
    }
}

/// Starting from `a=1` (rev 1) and `b=2` (rev 2), applies `ops` as one write and compares
/// the outcome's revision (None = condition failed) and the resulting rows and revision.
async fn check(
    ops: Vec<BatchOp>,
    revision: Option<Revision>,
    rows: &[(&str, &str, Revision, Revision)],
) {
    let (_dir, store) = open();
    apply_writes(
        &store,
        1,
        vec![vec![put("a", "1", None)], vec![put("b", "2", None)]],
    )
    .await;
    let outcomes = apply_writes(&store, 3, vec![ops.clone()]).await;
    assert_eq!(applied_at(&outcomes[0]), revision, "{ops:?}: {outcomes:?}");
    let expected: Vec<(String, String, Revision, Revision)> = rows
        .iter()
        .map(|(key, value, create, modified)| {
            (key.to_string(), value.to_string(), *create, *modified)
        })
        .collect();
    let expected_revision = revision.unwrap_or(2);
    assert_eq!(
        contents(&store).await,
        (expected, expected_revision),
        "{ops:?}"
    );
}

#[tokio::test]
async fn write_semantics() {
    use Condition::{Absent, Revision as At, Value};
    let untouched: &[(&str, &str, Revision, Revision)] = &[("a", "1", 1, 1), ("b", "2", 2, 2)];
    check(
        vec![put("a", "x", None)],
        Some(3),
        &[("a", "x", 1, 3), ("b", "2", 2, 2)],
    )
    .await;
    check(
        vec![put("c", "x", Some(Absent))],
        Some(3),
        &[("a", "1", 1, 1), ("b", "2", 2, 2), ("c", "x", 3, 3)],
    )
    .await;
    check(vec![put("a", "x", Some(Absent))], None, untouched).await;
    check(vec![delete("a", Some(At(1)))], Some(3), &[("b", "2", 2, 2)]).await;
    check(vec![delete("a", Some(At(2)))], None, untouched).await;
    check(vec![delete("zz", None)], Some(3), untouched).await;
    check(
        vec![put("b", "y", Some(Value(b"2".to_vec())))],
        Some(3),
        &[("a", "1", 1, 1), ("b", "y", 2, 3)],
    )
    .await;
    // Batch atomicity: a failing condition anywhere applies nothing.
    check(
        vec![
            put("a", "x", None),
            delete("b", None),
            put("c", "z", Some(At(9))),
        ],
        None,
        untouched,
    )
    .await;
    // Later ops see earlier ones; every op of a batch shares one revision.
    check(
        vec![
            delete("a", None),
            put("a", "new", Some(Absent)),
            put("b", "y", Some(At(2))),
        ],
        Some(3),
        &[("a", "new", 3, 3), ("b", "y", 2, 3)],
    )
    .await;
}

#[tokio::test]
async fn revisions_grow_by_one_per_applied_write_only() {
    let (_dir, store) = open();
    let blank = Entry::new_blank(openraft::testing::log_id::<TypeConfig>(1, 1, 1));
    let op = Op::Apply {
        range: RangeId(1),
        entries: vec![blank],
    };
    assert!(
        matches!(store.call(op).await.unwrap(), Outcome::Applied(outcomes) if outcomes == vec![CommandOutcome::Internal])
    );
    let writes = vec![
        vec![put("k", "1", None)],
        vec![put("k", "2", Some(Condition::Absent))],
        vec![put("k", "3", Some(Condition::Revision(1)))],
        vec![delete("k", None)],
        vec![put("k", "4", None)],
    ];
    let outcomes = apply_writes(&store, 2, writes).await;
    let revisions: Vec<Option<Revision>> = outcomes.iter().map(applied_at).collect();
    assert_eq!(revisions, vec![Some(1), None, Some(2), Some(3), Some(4)]);
    let CommandOutcome::ConditionFailed(failed) = &outcomes[1] else {
        panic!("{outcomes:?}")
    };
    assert_eq!((failed.op_index, failed.revision), (0, 1));
    assert_eq!(
        failed.current.as_ref().map(|kv| kv.value.clone()),
        Some(b"1".to_vec())
    );
    // Recreated after a delete: a new create_revision.
    let (rows, revision) = contents(&store).await;
    assert_eq!(rows, vec![("k".to_string(), "4".to_string(), 4, 4)]);
    assert_eq!(revision, 4);
    let sm = store.state_machine(RangeId(1));
    let applied = sm.applied().await.unwrap();
    assert_eq!(
        applied,
        (4, Some(openraft::testing::log_id::<TypeConfig>(1, 1, 6)))
    );
}

#[tokio::test]
async fn scan_pages_by_limit_and_bounds() {
    let (_dir, store) = open();
    let ops = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|key| put(key, "v", None))
        .collect();
    apply_writes(&store, 1, vec![ops]).await;
    let sm = store.state_machine(RangeId(1));
    let keys = |page: &crate::ScanPage| -> Vec<Vec<u8>> {
        page.kvs.iter().map(|kv| kv.key.clone()).collect()
    };

    let page = sm.scan(b"", b"", 2, 0).await.unwrap();
    assert_eq!(keys(&page), vec![b"a".to_vec(), b"b".to_vec()]);
    assert_eq!(page.next_start, Some(b"b\0".to_vec()));
    let page = sm.scan(b"b\0", b"", 2, 0).await.unwrap();
    assert_eq!(keys(&page), vec![b"c".to_vec(), b"d".to_vec()]);
    let page = sm.scan(b"d\0", b"", 2, 0).await.unwrap();
    assert_eq!((keys(&page), page.next_start), (vec![b"e".to_vec()], None));
    // Exactly `limit` rows left: no next page.
    let page = sm.scan(b"d", b"", 2, 0).await.unwrap();
    assert_eq!(page.next_start, None);
    // End is exclusive.
    let page = sm.scan(b"b", b"d", 10, 0).await.unwrap();
    assert_eq!(
        (keys(&page), page.next_start),
        (vec![b"b".to_vec(), b"c".to_vec()], None)
    );
    assert_eq!(page.revision, 1);
    assert_eq!(
        sm.get(b"c", 0).await.unwrap().0.map(|kv| kv.mod_revision),
        Some(1)
    );
    assert_eq!(sm.get(b"zz", 0).await.unwrap(), (None, 1));
}
