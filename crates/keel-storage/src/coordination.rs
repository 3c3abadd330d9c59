//! The decisions about locks, fenced writes and idempotency records: given the stored
//! record, the range clock and the next revision, what an operation answers and what it
//! stores. Pure: no I/O beyond the lookups it is handed. Knows nothing about redb, threads,
//! sessions or openraft; `apply` deduplicates, reads and writes around these decisions.
//!
//! Rules (`clock` is the range clock the command runs at, `next` the range's next revision;
//! a plan that changes anything takes `next`, one that changes nothing takes no revision):
//! - Locks: a stored hold whose phase is `Free` counts as absent. `Acquire` grants a free
//!   lock with token `next`, or extends a held lock for the same owner keeping its token;
//!   otherwise `Busy`. `Renew` needs the lock held (not delayed) under the token. `Release`
//!   needs it held or delayed under the token; it deletes the hold or hands it to the
//!   successor with token `next`.
//! - Idempotency records: an expired record counts as absent to `Begin`, which starts (or
//!   takes over) a record with token `next`, or reports the live one. `Complete` and `Abort`
//!   act on an in-progress record of their token, expired or not; a `Complete` repeated
//!   after it succeeded answers the stored result again.
//! - Fences: a fenced write is refused if a key it writes is fenced by another lock or by a
//!   higher token of the same lock; an equal token passes.

use keel_types::planted::{self, PlantedBug};
use keel_types::{
    Acquirer, BatchOp, CoordinationOp, CoordinationResult, Fence, IdempotencyRecord, LockHold,
    LockPhase, Rejection, Revision,
};

use crate::error::StorageError;

/// What a coordination operation does to its one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change<T> {
    /// Nothing is written and no revision is taken.
    Nothing,
    /// The record becomes this, at the next revision.
    Store(T),
    /// The record is deleted, at the next revision.
    Remove,
}

/// The decision about one coordination operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan<T> {
    /// The result to answer, or why the operation is refused (a refusal changes nothing).
    pub answer: Result<CoordinationResult, Rejection>,
    pub change: Change<T>,
}

impl<T> Plan<T> {
    fn unchanged(answer: Result<CoordinationResult, Rejection>) -> Plan<T> {
        Plan {
            answer,
            change: Change::Nothing,
        }
    }
}

/// The record a coordination operation acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject<'a> {
    /// A lock name (`locks` table).
    Lock(&'a [u8]),
    /// An idempotency key (`idempotency` table).
    Record(&'a [u8]),
}

pub(crate) fn subject(op: &CoordinationOp) -> Subject<'_> {
    match op {
        CoordinationOp::Acquire { name, .. }
        | CoordinationOp::Renew { name, .. }
        | CoordinationOp::Release { name, .. } => Subject::Lock(name),
        CoordinationOp::Begin { key, .. }
        | CoordinationOp::Complete { key, .. }
        | CoordinationOp::Abort { key, .. } => Subject::Record(key),
    }
}

/// Decides a lock operation (`subject` is `Lock`) against the stored hold of its name.
pub(crate) fn plan_lock_op(
    op: &CoordinationOp,
    stored: Option<&LockHold>,
    clock_ms: u64,
    next: Revision,
) -> Plan<LockHold> {
    let phase = stored.map_or(LockPhase::Free, |hold| hold.phase(clock_ms));
    let grant = |acquirer: &Acquirer, token| LockHold {
        owner: acquirer.owner.clone(),
        token,
        expires_at_ms: clock_ms.saturating_add(acquirer.ttl_ms),
        lock_delay_ms: acquirer.lock_delay_ms,
    };
    // The token of a held lock that matches `token`, or the refusal to answer.
    let holding = |name: &[u8], token: u64, phases: &[LockPhase]| match stored {
        Some(hold) if hold.token == token && phases.contains(&phase) => Ok(hold.clone()),
        _ => Err(Rejection::LockNotHeld {
            name: name.to_vec(),
            token,
            current_token: stored
                .filter(|_| phase == LockPhase::Held)
                .map(|hold| hold.token),
        }),
    };
    match op {
        CoordinationOp::Acquire { acquirer, .. } => match (stored, phase) {
            (_, LockPhase::Free) => store(CoordinationResult::Acquired, grant(acquirer, next)),
            (Some(hold), LockPhase::Held) if hold.owner == acquirer.owner => {
                store(CoordinationResult::Acquired, grant(acquirer, hold.token))
            }
            // The planted bug grants a held (or delayed) lock as if it were free.
            (Some(_), _) if planted::active(PlantedBug::LockNoExpiry) => {
                store(CoordinationResult::Acquired, grant(acquirer, next))
            }
            (Some(hold), _) => Plan::unchanged(Ok(CoordinationResult::Busy(hold.clone()))),
            (None, _) => unreachable!("an absent lock is free"),
        },
        CoordinationOp::Renew {
            name,
            token,
            ttl_ms,
        } => match holding(name, *token, &[LockPhase::Held]) {
            Ok(hold) => {
                let expires_at_ms = clock_ms.saturating_add(*ttl_ms);
                store(
                    CoordinationResult::Renewed,
                    LockHold {
                        expires_at_ms,
                        ..hold
                    },
                )
            }
            Err(rejection) => Plan::unchanged(Err(rejection)),
        },
        CoordinationOp::Release {
            name,
            token,
            successor,
        } => match holding(name, *token, &[LockPhase::Held, LockPhase::Delayed]) {
            Ok(_) => release(successor.as_ref().map(|successor| grant(successor, next))),
            Err(rejection) => Plan::unchanged(Err(rejection)),
        },
        other => unreachable!("{other:?} is not a lock operation"),
    }
}

fn store(result: impl FnOnce(LockHold) -> CoordinationResult, hold: LockHold) -> Plan<LockHold> {
    Plan {
        answer: Ok(result(hold.clone())),
        change: Change::Store(hold),
    }
}

fn release(successor: Option<LockHold>) -> Plan<LockHold> {
    let change = match &successor {
        Some(hold) => Change::Store(hold.clone()),
        None => Change::Remove,
    };
    Plan {
        answer: Ok(CoordinationResult::Released { successor }),
        change,
    }
}

/// Decides an idempotency operation (`subject` is `Record`) against its stored record.
pub(crate) fn plan_idempotency_op(
    op: &CoordinationOp,
    stored: Option<&IdempotencyRecord>,
    clock_ms: u64,
    next: Revision,
) -> Plan<IdempotencyRecord> {
    let live = stored.filter(|record| !record.is_expired(clock_ms));
    // Whether the stored record is in progress under `token`, expired or not.
    let owns = |token: u64| matches!(stored, Some(IdempotencyRecord::InProgress { token: stored, .. }) if *stored == token);
    let not_owned = |key: &[u8], token: u64| {
        Plan::unchanged(Err(Rejection::RecordNotOwned {
            key: key.to_vec(),
            token,
            current_token: live.map(IdempotencyRecord::token),
        }))
    };
    match op {
        CoordinationOp::Begin { owner, ttl_ms, .. } => begin(live, owner, *ttl_ms, clock_ms, next),
        // The planted bug stores any token's result over a live record, even a completed one.
        CoordinationOp::Complete {
            token,
            result,
            result_ttl_ms,
            ..
        } if owns(*token) || (live.is_some() && planted::active(PlantedBug::IdemStaleComplete)) => {
            let expires_at_ms = clock_ms.saturating_add(*result_ttl_ms);
            Plan {
                answer: Ok(CoordinationResult::Completed {
                    result: result.clone(),
                    expires_at_ms,
                }),
                change: Change::Store(IdempotencyRecord::Completed {
                    result: result.clone(),
                    token: *token,
                    expires_at_ms,
                }),
            }
        }
        CoordinationOp::Complete { key, token, .. } => match live {
            Some(IdempotencyRecord::Completed {
                result,
                token: stored,
                expires_at_ms,
            }) if stored == token => Plan::unchanged(Ok(CoordinationResult::Completed {
                result: result.clone(),
                expires_at_ms: *expires_at_ms,
            })),
            _ => not_owned(key, *token),
        },
        CoordinationOp::Abort { token, .. } if owns(*token) => Plan {
            answer: Ok(CoordinationResult::Aborted),
            change: Change::Remove,
        },
        CoordinationOp::Abort { key, token } => not_owned(key, *token),
        other => unreachable!("{other:?} is not an idempotency operation"),
    }
}

fn begin(
    live: Option<&IdempotencyRecord>,
    owner: &[u8],
    ttl_ms: u64,
    clock_ms: u64,
    next: Revision,
) -> Plan<IdempotencyRecord> {
    match live {
        None => {
            let expires_at_ms = clock_ms.saturating_add(ttl_ms);
            Plan {
                answer: Ok(CoordinationResult::Started {
                    token: next,
                    expires_at_ms,
                }),
                change: Change::Store(IdempotencyRecord::InProgress {
                    owner: owner.to_vec(),
                    token: next,
                    expires_at_ms,
                }),
            }
        }
        Some(IdempotencyRecord::InProgress {
            owner,
            expires_at_ms,
            ..
        }) => Plan::unchanged(Ok(CoordinationResult::InProgress {
            owner: owner.clone(),
            expires_at_ms: *expires_at_ms,
        })),
        Some(IdempotencyRecord::Completed {
            result,
            expires_at_ms,
            ..
        }) => Plan::unchanged(Ok(CoordinationResult::Completed {
            result: result.clone(),
            expires_at_ms: *expires_at_ms,
        })),
    }
}

/// Checks a write fenced by `fence` against the fence rows of the keys its ops write, in op
/// order; `lookup` reads a key's fence row. `Some` refusal if a key is fenced by another lock
/// or by a higher token.
pub(crate) fn check_fences(
    fence: &Fence,
    ops: &[BatchOp],
    mut lookup: impl FnMut(&[u8]) -> Result<Option<Fence>, StorageError>,
) -> Result<Option<Rejection>, StorageError> {
    for (op_index, op) in ops.iter().enumerate() {
        let Some(current) = lookup(op.key())? else {
            continue;
        };
        if current.lock != fence.lock || current.token > fence.token {
            return Ok(Some(Rejection::FencedOut {
                op_index: u32::try_from(op_index).expect("op count fits in u32"),
                key: op.key().to_vec(),
                lock: current.lock,
                current_token: current.token,
            }));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
