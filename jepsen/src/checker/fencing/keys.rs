//! Rules (c) and (d) of the fencing checker, on the fenced puts and final reads of one key:
//! acknowledged fenced writes never go from a higher token to a lower one in real-time order,
//! and a final read shows a write that may have happened and that the fence let stand.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::Stats;
use crate::checker::lease::{evidence, need_integer, need_text, slot};
use crate::checker::quote;
use crate::history::{Op, OpKind, Status};

/// An fput that did not fail.
#[derive(Debug, Clone, Copy)]
struct Write<'h> {
    index: usize,
    lock: &'h str,
    token: u64,
}

/// The ok fputs of one lock by return time, each with the highest token returned up to it.
#[derive(Debug, Default)]
struct Acknowledged {
    /// (return, index of the highest-token write returned by then, its token).
    by_return: Vec<(u64, usize, u64)>,
}

/// One key's fenced writes and successful reads.
pub(super) struct KeyView<'h> {
    history: &'h [Op],
    key: &'h str,
    /// Fputs that did not fail, by value (JSON text).
    written: HashMap<String, Write<'h>>,
    /// Values of failed fputs (to say why a read of one is wrong).
    refused: HashMap<String, usize>,
    /// Ok fputs per lock.
    acknowledged: BTreeMap<&'h str, Acknowledged>,
    /// Ok fputs by call time.
    ok_writes: Vec<Write<'h>>,
    /// The ok fput that returned first: (return, index).
    first_acknowledged: Option<(u64, usize)>,
    /// Successful gets.
    reads: Vec<usize>,
}

impl<'h> KeyView<'h> {
    /// Reads the key's ops (`indices`: fputs and gets only); counts fputs in `stats`.
    pub(super) fn build(
        history: &'h [Op],
        indices: &[usize],
        stats: &mut Stats,
    ) -> Result<KeyView<'h>, String> {
        let mut view = KeyView {
            history,
            key: history[indices[0]].key.as_str(),
            written: HashMap::new(),
            refused: HashMap::new(),
            acknowledged: BTreeMap::new(),
            ok_writes: Vec::new(),
            first_acknowledged: None,
            reads: Vec::new(),
        };
        let mut returns: BTreeMap<&'h str, Vec<(u64, usize, u64)>> = BTreeMap::new();
        for &index in indices {
            let op = &history[index];
            let status = op.status();
            if op.op == OpKind::Get {
                if status == Status::Ok {
                    view.reads.push(index);
                }
                continue;
            }
            count(op, status, stats);
            let value = op.value.to_string();
            if status == Status::Fail {
                view.refused.insert(value, index);
                continue;
            }
            let write = Write {
                index,
                lock: need_text(history, index, "lock")?,
                token: need_integer(history, index, "token")?,
            };
            if let Some(other) = view.written.insert(value, write) {
                return Err(format!(
                    "records {} and {} write the same value {}",
                    other.index + 1,
                    index + 1,
                    op.value
                ));
            }
            if let (Status::Ok, Some(return_ns)) = (status, op.return_ns) {
                returns
                    .entry(write.lock)
                    .or_default()
                    .push((return_ns, index, write.token));
                view.ok_writes.push(write);
                if view
                    .first_acknowledged
                    .is_none_or(|(first_ns, _)| return_ns < first_ns)
                {
                    view.first_acknowledged = Some((return_ns, index));
                }
            }
        }
        view.ok_writes
            .sort_by_key(|write| history[write.index].call_ns);
        view.acknowledged = returns
            .into_iter()
            .map(|(lock, writes)| (lock, Acknowledged::new(writes)))
            .collect();
        Ok(view)
    }

    /// (c): an ok fput that returned before another ok fput of the same lock was called has a
    /// token no higher than it.
    pub(super) fn writes_rise(&self) -> Result<(), Value> {
        for write in &self.ok_writes {
            let call_ns = self.history[write.index].call_ns;
            let Some((earlier, token)) = self.highest_before(write.lock, call_ns) else {
                continue;
            };
            if token > write.token {
                let explanation = format!(
                    "key {:?}: a write with token {} of lock {:?} was acknowledged after one \
                     with token {token} had been",
                    self.key, write.token, write.lock
                );
                return Err(evidence(
                    self.key,
                    explanation,
                    &[
                        ("earlier", quote(self.history, earlier)),
                        ("later", quote(self.history, write.index)),
                    ],
                ));
            }
        }
        Ok(())
    }

    /// (d): every successful read shows a write that may have happened and that the fence
    /// let stand, or absence only when no write was acknowledged before it.
    pub(super) fn final_reads(&self) -> Result<(), Value> {
        for &read in &self.reads {
            let op = &self.history[read];
            let returned_ns = op.return_ns.expect("an ok op has returned");
            let explanation = match self.written.get(&op.output.to_string()) {
                None if op.output.is_null() => match self.first_acknowledged {
                    Some((first_ns, write)) if first_ns < op.call_ns => {
                        return Err(self.lost(read, write));
                    }
                    _ => continue,
                },
                None => match self.refused.get(&op.output.to_string()) {
                    Some(&refused) => return Err(self.read_of_refused(read, refused)),
                    None => format!(
                        "key {:?}: a read returned {}, which no fput of the key wrote",
                        self.key, op.output
                    ),
                },
                Some(write) if self.history[write.index].call_ns > returned_ns => format!(
                    "key {:?}: a read returned {} before the fput of it was called",
                    self.key, op.output
                ),
                Some(write) => match self.highest_before(write.lock, op.call_ns) {
                    Some((higher, token)) if token > write.token => {
                        return Err(self.stale(read, *write, higher, token));
                    }
                    _ => continue,
                },
            };
            return Err(evidence(
                self.key,
                explanation,
                &[("read", quote(self.history, read))],
            ));
        }
        Ok(())
    }

    /// The highest-token ok fput of `lock` that returned before `time_ns`: (index, token).
    fn highest_before(&self, lock: &str, time_ns: u64) -> Option<(usize, u64)> {
        let writes = &self.acknowledged.get(lock)?.by_return;
        let count = writes.partition_point(|&(return_ns, _, _)| return_ns < time_ns);
        let (_, index, token) = writes.get(count.checked_sub(1)?)?;
        Some((*index, *token))
    }

    fn lost(&self, read: usize, write: usize) -> Value {
        let explanation = format!(
            "key {:?}: a read found the key absent after the fput of {} was acknowledged",
            self.key, self.history[write].value
        );
        let ops = [
            ("read", quote(self.history, read)),
            ("write", quote(self.history, write)),
        ];
        evidence(self.key, explanation, &ops)
    }

    fn read_of_refused(&self, read: usize, refused: usize) -> Value {
        let explanation = format!(
            "key {:?}: a read returned {}, whose fput failed",
            self.key, self.history[refused].value
        );
        let ops = [
            ("read", quote(self.history, read)),
            ("write", quote(self.history, refused)),
        ];
        evidence(self.key, explanation, &ops)
    }

    fn stale(&self, read: usize, write: Write, higher: usize, token: u64) -> Value {
        let explanation = format!(
            "key {:?}: a read returned {}, written with token {}, after a write with token \
             {token} of lock {:?} was acknowledged (the fence should have refused the lower one)",
            self.key, self.history[write.index].value, write.token, write.lock
        );
        let ops = [
            ("read", quote(self.history, read)),
            ("write", quote(self.history, write.index)),
            ("higher", quote(self.history, higher)),
        ];
        evidence(self.key, explanation, &ops)
    }
}

impl Acknowledged {
    /// From (return, index, token) of each ok fput of one lock.
    fn new(mut writes: Vec<(u64, usize, u64)>) -> Acknowledged {
        writes.sort_unstable();
        let mut highest: Option<(usize, u64)> = None;
        let by_return = writes
            .into_iter()
            .map(|(return_ns, index, token)| {
                if highest.is_none_or(|(_, top)| token > top) {
                    highest = Some((index, token));
                }
                let (top_index, top) = highest.expect("set above");
                (return_ns, top_index, top)
            })
            .collect();
        Acknowledged { by_return }
    }
}

/// Counts an fput in `stats`, late ones and `FencedOut` refusals apart.
fn count(op: &Op, status: Status, stats: &mut Stats) {
    let fenced_out = op.extra.get("error").and_then(Value::as_str) == Some("fenced-out");
    stats.fputs[slot(status)] += 1;
    stats.fputs_fenced_out += u64::from(fenced_out);
    if op.extra.get("late").and_then(Value::as_bool) == Some(true) {
        stats.late_fputs[slot(status)] += 1;
        stats.late_fputs_fenced_out += u64::from(fenced_out);
    }
}
