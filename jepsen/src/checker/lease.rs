//! What the fencing and idempotency checkers share: a *lease* — a lock grant, or a started
//! idempotency record — that one owner holds from its call for at least its TTL less margins
//! (`lease_ns`), the clock faults near which leases are not judged (`ClockFaults`), the search
//! for a second owner inside a lease (`second_owner`), and how rules read the fields that
//! these workloads add to an op. Knows nothing of locks or records.

use serde_json::{Map, Value, json};

use super::{CheckerName, Outcome, Verdict, check_by_key};
use crate::fault::FaultEvent;
use crate::history::{Op, OpKind, Status};

/// How much slower than the runner's clock a node's clock may run, per mille of a TTL: a
/// lease is taken to last at least this much less than its TTL.
pub const CLOCK_RATE_MARGIN_PER_MILLE: u64 = 10;
/// A lease is taken to last at least this much less than its TTL besides (expiry is judged
/// in whole milliseconds).
pub const LEASE_MARGIN_MS: u64 = 5;
/// A clock fault's span is widened by this on both sides: its start is logged after the
/// offset was set, its stop after it was reset.
pub const CLOCK_FAULT_PAD_MS: u64 = 2_500;

pub(super) const NS_PER_MS: u64 = 1_000_000;

/// One owner's ok lease: the op that was answered, and its times on the runner's clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease<'h> {
    pub index: usize,
    pub owner: &'h str,
    pub token: u64,
    pub ttl_ms: u64,
    pub call_ns: u64,
    pub return_ns: u64,
}

impl Lease<'_> {
    /// Whether `later`, another owner's lease with a higher token, returned before this one
    /// could have run out.
    fn could_not_have_expired_for(&self, later: &Lease) -> bool {
        let expiry_ns = self.call_ns.saturating_add(lease_ns(self.ttl_ms));
        self.owner != later.owner && self.token < later.token && later.return_ns < expiry_ns
    }
}

/// What a lease checker counts while it judges, for the report.
pub(super) trait LeaseStats: Default {
    fn to_json(&self) -> Value;
    /// The one-line summary of a valid history.
    fn valid_summary(&self) -> String;
}

/// The rules of one key of a lease workload: `Err(reason)` = unknown, `Ok(Err(evidence))`
/// = invalid.
pub(super) type Judge<S> =
    fn(&[Op], &[usize], &ClockFaults, &mut S) -> Result<Result<(), Value>, String>;

/// Checks a lease workload's history key by key (`check_by_key`), judging pairs near clock
/// faults in `faults` leniently, and adds the summary of a valid history and the counts.
pub(super) fn check_leases<S: LeaseStats>(
    checker: CheckerName,
    history: &[Op],
    faults: &[FaultEvent],
    kinds: &[OpKind],
    judge: Judge<S>,
) -> Outcome {
    let clocks = ClockFaults::new(faults);
    let mut stats = S::default();
    let judge_key =
        |history: &[Op], indices: &[usize]| judge(history, indices, &clocks, &mut stats);
    let mut outcome = check_by_key(checker, history, kinds, "consistent", judge_key);
    if outcome.result == Verdict::Valid {
        outcome.details["summary"] = Value::String(stats.valid_summary());
    }
    outcome.details["stats"] = stats.to_json();
    outcome
}

/// `[ok, fail, info]` counts (see `slot`) as a JSON object.
pub(super) fn by_status(counts: &[u64; 3]) -> Value {
    json!({ "ok": counts[0], "fail": counts[1], "info": counts[2] })
}

/// The least time a lease of `ttl_ms` lasts by the runner's clock, counted from its call:
/// the TTL less the clock-rate and rounding margins.
pub(super) fn lease_ns(ttl_ms: u64) -> u64 {
    let ttl_ns = ttl_ms.saturating_mul(NS_PER_MS);
    let rate_ns = (ttl_ns / 1000).saturating_mul(CLOCK_RATE_MARGIN_PER_MILLE);
    ttl_ns
        .saturating_sub(rate_ns)
        .saturating_sub(LEASE_MARGIN_MS * NS_PER_MS)
}

/// The first pair `(earlier, later)` of `leases` (sorted by call) where `later` returned to
/// another owner while `earlier` could not have expired and `still_held(earlier, later)` says
/// nothing ended it first. Pairs overlapped by a clock fault are counted in `excused` and
/// skipped. Looks, for each lease, only at those called within the longest lease before it
/// returned.
pub(super) fn second_owner<'a, 'h>(
    leases: &'a [Lease<'h>],
    clocks: &ClockFaults,
    excused: &mut u64,
    still_held: impl Fn(&Lease, &Lease) -> bool,
) -> Option<(&'a Lease<'h>, &'a Lease<'h>)> {
    let longest_ns = leases.iter().map(|l| lease_ns(l.ttl_ms)).max().unwrap_or(0);
    for later in leases {
        let first = match later.return_ns.checked_sub(longest_ns) {
            Some(from) => leases.partition_point(|l| l.call_ns <= from),
            None => 0,
        };
        let last = leases.partition_point(|l| l.call_ns < later.return_ns);
        for earlier in &leases[first..last] {
            if !earlier.could_not_have_expired_for(later) || !still_held(earlier, later) {
                continue;
            }
            if clocks.overlap(earlier.call_ns, later.return_ns) {
                *excused += 1;
                continue;
            }
            return Some((earlier, later));
        }
    }
    None
}

/// When node clocks were offset: the spans of `clock` faults, widened by
/// `CLOCK_FAULT_PAD_MS`, sorted by start, with the furthest end reached so far.
#[derive(Debug, Default)]
pub(super) struct ClockFaults {
    starts: Vec<u64>,
    reach: Vec<u64>,
}

impl ClockFaults {
    pub(super) fn new(faults: &[FaultEvent]) -> ClockFaults {
        let pad_ns = CLOCK_FAULT_PAD_MS * NS_PER_MS;
        let mut spans: Vec<(u64, u64)> = faults
            .iter()
            .filter(|fault| fault.fault == "clock")
            .map(|fault| {
                let stop_ns = fault.stop_ns.map_or(u64::MAX, |s| s.saturating_add(pad_ns));
                (fault.start_ns.saturating_sub(pad_ns), stop_ns)
            })
            .collect();
        spans.sort_unstable();
        let mut reach_ns = 0;
        let reach = spans
            .iter()
            .map(|&(_, stop_ns)| {
                reach_ns = reach_ns.max(stop_ns);
                reach_ns
            })
            .collect();
        ClockFaults {
            starts: spans.into_iter().map(|(start_ns, _)| start_ns).collect(),
            reach,
        }
    }

    /// Whether a (widened) clock fault overlaps `[from_ns, to_ns]`.
    pub(super) fn overlap(&self, from_ns: u64, to_ns: u64) -> bool {
        let started = self.starts.partition_point(|&start_ns| start_ns <= to_ns);
        started > 0 && self.reach[started - 1] >= from_ns
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

/// Helpers of the lease checkers' rule tests: histories written inline with times in ms.
#[cfg(test)]
pub(super) mod test_support {
    use serde_json::{Value, json};

    use crate::checker::{Outcome, Verdict};
    use crate::fault::FaultEvent;
    use crate::history::Op;

    /// One op from JSON whose `call` and `return` are in ms.
    pub fn op(text: &str) -> Op {
        let mut value: Value = serde_json::from_str(text).unwrap();
        for field in ["call", "return"] {
            if let Some(ms) = value[field].as_u64() {
                value[field] = json!(ms * 1_000_000);
            }
        }
        serde_json::from_value(value).unwrap()
    }

    /// A clock fault on node 1 from `start_ms` to `stop_ms`.
    pub fn clock_fault(start_ms: u64, stop_ms: u64) -> FaultEvent {
        FaultEvent {
            fault: "clock".into(),
            target: "n1 (leader) -2000 ms".into(),
            start_ns: start_ms * 1_000_000,
            stop_ns: Some(stop_ms * 1_000_000),
            extra: Default::default(),
        }
    }

    /// Checks `lines` with `faults` by `check`; the verdict must be `expected` and the
    /// compact details must contain `needle`. Returns the details.
    pub fn check_case(
        check: fn(&[Op], &[FaultEvent]) -> Outcome,
        lines: &[&str],
        faults: &[FaultEvent],
        expected: Verdict,
        needle: &str,
    ) -> Value {
        let history: Vec<Op> = lines.iter().map(|line| op(line)).collect();
        let outcome = check(&history, faults);
        let details = serde_json::to_string(&outcome.details).unwrap();
        assert_eq!(outcome.result, expected, "{lines:#?}\n{details}");
        assert!(details.contains(needle), "{needle:?} not in {details}");
        outcome.details
    }
}
