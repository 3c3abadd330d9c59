//! The register checker: per-key linearizability of get/put/cas/del. Keys are independent
//! (P-compositionality), so each key is searched alone with `wgl`. Knows nothing about files
//! or reports.
//!
//! Rules: a confirmed op takes effect between its call and return; an indeterminate write
//! may take effect at any time after its call, or never; a failed write never took effect; a
//! failed or indeterminate read is ignored. A failed cas says nothing (its condition may or
//! may not have held). The register starts absent; `del` and a cas with a null value make it
//! absent; `expect: null` on a cas expects it absent.

use std::collections::HashMap;
use std::time::Instant;

use serde_json::{Value, json};

use super::wgl::{self, DeadEnd, Interval, Model, Search, SearchBudget};
use super::{Budget, CheckerName, Outcome, foreign_op, keyed_outcome, quote};
use crate::history::{Op, OpKind, Status};
use crate::limits;

/// Checks every key of the history.
pub fn check(history: &[Op], budget: &Budget) -> Outcome {
    if let Some(index) = history.iter().position(|op| !is_register_op(&op.op)) {
        return foreign_op(CheckerName::Register, history, index);
    }
    let total_deadline = Instant::now() + budget.total_time;
    let mut invalid = Vec::new();
    let mut unknown = Vec::new();
    let keys = super::ops_by_key(history);
    for (key, indices) in &keys {
        match check_key(history, indices, budget, total_deadline) {
            KeyResult::Valid => {}
            KeyResult::Invalid(evidence) => invalid.push(evidence),
            KeyResult::Unknown(reason) => unknown.push(json!({ "key": key, "reason": reason })),
        }
    }
    keyed_outcome(keys.len(), invalid, unknown, "linearizable")
}

/// The answer for one key.
#[derive(Debug)]
enum KeyResult {
    Valid,
    Invalid(Value),
    Unknown(String),
}

/// One key's ops as the model sees them; states are interned values, 0 = absent.
#[derive(Debug, Default)]
struct KeyModel {
    ops: Vec<RegisterOp>,
    intervals: Vec<Interval>,
    /// For each model op, its index in the history.
    sources: Vec<usize>,
    values: Vec<Value>,
    interned: HashMap<String, u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RegisterOp {
    Read(u32),
    Write(u32),
    Cas { expect: u32, value: u32 },
}

impl Model for KeyModel {
    type State = u32;

    fn step(&self, state: &u32, op: usize) -> Option<u32> {
        match self.ops[op] {
            RegisterOp::Read(value) => (value == *state).then_some(value),
            RegisterOp::Write(value) => Some(value),
            RegisterOp::Cas { expect, value } => (expect == *state).then_some(value),
        }
    }
}

fn is_register_op(kind: &OpKind) -> bool {
    matches!(kind, OpKind::Get | OpKind::Put | OpKind::Cas | OpKind::Del)
}

fn check_key(history: &[Op], indices: &[usize], budget: &Budget, total: Instant) -> KeyResult {
    let model = match KeyModel::build(history, indices) {
        Ok(model) => model,
        Err(reason) => return KeyResult::Unknown(reason),
    };
    let model = model.without_unobserved_optional_writes();
    let count = model.ops.len();
    if count > budget.key_ops_max {
        let limit = budget.key_ops_max;
        return KeyResult::Unknown(format!(
            "{count} ops enter the search; limit is {limit} ops per key"
        ));
    }
    let search_budget = SearchBudget {
        deadline: total.min(Instant::now() + budget.key_time),
        memo_entries_max: budget.memo_entries_max,
    };
    match wgl::search(&model, 0, &model.intervals, &search_budget) {
        Search::Linearizable => KeyResult::Valid,
        Search::NotLinearizable(dead_end) => {
            KeyResult::Invalid(model.evidence(history, indices, &dead_end))
        }
        Search::OutOfBudget(reason) => KeyResult::Unknown(reason),
    }
}

impl KeyModel {
    /// The ops of one key that constrain the search, or why the key cannot be modelled.
    fn build(history: &[Op], indices: &[usize]) -> Result<KeyModel, String> {
        let mut model = KeyModel {
            values: vec![Value::Null],
            ..KeyModel::default()
        };
        for &index in indices {
            let op = &history[index];
            let status = op.status();
            let register_op = match (&op.op, status) {
                (OpKind::Get, Status::Ok) => RegisterOp::Read(model.intern(&op.output)),
                (OpKind::Get, _) | (_, Status::Fail) => continue,
                (OpKind::Put, _) if op.value.is_null() => {
                    return Err(format!("record {} is a put of null", index + 1));
                }
                (OpKind::Put, _) => RegisterOp::Write(model.intern(&op.value)),
                (OpKind::Del, _) => RegisterOp::Write(0),
                _ => RegisterOp::Cas {
                    expect: model.intern(&op.expect),
                    value: model.intern(&op.value),
                },
            };
            model.ops.push(register_op);
            model.sources.push(index);
            model.intervals.push(Interval {
                call_ns: op.call_ns,
                return_ns: (status == Status::Ok).then_some(op.return_ns).flatten(),
            });
        }
        Ok(model)
    }

    /// Drops indeterminate writes of values that no read returns and no cas expects. Sound:
    /// in any linearization where such a write takes effect, no op can observe its value, so
    /// the next op on the key is an unconditional write (put or del) or there is none, and
    /// the same order without it is a linearization too. Most timed-out writes in a real run
    /// are of this kind, and each one left in multiplies the search.
    fn without_unobserved_optional_writes(self) -> KeyModel {
        let mut observed = vec![false; self.values.len()];
        for op in &self.ops {
            match *op {
                RegisterOp::Read(value) => observed[value as usize] = true,
                RegisterOp::Cas { expect, .. } => observed[expect as usize] = true,
                RegisterOp::Write(_) => {}
            }
        }
        let keep: Vec<bool> = (0..self.ops.len())
            .map(|i| {
                let written = match self.ops[i] {
                    RegisterOp::Read(_) => return true,
                    RegisterOp::Write(value) | RegisterOp::Cas { value, .. } => value,
                };
                self.intervals[i].return_ns.is_some() || written == 0 || observed[written as usize]
            })
            .collect();
        KeyModel {
            ops: kept(self.ops, &keep),
            intervals: kept(self.intervals, &keep),
            sources: kept(self.sources, &keep),
            values: self.values,
            interned: self.interned,
        }
    }

    fn intern(&mut self, value: &Value) -> u32 {
        if value.is_null() {
            return 0;
        }
        let text = value.to_string();
        if let Some(id) = self.interned.get(&text) {
            return *id;
        }
        let id = u32::try_from(self.values.len()).expect("fewer than 2^32 values per key");
        self.values.push(value.clone());
        self.interned.insert(text, id);
        id
    }

    /// The evidence for a key that cannot be linearized: the op whose return no order gets
    /// past, the values the register could hold just before it, the ops concurrent with it
    /// and the last writes that completed before it began.
    fn evidence(&self, history: &[Op], indices: &[usize], dead_end: &DeadEnd<u32>) -> Value {
        let source = self.sources[dead_end.op];
        let blocked = &history[source];
        let possible: Vec<Value> = dead_end
            .states
            .iter()
            .map(|s| self.values[*s as usize].clone())
            .collect();
        let return_ns = blocked.return_ns.unwrap_or(u64::MAX);
        let concurrent: Vec<Value> = indices
            .iter()
            .filter(|&&i| i != source && overlaps(&history[i], blocked.call_ns, return_ns))
            .take(limits::EVIDENCE_OPS_MAX)
            .map(|&i| quote(history, i))
            .collect();
        json!({
            "key": blocked.key,
            "explanation": explain(blocked, &possible),
            "op": quote(history, source),
            "possible_values_before_return": possible,
            "concurrent": concurrent,
            "preceding_writes": self.preceding_writes(history, blocked.call_ns),
        })
    }

    /// The last writes (confirmed or indeterminate) that were called before `call_ns` and
    /// are not concurrent with it, oldest first.
    fn preceding_writes(&self, history: &[Op], call_ns: u64) -> Vec<Value> {
        let mut writes: Vec<usize> = self
            .sources
            .iter()
            .copied()
            .filter(|&i| history[i].op != OpKind::Get)
            .filter(|&i| history[i].return_ns.is_some_and(|r| r < call_ns))
            .collect();
        writes.sort_by_key(|&i| history[i].return_ns);
        let skip = writes.len().saturating_sub(limits::EVIDENCE_OPS_MAX / 2);
        writes[skip..].iter().map(|&i| quote(history, i)).collect()
    }
}

/// The items whose `keep` flag is set.
fn kept<T>(items: Vec<T>, keep: &[bool]) -> Vec<T> {
    items
        .into_iter()
        .zip(keep)
        .filter(|(_, keep)| **keep)
        .map(|(item, _)| item)
        .collect()
}

fn overlaps(op: &Op, start_ns: u64, end_ns: u64) -> bool {
    op.call_ns <= end_ns && op.return_ns.is_none_or(|r| r >= start_ns)
}

fn explain(blocked: &Op, possible: &[Value]) -> String {
    let possible = Value::Array(possible.to_vec());
    match blocked.op {
        OpKind::Get => format!(
            "get of {:?} returned {} but no order of the other ops lets the register hold it; \
             just before the get returned it could only hold one of {possible} (null = absent)",
            blocked.key, blocked.output
        ),
        OpKind::Cas => format!(
            "cas on {:?} expecting {} was confirmed but the register could only hold one of \
             {possible} (null = absent) when it had to take effect",
            blocked.key, blocked.expect
        ),
        _ => format!(
            "no order of the ops on {:?} gets past the return of this confirmed {}; the \
             register could hold one of {possible} (null = absent) there",
            blocked.key, blocked.op
        ),
    }
}
