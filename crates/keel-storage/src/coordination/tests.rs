//! Table tests of the coordination planners: every rule of the lock, idempotency and fence
//! decisions, one short case each.

use keel_types::{Acquirer, BatchOp, CoordinationOp, CoordinationResult, Fence, Rejection};

use super::*;

/// The clock every plan runs at.
const NOW: u64 = 1_000;
/// The revision a changing plan takes.
const NEXT: Revision = 11;

fn hold(owner: &str, token: u64, expires_at_ms: u64, lock_delay_ms: u64) -> LockHold {
    LockHold {
        owner: owner.as_bytes().to_vec(),
        token,
        expires_at_ms,
        lock_delay_ms,
    }
}

fn acquirer(owner: &str, ttl_ms: u64, lock_delay_ms: u64) -> Acquirer {
    Acquirer {
        owner: owner.as_bytes().to_vec(),
        ttl_ms,
        lock_delay_ms,
    }
}

fn acquire(owner: &str, ttl_ms: u64, lock_delay_ms: u64) -> CoordinationOp {
    CoordinationOp::Acquire {
        name: b"L".to_vec(),
        acquirer: acquirer(owner, ttl_ms, lock_delay_ms),
    }
}

fn renew(token: u64, ttl_ms: u64) -> CoordinationOp {
    CoordinationOp::Renew {
        name: b"L".to_vec(),
        token,
        ttl_ms,
    }
}

fn release(token: u64, successor: Option<Acquirer>) -> CoordinationOp {
    CoordinationOp::Release {
        name: b"L".to_vec(),
        token,
        successor,
    }
}

/// Held by `a` under token 7 until 1_500, then delayed 100 ms.
fn held() -> LockHold {
    hold("a", 7, 1_500, 100)
}

/// `a`'s TTL ran out at 900; delayed until 1_100.
fn delayed() -> LockHold {
    hold("a", 7, 900, 200)
}

/// `a`'s TTL ran out at 800; free since 900.
fn free() -> LockHold {
    hold("a", 7, 800, 100)
}

fn not_held(token: u64, current_token: Option<u64>) -> Plan<LockHold> {
    Plan::unchanged(Err(Rejection::LockNotHeld {
        name: b"L".to_vec(),
        token,
        current_token,
    }))
}

fn check_lock(op: CoordinationOp, stored: Option<LockHold>, expected: Plan<LockHold>) {
    assert_eq!(subject(&op), Subject::Lock(b"L"));
    let plan = plan_lock_op(&op, stored.as_ref(), NOW, NEXT);
    assert_eq!(plan, expected, "{op:?} on {stored:?}");
}

#[test]
fn acquire_plans() {
    let granted = |hold: LockHold| store(CoordinationResult::Acquired, hold);
    let busy = |hold: LockHold| Plan::unchanged(Ok(CoordinationResult::Busy(hold)));
    // A free lock is granted with the next revision as its token.
    check_lock(
        acquire("b", 500, 50),
        None,
        granted(hold("b", NEXT, 1_500, 50)),
    );
    check_lock(
        acquire("b", 500, 0),
        Some(free()),
        granted(hold("b", NEXT, 1_500, 0)),
    );
    // Free at exactly its available instant.
    check_lock(
        acquire("b", 10, 0),
        Some(hold("a", 7, NOW, 0)),
        granted(hold("b", NEXT, 1_010, 0)),
    );
    // The holder acquiring again keeps its token, with the new expiry and delay.
    check_lock(
        acquire("a", 2_000, 5),
        Some(held()),
        granted(hold("a", 7, 3_000, 5)),
    );
    // Anyone else, or anyone during the delay, is told who holds it.
    check_lock(acquire("b", 500, 0), Some(held()), busy(held()));
    check_lock(acquire("a", 500, 0), Some(delayed()), busy(delayed()));
    check_lock(acquire("b", 500, 0), Some(delayed()), busy(delayed()));
}

#[test]
fn renew_plans() {
    check_lock(
        renew(7, 2_000),
        Some(held()),
        store(CoordinationResult::Renewed, hold("a", 7, 3_000, 100)),
    );
    // A stale token is refused with the holder's; a lock that is not held has no holder.
    check_lock(renew(6, 2_000), Some(held()), not_held(6, Some(7)));
    check_lock(renew(7, 2_000), Some(delayed()), not_held(7, None));
    check_lock(renew(7, 2_000), Some(free()), not_held(7, None));
    check_lock(renew(7, 2_000), None, not_held(7, None));
}

#[test]
fn release_plans() {
    let released = |successor: Option<LockHold>| {
        let change = successor.clone().map_or(Change::Remove, Change::Store);
        Plan {
            answer: Ok(CoordinationResult::Released { successor }),
            change,
        }
    };
    check_lock(release(7, None), Some(held()), released(None));
    check_lock(release(7, None), Some(delayed()), released(None));
    // A hand-over grants the successor a new token in the same step.
    let successor = Some(acquirer("c", 300, 20));
    check_lock(
        release(7, successor),
        Some(held()),
        released(Some(hold("c", NEXT, 1_300, 20))),
    );
    check_lock(release(8, None), Some(held()), not_held(8, Some(7)));
    check_lock(release(6, None), Some(delayed()), not_held(6, None));
    check_lock(release(7, None), Some(free()), not_held(7, None));
    check_lock(release(7, None), None, not_held(7, None));
}

fn begin(owner: &str, ttl_ms: u64) -> CoordinationOp {
    CoordinationOp::Begin {
        key: b"K".to_vec(),
        owner: owner.as_bytes().to_vec(),
        ttl_ms,
    }
}

fn complete(token: u64, result: &str, result_ttl_ms: u64) -> CoordinationOp {
    CoordinationOp::Complete {
        key: b"K".to_vec(),
        token,
        result: result.as_bytes().to_vec(),
        result_ttl_ms,
    }
}

fn abort(token: u64) -> CoordinationOp {
    CoordinationOp::Abort {
        key: b"K".to_vec(),
        token,
    }
}

fn in_progress(owner: &str, token: u64, expires_at_ms: u64) -> IdempotencyRecord {
    IdempotencyRecord::InProgress {
        owner: owner.as_bytes().to_vec(),
        token,
        expires_at_ms,
    }
}

fn completed(result: &str, token: u64, expires_at_ms: u64) -> IdempotencyRecord {
    IdempotencyRecord::Completed {
        result: result.as_bytes().to_vec(),
        token,
        expires_at_ms,
    }
}

fn completed_result(result: &str, expires_at_ms: u64) -> CoordinationResult {
    CoordinationResult::Completed {
        result: result.as_bytes().to_vec(),
        expires_at_ms,
    }
}

fn not_owned(token: u64, current_token: Option<u64>) -> Plan<IdempotencyRecord> {
    Plan::unchanged(Err(Rejection::RecordNotOwned {
        key: b"K".to_vec(),
        token,
        current_token,
    }))
}

fn check_record(
    op: CoordinationOp,
    stored: Option<IdempotencyRecord>,
    expected: Plan<IdempotencyRecord>,
) {
    assert_eq!(subject(&op), Subject::Record(b"K"));
    let plan = plan_idempotency_op(&op, stored.as_ref(), NOW, NEXT);
    assert_eq!(plan, expected, "{op:?} on {stored:?}");
}

#[test]
fn begin_plans() {
    let started = |owner| Plan {
        answer: Ok(CoordinationResult::Started {
            token: NEXT,
            expires_at_ms: 1_200,
        }),
        change: Change::Store(in_progress(owner, NEXT, 1_200)),
    };
    check_record(begin("w", 200), None, started("w"));
    // An expired record (at exactly its expiry) is taken over with a higher token.
    check_record(
        begin("w2", 200),
        Some(in_progress("w1", 5, NOW)),
        started("w2"),
    );
    check_record(
        begin("w2", 200),
        Some(completed("r", 5, 900)),
        started("w2"),
    );
    // A live record is reported and nothing changes.
    let working = CoordinationResult::InProgress {
        owner: b"w1".to_vec(),
        expires_at_ms: 1_500,
    };
    check_record(
        begin("w2", 200),
        Some(in_progress("w1", 5, 1_500)),
        Plan::unchanged(Ok(working)),
    );
    check_record(
        begin("w1", 200),
        Some(completed("r", 5, 5_000)),
        Plan::unchanged(Ok(completed_result("r", 5_000))),
    );
}

#[test]
fn complete_plans() {
    let done = Plan {
        answer: Ok(completed_result("out", 1_300)),
        change: Change::Store(completed("out", 5, 1_300)),
    };
    check_record(
        complete(5, "out", 300),
        Some(in_progress("w", 5, 1_500)),
        done.clone(),
    );
    // The owner may still complete after its TTL if nobody took the record over.
    check_record(
        complete(5, "out", 300),
        Some(in_progress("w", 5, 900)),
        done,
    );
    // Taken over: the old owner's token is refused with the new one.
    check_record(
        complete(5, "out", 300),
        Some(in_progress("w2", NEXT, 1_500)),
        not_owned(5, Some(NEXT)),
    );
    check_record(
        complete(4, "out", 300),
        Some(in_progress("w", 5, 900)),
        not_owned(4, None),
    );
    // A repeated complete answers the stored result and changes nothing.
    check_record(
        complete(5, "other", 300),
        Some(completed("out", 5, 5_000)),
        Plan::unchanged(Ok(completed_result("out", 5_000))),
    );
    check_record(
        complete(6, "out", 300),
        Some(completed("out", 5, 5_000)),
        not_owned(6, Some(5)),
    );
    check_record(
        complete(5, "out", 300),
        Some(completed("out", 5, 900)),
        not_owned(5, None),
    );
    check_record(complete(5, "out", 300), None, not_owned(5, None));
}

#[test]
fn abort_plans() {
    let aborted = Plan {
        answer: Ok(CoordinationResult::Aborted),
        change: Change::Remove,
    };
    check_record(abort(5), Some(in_progress("w", 5, 1_500)), aborted.clone());
    check_record(abort(5), Some(in_progress("w", 5, 900)), aborted);
    check_record(
        abort(4),
        Some(in_progress("w", 5, 1_500)),
        not_owned(4, Some(5)),
    );
    check_record(
        abort(5),
        Some(completed("out", 5, 5_000)),
        not_owned(5, Some(5)),
    );
    check_record(abort(5), None, not_owned(5, None));
}

fn fence(lock: &str, token: u64) -> Fence {
    Fence {
        lock: lock.as_bytes().to_vec(),
        token,
    }
}

fn put(key: &str) -> BatchOp {
    BatchOp::Put {
        key: key.as_bytes().to_vec(),
        value: b"v".to_vec(),
        condition: None,
        return_previous: false,
        ttl_ms: None,
    }
}

fn delete(key: &str) -> BatchOp {
    BatchOp::Delete {
        key: key.as_bytes().to_vec(),
        condition: None,
        return_previous: false,
    }
}

fn fenced_out(op_index: u32, key: &str, lock: &str, current_token: u64) -> Option<Rejection> {
    Some(Rejection::FencedOut {
        op_index,
        key: key.as_bytes().to_vec(),
        lock: lock.as_bytes().to_vec(),
        current_token,
    })
}

/// Checks `ops` fenced by `with` against the fence rows `a` → (L, 5), `b` → (M, 3).
fn check_fence(with: Fence, ops: Vec<BatchOp>, expected: Option<Rejection>) {
    let stored = |key: &[u8]| match key {
        b"a" => Ok(Some(fence("L", 5))),
        b"b" => Ok(Some(fence("M", 3))),
        _ => Ok(None),
    };
    let checked = check_fences(&with, &ops, stored).unwrap();
    assert_eq!(checked, expected, "{ops:?} fenced by {with:?}");
}

#[test]
fn fence_checks() {
    // An equal or higher token of the key's lock passes; so does any fence on a new key.
    check_fence(fence("L", 5), vec![put("a")], None);
    check_fence(fence("L", 6), vec![put("a"), delete("a")], None);
    check_fence(fence("Z", 1), vec![put("c")], None);
    // A lower token, or another lock, is fenced out with the key's own fence.
    check_fence(fence("L", 4), vec![put("a")], fenced_out(0, "a", "L", 5));
    check_fence(fence("L", 9), vec![delete("b")], fenced_out(0, "b", "M", 3));
    let increment = BatchOp::Increment {
        key: b"a".to_vec(),
        delta: 1,
    };
    check_fence(fence("M", 9), vec![increment], fenced_out(0, "a", "L", 5));
    // The first refused op in order is reported.
    check_fence(
        fence("L", 4),
        vec![put("c"), delete("b"), put("a")],
        fenced_out(1, "b", "M", 3),
    );
}
