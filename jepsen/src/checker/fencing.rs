//! The fencing checker: locks with fencing tokens and the keys they guard (workload
//! `fencing`, DESIGN §7 "lock + fenced writes"). Ops, beyond the DESIGN §7 fields:
//!
//! - `acquire`: `key` is the lock's name; `owner` and `ttl_ms`; `token` is the granted token
//!   (ok acquires; a lock not granted within the wait is a failed acquire);
//! - `release`: `key` is the lock's name; `token` is the hold it frees;
//! - `fput`: a put of `value` to `key` fenced by (`lock`, `token`); values unique per key;
//! - `get`: a linearizable read of a guarded key (`output` null = absent): the final reads.
//!
//! Ops are grouped by `key` (a lock's name, or a guarded key) and each group is judged alone:
//!
//! - (a) **tokens rise**: an ok acquire that returned before another ok acquire of the same
//!   lock was called has the lower token, or the same one only if both are one owner's (the
//!   holder acquiring again keeps its token);
//! - (b) **one holder under the lease**: of two ok acquires A and B of one lock by different
//!   owners, A with the lower token (tokens are revisions, so A was granted first), B must
//!   not return before A's hold could have expired: `A.call + A.ttl`, less
//!   `CLOCK_RATE_MARGIN_PER_MILLE` of the TTL and `LEASE_MARGIN_MS`. Excused when a release
//!   of A's token (ok or indeterminate) was called before B returned, or A's owner acquired
//!   the lock again in between (which sets a new TTL). Pairs that a `clock` fault overlaps
//!   (a node clock offset; expiry is judged on node clocks), widened by
//!   `CLOCK_FAULT_PAD_MS`, are not judged: a lease needs close clocks, fencing does not;
//! - (c) **fenced writes never go back**: an ok fput that returned before another ok fput of
//!   the same key and lock was called has a token no higher than it;
//! - (d) **final reads**: a successful get returns a value written by an fput of its key
//!   that did not fail and was called before the get returned, whose token is at least that
//!   of every ok fput (same lock) that returned before the get was called (the key refuses
//!   lower tokens once it has accepted one); absence only if no ok fput returned before the
//!   get was called.
//!
//! Unknown outcomes never make a violation: an indeterminate acquire has no token and holds
//! nothing the checker relies on, an indeterminate release counts as a release, an
//! indeterminate fput may explain a read but is never compared. A group with an op missing
//! a field a rule needs, or two fputs of one value, is unknown. O(n log n) per group, plus,
//! for (b), the grants called within one TTL before each grant returned. Knows nothing
//! about servers or how the history was made.

mod keys;
mod locks;
#[cfg(test)]
mod tests;

use serde_json::{Value, json};

use super::lease::{ClockFaults, LeaseStats, by_status, check_leases};
use super::{CheckerName, Outcome};
use crate::fault::FaultEvent;
use crate::history::{Op, OpKind};

use keys::KeyView;
use locks::LockView;

/// What the history holds beyond the verdict, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub locks: usize,
    pub keys: usize,
    /// Ok acquires.
    pub grants: u64,
    /// Acquires answered "not granted" (the lock stayed busy through the wait).
    pub not_granted: u64,
    /// Fputs by outcome, and those refused with `FencedOut`.
    pub fputs: [u64; 3],
    pub fputs_fenced_out: u64,
    /// Fputs a holder made after sleeping past its TTL (`"late":true`), by outcome, and
    /// those refused with `FencedOut`.
    pub late_fputs: [u64; 3],
    pub late_fputs_fenced_out: u64,
    /// Pairs of grants (b) did not judge because a clock fault overlapped them.
    pub pairs_excused_by_clock_faults: u64,
}

/// Checks the history; `faults` says when node clocks were offset (for (b)).
pub fn check(history: &[Op], faults: &[FaultEvent]) -> Outcome {
    let kinds = [OpKind::Acquire, OpKind::Release, OpKind::Fput, OpKind::Get];
    check_leases(CheckerName::Fencing, history, faults, &kinds, judge)
}

/// One group: the lock rules if it holds lock ops, the key rules if it holds key ops.
fn judge(
    history: &[Op],
    indices: &[usize],
    clocks: &ClockFaults,
    stats: &mut Stats,
) -> Result<Result<(), Value>, String> {
    let is_lock_op =
        |&&index: &&usize| matches!(history[index].op, OpKind::Acquire | OpKind::Release);
    let (lock_ops, key_ops): (Vec<usize>, Vec<usize>) = indices.iter().partition(is_lock_op);
    if !lock_ops.is_empty() {
        stats.locks += 1;
        let view = LockView::build(history, &lock_ops, stats)?;
        if let Err(evidence) = view.tokens_rise() {
            return Ok(Err(evidence));
        }
        if let Err(evidence) = view.one_holder(clocks, stats) {
            return Ok(Err(evidence));
        }
    }
    if !key_ops.is_empty() {
        stats.keys += 1;
        let view = KeyView::build(history, &key_ops, stats)?;
        if let Err(evidence) = view.writes_rise() {
            return Ok(Err(evidence));
        }
        if let Err(evidence) = view.final_reads() {
            return Ok(Err(evidence));
        }
    }
    Ok(Ok(()))
}

impl LeaseStats for Stats {
    fn valid_summary(&self) -> String {
        let stats = self;
        format!(
            "{} locks held by one owner at a time with rising tokens, {} keys fenced; {} grants, \
         {} of {} late writes fenced out",
            stats.locks,
            stats.keys,
            stats.grants,
            stats.late_fputs_fenced_out,
            stats.late_fputs.iter().sum::<u64>()
        )
    }

    fn to_json(&self) -> Value {
        json!({
            "locks": self.locks,
            "keys": self.keys,
            "grants": self.grants,
            "not_granted": self.not_granted,
            "fputs": by_status(&self.fputs),
            "fputs_fenced_out": self.fputs_fenced_out,
            "late_fputs": by_status(&self.late_fputs),
            "late_fputs_fenced_out": self.late_fputs_fenced_out,
            "pairs_excused_by_clock_faults": self.pairs_excused_by_clock_faults,
        })
    }
}
