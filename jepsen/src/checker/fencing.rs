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

use serde_json::{Map, Value, json};

use super::{CheckerName, Outcome, Verdict, foreign_op, keyed_outcome, ops_by_key};
use crate::fault::FaultEvent;
use crate::history::{Op, OpKind, Status};

use keys::KeyView;
use locks::LockView;
pub(super) use locks::{ClockFaults, lease_ns};

/// How much slower than the runner's clock a node's clock may run, per mille of a TTL: a
/// hold is taken to last at least this much less than its TTL.
pub const CLOCK_RATE_MARGIN_PER_MILLE: u64 = 10;
/// A hold is taken to last at least this much less than its TTL besides (expiry is judged
/// in whole milliseconds).
pub const LEASE_MARGIN_MS: u64 = 5;
/// A clock fault's span is widened by this on both sides: its start is logged after the
/// offset was set, its stop after it was reset.
pub const CLOCK_FAULT_PAD_MS: u64 = 2_500;

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
    if let Some(index) = history.iter().position(|op| !kinds.contains(&op.op)) {
        return foreign_op(CheckerName::Fencing, history, index);
    }
    let clocks = ClockFaults::new(faults);
    let groups = ops_by_key(history);
    let mut stats = Stats::default();
    let mut invalid = Vec::new();
    let mut unknown = Vec::new();
    for (key, indices) in &groups {
        match judge(history, indices, &clocks, &mut stats) {
            Err(reason) => unknown.push(json!({ "key": key, "reason": reason })),
            Ok(Err(evidence)) => invalid.push(evidence),
            Ok(Ok(())) => {}
        }
    }
    let mut outcome = keyed_outcome(groups.len(), invalid, unknown, "consistent");
    if outcome.result == Verdict::Valid {
        outcome.details["summary"] = Value::String(valid_summary(&stats));
    }
    outcome.details["stats"] = stats.to_json();
    outcome
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

fn valid_summary(stats: &Stats) -> String {
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

impl Stats {
    fn to_json(&self) -> Value {
        let by_status =
            |counts: &[u64; 3]| json!({ "ok": counts[0], "fail": counts[1], "info": counts[2] });
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

/// Where a status is counted in `Stats`' `[ok, fail, info]` arrays.
pub(super) fn slot(status: Status) -> usize {
    match status {
        Status::Ok => 0,
        Status::Fail => 1,
        Status::Info => 2,
    }
}

/// An integer field of an op's extra fields.
pub(super) fn integer(op: &Op, name: &str) -> Option<u64> {
    op.extra.get(name).and_then(Value::as_u64)
}

/// A text field of an op's extra fields.
pub(super) fn text<'h>(op: &'h Op, name: &str) -> Option<&'h str> {
    op.extra.get(name).and_then(Value::as_str)
}

/// An integer field a rule needs; its absence makes the group unknown.
pub(super) fn need_integer(history: &[Op], index: usize, name: &str) -> Result<u64, String> {
    integer(&history[index], name).ok_or_else(|| missing(history, index, name, "integer"))
}

/// A text field a rule needs; its absence makes the group unknown.
pub(super) fn need_text<'h>(
    history: &'h [Op],
    index: usize,
    name: &str,
) -> Result<&'h str, String> {
    text(&history[index], name).ok_or_else(|| missing(history, index, name, "string"))
}

fn missing(history: &[Op], index: usize, name: &str, what: &str) -> String {
    format!(
        "record {} ({}) lacks the {what} field {name:?}",
        index + 1,
        history[index].op
    )
}

/// The details' evidence map: an explanation and the group's key, plus quoted ops.
pub(super) fn evidence(key: &str, explanation: String, ops: &[(&str, Value)]) -> Value {
    let mut fields = Map::new();
    fields.insert("explanation".into(), Value::String(explanation));
    fields.insert("key".into(), Value::String(key.to_string()));
    for (name, op) in ops {
        fields.insert((*name).to_string(), op.clone());
    }
    Value::Object(fields)
}

/// Milliseconds between two runner times, for explanations.
pub(super) fn ms_between(from_ns: u64, to_ns: u64) -> String {
    let ns = to_ns as i128 - from_ns as i128;
    format!("{:.1}", ns as f64 / 1e6)
}
