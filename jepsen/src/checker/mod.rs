//! The checkers: what each one is called, what it gets, what it answers, and which ones a
//! workload needs. Each checker is pure: a history (and fault log) in, a verdict out. Beside
//! them the availability measure (`availability`), which gives no verdict. Knows nothing
//! about files, servers or reports.

pub mod append;
pub mod availability;
pub mod counter;
pub mod coverage;
pub mod fencing;
pub mod follower_read;
pub mod idempotency;
mod lease;
pub mod register;
pub mod replicas;
pub mod watch;
pub mod wgl;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::fault::FaultEvent;
use crate::history::{Op, OpKind};
use crate::limits;
use crate::replicas::ReplicaReport;
use crate::spec::RunSpec;

/// A checker's answer. `Unknown` is never a pass: it means the checker could not decide
/// (budget spent, history it cannot model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Valid,
    Unknown,
    Invalid,
}

/// A verdict with its explanation. `details` is a JSON object whose `summary` is one line for
/// people; the other fields are the checker's own (counts, evidence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub result: Verdict,
    pub details: Value,
}

/// The checkers this crate has.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum CheckerName {
    Register,
    Append,
    Counter,
    #[serde(rename = "follower-read")]
    FollowerRead,
    Fencing,
    Idempotency,
    Watch,
    Coverage,
    Replicas,
}

/// What a checker may look at.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub history: &'a [Op],
    pub faults: &'a [FaultEvent],
    pub spec: Option<&'a RunSpec>,
    /// The runner's end-of-run findings about the replicas (`replicas.json`), if any.
    pub replicas: Option<&'a ReplicaReport>,
}

/// The budgets of the linearizability search (the other checkers run in O(n log n)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub key_ops_max: usize,
    pub key_time: Duration,
    pub total_time: Duration,
    pub memo_entries_max: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            key_ops_max: limits::REGISTER_KEY_OPS_MAX,
            key_time: Duration::from_millis(limits::REGISTER_KEY_TIME_BUDGET_MS),
            total_time: Duration::from_millis(limits::REGISTER_TOTAL_TIME_BUDGET_MS),
            memo_entries_max: limits::REGISTER_KEY_MEMO_ENTRIES_MAX,
        }
    }
}

impl Verdict {
    /// The verdict of several: invalid if any is, else unknown if any is, else valid.
    pub fn all(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
        verdicts.into_iter().max().unwrap_or(Verdict::Valid)
    }

    /// The process exit code for this verdict: 0 valid, 1 invalid, 2 unknown.
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Valid => "valid",
            Verdict::Invalid => "invalid",
            Verdict::Unknown => "unknown",
        }
    }
}

impl Outcome {
    /// An outcome whose details are `summary` plus the given fields.
    pub fn new(result: Verdict, summary: impl Into<String>, fields: Map<String, Value>) -> Self {
        let mut details = Map::new();
        details.insert("summary".into(), Value::String(summary.into()));
        details.extend(fields);
        Outcome {
            result,
            details: Value::Object(details),
        }
    }

    pub fn summary(&self) -> &str {
        self.details["summary"].as_str().unwrap_or("")
    }
}

impl CheckerName {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckerName::Register => "register",
            CheckerName::Append => "append",
            CheckerName::Counter => "counter",
            CheckerName::FollowerRead => "follower-read",
            CheckerName::Fencing => "fencing",
            CheckerName::Idempotency => "idempotency",
            CheckerName::Watch => "watch",
            CheckerName::Coverage => "coverage",
            CheckerName::Replicas => "replicas",
        }
    }

    /// Whether the checker reads history.jsonl.
    pub fn needs_history(self) -> bool {
        !matches!(self, CheckerName::Coverage | CheckerName::Replicas)
    }

    pub fn run(self, input: Input<'_>, budget: &Budget) -> Outcome {
        match self {
            CheckerName::Register => register::check(input.history, budget),
            CheckerName::Append => append::check(input.history),
            CheckerName::Counter => counter::check(input.history),
            CheckerName::FollowerRead => follower_read::check(input.history, input.faults),
            CheckerName::Fencing => fencing::check(input.history, input.faults),
            CheckerName::Idempotency => idempotency::check(input.history, input.faults),
            CheckerName::Watch => watch::check(input.history),
            CheckerName::Coverage => coverage::check(input.spec, input.faults),
            CheckerName::Replicas => replicas::check(input.replicas),
        }
    }
}

/// The checkers a workload needs; None for a workload this crate cannot check yet.
pub fn for_workload(workload: &str) -> Option<Vec<CheckerName>> {
    let main = match workload {
        "register" => CheckerName::Register,
        "append" => CheckerName::Append,
        "counter" => CheckerName::Counter,
        "follower-read" => CheckerName::FollowerRead,
        "fencing" => CheckerName::Fencing,
        "idempotency" => CheckerName::Idempotency,
        "watch" => CheckerName::Watch,
        _ => return None,
    };
    Some(vec![main, CheckerName::Coverage])
}

/// The indices of the history's ops, grouped by key, keys in order.
pub fn ops_by_key(history: &[Op]) -> BTreeMap<&str, Vec<usize>> {
    let mut keys: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, op) in history.iter().enumerate() {
        keys.entry(op.key.as_str()).or_default().push(index);
    }
    keys
}

/// An op quoted as evidence: its record number (1-based position in the history) and the
/// record itself.
pub fn quote(history: &[Op], index: usize) -> Value {
    json!({ "record": index + 1, "op": history[index] })
}

/// The `unknown` answer for a history holding an op kind the checker does not model.
pub fn foreign_op(checker: CheckerName, history: &[Op], index: usize) -> Outcome {
    let op = &history[index];
    let summary = format!(
        "record {} has op \"{}\", which the {} checker does not model",
        index + 1,
        op.op,
        checker.as_str()
    );
    let mut fields = Map::new();
    fields.insert("evidence".into(), quote(history, index));
    Outcome::new(Verdict::Unknown, summary, fields)
}

/// Keeps at most `limits::DETAILS_ITEMS_MAX` items and says how many were left out.
pub fn capped(items: Vec<Value>) -> Value {
    let total = items.len();
    let shown: Vec<Value> = items.into_iter().take(limits::DETAILS_ITEMS_MAX).collect();
    if shown.len() == total {
        Value::Array(shown)
    } else {
        json!({ "shown": shown, "total": total })
    }
}

/// Checks a history of one workload key by key: `unknown` if it holds an op kind outside
/// `kinds`; otherwise `judge` rules on each key's ops (given as indices into the history):
/// `Err(reason)` = the key is unknown, `Ok(Err(evidence))` = invalid, `Ok(Ok(()))` = valid.
pub fn check_by_key<F>(
    checker: CheckerName,
    history: &[Op],
    kinds: &[OpKind],
    valid_word: &str,
    mut judge: F,
) -> Outcome
where
    F: FnMut(&[Op], &[usize]) -> Result<Result<(), Value>, String>,
{
    if let Some(index) = history.iter().position(|op| !kinds.contains(&op.op)) {
        return foreign_op(checker, history, index);
    }
    let keys = ops_by_key(history);
    let mut invalid = Vec::new();
    let mut unknown = Vec::new();
    for (key, indices) in &keys {
        match judge(history, indices) {
            Err(reason) => unknown.push(json!({ "key": key, "reason": reason })),
            Ok(Err(evidence)) => invalid.push(evidence),
            Ok(Ok(())) => {}
        }
    }
    keyed_outcome(keys.len(), invalid, unknown, valid_word)
}

/// The outcome of a checker that judges keys one by one: invalid if any key is, else unknown
/// if any key is, else valid. `invalid` holds evidence objects with an `explanation`,
/// `unknown` objects with a `key` and a `reason`.
pub fn keyed_outcome(
    keys: usize,
    invalid: Vec<Value>,
    unknown: Vec<Value>,
    valid_word: &str,
) -> Outcome {
    let (invalid_count, unknown_count) = (invalid.len(), unknown.len());
    let (result, summary) = if let Some(first) = invalid.first() {
        let first = first["explanation"].as_str().unwrap_or("");
        let summary = format!(
            "{invalid_count} of {keys} keys invalid, {unknown_count} unknown; first: {first}"
        );
        (Verdict::Invalid, summary)
    } else if let Some(first) = unknown.first() {
        let reason = first["reason"].as_str().unwrap_or("");
        let summary = format!(
            "{unknown_count} of {keys} keys unknown; first: key {} — {reason}",
            first["key"]
        );
        (Verdict::Unknown, summary)
    } else {
        (Verdict::Valid, format!("all {keys} keys {valid_word}"))
    };
    let mut fields = Map::new();
    fields.insert("keys".into(), json!(keys));
    fields.insert("keys_invalid".into(), json!(invalid_count));
    fields.insert("keys_unknown".into(), json!(unknown_count));
    fields.insert("invalid".into(), capped(invalid));
    fields.insert("unknown".into(), capped(unknown));
    Outcome::new(result, summary, fields)
}
