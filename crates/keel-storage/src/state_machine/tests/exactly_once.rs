//! Request ids, increments, TTLs, cleanup and the range clock through the real writer and
//! redb: what every replica applies, what reads see, and what survives a reopen and a
//! snapshot install.

use keel_types::{
    BatchOp, Cleanup, Command, CommandOutcome, Condition, ExpiredKey, KeyValue, Mutation, OpResult,
    RangeId, Rejection, RequestId, Revision, limits,
};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

use super::{apply_commands, delete, mutate, open, put};
use crate::state_machine::{RangeCounts, ScanPage, StateMachine};
use crate::store::Store;

const CLIENT: u64 = 0xc1;

fn id(client_started_ms: u64, sequence: u64, completed_below: u64) -> RequestId {
    RequestId {
        client_id: CLIENT,
        client_started_ms,
        sequence,
        completed_below,
    }
}

/// A mutation of `CLIENT` (session started at 1_000) proposed at `now_ms`.
fn request(sequence: u64, completed_below: u64, now_ms: u64, ops: Vec<BatchOp>) -> Command {
    Command::Mutate(Mutation {
        request: Some(id(1_000, sequence, completed_below)),
        now_ms,
        ops,
    })
}

/// A mutation without a request id proposed at `now_ms`.
pub(super) fn at(now_ms: u64, ops: Vec<BatchOp>) -> Command {
    Command::Mutate(Mutation {
        request: None,
        now_ms,
        ops,
    })
}

pub(super) fn put_ttl(key: &str, value: &str, ttl_ms: u64) -> BatchOp {
    BatchOp::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: Some(ttl_ms),
    }
}

pub(super) fn increment(key: &str, delta: i64) -> BatchOp {
    BatchOp::Increment {
        key: key.as_bytes().to_vec(),
        delta,
    }
}

/// Applies commands one by one from log index `next`, advancing it. Shared with the
/// coordination and upkeep tests.
pub(super) struct Applier {
    pub store: Store,
    pub next: u64,
}

impl Applier {
    pub fn new(store: &Store) -> Applier {
        Applier {
            store: store.clone(),
            next: 1,
        }
    }

    pub async fn apply(&mut self, command: Command) -> CommandOutcome {
        let outcomes = apply_commands(&self.store, self.next, vec![command]).await;
        self.next += 1;
        outcomes.into_iter().next().unwrap()
    }

    pub fn sm(&self) -> StateMachine {
        self.store.state_machine(RangeId(1))
    }

    pub async fn value(&self, key: &str, now_ms: u64) -> Option<KeyValue> {
        self.sm().get(key.as_bytes(), now_ms).await.unwrap().0
    }

    pub async fn revision(&self) -> Revision {
        self.sm().applied().await.unwrap().0
    }
}

fn applied_at(outcome: &CommandOutcome) -> Revision {
    match outcome {
        CommandOutcome::Applied { revision, .. } => *revision,
        other => panic!("expected an applied outcome, got {other:?}"),
    }
}

fn expired(sequence: u64) -> CommandOutcome {
    CommandOutcome::Rejected(Rejection::RequestIdExpired {
        client_id: CLIENT,
        sequence,
    })
}

#[tokio::test]
async fn replay_returns_the_first_outcome_and_changes_nothing() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let first = applier
        .apply(request(1, 1, 1_000, vec![put("a", "1", None)]))
        .await;
    assert_eq!(applied_at(&first), 1);
    // A retry is answered from the record.
    let replayed = applier
        .apply(request(1, 1, 1_100, vec![put("a", "1", None)]))
        .await;
    assert_eq!(replayed, CommandOutcome::Replayed(Box::new(first)));
    // Another request under a used id is refused and changes nothing.
    let counts = applier.sm().counts().await.unwrap();
    for ops in [
        vec![put("a", "2", None)],
        vec![delete("a", None)],
        vec![put("a", "1", None), put("b", "1", None)],
    ] {
        let reused = applier.apply(request(1, 1, 1_100, ops)).await;
        let expected = CommandOutcome::Rejected(Rejection::RequestIdReused {
            client_id: CLIENT,
            sequence: 1,
        });
        assert_eq!(reused, expected);
    }
    assert_eq!(applier.sm().counts().await.unwrap(), counts);
    assert_eq!(applier.value("a", 0).await.unwrap().value, b"1");
    assert_eq!(applier.revision().await, 1);

    let failed = applier
        .apply(request(
            2,
            1,
            1_200,
            vec![put("a", "x", Some(Condition::Absent))],
        ))
        .await;
    assert!(
        matches!(failed, CommandOutcome::ConditionFailed(_)),
        "{failed:?}"
    );
    applier.apply(mutate(vec![delete("a", None)])).await;
    // The key is absent now, but the retry still gets the first answer.
    let replayed = applier
        .apply(request(
            2,
            1,
            1_300,
            vec![put("a", "x", Some(Condition::Absent))],
        ))
        .await;
    assert_eq!(replayed, CommandOutcome::Replayed(Box::new(failed)));
    assert_eq!(applier.value("a", 0).await, None);
    assert_eq!(applier.revision().await, 2);
    let counts = applier.sm().counts().await.unwrap();
    assert_eq!((counts.sessions, counts.requests), (1, 2));
}

#[tokio::test]
async fn request_ids_expire_below_completed_below_and_after_cleanup() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier
        .apply(request(1, 1, 1_000, vec![put("a", "1", None)]))
        .await;
    applier
        .apply(request(2, 2, 1_000, vec![put("b", "1", None)]))
        .await;
    // Request 2 told the range that 1 is complete: its record is gone.
    let late = applier
        .apply(request(1, 1, 1_000, vec![put("a", "2", None)]))
        .await;
    assert_eq!(late, expired(1));
    assert_eq!(applier.sm().counts().await.unwrap().requests, 1);

    // The session idles past the window and is cleaned up; its requests are refused.
    let cleanup = applier.sm().plan_cleanup(5_000, 2_000).await.unwrap();
    assert_eq!(cleanup.sessions, vec![CLIENT]);
    assert_eq!(
        applier.apply(Command::Cleanup(cleanup)).await,
        CommandOutcome::Internal
    );
    let exactly_once = RangeCounts {
        keys: 2,
        size_bytes: 4,
        ..RangeCounts::default()
    };
    assert_eq!(applier.sm().counts().await.unwrap(), exactly_once);
    let retry = applier
        .apply(request(2, 2, 5_000, vec![put("b", "2", None)]))
        .await;
    assert_eq!(retry, expired(2));
    assert_eq!(
        applier.sm().counts().await.unwrap().sessions,
        0,
        "nothing stored"
    );
    // A session opened after the horizon is admitted.
    let fresh = Command::Mutate(Mutation {
        request: Some(id(1_001, 1, 1)),
        now_ms: 5_000,
        ops: vec![put("b", "3", None)],
    });
    assert_eq!(applied_at(&applier.apply(fresh).await), 3);
    assert_eq!(applier.value("b", 0).await.unwrap().value, b"3");
}

#[tokio::test]
async fn sessions_keep_a_bounded_number_of_records() {
    let (_dir, store) = open();
    let max = limits::REQUESTS_PER_SESSION_MAX;
    let commands = (1..=max)
        .map(|sequence| request(sequence, 1, 1_000, vec![put("k", "v", None)]))
        .collect();
    let outcomes = apply_commands(&store, 1, commands).await;
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, CommandOutcome::Applied { .. }))
    );
    let mut applier = Applier {
        store: store.clone(),
        next: max + 1,
    };
    let refused = applier
        .apply(request(max + 1, 1, 1_000, vec![put("k", "w", None)]))
        .await;
    assert_eq!(
        refused,
        CommandOutcome::Rejected(Rejection::TooManyInFlight {
            client_id: CLIENT,
            limit: max,
        })
    );
    assert_eq!(applier.revision().await, max);
    // Completing one request frees one record.
    let accepted = applier
        .apply(request(max + 1, 2, 1_000, vec![put("k", "w", None)]))
        .await;
    assert_eq!(applied_at(&accepted), max + 1);
    assert_eq!(applier.sm().counts().await.unwrap().requests, max);
}

#[tokio::test]
async fn increments_count_from_absent_and_refuse_without_side_effects() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let counter = |outcome: &CommandOutcome| match outcome {
        CommandOutcome::Applied { results, .. } => results[0].counter,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        counter(&applier.apply(mutate(vec![increment("n", 5)])).await),
        Some(5)
    );
    assert_eq!(
        counter(&applier.apply(mutate(vec![increment("n", -7)])).await),
        Some(-2)
    );
    assert_eq!(applier.value("n", 0).await.unwrap().value, b"-2");
    applier.apply(mutate(vec![put("text", "abc", None)])).await;
    applier
        .apply(mutate(vec![put("max", &i64::MAX.to_string(), None)]))
        .await;

    let not_a_counter = applier
        .apply(mutate(vec![increment("n", 1), increment("text", 1)]))
        .await;
    assert_eq!(
        not_a_counter,
        CommandOutcome::Rejected(Rejection::NotACounter {
            op_index: 1,
            key: b"text".to_vec(),
        })
    );
    let overflow = applier.apply(mutate(vec![increment("max", 1)])).await;
    assert!(
        matches!(
            overflow,
            CommandOutcome::Rejected(Rejection::Overflow {
                current: i64::MAX,
                delta: 1,
                ..
            })
        ),
        "{overflow:?}"
    );
    assert_eq!(applier.revision().await, 4, "refusals use no revision");
    assert_eq!(
        applier.value("n", 0).await.unwrap().value,
        b"-2",
        "nothing applied"
    );
}

#[tokio::test]
async fn expired_keys_are_absent_from_the_boundary_on() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier
        .apply(at(
            1_000,
            vec![put_ttl("t", "1", 500), put("plain", "p", None)],
        ))
        .await;
    let t = applier
        .value("t", 1_499)
        .await
        .expect("live before its expiry");
    assert_eq!((t.expires_at_ms, t.create_revision), (Some(1_500), 1));
    assert_eq!(
        applier.value("t", 1_500).await,
        None,
        "expired at exactly its expiry"
    );
    let keys = |page: ScanPage| -> Vec<Vec<u8>> { page.kvs.into_iter().map(|kv| kv.key).collect() };
    let sm = applier.sm();
    assert_eq!(keys(sm.scan(b"", b"", 0, 1_499).await.unwrap()).len(), 2);
    assert_eq!(
        keys(sm.scan(b"", b"", 0, 1_500).await.unwrap()),
        vec![b"plain".to_vec()]
    );

    // To a write at or after the expiry the key is absent: created anew.
    let created = applier
        .apply(at(1_500, vec![put("t", "2", Some(Condition::Absent))]))
        .await;
    assert_eq!(applied_at(&created), 2);
    let t = applier.value("t", 0).await.unwrap();
    assert_eq!(
        (t.create_revision, t.expires_at_ms),
        (2, None),
        "no TTL without one"
    );

    // An increment keeps the TTL; a put without one clears it.
    applier.apply(at(1_500, vec![put_ttl("c", "1", 100)])).await;
    applier.apply(at(1_550, vec![increment("c", 1)])).await;
    let c = applier.value("c", 0).await.unwrap();
    assert_eq!(
        (c.value.as_slice(), c.expires_at_ms),
        (&b"2"[..], Some(1_600))
    );
    applier.apply(at(1_560, vec![put("c", "3", None)])).await;
    assert_eq!(
        applier.value("c", 1_000_000).await.unwrap().expires_at_ms,
        None
    );
    assert_eq!(applier.sm().counts().await.unwrap().keys_with_ttl, 0);
}

#[tokio::test]
async fn scans_skip_expired_rows_and_page_on() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    // k00..k19 expire at 1_100, then live l0..l2.
    let mut ops: Vec<BatchOp> = (0..20)
        .map(|i| put_ttl(&format!("k{i:02}"), "x", 100))
        .collect();
    ops.extend((0..3).map(|i| put(&format!("l{i}"), "y", None)));
    applier.apply(at(1_000, ops)).await;
    let sm = applier.sm();
    let mut start = Vec::new();
    let mut pages = Vec::new();
    loop {
        let page = sm.scan(&start, b"", 2, 2_000).await.unwrap();
        pages.push(page.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>());
        match page.next_start {
            Some(next) => start = next,
            None => break,
        }
    }
    // Each page examines at most 4 × 2 rows: 20 expired rows take three pages.
    let expected: Vec<Vec<Vec<u8>>> = vec![
        vec![],
        vec![],
        vec![b"l0".to_vec(), b"l1".to_vec()],
        vec![b"l2".to_vec()],
    ];
    assert_eq!(pages, expected);
}

#[tokio::test]
async fn cleanup_removes_only_what_is_still_expired_or_idle() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier
        .apply(at(
            1_000,
            vec![
                put_ttl("gone", "1", 100),
                put_ttl("renewed", "1", 100),
                put_ttl("later", "1", 5_000),
            ],
        ))
        .await;
    applier
        .apply(request(1, 1, 1_000, vec![put("s", "1", None)]))
        .await;
    let other = Command::Mutate(Mutation {
        request: Some(RequestId {
            client_id: 2,
            ..id(1_000, 1, 1)
        }),
        now_ms: 3_000,
        ops: vec![put("s", "2", None)],
    });
    applier.apply(other).await;
    let plan = applier.sm().plan_cleanup(4_000, 2_000).await.unwrap();
    let expired_key = |key: &str, expires_at_ms| ExpiredKey {
        key: key.as_bytes().to_vec(),
        expires_at_ms,
    };
    assert_eq!(
        plan.keys,
        vec![expired_key("gone", 1_100), expired_key("renewed", 1_100)]
    );
    assert_eq!(plan.sessions, vec![CLIENT]);
    assert_eq!(plan.now_ms, 4_000);

    // Between planning and applying, "renewed" is written again.
    applier
        .apply(at(4_000, vec![put_ttl("renewed", "2", 100)]))
        .await;
    let cleanup = Cleanup {
        keys: vec![
            expired_key("gone", 1_100),
            expired_key("renewed", 1_100),
            expired_key("later", 6_000),
        ],
        sessions: vec![CLIENT, 2],
        ..plan
    };
    applier.apply(Command::Cleanup(cleanup)).await;
    let counts = applier.sm().counts().await.unwrap();
    assert_eq!(
        counts,
        RangeCounts {
            sessions: 1,
            requests: 1,
            keys_with_ttl: 2,
            keys: 3,
            size_bytes: "renewed2later1s2".len() as u64,
        }
    );
    assert_eq!(applier.value("renewed", 0).await.unwrap().value, b"2");
    assert!(applier.value("later", 0).await.is_some());
    assert_eq!(
        applier.revision().await,
        5,
        "removing \"gone\" takes one revision"
    );
    let plan = applier.sm().plan_cleanup(4_000, 2_000).await.unwrap();
    assert!(plan.is_empty(), "{plan:?}");
}

#[tokio::test]
async fn the_clock_never_goes_back() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    applier.apply(at(5_000, vec![put("a", "1", None)])).await;
    // A command stamped earlier (an old leader's clock) runs at the range clock.
    applier.apply(at(1_000, vec![put_ttl("t", "1", 100)])).await;
    assert_eq!(
        applier.value("t", 0).await.unwrap().expires_at_ms,
        Some(5_100)
    );
    // Reads use the later of their own time and the range clock.
    applier.apply(at(5_100, vec![put("b", "1", None)])).await;
    assert_eq!(applier.value("t", 0).await, None);
    // A legacy write runs at the range clock too.
    let legacy = Command::Write {
        ops: vec![keel_types::command::legacy::BatchOpV1::Delete {
            key: b"a".to_vec(),
            condition: None,
            return_previous: false,
        }],
    };
    assert_eq!(applied_at(&applier.apply(legacy).await), 4);
    assert_eq!(applier.value("a", 0).await, None);
}

/// A range with a session, two records (one a condition failure), a live TTL key and one
/// expired at the range clock (2_000).
async fn fill(applier: &mut Applier) -> CommandOutcome {
    let first = applier
        .apply(request(
            1,
            1,
            1_000,
            vec![put_ttl("live", "1", 60_000), put_ttl("dead", "1", 500)],
        ))
        .await;
    applier
        .apply(request(
            2,
            1,
            2_000,
            vec![put("live", "x", Some(Condition::Absent))],
        ))
        .await;
    first
}

async fn check_filled(applier: &mut Applier, first: CommandOutcome) {
    assert_eq!(
        applier.value("dead", 0).await,
        None,
        "expired at the range clock"
    );
    assert_eq!(
        applier.value("live", 0).await.unwrap().expires_at_ms,
        Some(61_000)
    );
    let counts = applier.sm().counts().await.unwrap();
    let expected = RangeCounts {
        sessions: 1,
        requests: 2,
        keys_with_ttl: 2,
        keys: 2,
        size_bytes: "live1dead1".len() as u64,
    };
    assert_eq!(counts, expected);
    let plan = applier.sm().plan_cleanup(0, 0).await.unwrap();
    assert_eq!(
        plan.keys.len(),
        1,
        "the TTL index holds the expired key: {plan:?}"
    );
    let retry = vec![put_ttl("live", "1", 60_000), put_ttl("dead", "1", 500)];
    let replayed = applier.apply(request(1, 1, 0, retry)).await;
    assert_eq!(replayed, CommandOutcome::Replayed(Box::new(first)));
    assert!(applier.value("live", 0).await.is_some());
}

#[tokio::test]
async fn exactly_once_and_ttl_state_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let reopen =
        || Store::open(&dir.path().join("keel.redb"), &dir.path().join("snapshots")).unwrap();
    let store = reopen();
    let mut applier = Applier::new(&store);
    let first = fill(&mut applier).await;
    store.shutdown();
    let store = reopen();
    let mut applier = Applier {
        store: store.clone(),
        next: applier.next,
    };
    check_filled(&mut applier, first).await;
}

#[tokio::test]
async fn snapshots_carry_sessions_records_clock_and_ttls() {
    let (_dir_a, store_a) = open();
    let mut source = Applier::new(&store_a);
    let first = fill(&mut source).await;
    let mut sm = source.sm();
    let snapshot = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    // The target holds state of its own that the install must replace.
    let (_dir_b, store_b) = open();
    let mut target = Applier::new(&store_b);
    target
        .apply(at(
            100,
            vec![put_ttl("dead", "old", 50), put_ttl("stale", "1", 10)],
        ))
        .await;
    target
        .apply(request(7, 1, 100, vec![put("other", "1", None)]))
        .await;
    target
        .sm()
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(
        target.sm().applied().await.unwrap(),
        source.sm().applied().await.unwrap()
    );
    target.next = source.next;
    check_filled(&mut target, first).await;
    let plan = target.sm().plan_cleanup(0, 0).await.unwrap();
    let expired = ExpiredKey {
        key: b"dead".to_vec(),
        expires_at_ms: 1_500,
    };
    assert_eq!(
        plan.keys,
        vec![expired],
        "old TTL-index rows of the span are gone"
    );
    assert_eq!(target.value("stale", 0).await, None);
    // The target's record of request 7 was replaced with the source's session.
    let again = target
        .apply(request(7, 1, 0, vec![put("other", "2", None)]))
        .await;
    assert!(matches!(again, CommandOutcome::Applied { .. }), "{again:?}");
}

#[test]
fn results_of_increments_and_puts_are_recorded_whole() {
    // The stored outcome is the full CommandOutcome: a replay can answer with counters.
    let outcome = CommandOutcome::Applied {
        revision: 3,
        results: vec![OpResult {
            previous: None,
            existed: false,
            counter: Some(7),
        }],
    };
    let bytes = crate::codec::encode(&outcome);
    let decoded: CommandOutcome = crate::codec::decode("request record", &bytes).unwrap();
    assert_eq!(decoded, outcome);
}
