//! Splits through the real writer and redb: what each half reads, writes and refuses after
//! a split, what the child inherits, what snapshots of the halves carry, installs over other
//! spans, and how a store tells a caller that its ranges changed.

use std::collections::BTreeMap;

use keel_types::{
    Acquirer, BatchOp, Cleanup, Command, CommandOutcome, Coordination, CoordinationCounts,
    CoordinationOp, ExpiredKey, ExpiredRecord, Fence, KeyValue, LockHold, Mutation,
    RangeDescriptor, RangeId, Reclaim, Rejection, RequestId, Revision, Split,
};
use openraft::entry::RaftEntry;
use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use redb::ReadableTableMetadata;

use super::{apply_commands_to, mutate, open, put};
use crate::error::StorageError;
use crate::op::{Op, Outcome};
use crate::raft_types::{Entry, Membership, Snapshot, TypeConfig};
use crate::split::initial_log_id;
use crate::state_machine::{KeyRead, RangeCounts, StateMachine};
use crate::store::Store;
use crate::tables::{InstallMarker, KV, TTL};

const CLIENT: u64 = 0x5b;

/// Applies commands to the ranges of one store, each range at its own next log index.
struct Ranges {
    store: Store,
    next: BTreeMap<RangeId, u64>,
}

impl Ranges {
    fn new(store: &Store) -> Ranges {
        Ranges {
            store: store.clone(),
            next: BTreeMap::new(),
        }
    }

    fn index(&mut self, range: RangeId) -> u64 {
        let next = self.next.entry(range).or_insert(1);
        *next += 1;
        *next - 1
    }

    async fn apply(&mut self, range: RangeId, command: Command) -> CommandOutcome {
        let index = self.index(range);
        let outcomes = apply_commands_to(&self.store, range, index, vec![command]).await;
        outcomes.into_iter().next().unwrap()
    }

    /// Applies a membership entry making `voters` the range's voters.
    async fn membership(&mut self, range: RangeId, voters: &[u64]) {
        self.membership_of(range, &[voters], &[]).await;
    }

    /// Applies a membership entry with the voter `configs` (two: joint) and `learners`.
    async fn membership_of(&mut self, range: RangeId, configs: &[&[u64]], learners: &[u64]) {
        let index = self.index(range);
        let log_id = openraft::testing::log_id::<TypeConfig>(1, 1, index);
        let configs = configs
            .iter()
            .map(|voters| voters.iter().copied().collect())
            .collect();
        let learners: std::collections::BTreeSet<u64> = learners.iter().copied().collect();
        let membership = Membership::new_with_defaults(configs, learners);
        let entries = vec![Entry::new_membership(log_id, membership)];
        let op = Op::Apply { range, entries };
        assert!(matches!(
            self.store.call(op).await.unwrap(),
            Outcome::Applied(_)
        ));
    }

    fn sm(&self, range: RangeId) -> StateMachine {
        self.store.state_machine(range)
    }
}

fn request(sequence: u64, ops: Vec<BatchOp>) -> Command {
    Command::Mutate(Mutation {
        request: Some(RequestId {
            client_id: CLIENT,
            client_started_ms: 1_000,
            sequence,
            completed_below: 1,
        }),
        now_ms: 2_000,
        ops,
    })
}

fn put_ttl(key: &str, value: &str, ttl_ms: u64) -> BatchOp {
    BatchOp::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: Some(ttl_ms),
    }
}

fn split(at: &str, child: u64, expected_epoch: u64) -> Command {
    Command::Split(Split {
        at: at.as_bytes().to_vec(),
        child: RangeId(child),
        expected_epoch,
    })
}

fn span(id: u64, start: &str, end: Option<&str>, epoch: u64, conf: u64) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(id),
        start: start.as_bytes().to_vec(),
        end: end.map(|end| end.as_bytes().to_vec()),
        epoch,
        conf_version: conf,
        replicas: vec![1, 2, 3],
    }
}

fn lock_op(name: &str) -> Command {
    Command::Coordinate(Coordination {
        request: None,
        now_ms: 2_000,
        op: CoordinationOp::Acquire {
            name: name.as_bytes().to_vec(),
            acquirer: Acquirer {
                owner: b"o".to_vec(),
                ttl_ms: 60_000,
                lock_delay_ms: 0,
            },
        },
    })
}

fn fenced(token: u64, key: &str) -> Command {
    Command::FencedMutate {
        fence: Fence {
            lock: b"a-lock".to_vec(),
            token,
        },
        mutation: Mutation {
            request: None,
            now_ms: 2_000,
            ops: vec![put(key, "f", None)],
        },
    }
}

fn revision_of(outcome: &CommandOutcome) -> Revision {
    match outcome {
        CommandOutcome::Applied { revision, .. } => *revision,
        CommandOutcome::Coordinated { revision, .. } => *revision,
        other => panic!("expected an applied outcome, got {other:?}"),
    }
}

fn out_of_range(key: &str, range: RangeDescriptor) -> CommandOutcome {
    CommandOutcome::Rejected(Rejection::KeyOutOfRange {
        key: key.as_bytes().to_vec(),
        range,
    })
}

async fn keys(sm: &StateMachine) -> Vec<String> {
    let page = sm.scan(b"", b"", 0, 0).await.unwrap();
    page.kvs
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect()
}

/// Range 1 (voters 1, 2, 3) with keys `a`..`f` (request 1 wrote `a` and `e`; `b` and `f`
/// expire at 3_000, the clock is 2_000), locks `a-lock` and `x-lock`, the fence of `c` by
/// `a-lock` and an idempotency record `rec-y`. Returns its revision.
async fn fill(ranges: &mut Ranges) -> Revision {
    let first = RangeId::FIRST;
    ranges.membership(first, &[1, 2, 3]).await;
    let written = ranges
        .apply(
            first,
            request(1, vec![put("a", "1", None), put("e", "5", None)]),
        )
        .await;
    assert_eq!(revision_of(&written), 1);
    let ops = vec![
        put_ttl("b", "2", 1_000),
        put("c", "3", None),
        put("d", "4", None),
        put_ttl("f", "6", 1_000),
    ];
    ranges.apply(first, request(2, ops)).await;
    let token = revision_of(&ranges.apply(first, lock_op("a-lock")).await);
    ranges.apply(first, lock_op("x-lock")).await;
    ranges.apply(first, fenced(token, "c")).await;
    let begin = Command::Coordinate(Coordination {
        request: None,
        now_ms: 2_000,
        op: CoordinationOp::Begin {
            key: b"rec-y".to_vec(),
            owner: b"o".to_vec(),
            ttl_ms: 10_000,
        },
    });
    ranges.apply(first, begin).await;
    ranges.sm(first).applied().await.unwrap().0
}

/// `fill`, then a split at `d` into range 2. Returns the revision before the split.
async fn split_filled(ranges: &mut Ranges) -> Revision {
    let before = fill(ranges).await;
    let outcome = ranges.apply(RangeId::FIRST, split("d", 2, 0)).await;
    let expected = CommandOutcome::Split {
        left: span(1, "", Some("d"), 1, 1),
        right: span(2, "d", None, 1, 1),
    };
    assert_eq!(outcome, expected);
    before
}

#[tokio::test]
async fn each_half_reads_and_writes_only_its_span() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    let (parent, child) = (RangeId(1), RangeId(2));
    assert_eq!(keys(&ranges.sm(parent)).await, ["a", "b", "c"]);
    assert_eq!(keys(&ranges.sm(child)).await, ["d", "e", "f"]);
    assert_eq!(ranges.sm(parent).get(b"e", 0).await.unwrap().0, None);
    assert!(ranges.sm(child).get(b"e", 0).await.unwrap().0.is_some());
    let left = span(1, "", Some("d"), 1, 1);
    let right = span(2, "d", None, 1, 1);
    assert_eq!(ranges.sm(parent).descriptor().await.unwrap(), left);
    assert_eq!(ranges.sm(child).descriptor().await.unwrap(), right);
    // A read of a key that split off names the range it read from.
    match ranges.sm(parent).read_key(b"e", 0).await.unwrap() {
        KeyRead::Outside { descriptor, .. } => assert_eq!(descriptor, left),
        inside => panic!("{inside:?}"),
    }
    let read = ranges.sm(child).read_key(b"e", 0).await.unwrap();
    assert!(
        matches!(read, KeyRead::Inside { kv: Some(_), .. }),
        "{read:?}"
    );

    // A key outside the span is refused whole: nothing written, no record, no session.
    let counts = ranges.sm(parent).counts().await.unwrap();
    let refused = ranges
        .apply(
            parent,
            request(3, vec![put("a", "x", None), put("e", "x", None)]),
        )
        .await;
    assert_eq!(refused, out_of_range("e", left.clone()));
    assert_eq!(ranges.sm(parent).counts().await.unwrap(), counts);
    assert_eq!(
        ranges
            .sm(parent)
            .get(b"a", 0)
            .await
            .unwrap()
            .0
            .unwrap()
            .value,
        b"1"
    );
    // The same request id is then applied where the key belongs.
    let applied = ranges
        .apply(child, request(3, vec![put("e", "x", None)]))
        .await;
    assert!(
        matches!(applied, CommandOutcome::Applied { .. }),
        "{applied:?}"
    );
    let unknown = Command::Mutate(Mutation {
        request: None,
        now_ms: 0,
        ops: vec![put("c", "x", None)],
    });
    assert_eq!(
        ranges.apply(child, unknown).await,
        out_of_range("c", right.clone())
    );
    // Lock names, idempotency keys and fenced writes are checked the same way.
    assert_eq!(
        ranges.apply(child, lock_op("b-lock")).await,
        out_of_range("b-lock", right)
    );
    assert_eq!(
        ranges.apply(parent, fenced(9, "z")).await,
        out_of_range("z", left)
    );
    assert!(
        ranges
            .sm(parent)
            .lock(b"a-lock", 0)
            .await
            .unwrap()
            .0
            .is_some()
    );
    assert_eq!(ranges.sm(parent).lock(b"x-lock", 0).await.unwrap().0, None);
    assert!(
        ranges
            .sm(child)
            .lock(b"x-lock", 0)
            .await
            .unwrap()
            .0
            .is_some()
    );
    // Each half lists its own held locks, as many rows as asked at most.
    let names = |held: Vec<(Vec<u8>, LockHold)>| -> Vec<Vec<u8>> {
        held.into_iter().map(|(name, _)| name).collect()
    };
    let (parent_held, more) = ranges.sm(parent).held_locks(0, 10).await.unwrap();
    assert_eq!(
        (names(parent_held), more),
        (vec![b"a-lock".to_vec()], false)
    );
    let (child_held, more) = ranges.sm(child).held_locks(0, 10).await.unwrap();
    assert_eq!((names(child_held), more), (vec![b"x-lock".to_vec()], false));
    let (none, more) = ranges.sm(child).held_locks(0, 0).await.unwrap();
    assert_eq!((none.len(), more), (0, true));
}

#[tokio::test]
async fn a_request_applied_before_the_split_replays_on_both_halves() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    let retry = || request(1, vec![put("a", "1", None), put("e", "5", None)]);
    let changed = || {
        request(
            1,
            vec![put("a", "changed", None), put("e", "changed", None)],
        )
    };
    let reused = CommandOutcome::Rejected(Rejection::RequestIdReused {
        client_id: CLIENT,
        sequence: 1,
    });
    for range in [RangeId(1), RangeId(2)] {
        let replayed = ranges.apply(range, retry()).await;
        assert!(
            matches!(&replayed, CommandOutcome::Replayed(first) if revision_of(first) == 1),
            "{range}: {replayed:?}"
        );
        // Another request under the same id is refused on both halves.
        assert_eq!(ranges.apply(range, changed()).await, reused, "{range}");
    }
    assert_eq!(
        ranges
            .sm(RangeId(1))
            .get(b"a", 0)
            .await
            .unwrap()
            .0
            .unwrap()
            .value,
        b"1"
    );
    assert_eq!(
        ranges
            .sm(RangeId(2))
            .get(b"e", 0)
            .await
            .unwrap()
            .0
            .unwrap()
            .value,
        b"5"
    );
}

#[tokio::test]
async fn the_child_inherits_revision_clock_and_membership() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    let before = split_filled(&mut ranges).await;
    let child = RangeId(2);
    let (revision, applied) = ranges.sm(child).applied().await.unwrap();
    assert_eq!((revision, applied), (before, Some(initial_log_id())));
    // openraft sees an initialized group snapshotted at the initial log id.
    let (applied, membership) = ranges.sm(child).applied_state().await.unwrap();
    assert_eq!(applied, Some(initial_log_id()));
    assert_eq!(membership.log_id(), &Some(initial_log_id()));
    assert_eq!(membership.voter_ids().collect::<Vec<_>>(), vec![1, 2, 3]);
    let log = store.log_store(child).get_log_state().await.unwrap();
    assert_eq!(log.last_purged_log_id, Some(initial_log_id()));
    assert_eq!(log.last_log_id, Some(initial_log_id()));
    assert_eq!(
        store.ranges().unwrap(),
        vec![RangeId(2)],
        "only the child has Raft state"
    );

    // Proposed at time 0, the write runs at the clock the child inherited (2_000).
    let written = ranges.apply(
        child,
        Command::Mutate(Mutation {
            request: None,
            now_ms: 0,
            ops: vec![put_ttl("x", "1", 500)],
        }),
    );
    assert_eq!(revision_of(&written.await), before + 1);
    let x = ranges.sm(child).get(b"x", 0).await.unwrap();
    assert_eq!((x.0.unwrap().expires_at_ms, x.1), (Some(2_500), before + 1));
}

#[tokio::test]
async fn counts_of_the_halves_add_up() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    fill(&mut ranges).await;
    let whole = ranges.sm(RangeId(1)).counts().await.unwrap();
    let coordination = ranges.sm(RangeId(1)).coordination_counts().await.unwrap();
    ranges.apply(RangeId(1), split("d", 2, 0)).await;
    let (left, right) = (ranges.sm(RangeId(1)), ranges.sm(RangeId(2)));
    let (left_counts, right_counts) = (left.counts().await.unwrap(), right.counts().await.unwrap());
    let expected_right = RangeCounts {
        sessions: 1,
        requests: 2,
        keys_with_ttl: 1,
        keys: 3,
        size_bytes: 6,
    };
    assert_eq!(right_counts, expected_right);
    let expected_left = RangeCounts {
        keys_with_ttl: 1,
        keys: 3,
        size_bytes: 6,
        ..expected_right
    };
    assert_eq!(left_counts, expected_left);
    assert_eq!(
        (whole.sessions, whole.requests),
        (left_counts.sessions, left_counts.requests),
        "sessions and records are copied"
    );
    assert_eq!(left_counts.keys + right_counts.keys, whole.keys);
    assert_eq!(
        left_counts.size_bytes + right_counts.size_bytes,
        whole.size_bytes
    );
    assert_eq!(
        left_counts.keys_with_ttl + right_counts.keys_with_ttl,
        whole.keys_with_ttl
    );
    let expected = |locks, fenced_keys, idempotency_records| CoordinationCounts {
        locks,
        fenced_keys,
        idempotency_records,
    };
    assert_eq!(coordination, expected(2, 1, 1));
    assert_eq!(left.coordination_counts().await.unwrap(), expected(1, 1, 0));
    assert_eq!(
        right.coordination_counts().await.unwrap(),
        expected(1, 0, 1)
    );
}

#[tokio::test]
async fn split_key_halves_the_bytes() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    let first = RangeId::FIRST;
    let mutate = |ops| {
        Command::Mutate(Mutation {
            request: None,
            now_ms: 0,
            ops,
        })
    };
    assert_eq!(ranges.sm(first).split_key().await.unwrap(), None, "no keys");
    ranges.apply(first, mutate(vec![put("k", "v", None)])).await;
    assert_eq!(ranges.sm(first).split_key().await.unwrap(), None, "one key");
    // Four rows of 10 bytes: the bytes before `m3` are half.
    let rows = ["m1", "m2", "m3", "m4"].map(|key| put(key, "vvvvvvvv", None));
    ranges.apply(first, mutate(rows.to_vec())).await;
    ranges
        .apply(
            first,
            mutate(vec![BatchOp::Delete {
                key: b"k".to_vec(),
                condition: None,
                return_previous: false,
            }]),
        )
        .await;
    assert_eq!(
        ranges.sm(first).split_key().await.unwrap(),
        Some(b"m3".to_vec())
    );
    // A first row holding most bytes: the split still leaves it a key on each side.
    ranges
        .apply(first, mutate(vec![put("a", &"v".repeat(1_000), None)]))
        .await;
    assert_eq!(
        ranges.sm(first).split_key().await.unwrap(),
        Some(b"m1".to_vec())
    );
    // Within the span of a half: of `m2`, `m3`, `m4`, the first two hold half the bytes.
    ranges.apply(first, split("m2", 2, 0)).await;
    assert_eq!(
        ranges.sm(RangeId(2)).split_key().await.unwrap(),
        Some(b"m4".to_vec())
    );
    assert_eq!(
        ranges.sm(first).split_key().await.unwrap(),
        Some(b"m1".to_vec())
    );
}

#[tokio::test]
async fn a_split_at_another_epoch_or_outside_the_span_changes_nothing() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    let (parent, child) = (RangeId(1), RangeId(2));
    let left = span(1, "", Some("d"), 1, 1);
    let mismatch = |expected_epoch, range: &RangeDescriptor| {
        CommandOutcome::Rejected(Rejection::EpochMismatch {
            expected_epoch,
            range: range.clone(),
        })
    };
    let cases = [
        (split("b", 3, 0), mismatch(0, &left)),
        (split("e", 3, 1), mismatch(1, &left)),
        (split("", 3, 1), mismatch(1, &left)),
        (split("d", 3, 1), mismatch(1, &left)),
    ];
    for (command, expected) in cases {
        assert_eq!(ranges.apply(parent, command).await, expected);
    }
    assert_eq!(ranges.sm(parent).descriptor().await.unwrap(), left);
    assert!(
        !store
            .descriptors()
            .await
            .unwrap()
            .iter()
            .any(|d| d.id == RangeId(3))
    );
    // At the current epoch the parent splits again; so does the child, at its own.
    let outcome = ranges.apply(parent, split("b", 3, 1)).await;
    assert_eq!(
        outcome,
        CommandOutcome::Split {
            left: span(1, "", Some("b"), 2, 1),
            right: span(3, "b", Some("d"), 2, 1),
        }
    );
    ranges.apply(child, split("e", 4, 1)).await;
    let descriptors = store.descriptors().await.unwrap();
    let spans: Vec<(u64, String)> = descriptors
        .iter()
        .map(|d| (d.id.0, d.span_text()))
        .collect();
    let expected = [
        (1, r#"["", "b")"#),
        (2, r#"["d", "e")"#),
        (3, r#"["b", "d")"#),
        (4, r#"["e", +inf)"#),
    ];
    let expected: Vec<(u64, String)> = expected
        .iter()
        .map(|(id, text)| (*id, text.to_string()))
        .collect();
    assert_eq!(spans, expected);
    assert_eq!(keys(&ranges.sm(RangeId(3))).await, ["b", "c"]);
    assert_eq!(keys(&ranges.sm(RangeId(4))).await, ["e", "f"]);
}

#[tokio::test]
async fn a_split_of_a_range_changing_its_membership_is_refused() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    let first = RangeId::FIRST;
    ranges
        .apply(
            first,
            request(1, vec![put("a", "1", None), put("n", "2", None)]),
        )
        .await;
    let joint: [&[u64]; 2] = [&[1, 2, 3], &[1, 2, 4]];
    let changing: [(&[&[u64]], &[u64]); 2] = [(&[&[1, 2, 3]], &[4]), (&joint, &[])];
    for (configs, learners) in changing {
        ranges.membership_of(first, configs, learners).await;
        let before = ranges.sm(first).descriptor().await.unwrap();
        let outcome = ranges.apply(first, split("m", 2, before.epoch)).await;
        assert_eq!(
            outcome,
            CommandOutcome::Rejected(Rejection::MembershipChanging {
                range: before.clone()
            }),
            "{configs:?} learners {learners:?}"
        );
        assert_eq!(ranges.sm(first).descriptor().await.unwrap(), before);
        assert_eq!(store.descriptors().await.unwrap(), vec![before]);
    }
    ranges.membership(first, &[1, 2, 4]).await;
    let outcome = ranges.apply(first, split("m", 2, 0)).await;
    assert!(
        matches!(outcome, CommandOutcome::Split { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn conf_version_counts_membership_entries() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    let first = RangeId::FIRST;
    ranges.membership(first, &[1]).await;
    ranges.membership(first, &[1, 2]).await;
    ranges.membership(first, &[2, 3, 1]).await;
    let descriptor = ranges.sm(first).descriptor().await.unwrap();
    assert_eq!(
        (descriptor.conf_version, descriptor.replicas),
        (3, vec![1, 2, 3])
    );
    ranges.apply(first, split("m", 2, 0)).await;
    assert_eq!(
        ranges
            .sm(RangeId(2))
            .descriptor()
            .await
            .unwrap()
            .conf_version,
        3
    );
}

#[tokio::test]
async fn cleanup_and_reclaim_skip_items_outside_the_span() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    let expired = |key: &str| ExpiredKey {
        key: key.as_bytes().to_vec(),
        expires_at_ms: 3_000,
    };
    // Both halves are asked to remove both expired keys; each removes its own only.
    let plan = ranges.sm(RangeId(1)).plan_cleanup(5_000, 0).await.unwrap();
    assert_eq!(plan.keys, vec![expired("b")]);
    let cleanup = Cleanup {
        now_ms: 5_000,
        keys: vec![expired("b"), expired("f")],
        sessions: vec![],
        sessions_idle_before_ms: 0,
    };
    ranges.apply(RangeId(1), Command::Cleanup(cleanup)).await;
    assert_eq!(ranges.sm(RangeId(1)).counts().await.unwrap().keys, 2);
    assert_eq!(ranges.sm(RangeId(2)).counts().await.unwrap().keys, 3);
    assert!(raw_row_exists(&store, b"f").await, "the child's key stays");
    let plan = ranges.sm(RangeId(2)).plan_cleanup(5_000, 0).await.unwrap();
    assert_eq!(plan.keys, vec![expired("f")]);

    // `a-lock` is the parent's, `x-lock` and `rec-y` the child's (free at 62_000 and
    // expired at 12_000).
    let due = |key: &str, at_ms| ExpiredRecord {
        key: key.as_bytes().to_vec(),
        at_ms,
    };
    let reclaim = || Reclaim {
        now_ms: 100_000,
        locks: vec![due("a-lock", 62_000), due("x-lock", 62_000)],
        records: vec![due("rec-y", 12_000)],
    };
    ranges.apply(RangeId(1), Command::Reclaim(reclaim())).await;
    let counts = |locks, idempotency_records| CoordinationCounts {
        locks,
        fenced_keys: 0,
        idempotency_records,
    };
    assert_eq!(
        ranges.sm(RangeId(2)).coordination_counts().await.unwrap(),
        counts(1, 1)
    );
    ranges.apply(RangeId(2), Command::Reclaim(reclaim())).await;
    assert_eq!(
        ranges.sm(RangeId(2)).coordination_counts().await.unwrap(),
        counts(0, 0)
    );
    let parent = ranges.sm(RangeId(1)).coordination_counts().await.unwrap();
    assert_eq!((parent.locks, parent.fenced_keys), (0, 1));
}

/// Whether the file's `kv` table holds `key`, whichever range owns it.
async fn raw_row_exists(store: &Store, key: &'static [u8]) -> bool {
    store
        .read(move |txn| {
            let kv = txn
                .open_table(KV)
                .map_err(|e| StorageError::redb("open kv", e))?;
            let row = kv.get(key).map_err(|e| StorageError::redb("read kv", e))?;
            Ok(row.is_some())
        })
        .await
        .unwrap()
}

/// Rows of the file's `kv` and `ttl` tables, whichever range owns them.
async fn raw_row_counts(store: &Store) -> (u64, u64) {
    store
        .read(|txn| {
            let len = |table| -> Result<u64, StorageError> {
                let table = txn
                    .open_table(table)
                    .map_err(|e| StorageError::redb("open table", e))?;
                table.len().map_err(|e| StorageError::redb("count rows", e))
            };
            Ok((len(KV)?, len(TTL)?))
        })
        .await
        .unwrap()
}

/// Rows of the `history` table of the file.
async fn raw_event_count(store: &Store) -> u64 {
    store
        .read(|txn| {
            let history = txn
                .open_table(crate::tables::HISTORY)
                .map_err(|e| StorageError::redb("open table", e))?;
            history
                .len()
                .map_err(|e| StorageError::redb("count rows", e))
        })
        .await
        .unwrap()
}

async fn snapshot_of(sm: &mut StateMachine) -> Snapshot {
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
}

/// What a half looks like to a reader: descriptor, rows, counts, locks.
async fn view(
    sm: &StateMachine,
) -> (
    RangeDescriptor,
    Vec<KeyValue>,
    RangeCounts,
    CoordinationCounts,
) {
    (
        sm.descriptor().await.unwrap(),
        sm.scan(b"", b"", 0, 0).await.unwrap().kvs,
        sm.counts().await.unwrap(),
        sm.coordination_counts().await.unwrap(),
    )
}

#[tokio::test]
async fn snapshots_of_the_halves_carry_their_span_only() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    for range in [RangeId(1), RangeId(2)] {
        let mut source = ranges.sm(range);
        let snapshot = snapshot_of(&mut source).await;
        let (_target_dir, target_store) = open();
        let mut target = target_store.state_machine(range);
        let mut events = target_store.range_events();
        target
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
        assert!(events.has_changed().unwrap(), "an install is a range event");
        events.mark_unchanged();
        assert_eq!(view(&target).await, view(&source).await, "{range}");
        assert_eq!(
            raw_row_counts(&target_store).await,
            (3, 1),
            "{range}: its rows only"
        );
        assert_eq!(
            target_store.descriptors().await.unwrap(),
            vec![source.descriptor().await.unwrap()]
        );
        assert_eq!(
            target.applied().await.unwrap(),
            source.applied().await.unwrap()
        );
    }
}

#[tokio::test]
async fn installing_a_smaller_span_clears_the_rows_of_the_old_one() {
    let (_source_dir, source_store) = open();
    let mut source = Ranges::new(&source_store);
    split_filled(&mut source).await;
    let snapshot = snapshot_of(&mut source.sm(RangeId(1))).await;

    // The target's range 1 still spans everything, with rows on both sides of `d`.
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    fill(&mut ranges).await;
    ranges
        .apply(
            RangeId(1),
            Command::Mutate(Mutation {
                request: None,
                now_ms: 0,
                ops: vec![put("zz", "1", None), put_ttl("yy", "1", 10)],
            }),
        )
        .await;
    assert_eq!(raw_row_counts(&store).await, (8, 3));
    let mut sm = ranges.sm(RangeId(1));
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(view(&sm).await, view(&source.sm(RangeId(1))).await);
    assert_eq!(
        raw_row_counts(&store).await,
        (3, 1),
        "rows beyond `d` are gone"
    );
    for key in [&b"e"[..], b"zz", b"yy"] {
        assert!(!raw_row_exists(&store, key).await, "{key:?}");
    }
    assert_eq!(
        raw_event_count(&store).await,
        0,
        "the events of the old span are gone"
    );
}

#[tokio::test]
async fn snapshot_overlap_finds_other_ranges_with_state() {
    let (_whole_dir, whole_store) = open();
    let mut unsplit = Ranges::new(&whole_store);
    fill(&mut unsplit).await;
    let whole = snapshot_of(&mut unsplit.sm(RangeId(1))).await;
    let (_source_dir, source_store) = open();
    let mut source = Ranges::new(&source_store);
    split_filled(&mut source).await;
    let left = snapshot_of(&mut source.sm(RangeId(1))).await;
    let right = snapshot_of(&mut source.sm(RangeId(2))).await;

    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    let overlap = |range, snapshot: &Snapshot| {
        let (store, file) = (store.clone(), snapshot.snapshot.clone());
        async move { store.snapshot_overlap(range, &file).await.unwrap() }
    };
    // A range's own span does not count; the other range's does.
    assert_eq!(overlap(RangeId(1), &left).await, None);
    assert_eq!(overlap(RangeId(2), &right).await, None);
    assert_eq!(overlap(RangeId(1), &whole).await, Some(RangeId(2)));
    assert_eq!(overlap(RangeId(5), &right).await, Some(RangeId(2)));
    assert_eq!(overlap(RangeId(2), &left).await, Some(RangeId(1)));
    // Installing it anyway is refused before anything is touched.
    let mut sm = ranges.sm(RangeId(1));
    let error = sm
        .install_snapshot(&whole.meta, whole.snapshot.clone())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("overlaps range r2"), "{error}");
    assert_eq!(keys(&ranges.sm(RangeId(2))).await, ["d", "e", "f"]);
    assert_eq!(keys(&ranges.sm(RangeId(1))).await, ["a", "b", "c"]);
}

#[tokio::test]
async fn range_events_follow_splits_only() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    let mut events = store.range_events();
    fill(&mut ranges).await;
    assert!(!events.has_changed().unwrap(), "writes are no range event");
    ranges.apply(RangeId(1), split("d", 2, 0)).await;
    assert!(events.has_changed().unwrap());
    assert_eq!(*events.borrow_and_update(), 1);
    ranges.apply(RangeId(1), split("x", 3, 0)).await;
    assert!(
        !events.has_changed().unwrap(),
        "a refused split is no range event"
    );
    let ids: Vec<RangeId> = store
        .descriptors()
        .await
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(ids, vec![RangeId(1), RangeId(2)]);
}

#[tokio::test]
async fn a_child_with_state_here_is_left_alone() {
    // This store got range 2 by snapshot (as a replica added to it might) before its range 1
    // applied the split that made range 2.
    let (_source_dir, source_store) = open();
    let mut source = Ranges::new(&source_store);
    split_filled(&mut source).await;
    let child_snapshot = snapshot_of(&mut source.sm(RangeId(2))).await;
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    let child = RangeId(2);
    ranges
        .sm(child)
        .install_snapshot(&child_snapshot.meta, child_snapshot.snapshot)
        .await
        .unwrap();
    let before = view(&ranges.sm(child)).await;
    let applied = ranges.sm(child).applied().await.unwrap();

    ranges.membership(RangeId(1), &[1, 2, 3]).await;
    let ops = vec![put("a", "1", None), put("b", "2", None)];
    ranges
        .apply(
            RangeId(1),
            Command::Mutate(Mutation {
                request: None,
                now_ms: 0,
                ops,
            }),
        )
        .await;
    let outcome = ranges.apply(RangeId(1), split("d", 2, 0)).await;
    assert_eq!(
        outcome,
        CommandOutcome::Split {
            left: span(1, "", Some("d"), 1, 1),
            right: span(2, "d", None, 1, 1),
        }
    );
    assert_eq!(view(&ranges.sm(child)).await, before);
    assert_eq!(ranges.sm(child).applied().await.unwrap(), applied);
    let counts = ranges.sm(RangeId(1)).counts().await.unwrap();
    assert_eq!(
        (counts.keys, counts.size_bytes),
        (2, 4),
        "the parent counts its half"
    );
}

/// Rows of `table` in the whole file, to show what a removal left behind.
async fn rows_in(store: &Store, table: redb::TableDefinition<'static, &[u8], &[u8]>) -> u64 {
    store
        .read(move |txn| Ok(txn.open_table(table).unwrap().len().unwrap()))
        .await
        .unwrap()
}

/// A snapshot of range 2 of `split_filled`, from a store of its own (kept with its dir).
async fn right_half_snapshot() -> ((tempfile::TempDir, Store), Snapshot) {
    let (dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    let snapshot = snapshot_of(&mut ranges.sm(RangeId(2))).await;
    ((dir, store), snapshot)
}

#[tokio::test]
async fn removing_a_range_deletes_its_rows_log_and_state_and_leaves_its_neighbour() {
    let (dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    let (kept, removed) = (RangeId(1), RangeId(2));
    let kept_before = view(&ranges.sm(kept)).await;
    snapshot_of(&mut ranges.sm(removed)).await;
    let (_source_dir, source) = right_half_snapshot().await;
    let snapshot_files = || {
        std::fs::read_dir(dir.path().join("snapshots"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.starts_with("r2-"))
            .count()
    };
    assert_eq!(snapshot_files(), 1);
    assert!(store.ranges().unwrap().contains(&removed));
    assert!(!store.was_removed(removed).await.unwrap());

    store.remove_range(removed).await.unwrap();

    assert_eq!(
        view(&ranges.sm(kept)).await,
        kept_before,
        "the neighbour is intact"
    );
    let ids: Vec<RangeId> = store
        .descriptors()
        .await
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(ids, [kept]);
    assert!(!store.ranges().unwrap().contains(&removed));
    assert!(store.removals().unwrap().is_empty());
    assert!(store.was_removed(removed).await.unwrap());
    assert!(!store.was_removed(kept).await.unwrap());
    assert_eq!(snapshot_files(), 0);
    assert_eq!(keys(&ranges.sm(kept)).await, ["a", "b", "c"]);
    assert_eq!(
        rows_in(&store, KV).await,
        3,
        "only the kept range's rows remain"
    );
    let fresh = ranges.sm(removed).descriptor().await.unwrap();
    assert_eq!(
        (fresh.epoch, fresh.conf_version),
        (0, 0),
        "no state left: {fresh}"
    );
    // Its span is free: a snapshot of it may be installed by another range now.
    let file = source.snapshot.clone();
    assert_eq!(
        store.snapshot_overlap(RangeId(7), &file).await.unwrap(),
        None
    );
    // Removing it again, or a range never held, changes nothing.
    store.remove_range(removed).await.unwrap();
    store.remove_range(RangeId(9)).await.unwrap();
    assert_eq!(view(&ranges.sm(kept)).await, kept_before);
}

#[tokio::test]
async fn a_removal_cut_short_hides_the_range_but_keeps_its_span_owned_until_finished() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    let removed = RangeId(2);
    let (_source_dir, snapshot) = right_half_snapshot().await;
    // A crash right after the first step.
    store
        .call(Op::RemoveBegin { range: removed })
        .await
        .unwrap();

    assert_eq!(store.removals().unwrap(), [removed]);
    assert!(!store.ranges().unwrap().contains(&removed));
    let ids: Vec<RangeId> = store
        .descriptors()
        .await
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(ids, [RangeId::FIRST]);
    let file = snapshot.snapshot.clone();
    assert_eq!(
        store.snapshot_overlap(RangeId(7), &file).await.unwrap(),
        Some(removed),
        "its rows are still there: nothing may be installed over them"
    );

    store.remove_range(removed).await.unwrap();
    assert!(store.removals().unwrap().is_empty());
    assert_eq!(
        store.snapshot_overlap(RangeId(7), &file).await.unwrap(),
        None
    );
    assert_eq!(rows_in(&store, KV).await, 3);
}

#[tokio::test]
async fn upkeep_skips_the_other_halfs_rows_to_name_its_next_due() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    split_filled(&mut ranges).await;
    // The file's indexes, in time order: b (parent) and f (child) expire at 3_000, rec-y
    // (child) at 12_000, a-lock (parent) and x-lock (child) are free at 62_000. A long
    // window keeps the sessions both halves hold out of the way.
    let window_ms = 1_000_000;
    let sessions_due = 2_000 + window_ms + 1;
    let parent = ranges.sm(RangeId(1));
    let upkeep = parent.plan_upkeep(2_500, window_ms).await.unwrap();
    assert_eq!(upkeep.next_due_ms, Some(3_000));
    let upkeep = parent.plan_upkeep(5_000, window_ms).await.unwrap();
    assert_eq!(upkeep.cleanup.keys.len(), 1);
    ranges
        .apply(RangeId(1), Command::Cleanup(upkeep.cleanup))
        .await;
    // f and rec-y are the child's: the parent's next is a-lock.
    let upkeep = parent.plan_upkeep(5_000, window_ms).await.unwrap();
    assert!(upkeep.cleanup.is_empty() && upkeep.reclaim.is_empty());
    assert_eq!(upkeep.next_due_ms, Some(62_000));
    let child = ranges
        .sm(RangeId(2))
        .plan_upkeep(5_000, window_ms)
        .await
        .unwrap();
    assert_eq!(child.cleanup.keys.len(), 1, "f expired");
    assert_eq!(child.next_due_ms, Some(12_000), "then rec-y");
    let late = ranges.sm(RangeId(2)).plan_upkeep(70_000, window_ms).await;
    assert_eq!(late.unwrap().next_due_ms, Some(sessions_due));
}

#[tokio::test]
async fn a_first_range_installing_its_first_snapshot_claims_no_span_yet() {
    // A new node receives replicas of the first range and of another at once; the first
    // range's install has begun (its marker is written) but it holds nothing yet.
    let (_source_dir, right) = right_half_snapshot().await;
    let (_dir, store) = open();
    let marker = InstallMarker {
        snapshot_last_log_id: None,
    };
    store
        .call(Op::InstallBegin {
            range: RangeId::FIRST,
            marker,
        })
        .await
        .unwrap();
    let file = right.snapshot.clone();
    assert_eq!(
        store.snapshot_overlap(RangeId(2), &file).await.unwrap(),
        None,
        "the whole keyspace is not the first range's before it applied anything"
    );
    let mut sm = store.state_machine(RangeId(2));
    sm.install_snapshot(&right.meta, right.snapshot.clone())
        .await
        .unwrap();
    assert_eq!(keys(&sm).await, ["d", "e", "f"]);
}

#[tokio::test]
async fn a_namespace_is_counted_by_its_rows_until_its_range_lies_inside_it() {
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    let (a, a_end) = (b"\xffTa\x01".to_vec(), b"\xffTa\x02".to_vec());
    let (b, b_end) = (b"\xffTb\x01".to_vec(), b"\xffTb\x02".to_vec());
    let put = |prefix: &[u8], value: &[u8]| BatchOp::Put {
        key: [prefix, b"k"].concat(),
        value: value.to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: None,
    };
    let ops = vec![put(&a, b"1"), put(&b, b"22")];
    ranges.apply(RangeId::FIRST, mutate(ops)).await;
    let sm = ranges.sm(RangeId::FIRST);
    let in_a = sm.namespace_quota_counts(a.clone(), a_end.clone()).await;
    let rows_of_a = sm.quota_counts_within(a, a_end).await.unwrap();
    assert_eq!(in_a.unwrap(), rows_of_a);
    assert_ne!(rows_of_a, sm.quota_counts().await.unwrap());
    // b's namespace splits off into range 2, `[b, b_end)`: its recorded counts answer.
    for (at, range, child, expected_epoch) in [(&b, 1, 2, 0), (&b_end, 2, 3, 1)] {
        let split = Command::Split(Split {
            at: at.clone(),
            child: RangeId(child),
            expected_epoch,
        });
        let outcome = ranges.apply(RangeId(range), split).await;
        assert!(
            matches!(outcome, CommandOutcome::Split { .. }),
            "{outcome:?}"
        );
    }
    let sm = ranges.sm(RangeId(2));
    let counted = sm.namespace_quota_counts(b, b_end).await.unwrap();
    assert_eq!(counted, sm.quota_counts().await.unwrap());
    assert_eq!(counted.keys, 1);
}

#[tokio::test]
async fn leases_stay_with_the_half_that_holds_their_namespace() {
    use super::lease::{NS, grant, lease, leased, put_leased, revoke, txn};
    use keel_types::LeaseResult;
    let (_dir, store) = open();
    let mut ranges = Ranges::new(&store);
    let (parent, child) = (RangeId::FIRST, RangeId(2));
    ranges.membership(parent, &[1, 2, 3]).await;
    ranges.apply(parent, lease(2_000, grant(1, 60_000))).await;
    let attached = ranges.apply(parent, txn(2_000, vec![put_leased("etcd/a", "1", 1)]));
    assert!(matches!(attached.await, CommandOutcome::Transacted { .. }));
    // `etcd/` sorts after `d`: the namespace, its lease and its key go to the child.
    ranges.apply(parent, split("d", 2, 0)).await;
    assert_eq!(
        ranges.sm(parent).leases(NS).await.unwrap().0,
        Vec::<i64>::new()
    );
    let (info, _) = ranges.sm(child).lease(NS, 1, true).await.unwrap();
    assert_eq!(info.unwrap().keys, vec![b"etcd/a".to_vec()]);
    let due = |sm: StateMachine| async move {
        let plan = sm.plan_upkeep(1_000_000, 1).await.unwrap();
        plan.expire_leases.leases.len()
    };
    assert_eq!(due(ranges.sm(parent)).await, 0);
    assert_eq!(due(ranges.sm(child)).await, 1);
    let revoked = ranges.apply(child, lease(2_000, revoke(1))).await;
    let expected = LeaseResult::Revoked {
        revision: 2,
        deleted: 1,
    };
    assert_eq!(revoked, leased(expected));
    assert_eq!(keys(&ranges.sm(child)).await, Vec::<String>::new());
}
