//! Locks, fenced writes, idempotency records and reclaims through the real writer and redb:
//! what every replica applies, what reads see, and what a snapshot carries.

use keel_types::coordination::idempotency_key;
use keel_types::{
    Acquirer, BatchOp, Command, CommandOutcome, Condition, Coordination, CoordinationCounts,
    CoordinationOp, CoordinationResult, EventCursor, EventKind, ExpiredRecord, Fence,
    IdempotencyRecord, LockHold, Mutation, RangeId, Reclaim, Rejection, RequestId, Revision, Split,
};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

use super::exactly_once::Applier;
use super::history::{page_from, revisions as key_revisions};
use super::{delete, mutate, open, put};
use crate::state_machine::StateMachine;

fn acquirer(owner: &str, ttl_ms: u64, lock_delay_ms: u64) -> Acquirer {
    Acquirer {
        owner: owner.as_bytes().to_vec(),
        ttl_ms,
        lock_delay_ms,
    }
}

fn acquire(name: &str, owner: &str, ttl_ms: u64, lock_delay_ms: u64) -> CoordinationOp {
    CoordinationOp::Acquire {
        name: name.as_bytes().to_vec(),
        acquirer: acquirer(owner, ttl_ms, lock_delay_ms),
    }
}

fn renew(name: &str, token: u64, ttl_ms: u64) -> CoordinationOp {
    CoordinationOp::Renew {
        name: name.as_bytes().to_vec(),
        token,
        ttl_ms,
    }
}

fn release(name: &str, token: u64, successor: Option<Acquirer>) -> CoordinationOp {
    CoordinationOp::Release {
        name: name.as_bytes().to_vec(),
        token,
        successor,
    }
}

fn begin(key: &[u8], owner: &str, ttl_ms: u64) -> CoordinationOp {
    CoordinationOp::Begin {
        key: key.to_vec(),
        owner: owner.as_bytes().to_vec(),
        ttl_ms,
    }
}

fn complete(key: &[u8], token: u64, result: &str, result_ttl_ms: u64) -> CoordinationOp {
    CoordinationOp::Complete {
        key: key.to_vec(),
        token,
        result: result.as_bytes().to_vec(),
        result_ttl_ms,
    }
}

/// A coordination operation without a request id proposed at `now_ms`.
fn at(now_ms: u64, op: CoordinationOp) -> Command {
    Command::Coordinate(Coordination {
        request: None,
        now_ms,
        op,
    })
}

fn request_id(sequence: u64) -> Option<RequestId> {
    Some(RequestId {
        client_id: 0xc0,
        client_started_ms: 500,
        sequence,
        completed_below: 1,
    })
}

/// A write fenced by `(lock, token)` proposed at `now_ms`.
fn fenced(now_ms: u64, lock: &str, token: u64, ops: Vec<BatchOp>) -> Command {
    fenced_as(None, now_ms, lock, token, ops)
}

fn fenced_as(
    request: Option<RequestId>,
    now_ms: u64,
    lock: &str,
    token: u64,
    ops: Vec<BatchOp>,
) -> Command {
    Command::FencedMutate {
        fence: Fence {
            lock: lock.as_bytes().to_vec(),
            token,
        },
        mutation: Mutation {
            request,
            now_ms,
            ops,
        },
    }
}

fn hold(owner: &str, token: u64, expires_at_ms: u64, lock_delay_ms: u64) -> LockHold {
    LockHold {
        owner: owner.as_bytes().to_vec(),
        token,
        expires_at_ms,
        lock_delay_ms,
    }
}

fn coordinated(revision: Revision, result: CoordinationResult) -> CommandOutcome {
    CommandOutcome::Coordinated { revision, result }
}

/// The token of an `Acquired` outcome.
fn granted(outcome: &CommandOutcome) -> u64 {
    match outcome {
        CommandOutcome::Coordinated {
            result: CoordinationResult::Acquired(hold),
            ..
        } => hold.token,
        other => panic!("expected a granted lock, got {other:?}"),
    }
}

fn applied_at(outcome: &CommandOutcome) -> Revision {
    match outcome {
        CommandOutcome::Applied { revision, .. } => *revision,
        other => panic!("expected an applied write, got {other:?}"),
    }
}

fn not_held(name: &str, token: u64, current_token: Option<u64>) -> CommandOutcome {
    CommandOutcome::Rejected(Rejection::LockNotHeld {
        name: name.as_bytes().to_vec(),
        token,
        current_token,
    })
}

fn fenced_out(op_index: u32, key: &str, lock: &str, current_token: u64) -> CommandOutcome {
    CommandOutcome::Rejected(Rejection::FencedOut {
        op_index,
        key: key.as_bytes().to_vec(),
        lock: lock.as_bytes().to_vec(),
        current_token,
    })
}

async fn counts(applier: &Applier) -> CoordinationCounts {
    applier.sm().coordination_counts().await.unwrap()
}

async fn holder(sm: &StateMachine, name: &str, now_ms: u64) -> Option<LockHold> {
    sm.lock(name.as_bytes(), now_ms).await.unwrap().0
}

#[tokio::test]
async fn locks_grant_refuse_renew_and_hand_over_with_growing_tokens() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let first = applier.apply(at(1_000, acquire("L", "a", 1_000, 0))).await;
    assert_eq!(
        first,
        coordinated(1, CoordinationResult::Acquired(hold("a", 1, 2_000, 0)))
    );
    // Someone else is told who holds it; no revision is used.
    let busy = applier.apply(at(1_100, acquire("L", "b", 1_000, 0))).await;
    assert_eq!(
        busy,
        coordinated(1, CoordinationResult::Busy(hold("a", 1, 2_000, 0)))
    );
    // The holder acquiring again keeps its token; that takes a revision.
    let again = applier.apply(at(1_200, acquire("L", "a", 1_000, 0))).await;
    assert_eq!(
        again,
        coordinated(2, CoordinationResult::Acquired(hold("a", 1, 2_200, 0)))
    );
    let renewed = applier.apply(at(1_300, renew("L", 1, 2_000))).await;
    assert_eq!(
        renewed,
        coordinated(3, CoordinationResult::Renewed(hold("a", 1, 3_300, 0)))
    );
    assert_eq!(
        applier.apply(at(1_300, renew("L", 9, 10))).await,
        not_held("L", 9, Some(1))
    );
    // A release hands over to the successor with a new token in the same step.
    let handed = applier
        .apply(at(1_400, release("L", 1, Some(acquirer("b", 500, 0)))))
        .await;
    let successor = hold("b", 4, 1_900, 0);
    let released = CoordinationResult::Released {
        successor: Some(successor.clone()),
    };
    assert_eq!(handed, coordinated(4, released));
    assert_eq!(
        applier.apply(at(1_400, release("L", 1, None))).await,
        not_held("L", 1, Some(4))
    );
    assert_eq!(holder(&applier.sm(), "L", 0).await, Some(successor));

    let other = granted(&applier.apply(at(1_500, acquire("M", "c", 1_000, 0))).await);
    let freed = applier.apply(at(1_500, release("L", 4, None))).await;
    assert_eq!(
        freed,
        coordinated(6, CoordinationResult::Released { successor: None })
    );
    assert_eq!(holder(&applier.sm(), "L", 0).await, None);
    let last = granted(&applier.apply(at(1_600, acquire("L", "a", 1_000, 0))).await);
    let tokens = [1, 4, other, last];
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    assert_eq!(counts(&applier).await.locks, 2);
    assert_eq!(applier.revision().await, 7);
}

#[tokio::test]
async fn an_expired_lock_is_taken_by_nobody_during_its_delay() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let first = granted(&applier.apply(at(1_000, acquire("L", "a", 100, 50))).await);
    let busy = applier.apply(at(1_120, acquire("L", "a", 100, 0))).await;
    assert_eq!(
        busy,
        coordinated(1, CoordinationResult::Busy(hold("a", 1, 1_100, 50)))
    );
    assert_eq!(
        applier.apply(at(1_120, renew("L", first, 100))).await,
        not_held("L", 1, None)
    );
    let sm = applier.sm();
    assert!(
        holder(&sm, "L", 1_149).await.is_some(),
        "shown while delayed"
    );
    assert_eq!(
        holder(&sm, "L", 1_150).await,
        None,
        "free from its available instant"
    );
    let next = granted(&applier.apply(at(1_150, acquire("L", "b", 100, 0))).await);
    assert!(next > first);
}

#[tokio::test]
async fn fenced_writes_refuse_stale_tokens_and_other_locks() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let old = granted(&applier.apply(at(1_000, acquire("L", "a", 100, 0))).await);
    let put_k = |value| vec![put("k", value, None)];
    assert_eq!(
        applied_at(&applier.apply(fenced(1_000, "L", old, put_k("1"))).await),
        2
    );
    assert_eq!(counts(&applier).await.fenced_keys, 1);
    // `a` expired; `b` holds the lock with a higher token and writes with it.
    let new = granted(&applier.apply(at(2_000, acquire("L", "b", 100, 0))).await);
    assert_eq!(
        applied_at(&applier.apply(fenced(2_000, "L", new, put_k("2"))).await),
        4
    );
    // The paused old holder is fenced out, and so is a write under another lock.
    let stale = applier.apply(fenced(2_000, "L", old, put_k("3"))).await;
    assert_eq!(stale, fenced_out(0, "k", "L", new));
    let ops = vec![put("other", "x", None), put("k", "x", None)];
    assert_eq!(
        applier.apply(fenced(2_000, "M", 99, ops)).await,
        fenced_out(1, "k", "L", new)
    );
    assert_eq!(applier.value("k", 0).await.unwrap().value, b"2");
    assert_eq!(applier.value("other", 0).await, None, "nothing applied");
    // The same token is accepted again.
    assert_eq!(
        applied_at(&applier.apply(fenced(2_000, "L", new, put_k("4"))).await),
        5
    );
    // A failed condition fences nothing.
    let ops = vec![put("j", "x", None), put("k", "x", Some(Condition::Absent))];
    let failed = applier.apply(fenced(2_000, "L", new, ops)).await;
    assert!(
        matches!(failed, CommandOutcome::ConditionFailed(_)),
        "{failed:?}"
    );
    // An unfenced put keeps the fence; an unfenced delete retires it.
    applier.apply(mutate(vec![put("k", "5", None)])).await;
    assert_eq!(counts(&applier).await.fenced_keys, 1);
    applier.apply(mutate(vec![delete("k", None)])).await;
    assert_eq!(counts(&applier).await.fenced_keys, 0);
    assert_eq!(
        applied_at(&applier.apply(fenced(2_000, "L", old, put_k("6"))).await),
        8
    );
    // A fenced delete keeps the key fenced.
    let ops = vec![delete("k", None)];
    assert_eq!(
        applied_at(&applier.apply(fenced(2_000, "L", new, ops)).await),
        9
    );
    assert_eq!(
        applier.apply(fenced(2_000, "L", old, put_k("7"))).await,
        fenced_out(0, "k", "L", new)
    );
}

#[tokio::test]
async fn idempotency_records_start_report_take_over_and_complete() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let key = idempotency_key(b"payments", b"order-1");
    let started = |token, expires_at_ms| CoordinationResult::Started {
        token,
        expires_at_ms,
    };
    let done = |expires_at_ms| CoordinationResult::Completed {
        result: b"done".to_vec(),
        expires_at_ms,
    };
    let first = applier.apply(at(1_000, begin(&key, "w1", 500))).await;
    assert_eq!(first, coordinated(1, started(1, 1_500)));
    let working = CoordinationResult::InProgress {
        owner: b"w1".to_vec(),
        expires_at_ms: 1_500,
    };
    assert_eq!(
        applier.apply(at(1_100, begin(&key, "w2", 500))).await,
        coordinated(1, working)
    );
    // At its expiry the record is taken over with a higher token; the old owner is refused.
    let takeover = applier.apply(at(1_500, begin(&key, "w2", 500))).await;
    assert_eq!(takeover, coordinated(2, started(2, 2_000)));
    let late = applier
        .apply(at(1_600, complete(&key, 1, "late", 100)))
        .await;
    let not_owned = |token, current_token| {
        CommandOutcome::Rejected(Rejection::RecordNotOwned {
            key: key.clone(),
            token,
            current_token,
        })
    };
    assert_eq!(late, not_owned(1, Some(2)));
    let completed = applier
        .apply(at(1_700, complete(&key, 2, "done", 10_000)))
        .await;
    assert_eq!(completed, coordinated(3, done(11_700)));
    // Repeating the complete, or beginning again, answers the result; no revision.
    let repeated = applier
        .apply(at(1_800, complete(&key, 2, "again", 10)))
        .await;
    assert_eq!(repeated, coordinated(3, done(11_700)));
    assert_eq!(
        applier.apply(at(1_900, begin(&key, "w3", 500))).await,
        coordinated(3, done(11_700))
    );
    let abort = CoordinationOp::Abort {
        key: key.clone(),
        token: 2,
    };
    assert_eq!(applier.apply(at(1_900, abort)).await, not_owned(2, Some(2)));
    let sm = applier.sm();
    let (record, revision) = sm.idempotency_record(&key, 0).await.unwrap();
    let stored = IdempotencyRecord::Completed {
        result: b"done".to_vec(),
        token: 2,
        expires_at_ms: 11_700,
    };
    assert_eq!((record, revision), (Some(stored), 3));
    assert_eq!(sm.idempotency_record(&key, 11_700).await.unwrap().0, None);
    assert_eq!(counts(&applier).await.idempotency_records, 1);
}

#[tokio::test]
async fn an_aborted_record_frees_its_key() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let key = idempotency_key(b"payments", b"order-2");
    let abort = |token| {
        at(
            2_000,
            CoordinationOp::Abort {
                key: key.clone(),
                token,
            },
        )
    };
    let first = granted_record(&applier.apply(at(2_000, begin(&key, "w", 100))).await);
    let aborted = applier.apply(abort(first)).await;
    assert_eq!(aborted, coordinated(2, CoordinationResult::Aborted));
    assert_eq!(
        applier.sm().idempotency_record(&key, 0).await.unwrap().0,
        None
    );
    assert_eq!(counts(&applier).await.idempotency_records, 0);
    let again = applier.apply(abort(first)).await;
    let not_owned = Rejection::RecordNotOwned {
        key: key.clone(),
        token: first,
        current_token: None,
    };
    assert_eq!(again, CommandOutcome::Rejected(not_owned));
    // The next begin starts afresh, with a higher token.
    let next = granted_record(&applier.apply(at(2_000, begin(&key, "w2", 100))).await);
    assert!(next > first);
}

/// The token of a `Started` outcome.
fn granted_record(outcome: &CommandOutcome) -> u64 {
    match outcome {
        CommandOutcome::Coordinated {
            result: CoordinationResult::Started { token, .. },
            ..
        } => *token,
        other => panic!("expected a started record, got {other:?}"),
    }
}

#[tokio::test]
async fn retried_coordination_and_fenced_requests_replay_their_first_outcome() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let acquire_once = || {
        Command::Coordinate(Coordination {
            request: request_id(1),
            now_ms: 1_000,
            op: acquire("L", "a", 1_000, 0),
        })
    };
    let first = applier.apply(acquire_once()).await;
    assert_eq!(granted(&first), 1);
    applier.apply(at(1_000, release("L", 1, None))).await;
    // The lock is free now, but the retry is not applied again.
    assert_eq!(
        applier.apply(acquire_once()).await,
        CommandOutcome::Replayed(Box::new(first))
    );
    assert_eq!(holder(&applier.sm(), "L", 0).await, None);
    assert_eq!(applier.revision().await, 2);

    let write = || fenced_as(request_id(2), 1_000, "L", 1, vec![put("k", "1", None)]);
    let written = applier.apply(write()).await;
    assert_eq!(applied_at(&written), 3);
    assert_eq!(
        applier.apply(write()).await,
        CommandOutcome::Replayed(Box::new(written))
    );
    // A refusal is recorded too: after the fence is retired, the retry is still refused.
    let refused_write = || fenced_as(request_id(3), 1_000, "M", 9, vec![put("k", "2", None)]);
    let refused = applier.apply(refused_write()).await;
    assert_eq!(refused, fenced_out(0, "k", "L", 1));
    applier.apply(mutate(vec![delete("k", None)])).await;
    assert_eq!(
        applier.apply(refused_write()).await,
        CommandOutcome::Replayed(Box::new(refused))
    );
    assert_eq!(applier.value("k", 0).await, None);
    let sessions = applier.sm().counts().await.unwrap();
    assert_eq!((sessions.sessions, sessions.requests), (1, 3));
}

fn due(key: &str, at_ms: u64) -> ExpiredRecord {
    ExpiredRecord {
        key: key.as_bytes().to_vec(),
        at_ms,
    }
}

/// The range's recorded counts of keys and bytes (locks, fences and records included) match
/// its rows counted one by one.
async fn assert_counted(sm: &StateMachine) {
    let recorded = sm.quota_counts().await.unwrap();
    let everything = sm.quota_counts_within(Vec::new(), vec![0xFF; 8192]);
    assert_eq!(recorded, everything.await.unwrap());
}

#[tokio::test]
async fn stored_locks_fences_and_records_count_their_bytes() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    let empty = applier.sm().quota_counts().await.unwrap();
    fill(&mut applier).await;
    let filled = applier.sm().quota_counts().await.unwrap();
    assert_counted(&applier.sm()).await;
    // A larger result, a renewal and a fence dropped by a delete move the bytes both ways.
    let token = granted_record(&applier.apply(at(2_000, begin(b"big", "w", 100))).await);
    let result = "r".repeat(10_000);
    applier
        .apply(at(2_000, complete(b"big", token, &result, 60_000)))
        .await;
    let grown = applier.sm().quota_counts().await.unwrap();
    assert!(
        grown.bytes >= filled.bytes + 10_000,
        "{filled:?} -> {grown:?}"
    );
    assert_counted(&applier.sm()).await;
    applier.apply(mutate(vec![delete("k", None)])).await;
    assert_counted(&applier.sm()).await;
    assert!(applier.sm().quota_counts().await.unwrap().bytes > empty.bytes);
}

#[tokio::test]
async fn reclaim_removes_only_free_locks_and_expired_records() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    // A key of the same name as a lock: a reclaim of the lock is not the key's event.
    applier.apply(mutate(vec![put("free", "v", None)])).await;
    for op in [
        acquire("free", "a", 100, 0),
        acquire("delayed", "a", 100, 5_000),
        acquire("retaken", "a", 100, 0),
        acquire("held", "a", 100_000, 0),
        begin(b"r-expired", "w", 100),
        begin(b"r-live", "w", 100_000),
    ] {
        applier.apply(at(1_000, op)).await;
    }
    let plan = applier.sm().plan_reclaim(2_000).await.unwrap();
    let expected = Reclaim {
        now_ms: 2_000,
        locks: vec![due("free", 1_100), due("retaken", 1_100)],
        records: vec![due("r-expired", 1_100)],
    };
    assert_eq!(plan, expected);
    // Between planning and applying, "retaken" is acquired again.
    applier
        .apply(at(2_000, acquire("retaken", "b", 100, 0)))
        .await;
    let mut reclaim = plan;
    reclaim.locks.push(due("held", 101_000));
    reclaim.records.push(due("r-live", 2_000));
    let revision = applier.revision().await;
    assert_eq!(
        applier.apply(Command::Reclaim(reclaim)).await,
        CommandOutcome::Internal
    );
    // The lock it removed is an event of one revision, the record of the next.
    assert_eq!(applier.revision().await, revision + 2);
    let page = page_from(&applier.sm(), EventCursor::at(revision + 1), 10).await;
    let reclaimed: Vec<(Revision, &[u8], EventKind)> = page
        .page
        .events
        .iter()
        .map(|event| (event.revision, event.key.as_slice(), event.kind))
        .collect();
    let expected: Vec<(Revision, &[u8], EventKind)> = vec![
        (revision + 1, b"free", EventKind::LockReclaimed { token: 2 }),
        (
            revision + 2,
            b"r-expired",
            EventKind::RecordReclaimed { token: 6 },
        ),
    ];
    assert_eq!(reclaimed, expected);
    assert!(
        page.page
            .events
            .iter()
            .all(|e| e.after.is_none() && e.before.is_none())
    );
    // The key "free" keeps its own history and its state before the reclaim.
    let sm = applier.sm();
    assert_eq!(key_revisions(&sm, "free").await, vec![1]);
    let before = sm.read_key_at(b"free", revision).await.unwrap();
    assert_eq!(before.unwrap().map(|kv| kv.value), Some(b"v".to_vec()));
    let expected = CoordinationCounts {
        locks: 3,
        fenced_keys: 0,
        idempotency_records: 1,
    };
    assert_eq!(counts(&applier).await, expected);
    assert_counted(&applier.sm()).await;
    assert!(applier.sm().plan_reclaim(2_000).await.unwrap().is_empty());
    let later = applier.sm().plan_reclaim(6_100).await.unwrap();
    assert_eq!(
        later.locks,
        vec![due("retaken", 2_100), due("delayed", 6_100)]
    );
    // A reclaim of a format-8 log removes as it did, at no revision and with no event.
    let revision = applier.revision().await;
    applier.apply(Command::ReclaimUnrecorded(later)).await;
    assert_eq!(applier.revision().await, revision);
    assert_eq!(counts(&applier).await.locks, 1);
    let page = page_from(&applier.sm(), EventCursor::at(revision + 1), 10).await;
    assert!(page.page.events.is_empty());
}

#[tokio::test]
async fn reads_and_reclaim_plans_stay_within_the_span() {
    let (_dir, store) = open();
    let mut applier = Applier::new(&store);
    for name in ["a-lock", "z-lock"] {
        applier.apply(at(1_000, acquire(name, "o", 100, 0))).await;
        applier
            .apply(at(1_000, begin(name.as_bytes(), "o", 100)))
            .await;
    }
    let split = Split {
        at: b"m".to_vec(),
        child: RangeId(2),
        expected_epoch: 0,
    };
    let outcome = applier.apply(Command::Split(split)).await;
    assert!(
        matches!(outcome, CommandOutcome::Split { .. }),
        "{outcome:?}"
    );
    // The child owns `[m, +inf)`; each half counts the bytes of its own rows.
    let sm = store.state_machine(RangeId(2));
    assert_counted(&sm).await;
    assert_counted(&applier.sm()).await;
    assert_eq!(holder(&sm, "a-lock", 0).await, None);
    assert!(holder(&sm, "z-lock", 0).await.is_some());
    assert_eq!(sm.idempotency_record(b"a-lock", 0).await.unwrap().0, None);
    assert!(
        sm.idempotency_record(b"z-lock", 0)
            .await
            .unwrap()
            .0
            .is_some()
    );
    let plan = sm.plan_reclaim(5_000).await.unwrap();
    assert_eq!(
        (plan.locks, plan.records),
        (vec![due("z-lock", 1_100)], vec![due("z-lock", 1_100)])
    );
}

/// A range with a held lock fencing `k`, a lock free at the clock and a completed record.
async fn fill(applier: &mut Applier) {
    let token = granted(&applier.apply(at(1_000, acquire("L", "a", 60_000, 0))).await);
    applier
        .apply(fenced(1_000, "L", token, vec![put("k", "1", None)]))
        .await;
    applier.apply(at(1_000, acquire("gone", "a", 10, 0))).await;
    let token = granted_record(&applier.apply(at(1_000, begin(b"K", "w", 100))).await);
    applier
        .apply(at(2_000, complete(b"K", token, "out", 60_000)))
        .await;
}

#[tokio::test]
async fn snapshots_carry_locks_fences_and_records() {
    let (_dir_a, store_a) = open();
    let mut source = Applier::new(&store_a);
    fill(&mut source).await;
    let snapshot = source
        .sm()
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    // The target holds coordination state of its own that the install must replace.
    let (_dir_b, store_b) = open();
    let mut target = Applier::new(&store_b);
    let token = granted(&target.apply(at(100, acquire("T", "t", 10, 0))).await);
    target
        .apply(fenced(100, "T", token, vec![put("tk", "1", None)]))
        .await;
    target.apply(at(100, begin(b"TK", "t", 10))).await;
    target
        .sm()
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    target.next = source.next;

    let (source_sm, target_sm) = (source.sm(), target.sm());
    assert_eq!(counts(&target).await, counts(&source).await);
    assert_counted(&target_sm).await;
    let counted = target_sm.quota_counts().await.unwrap();
    assert_eq!(counted, source_sm.quota_counts().await.unwrap());
    assert_eq!(counts(&target).await.fenced_keys, 1);
    assert_eq!(
        holder(&target_sm, "L", 0).await,
        holder(&source_sm, "L", 0).await
    );
    assert_eq!(holder(&target_sm, "T", 0).await, None);
    let record = target_sm.idempotency_record(b"K", 0).await.unwrap();
    assert_eq!(record, source_sm.idempotency_record(b"K", 0).await.unwrap());
    assert!(record.0.is_some());
    let plan = target_sm.plan_reclaim(1_000_000).await.unwrap();
    assert_eq!(plan, source_sm.plan_reclaim(1_000_000).await.unwrap());
    assert_eq!(
        plan.locks.len(),
        2,
        "deadlines rebuilt, the target's own gone: {plan:?}"
    );
    // The fence came along: a lower token is refused.
    let stale = target
        .apply(fenced(3_000, "L", 0, vec![put("k", "2", None)]))
        .await;
    assert_eq!(stale, fenced_out(0, "k", "L", 1));
}
