//! Errors of the client's compound calls: taking a lock for a guard, losing it, and running
//! work under an idempotency record. Single calls fail with `KvError`.

use std::time::Duration;

use keel_types::KvError;
use keel_types::validate::show_key;
use thiserror::Error;

use crate::results::LockHolder;

/// Why `Client::lock` returned no guard.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LockError {
    /// Someone else held the lock (or it was in its lock-delay) until the wait ran out.
    #[error("lock {} is held{}; it becomes free in {} ms unless renewed", show_key(.name), holder_text(.holder), .available_in.as_millis())]
    Busy {
        name: Vec<u8>,
        /// Unset when the lock is in its lock-delay with nobody holding it.
        holder: Option<LockHolder>,
        available_in: Duration,
    },
    /// The acquire (or the renew that follows a long wait) failed.
    #[error(transparent)]
    Keel(#[from] KvError),
}

/// Why a `LockGuard` no longer holds its lock, as `LockGuard::lost` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LockLost {
    /// A renew was refused: the TTL had run out, and maybe another holder took the lock.
    #[error("lock lost: a renew was refused: {0}")]
    Refused(KvError),
    /// The lock's TTL, counted from when the last successful acquire or renew was sent, ran
    /// out before another renew succeeded. The cluster may not have noticed yet, but this
    /// holder can no longer tell that it holds the lock.
    #[error("lock lost: its TTL ran out before a renew succeeded")]
    Expired,
    /// The guard was released or dropped.
    #[error("lock released")]
    Released,
}

/// Why `Client::idempotent` returned no result.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdempotentError<E> {
    /// The work failed; the record was aborted (best effort), so the next caller runs it
    /// afresh.
    #[error("the work failed: {0}")]
    Work(#[source] E),
    /// The cluster refused a call or left its outcome unknown. `RecordNotOwned` after the
    /// work ran means it outlived its TTL and another caller took the record over: this
    /// result was not stored, and the other owner's result wins.
    #[error(transparent)]
    Keel(#[from] KvError),
    /// Another owner still had the work in progress when the wait ran out.
    #[error("another owner ({}) has the work in progress for {} ms more", show_key(.owner), .ttl_remaining.as_millis())]
    InProgress {
        owner: Vec<u8>,
        ttl_remaining: Duration,
    },
}

fn holder_text(holder: &Option<LockHolder>) -> String {
    match holder {
        Some(holder) => format!(
            " by {} with token {}",
            show_key(&holder.owner),
            holder.token
        ),
        None => " in its lock-delay".to_string(),
    }
}
