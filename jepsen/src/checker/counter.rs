//! The counter checker: `incr` adds `value` (an integer delta, any sign) to the counter of
//! `key`, `read` returns it in `output`. Counters start at 0. Runs in O(n log n) per key.
//! Knows nothing about files or reports.
//!
//! For a read R (confirmed; failed and indeterminate reads are ignored), let
//! M = confirmed incrs that returned before R was called (they must have taken effect) and
//! P = confirmed or indeterminate incrs called before R returned (they may have). Failed
//! incrs are in neither. R's value must lie in
//! `[pos(M) + neg(P), pos(P) + neg(M)]`, where pos sums the positive deltas and neg the
//! negative ones. With only positive deltas this is
//! `[sum of M, sum of P]` = [acknowledged before the read, acknowledged + indeterminate
//! called before it ended]. When no delta on a key is negative, a read called after another
//! read returned must also be at least as large (real-time monotonicity).

use serde_json::{Value, json};

use super::{CheckerName, Outcome, check_by_key, quote};
use crate::history::{Op, OpKind, Status};

/// Checks every key of the history.
pub fn check(history: &[Op]) -> Outcome {
    let kinds = [OpKind::Incr, OpKind::Read];
    check_by_key(
        CheckerName::Counter,
        history,
        &kinds,
        "within bounds",
        |history, indices| KeyView::build(history, indices).map(|view| view.check()),
    )
}

/// One key's increments (sorted two ways, with running sums) and successful reads.
struct KeyView<'h> {
    history: &'h [Op],
    /// Confirmed incrs by return time, and the running (pos, neg) sums after each.
    confirmed: Vec<(u64, Sums)>,
    /// Confirmed or indeterminate incrs by call time, and the running sums after each.
    possible: Vec<(u64, Sums)>,
    /// (history index, value) of each successful read.
    reads: Vec<(usize, i128)>,
    has_negative: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    positive: i128,
    negative: i128,
    count: usize,
}

impl<'h> KeyView<'h> {
    fn build(history: &'h [Op], indices: &[usize]) -> Result<Self, String> {
        let mut confirmed = Vec::new();
        let mut possible = Vec::new();
        let mut reads = Vec::new();
        for &index in indices {
            let op = &history[index];
            let status = op.status();
            if op.op == OpKind::Read {
                if status == Status::Ok {
                    let value = integer(&op.output)
                        .ok_or_else(|| format!("record {} reads a non-integer", index + 1))?;
                    reads.push((index, value));
                }
                continue;
            }
            let delta = integer(&op.value)
                .ok_or_else(|| format!("record {} has a non-integer delta", index + 1))?;
            if status == Status::Ok {
                confirmed.push((op.return_ns.unwrap_or(u64::MAX), delta));
            }
            if status != Status::Fail {
                possible.push((op.call_ns, delta));
            }
        }
        let has_negative = possible.iter().any(|(_, delta)| *delta < 0);
        Ok(KeyView {
            history,
            confirmed: running_sums(confirmed),
            possible: running_sums(possible),
            reads,
            has_negative,
        })
    }

    fn check(&self) -> Result<(), Value> {
        for &(index, value) in &self.reads {
            self.check_bounds(index, value)?;
        }
        if !self.has_negative {
            self.check_monotonic()?;
        }
        Ok(())
    }

    fn check_bounds(&self, index: usize, value: i128) -> Result<(), Value> {
        let read = &self.history[index];
        let return_ns = read.return_ns.expect("a successful read returned");
        let must = sums_before(&self.confirmed, read.call_ns);
        let may = sums_before(&self.possible, return_ns);
        let lower = must.positive + may.negative;
        let upper = may.positive + must.negative;
        if (lower..=upper).contains(&value) {
            return Ok(());
        }
        let side = if value < lower { "under" } else { "over" };
        Err(json!({
            "key": read.key,
            "explanation": format!(
                "read returned {value}, outside [{lower}, {upper}] ({side}-count): {} confirmed \
                 incrs returned before the read began, {} confirmed or indeterminate incrs were \
                 called before it ended",
                must.count, may.count
            ),
            "read": quote(self.history, index),
            "lower": lower.to_string(),
            "upper": upper.to_string(),
        }))
    }

    /// A sweep over reads by call time and by return time.
    fn check_monotonic(&self) -> Result<(), Value> {
        let mut by_call = self.reads.clone();
        by_call.sort_by_key(|(i, _)| self.history[*i].call_ns);
        let mut by_return = by_call.clone();
        by_return.sort_by_key(|(i, _)| self.history[*i].return_ns);
        let mut next = 0;
        let mut largest: Option<(usize, i128)> = None;
        for (index, value) in by_call {
            let call_ns = self.history[index].call_ns;
            while next < by_return.len()
                && self.history[by_return[next].0]
                    .return_ns
                    .is_some_and(|r| r < call_ns)
            {
                if largest.is_none_or(|(_, v)| by_return[next].1 > v) {
                    largest = Some(by_return[next]);
                }
                next += 1;
            }
            if let Some((earlier, earlier_value)) = largest
                && earlier_value > value
            {
                return Err(json!({
                    "key": self.history[index].key,
                    "explanation": format!(
                        "read returned {value} after an earlier read had returned \
                         {earlier_value}, and no delta is negative"
                    ),
                    "earlier_read": quote(self.history, earlier),
                    "read": quote(self.history, index),
                }));
            }
        }
        Ok(())
    }
}

fn integer(value: &Value) -> Option<i128> {
    value
        .as_i64()
        .map(i128::from)
        .or_else(|| value.as_u64().map(i128::from))
}

/// Sorts (time, delta) by time and pairs each time with the sums up to and including it.
fn running_sums(mut deltas: Vec<(u64, i128)>) -> Vec<(u64, Sums)> {
    deltas.sort_unstable();
    let mut sums = Sums::default();
    deltas
        .into_iter()
        .map(|(time, delta)| {
            if delta > 0 {
                sums.positive += delta;
            } else {
                sums.negative += delta;
            }
            sums.count += 1;
            (time, sums)
        })
        .collect()
}

/// The sums of the deltas whose time is strictly before `time_ns`.
fn sums_before(running: &[(u64, Sums)], time_ns: u64) -> Sums {
    let count = running.partition_point(|(time, _)| *time < time_ns);
    count
        .checked_sub(1)
        .map(|last| running[last].1)
        .unwrap_or_default()
}
