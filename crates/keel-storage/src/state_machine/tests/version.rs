//! etcd's `version` of a key through the real writer and redb: what every write path stores
//! (puts, increments, fenced writes, format-1 writes), that a key created anew (absent,
//! deleted or expired) starts at 1, and that versions survive a reopen and a snapshot
//! install and are what history events and replayed request records hold.

use keel_types::command::legacy::BatchOpV1;
use keel_types::{
    BatchOp, Command, CommandOutcome, Condition, Fence, KeyValue, Mutation, OpResult, RequestId,
    Revision,
};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

use super::exactly_once::{Applier, at, put_ttl};
use super::history::history;
use super::{delete, kv, mutate, open, put};
use crate::store::Store;

/// `key`'s value, create and mod revision and version at `now_ms`; `None` if absent.
async fn lineage(
    applier: &Applier,
    key: &str,
    now_ms: u64,
) -> Option<(String, Revision, Revision, u64)> {
    let kv = applier.value(key, now_ms).await?;
    let value = String::from_utf8(kv.value).unwrap();
    Some((value, kv.create_revision, kv.mod_revision, kv.version))
}

fn increment(key: &str, delta: i64) -> BatchOp {
    BatchOp::Increment {
        key: key.as_bytes().to_vec(),
        delta,
    }
}

fn state(
    value: &str,
    create: Revision,
    modified: Revision,
    version: u64,
) -> Option<(String, Revision, Revision, u64)> {
    Some((value.to_string(), create, modified, version))
}

#[tokio::test]
async fn every_write_path_counts_versions_and_a_new_key_starts_at_1() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(mutate(vec![put("a", "1", None)])).await;
    assert_eq!(lineage(&applier, "a", 0).await, state("1", 1, 1, 1));
    applier.apply(mutate(vec![put("a", "2", None)])).await;
    assert_eq!(lineage(&applier, "a", 0).await, state("2", 1, 2, 2));
    applier.apply(mutate(vec![increment("a", 1)])).await;
    assert_eq!(lineage(&applier, "a", 0).await, state("3", 1, 3, 3));
    applier.apply(mutate(vec![delete("a", None)])).await;
    assert_eq!(lineage(&applier, "a", 0).await, None);
    // Created again: version 1 and a new create_revision.
    applier.apply(mutate(vec![put("a", "x", None)])).await;
    assert_eq!(lineage(&applier, "a", 0).await, state("x", 5, 5, 1));

    let fenced = Command::FencedMutate {
        fence: Fence {
            lock: b"l".to_vec(),
            token: 1,
        },
        mutation: Mutation {
            request: None,
            now_ms: 0,
            ops: vec![put("a", "y", None)],
        },
    };
    let outcome = applier.apply(fenced).await;
    assert!(
        matches!(outcome, CommandOutcome::Applied { revision: 6, .. }),
        "{outcome:?}"
    );
    assert_eq!(lineage(&applier, "a", 0).await, state("y", 5, 6, 2));
    let legacy = Command::Write {
        ops: vec![BatchOpV1::Put {
            key: b"a".to_vec(),
            value: b"z".to_vec(),
            condition: None,
            return_previous: false,
        }],
    };
    applier.apply(legacy).await;
    assert_eq!(lineage(&applier, "a", 0).await, state("z", 5, 7, 3));

    // A write that fails its condition writes nothing and counts nothing; the state it
    // reports carries the version.
    let refused = applier
        .apply(mutate(vec![put("a", "no", Some(Condition::Absent))]))
        .await;
    let CommandOutcome::ConditionFailed(failed) = refused else {
        panic!("expected a failed condition, got {refused:?}");
    };
    assert_eq!(failed.current.map(|kv| kv.version), Some(3));
    assert_eq!(lineage(&applier, "a", 0).await, state("z", 5, 7, 3));
}

#[tokio::test]
async fn a_write_over_an_expired_row_starts_at_version_1() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(at(1_000, vec![put_ttl("t", "1", 500)])).await; // 1
    applier.apply(at(1_100, vec![put_ttl("t", "2", 500)])).await; // 2
    assert_eq!(lineage(&applier, "t", 1_100).await, state("2", 1, 2, 2));
    // The row (version 2) expired at 1_600 and is not cleaned up yet.
    applier.apply(at(2_000, vec![put("t", "3", None)])).await; // 3
    assert_eq!(lineage(&applier, "t", 2_000).await, state("3", 3, 3, 1));
    applier.apply(at(2_000, vec![put_ttl("u", "7", 100)])).await; // 4
    applier.apply(at(2_000, vec![increment("u", 1)])).await; // 5
    assert_eq!(lineage(&applier, "u", 2_000).await, state("8", 4, 5, 2));
    applier.apply(at(3_000, vec![increment("u", 1)])).await; // 6
    assert_eq!(lineage(&applier, "u", 3_000).await, state("1", 6, 6, 1));
}

/// Writes `a` three times and `b` once (revisions 1 to 4).
async fn fill(applier: &mut Applier) {
    applier
        .apply(mutate(vec![put("a", "1", None), put("b", "1", None)]))
        .await;
    applier.apply(mutate(vec![put("a", "2", None)])).await;
    applier.apply(mutate(vec![increment("a", 1)])).await;
}

async fn check_filled(applier: &Applier) {
    assert_eq!(lineage(applier, "a", 0).await, state("3", 1, 3, 3));
    assert_eq!(lineage(applier, "b", 0).await, state("1", 1, 1, 1));
}

#[tokio::test]
async fn versions_survive_reopen_and_snapshot_install() {
    let dir = tempfile::tempdir().unwrap();
    let reopen =
        || Store::open(&dir.path().join("keel.redb"), &dir.path().join("snapshots")).unwrap();
    let store = reopen();
    let mut source = Applier::new(&store);
    fill(&mut source).await;
    store.shutdown();
    let store = reopen();
    let mut source = Applier {
        store: store.clone(),
        next: source.next,
    };
    check_filled(&source).await;

    let snapshot = source
        .sm()
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let (_dir_b, store_b) = open();
    let mut target = Applier::new(&store_b);
    target.apply(mutate(vec![put("a", "other", None)])).await;
    target
        .sm()
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    check_filled(&target).await;
    // Both count on from the versions they hold.
    target.next = source.next;
    for applier in [&mut source, &mut target] {
        applier.apply(mutate(vec![put("a", "4", None)])).await;
        assert_eq!(lineage(applier, "a", 0).await, state("4", 1, 4, 4));
    }
}

/// A put under request `sequence` of client `0xc2` that returns the key's previous state.
fn request(sequence: u64, key: &str, value: &str) -> Command {
    Command::Mutate(Mutation {
        request: Some(RequestId {
            client_id: 0xc2,
            client_started_ms: 1_000,
            sequence,
            completed_below: 1,
        }),
        now_ms: 1_000,
        ops: vec![BatchOp::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            condition: None,
            return_previous: true,
            ttl_ms: None,
        }],
    })
}

#[tokio::test]
async fn history_events_and_replayed_records_carry_versions() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(request(1, "a", "1")).await;
    let second = applier.apply(request(2, "a", "2")).await;
    let recorded = CommandOutcome::Applied {
        revision: 2,
        results: vec![OpResult {
            previous: Some(kv("a", "1", 1, 1, 1)),
            existed: true,
            counter: None,
        }],
    };
    assert_eq!(second, recorded);
    applier.apply(mutate(vec![put("a", "3", None)])).await;
    // The retry gets the recorded outcome, version and all, not the key's state now.
    let replayed = applier.apply(request(2, "a", "2")).await;
    assert_eq!(replayed, CommandOutcome::Replayed(Box::new(recorded)));
    assert_eq!(lineage(&applier, "a", 0).await, state("3", 1, 3, 3));

    let page = history(&applier.sm(), "a", 0, 0).await;
    let versions: Vec<(Revision, Option<u64>, Option<u64>)> = page
        .events
        .iter()
        .map(|event| {
            let version = |kv: &Option<KeyValue>| kv.as_ref().map(|kv| kv.version);
            (
                event.revision,
                version(&event.before),
                version(&event.after),
            )
        })
        .collect();
    assert_eq!(
        versions,
        vec![
            (1, None, Some(1)),
            (2, Some(1), Some(2)),
            (3, Some(2), Some(3))
        ]
    );
}
