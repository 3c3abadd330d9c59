//! The retry policy as pure functions: given what went wrong with an attempt, retry (and
//! where) or give up (and with which error). Knows nothing of channels, clocks or tonic.
//!
//! The rule: a read is retried whatever happened (reads change nothing). A write carries a
//! request id, so the server applies it at most once however often it is sent: it is retried
//! with the same id unless the answer is final, and only `RequestIdExpired` moves it to a new
//! id, and only while no attempt of it can have been applied. Final answers are those about
//! the data or the caller's standing, which sending again cannot change: a failed condition,
//! a bad argument, a non-counter or an overflow, a fenced-out write, a lock not held, an
//! idempotency record not owned.
//!
//! Ranges: `KeyOutOfRange` (and `EpochMismatch` on a data request) means the request reached
//! a range that does not hold its key and nothing was applied (the server refuses before it
//! stores a request record): refresh the range table and send again, same id. On a split,
//! `EpochMismatch` is final (the range changed meanwhile).

use std::time::Duration;

use keel_types::{KvError, NodeAddr, RangeDescriptor, limits};

use crate::attempt::AttemptError;
use crate::endpoints;

/// First pause between write attempts (before jitter); it doubles per attempt.
const WRITE_BACKOFF_MS_MIN: u64 = 50;
/// Longest pause between write attempts (before jitter).
const WRITE_BACKOFF_MS_MAX: u64 = 1_000;
/// Pause before following a leader hint that is not the request's first (it doubles per
/// attempt): during a leader transfer the old leader names the new one before that one has
/// won, and the two can send a request back and forth until it has.
const HINT_BACKOFF_MS_MIN: u64 = 10;
/// Longest pause before following a leader hint.
const HINT_BACKOFF_MS_MAX: u64 = 200;

/// Where the next attempt goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The leader a replica named; it may be missing from the endpoint list.
    Hinted(NodeAddr),
    /// The next endpoint of the list, in rotation.
    Next,
    /// The endpoint that answered: it is the right one, only busy (`Overloaded`).
    Same,
    /// The request reached the wrong range: refresh the range table and route again.
    Refresh,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Retry { target: Target },
    GiveUp(KvError),
}

/// What the attempts of one write have shown so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteProgress {
    /// Attempts made, under every id the write had.
    pub attempts: u32,
    /// Some attempt may have been applied (its outcome is unknown).
    pub maybe_applied: bool,
    /// The write was moved to a new session and id once already.
    pub renewed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteDecision {
    /// Send the write again with the same request id.
    Retry {
        target: Target,
    },
    /// The id expired before any attempt can have been applied: open a new session and send
    /// the write under a new id, to the same endpoint.
    Renew,
    GiveUp(KvError),
}

/// What a failed attempt says about the request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Effect {
    /// Certainly not applied; may go again, there.
    NotApplied(Target),
    /// May have been applied: sent, and no answer came (or one saying it is unknown); the
    /// next attempt goes to the target.
    MaybeApplied(Target),
    /// The server refused the request id as expired; nothing was applied now.
    IdExpired,
    /// An answer that sending again cannot change.
    Final,
    /// Refused at the door (credentials, a quota), before the request id was looked at:
    /// this attempt was not applied, but an earlier one may have been.
    Refused,
}

fn effect(error: &AttemptError) -> Effect {
    match error {
        AttemptError::Server(KvError::NotLeader {
            leader: Some((_, addr)),
            ..
        }) if !addr.addr.is_empty() => Effect::NotApplied(Target::Hinted(addr.clone())),
        AttemptError::Server(KvError::NotLeader { .. } | KvError::Unavailable { .. })
        | AttemptError::NotSent(_) => Effect::NotApplied(Target::Next),
        AttemptError::Server(KvError::Overloaded { .. }) => Effect::NotApplied(Target::Same),
        AttemptError::Server(KvError::KeyOutOfRange { .. } | KvError::EpochMismatch { .. }) => {
            Effect::NotApplied(Target::Refresh)
        }
        AttemptError::Server(
            KvError::Timeout { .. } | KvError::Fatal { .. } | KvError::OutcomeUnknown { .. },
        )
        | AttemptError::Lost(_)
        | AttemptError::TimedOut(_) => Effect::MaybeApplied(Target::Next),
        AttemptError::Superseded { leader, .. } => {
            Effect::MaybeApplied(Target::Hinted(leader.clone()))
        }
        AttemptError::Server(KvError::RequestIdExpired { .. }) => Effect::IdExpired,
        AttemptError::Server(
            KvError::InvalidArgument { .. }
            | KvError::ConditionFailed(_)
            | KvError::NotACounter { .. }
            | KvError::Overflow { .. }
            | KvError::FencedOut { .. }
            | KvError::LockNotHeld { .. }
            | KvError::RecordNotOwned { .. }
            | KvError::FutureRevision { .. }
            | KvError::Compacted { .. }
            | KvError::LeaseNotFound { .. },
        ) => Effect::Final,
        AttemptError::Server(
            KvError::Unauthenticated { .. }
            | KvError::PermissionDenied { .. }
            | KvError::QuotaExceeded { .. },
        ) => Effect::Refused,
    }
}

/// Decides after attempt number `attempt` (1 for the first) of a read failed with `error`.
pub fn decide_read(error: &AttemptError, attempt: u32) -> Decision {
    let target = match effect(error) {
        Effect::NotApplied(target) | Effect::MaybeApplied(target) => target,
        Effect::IdExpired | Effect::Final | Effect::Refused => {
            return Decision::GiveUp(final_error(error));
        }
    };
    if attempt >= limits::CLIENT_READ_ATTEMPTS_MAX {
        return Decision::GiveUp(read_exhausted(error, &format!("{attempt} attempts")));
    }
    Decision::Retry { target }
}

/// Decides after an attempt of a write failed with `error`; `progress` counts that attempt
/// already and is updated with what the error shows.
pub fn decide_write(error: &AttemptError, progress: &mut WriteProgress) -> WriteDecision {
    let target = match effect(error) {
        Effect::Final => return WriteDecision::GiveUp(final_error(error)),
        Effect::Refused if progress.maybe_applied => {
            let spent = format!("{} attempts", progress.attempts);
            return WriteDecision::GiveUp(write_gave_up(error, progress, &spent));
        }
        Effect::Refused => return WriteDecision::GiveUp(final_error(error)),
        Effect::IdExpired if !progress.maybe_applied && !progress.renewed => {
            progress.renewed = true;
            return WriteDecision::Renew;
        }
        Effect::IdExpired => return WriteDecision::GiveUp(final_error(error)),
        Effect::NotApplied(target) => target,
        Effect::MaybeApplied(target) => {
            progress.maybe_applied = true;
            target
        }
    };
    if progress.attempts >= limits::CLIENT_WRITE_ATTEMPTS_MAX {
        let spent = format!("{} attempts", progress.attempts);
        return WriteDecision::GiveUp(write_gave_up(error, progress, &spent));
    }
    WriteDecision::Retry { target }
}

/// Decides after attempt number `attempt` of a split failed with `error`. A split carries no
/// request id, but the server answers a split already made at its key with the two halves
/// it made, so an attempt that may have been applied is sent again like any other.
/// `EpochMismatch` is final: the range changed since the split was asked for. The call
/// answers `OutcomeUnknown` when it is given up after an attempt that may have been applied
/// (`settled`).
pub fn decide_split(error: &AttemptError, attempt: u32) -> Decision {
    if let AttemptError::Server(KvError::EpochMismatch { .. }) = error {
        return Decision::GiveUp(final_error(error));
    }
    decide_read(error, attempt)
}

/// Whether the failed attempt of a write may have been applied.
pub fn may_have_applied(error: &AttemptError) -> bool {
    matches!(effect(error), Effect::MaybeApplied(_))
}

/// What a call without a request id (a split) answers when it is given up with `error`:
/// `error` itself, unless an earlier attempt may have been applied and `error` would say
/// nothing was (`Unavailable`, `Timeout`, `Overloaded`); then `OutcomeUnknown`.
pub fn settled(error: KvError, maybe_applied: bool) -> KvError {
    match error {
        KvError::Unavailable { message }
        | KvError::Timeout { message }
        | KvError::Overloaded { message }
            if maybe_applied =>
        {
            KvError::OutcomeUnknown {
                message: format!("{message}; an earlier attempt may or may not have been applied"),
            }
        }
        error => error,
    }
}

/// Whether a write whose keys the range table now places in more than one range was
/// certainly applied nowhere, so it may be refused (an atomic batch) or split into new
/// requests with new ids (a part of a non-atomic batch). Ranges only split, and a child
/// range starts with its parent's request records, so an applied write is answered from its
/// record by whichever range now holds its first key. Hence: no attempt may have been
/// applied, or the range holding the first key said `KeyOutOfRange` (it has no record).
pub fn spanning_write_not_applied(
    progress: &WriteProgress,
    last: &AttemptError,
    first_key: &[u8],
) -> bool {
    if !progress.maybe_applied {
        return true;
    }
    let refused_by_owner = |range: &RangeDescriptor| range.contains(first_key);
    matches!(last, AttemptError::Server(KvError::KeyOutOfRange { range, .. }) if refused_by_owner(range))
}

/// The error to return when the deadline of a read passes before a retry the policy wanted.
pub fn read_deadline_passed(error: &AttemptError, timeout: Duration) -> KvError {
    read_exhausted(error, &format!("{} ms", timeout.as_millis()))
}

/// The error to return when a write is given up before an answer: `OutcomeUnknown` if any
/// attempt may have been applied, else what the last attempt said (it was not applied).
pub fn write_gave_up(error: &AttemptError, progress: &WriteProgress, spent: &str) -> KvError {
    if progress.maybe_applied {
        return KvError::OutcomeUnknown {
            message: format!(
                "no answer after {spent}; last error: {error}; the write may or may not have been applied"
            ),
        };
    }
    let message = format!("gave up after {spent}; the write was not applied; last error: {error}");
    match error {
        AttemptError::Server(KvError::Overloaded { .. }) => KvError::Overloaded { message },
        _ => KvError::Unavailable { message },
    }
}

/// Pause before attempt `attempt + 1` of a read, given the error of attempt `attempt`, where
/// the next attempt goes, and the time left before the deadline:
///
/// - none when following the request's first hint to a leader, or to a refreshed range
///   table (the refresh itself is rate-limited); `hint_backoff` for a later hint;
/// - while the range has no leader (`NotLeader` without a usable hint, `Unavailable`), the
///   time left spread evenly over the attempts left, within 100 ms..1 s: elections take
///   seconds, and attempts spent early would be missing when the new leader is up;
/// - otherwise (a connection failure, no answer), doubling from 50 ms up to 1 s, so another
///   endpoint is tried soon.
pub fn read_backoff(
    error: &AttemptError,
    target: &Target,
    attempt: u32,
    remaining: Duration,
) -> Duration {
    match target {
        Target::Hinted(_) => return hint_backoff(attempt),
        Target::Refresh => return Duration::ZERO,
        Target::Next | Target::Same => {}
    }
    match error {
        AttemptError::Server(KvError::NotLeader { .. } | KvError::Unavailable { .. }) => {
            // One share more than attempts left, so the last attempt has time to run too.
            let shares = limits::CLIENT_READ_ATTEMPTS_MAX.saturating_sub(attempt) + 1;
            (remaining / shares).clamp(Duration::from_millis(100), Duration::from_secs(1))
        }
        _ => Duration::from_millis((50u64 << attempt.saturating_sub(1).min(5)).min(1_000)),
    }
}

/// Pause before attempt `attempt + 1` of a write: `hint_backoff` when following a hint to a
/// leader, none for a refreshed range table (whose refresh is rate-limited), else exponential
/// from `WRITE_BACKOFF_MS_MIN` to `WRITE_BACKOFF_MS_MAX`, of which a random part (`jitter`,
/// 0..=1) is kept in the second half, so that many clients retrying after one failure
/// spread out.
pub fn write_backoff(target: &Target, attempt: u32, jitter: f64) -> Duration {
    match target {
        Target::Hinted(_) => return hint_backoff(attempt),
        Target::Refresh => return Duration::ZERO,
        Target::Next | Target::Same => {}
    }
    let exponent = attempt.saturating_sub(1).min(16);
    let base_ms = (WRITE_BACKOFF_MS_MIN << exponent).min(WRITE_BACKOFF_MS_MAX);
    let half_us = base_ms * 500;
    // `as` saturates; the product is within 0..=half_us.
    let jitter_us = (half_us as f64 * jitter.clamp(0.0, 1.0)) as u64;
    Duration::from_micros(half_us + jitter_us)
}

/// Pause before following a leader hint after attempt `attempt`: none after the first
/// attempt (a leader moved; the hint is news), then doubling from `HINT_BACKOFF_MS_MIN` to
/// `HINT_BACKOFF_MS_MAX`, so that two replicas naming each other while a transfer completes
/// do not use up the request's attempts in a few milliseconds.
pub fn hint_backoff(attempt: u32) -> Duration {
    if attempt <= 1 {
        return Duration::ZERO;
    }
    let exponent = (attempt - 2).min(16);
    Duration::from_millis((HINT_BACKOFF_MS_MIN << exponent).min(HINT_BACKOFF_MS_MAX))
}

/// A hint naming an endpoint that could not be reached during this request is stale (replicas
/// name a crashed leader until they elect a new one): rotate instead. `unreachable` holds
/// normalized URIs.
pub fn skip_stale_hint(target: Target, unreachable: &[String]) -> Target {
    match &target {
        Target::Hinted(addr) => match endpoints::normalize(&addr.addr) {
            Ok(uri) if !unreachable.contains(&uri) => target,
            _ => Target::Next,
        },
        Target::Next | Target::Same | Target::Refresh => target,
    }
}

/// The error returned for an attempt error that is not retried (for a write: a final answer,
/// always the server's own).
pub fn final_error(error: &AttemptError) -> KvError {
    match error {
        AttemptError::Server(error) => error.clone(),
        AttemptError::NotSent(_) | AttemptError::Lost(_) => KvError::unavailable(error.to_string()),
        AttemptError::TimedOut(_) | AttemptError::Superseded { .. } => KvError::Timeout {
            message: error.to_string(),
        },
    }
}

/// The error returned when a read's retryable error is still there after `spent`.
fn read_exhausted(error: &AttemptError, spent: &str) -> KvError {
    let message = format!("gave up after {spent}; last error: {error}");
    match error {
        AttemptError::TimedOut(_)
        | AttemptError::Superseded { .. }
        | AttemptError::Server(KvError::Timeout { .. }) => KvError::Timeout { message },
        AttemptError::Server(KvError::Overloaded { .. }) => KvError::Overloaded { message },
        _ => KvError::Unavailable { message },
    }
}

#[cfg(test)]
mod tests;
