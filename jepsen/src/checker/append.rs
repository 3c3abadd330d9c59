//! The append checker: each key holds a list, `append` adds a unique value to it (the client
//! does read + cas), `read` returns the whole list. Checks run in O(n log n) per key. Knows
//! nothing about files or reports.
//!
//! Per key, a violation of any of these makes the history invalid:
//! 1. no read holds a value twice;
//! 2. every value read was appended to that key by an op that did not fail, called before the
//!    read returned;
//! 3. all reads are prefixes of the longest read (no two reads disagree on order);
//! 4. every confirmed append that returned before a read was called is in that read;
//! 5. a read called after another read returned is at least as long;
//! 6. if a confirmed append of `a` returned before the append of `b` was called and `b` was
//!    read, `a` was read too, before `b`.
//!
//! Failed and indeterminate reads are ignored. Two appends of the same value to one key make
//! that key `unknown` (values must be unique to be attributed).

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use super::{CheckerName, Outcome, check_by_key, quote};
use crate::history::{Op, OpKind, Status};

/// Checks every key of the history.
pub fn check(history: &[Op]) -> Outcome {
    let kinds = [OpKind::Append, OpKind::Read];
    check_by_key(
        CheckerName::Append,
        history,
        &kinds,
        "consistent",
        |history, indices| KeyView::build(history, indices).map(|view| view.check()),
    )
}

/// One key's appends and successful reads. Values are compared by their JSON text.
struct KeyView<'h> {
    history: &'h [Op],
    /// Value text → index of the append op in the history.
    appends: HashMap<String, usize>,
    reads: Vec<Read>,
}

struct Read {
    index: usize,
    values: Vec<String>,
}

/// Where a value stands in the longest read; `usize::MAX` = not in it.
const MISSING: usize = usize::MAX;

impl<'h> KeyView<'h> {
    fn build(history: &'h [Op], indices: &[usize]) -> Result<Self, String> {
        let mut appends = HashMap::new();
        let mut reads = Vec::new();
        for &index in indices {
            let op = &history[index];
            if op.op == OpKind::Append {
                if op.value.is_null() {
                    return Err(format!("record {} appends null", index + 1));
                }
                if let Some(first) = appends.insert(op.value.to_string(), index) {
                    return Err(format!(
                        "records {} and {} append the same value {}; values must be unique",
                        first + 1,
                        index + 1,
                        op.value
                    ));
                }
            } else if op.status() == Status::Ok {
                let Value::Array(items) = &op.output else {
                    return Err(format!(
                        "record {} is a read whose output is no list",
                        index + 1
                    ));
                };
                let values = items.iter().map(Value::to_string).collect();
                reads.push(Read { index, values });
            }
        }
        Ok(KeyView {
            history,
            appends,
            reads,
        })
    }

    fn check(&self) -> Result<(), Value> {
        for read in &self.reads {
            self.check_contents(read)?;
        }
        let Some(longest) = self.reads.iter().max_by_key(|r| r.values.len()) else {
            return Ok(());
        };
        self.check_prefixes(longest)?;
        let position: HashMap<&str, usize> = longest
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| (v.as_str(), i))
            .collect();
        self.check_acknowledged_in_reads(&position)?;
        self.check_reads_grow()?;
        self.check_order(longest, &position)
    }

    /// Rules 1 and 2.
    fn check_contents(&self, read: &Read) -> Result<(), Value> {
        let read_op = &self.history[read.index];
        let mut seen = HashSet::new();
        for value in &read.values {
            let problem = if !seen.insert(value) {
                format!("value {value} appears twice in one read")
            } else {
                match self.appends.get(value) {
                    None => format!("value {value} was never appended to this key"),
                    Some(&a) if self.history[a].status() == Status::Fail => {
                        format!("value {value} was read but its append failed")
                    }
                    Some(&a) if self.history[a].call_ns > read_op.return_ns.unwrap_or(0) => {
                        format!("value {value} was read before its append was called")
                    }
                    Some(_) => continue,
                }
            };
            let mut evidence = json!({ "key": read_op.key, "explanation": problem,
                "read": quote(self.history, read.index) });
            if let Some(&a) = self.appends.get(value) {
                evidence["append"] = quote(self.history, a);
            }
            return Err(evidence);
        }
        Ok(())
    }

    /// Rule 3.
    fn check_prefixes(&self, longest: &Read) -> Result<(), Value> {
        for read in &self.reads {
            let differ = read
                .values
                .iter()
                .zip(&longest.values)
                .position(|(a, b)| a != b);
            if let Some(at) = differ {
                let key = &self.history[read.index].key;
                return Err(json!({
                    "key": key,
                    "explanation": format!(
                        "two reads disagree at position {at}: {} vs {}",
                        read.values[at], longest.values[at]
                    ),
                    "read": quote(self.history, read.index),
                    "longest_read": quote(self.history, longest.index),
                }));
            }
        }
        Ok(())
    }

    /// Rule 4: a sweep over confirmed appends by return time and reads by call time.
    fn check_acknowledged_in_reads(&self, position: &HashMap<&str, usize>) -> Result<(), Value> {
        let acknowledged = self.acknowledged_by_return();
        let mut reads: Vec<&Read> = self.reads.iter().collect();
        reads.sort_by_key(|r| self.history[r.index].call_ns);
        let mut next = 0;
        let mut worst: Option<(usize, usize)> = None;
        for read in reads {
            let call_ns = self.history[read.index].call_ns;
            while next < acknowledged.len() && self.returned(acknowledged[next]) < call_ns {
                let append = acknowledged[next];
                let at = self.position_of(position, append);
                if worst.is_none_or(|(w, _)| at > w) {
                    worst = Some((at, append));
                }
                next += 1;
            }
            if let Some((at, append)) = worst
                && at >= read.values.len()
            {
                let op = &self.history[append];
                return Err(json!({
                    "key": op.key,
                    "explanation": format!(
                        "append of {} was confirmed before the read began but the read lacks it",
                        op.value
                    ),
                    "append": quote(self.history, append),
                    "read": quote(self.history, read.index),
                }));
            }
        }
        Ok(())
    }

    /// Rule 5: a sweep over reads by call time and by return time.
    fn check_reads_grow(&self) -> Result<(), Value> {
        let mut by_call: Vec<&Read> = self.reads.iter().collect();
        by_call.sort_by_key(|r| self.history[r.index].call_ns);
        let mut by_return = by_call.clone();
        by_return.sort_by_key(|r| self.returned(r.index));
        let mut next = 0;
        let mut longest_done: Option<&Read> = None;
        for read in by_call {
            let call_ns = self.history[read.index].call_ns;
            while next < by_return.len() && self.returned(by_return[next].index) < call_ns {
                let done = by_return[next];
                if longest_done.is_none_or(|l| done.values.len() > l.values.len()) {
                    longest_done = Some(done);
                }
                next += 1;
            }
            if let Some(earlier) = longest_done
                && earlier.values.len() > read.values.len()
            {
                return Err(json!({
                    "key": self.history[read.index].key,
                    "explanation": format!(
                        "stale read: {} values, after an earlier read had returned {} values",
                        read.values.len(),
                        earlier.values.len()
                    ),
                    "earlier_read": quote(self.history, earlier.index),
                    "read": quote(self.history, read.index),
                }));
            }
        }
        Ok(())
    }

    /// Rule 6: a sweep over the longest read's values by their append's call time.
    fn check_order(&self, longest: &Read, position: &HashMap<&str, usize>) -> Result<(), Value> {
        let acknowledged = self.acknowledged_by_return();
        let mut read_appends: Vec<usize> = longest.values.iter().map(|v| self.appends[v]).collect();
        read_appends.sort_by_key(|&a| self.history[a].call_ns);
        let mut next = 0;
        let mut worst: Option<(usize, usize)> = None;
        for later in read_appends {
            let call_ns = self.history[later].call_ns;
            while next < acknowledged.len() && self.returned(acknowledged[next]) < call_ns {
                let earlier = acknowledged[next];
                let at = self.position_of(position, earlier);
                if worst.is_none_or(|(w, _)| at > w) {
                    worst = Some((at, earlier));
                }
                next += 1;
            }
            let later_at = self.position_of(position, later);
            if let Some((at, earlier)) = worst
                && at > later_at
            {
                return Err(json!({
                    "key": self.history[later].key,
                    "explanation": format!(
                        "append of {} returned before append of {} was called, yet {} is read \
                         {}",
                        self.history[earlier].value,
                        self.history[later].value,
                        self.history[earlier].value,
                        if at == MISSING { "nowhere" } else { "after it" }
                    ),
                    "earlier_append": quote(self.history, earlier),
                    "later_append": quote(self.history, later),
                    "longest_read": quote(self.history, longest.index),
                }));
            }
        }
        Ok(())
    }

    /// Confirmed appends, by return time.
    fn acknowledged_by_return(&self) -> Vec<usize> {
        let mut acknowledged: Vec<usize> = self
            .appends
            .values()
            .copied()
            .filter(|&a| self.history[a].status() == Status::Ok)
            .collect();
        acknowledged.sort_by_key(|&a| self.returned(a));
        acknowledged
    }

    fn returned(&self, index: usize) -> u64 {
        self.history[index].return_ns.unwrap_or(u64::MAX)
    }

    fn position_of(&self, position: &HashMap<&str, usize>, append: usize) -> usize {
        let text = self.history[append].value.to_string();
        position.get(text.as_str()).copied().unwrap_or(MISSING)
    }
}
