//! The idempotency checker: idempotency records (workload `idempotency`, DESIGN §4 and §7
//! "idempotency records"). Ops, beyond the DESIGN §7 fields, all with `key` = the record's id:
//!
//! - `begin`: `owner` and `ttl_ms`; ok answers carry `state` (`started` with its `token`,
//!   `in-progress`, or `completed` with its `result`);
//! - `complete`: `owner`, `token`, `value` = the result it sends (unique per id),
//!   `result_ttl_ms`; an ok complete carries the stored `result` it was answered;
//! - `abort`: `token`;
//! - `get`: a linearizable read of the record (`state`, and `result` when `completed`): the
//!   final reads.
//!
//! Ops are grouped by id and each group is judged alone. A record's life ends when it is
//! aborted or its result expires; an abort acts only on a record in progress, and the
//! workload keeps results longer than the run, so an id has one result all run long (a group
//! with a complete whose `result_ttl_ms` is shorter than the group's span is unknown).
//! Invalid when:
//!
//! - (a) **one result**: an answer that saw the record completed (an ok begin, complete or
//!   get) carries a result no complete of the id that did not fail sent, called before that
//!   answer returned; or two such answers carry different results; or a begin called after
//!   such an answer returned started the record again;
//! - (b) **completes by their owner**: an ok complete carries a token no ok begin of the id
//!   answered `started` with to the complete's owner;
//! - (c) **tokens rise**: an ok `started` begin that returned before another was called has
//!   the lower token;
//! - (d) **one owner under the TTL**: of two `started` begins A and B of one id by different
//!   owners, A with the lower token, B returned before A's record could have expired
//!   (`A.call + A.ttl`, less the fencing checker's clock-rate and rounding margins), while no
//!   complete or abort of A's token (ok or indeterminate) had been called. Pairs that a
//!   `clock` fault overlaps (widened as in fencing) are not judged.
//!
//! Unknown outcomes never make a violation: an indeterminate begin has no token, an
//! indeterminate complete may explain a result but is never an answer, an indeterminate
//! complete or abort ends its token's hold. A group with an op missing a field a rule needs,
//! or two completes sending one value, is unknown. O(n log n) per group, plus, for (d), the
//! starts called within one TTL before each start returned. Knows nothing about servers or
//! how the history was made.

mod record;
#[cfg(test)]
mod tests;

use serde_json::{Value, json};

use super::lease::{ClockFaults, LeaseStats, by_status, check_leases, slot};
use super::{CheckerName, Outcome};
use crate::fault::FaultEvent;
use crate::history::{Op, OpKind};

use record::RecordView;

/// What the history holds beyond the verdict, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub ids: usize,
    /// Ids whose result some answer saw.
    pub ids_completed: usize,
    /// Ok begins by the state they saw: started, in progress, completed.
    pub begins: [u64; 3],
    /// Starts of an id after its first (takeovers, or starts after an abort).
    pub restarts: u64,
    /// Completes by outcome, and those refused with `RecordNotOwned`.
    pub completes: [u64; 3],
    pub completes_not_owned: u64,
    /// Completes after work that outlasted the TTL (`"late":true`), by outcome, and those
    /// refused with `RecordNotOwned`.
    pub late_completes: [u64; 3],
    pub late_completes_not_owned: u64,
    /// Aborts by outcome.
    pub aborts: [u64; 3],
    /// Pairs of starts (d) did not judge because a clock fault overlapped them.
    pub pairs_excused_by_clock_faults: u64,
}

/// Checks the history; `faults` says when node clocks were offset (for (d)).
pub fn check(history: &[Op], faults: &[FaultEvent]) -> Outcome {
    let kinds = [OpKind::Begin, OpKind::Complete, OpKind::Abort, OpKind::Get];
    check_leases(CheckerName::Idempotency, history, faults, &kinds, judge)
}

/// One id: the rules in order, the first violation wins.
fn judge(
    history: &[Op],
    indices: &[usize],
    clocks: &ClockFaults,
    stats: &mut Stats,
) -> Result<Result<(), Value>, String> {
    stats.ids += 1;
    let view = RecordView::build(history, indices, stats)?;
    let verdict = view
        .one_result()
        .and_then(|()| view.completes_by_owner())
        .and_then(|()| view.tokens_rise())
        .and_then(|()| view.one_owner(clocks, stats));
    Ok(verdict)
}

impl LeaseStats for Stats {
    fn valid_summary(&self) -> String {
        let stats = self;
        format!(
            "{} ids with one result each ({} completed), one owner at a time with rising tokens; \
         {} starts ({} restarts), {} of {} late completes refused",
            stats.ids,
            stats.ids_completed,
            stats.begins[0],
            stats.restarts,
            stats.late_completes_not_owned,
            stats.late_completes.iter().sum::<u64>()
        )
    }

    fn to_json(&self) -> Value {
        json!({
            "ids": self.ids,
            "ids_completed": self.ids_completed,
            "begins": {
                "started": self.begins[0],
                "in_progress": self.begins[1],
                "completed": self.begins[2],
            },
            "restarts": self.restarts,
            "completes": by_status(&self.completes),
            "completes_not_owned": self.completes_not_owned,
            "late_completes": by_status(&self.late_completes),
            "late_completes_not_owned": self.late_completes_not_owned,
            "aborts": by_status(&self.aborts),
            "pairs_excused_by_clock_faults": self.pairs_excused_by_clock_faults,
        })
    }
}

impl Stats {
    /// Counts a complete or an abort by its outcome.
    fn count_end(&mut self, op: &Op, late: bool, not_owned: bool) {
        let status = slot(op.status());
        if op.op == OpKind::Abort {
            self.aborts[status] += 1;
            return;
        }
        self.completes[status] += 1;
        self.completes_not_owned += u64::from(not_owned);
        if late {
            self.late_completes[status] += 1;
            self.late_completes_not_owned += u64::from(not_owned);
        }
    }
}
