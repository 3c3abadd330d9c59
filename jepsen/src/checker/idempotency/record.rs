//! The rules of the idempotency checker on the ops of one record id: one result, completes
//! by the owner of their token, rising tokens, one owner under the TTL.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::Stats;
use crate::checker::lease::{
    ClockFaults, Lease, NS_PER_MS, evidence, ms_between, need_integer, need_text, second_owner,
    text,
};
use crate::checker::quote;
use crate::history::{Op, OpKind, Status};

/// An ok begin answered `started`: one owner's hold of the record.
type Start<'h> = Lease<'h>;

/// An ok answer that saw the record completed, and the result it saw.
#[derive(Debug, Clone, Copy)]
struct Seen<'h> {
    index: usize,
    result: &'h str,
    return_ns: u64,
}

/// One record's starts, the results seen, and the completes and aborts that may have acted.
pub(super) struct RecordView<'h> {
    history: &'h [Op],
    id: &'h str,
    /// Starts, by call time.
    starts: Vec<Start<'h>>,
    /// Answers that saw a result, by return time.
    seen: Vec<Seen<'h>>,
    /// Per result sent by a complete that did not fail: that complete's index and call.
    sent: HashMap<&'h str, (usize, u64)>,
    /// Ok completes: index, owner, token.
    ok_completes: Vec<(usize, &'h str, u64)>,
    /// Per token, the earliest call of a complete or abort of it that did not fail.
    ends: HashMap<u64, u64>,
    /// The shortest result TTL of a complete that did not fail.
    result_ttl_ms_min: Option<u64>,
}

impl<'h> RecordView<'h> {
    /// Reads the id's ops; counts them in `stats`. `Err` = the id is unknown.
    pub(super) fn build(
        history: &'h [Op],
        indices: &[usize],
        stats: &mut Stats,
    ) -> Result<RecordView<'h>, String> {
        let mut view = RecordView {
            history,
            id: history[indices[0]].key.as_str(),
            starts: Vec::new(),
            seen: Vec::new(),
            sent: HashMap::new(),
            ok_completes: Vec::new(),
            ends: HashMap::new(),
            result_ttl_ms_min: None,
        };
        for &index in indices {
            match history[index].op {
                OpKind::Begin => view.add_begin(index, stats)?,
                OpKind::Complete | OpKind::Abort => view.add_end(index, stats)?,
                _ => view.add_get(index)?,
            }
        }
        view.results_outlive(indices)?;
        view.starts
            .sort_by_key(|start| (start.call_ns, start.index));
        view.seen.sort_by_key(|seen| (seen.return_ns, seen.index));
        stats.restarts += view.starts.len().saturating_sub(1) as u64;
        stats.ids_completed += usize::from(!view.seen.is_empty());
        Ok(view)
    }

    fn add_begin(&mut self, index: usize, stats: &mut Stats) -> Result<(), String> {
        let op = &self.history[index];
        let Some(return_ns) = op.return_ns.filter(|_| op.status() == Status::Ok) else {
            return Ok(());
        };
        match need_text(self.history, index, "state")? {
            "started" => {
                stats.begins[0] += 1;
                self.starts.push(Start {
                    index,
                    owner: need_text(self.history, index, "owner")?,
                    token: need_integer(self.history, index, "token")?,
                    ttl_ms: need_integer(self.history, index, "ttl_ms")?,
                    call_ns: op.call_ns,
                    return_ns,
                });
            }
            "in-progress" => stats.begins[1] += 1,
            "completed" => {
                stats.begins[2] += 1;
                self.add_seen(index)?;
            }
            other => {
                return Err(format!(
                    "record {} has the unknown state {other:?}",
                    index + 1
                ));
            }
        }
        Ok(())
    }

    /// A complete or an abort.
    fn add_end(&mut self, index: usize, stats: &mut Stats) -> Result<(), String> {
        let op = &self.history[index];
        let late = op.extra.get("late").and_then(Value::as_bool) == Some(true);
        let not_owned = text(op, "error") == Some("record-not-owned");
        stats.count_end(op, late, not_owned);
        if op.status() == Status::Fail {
            return Ok(());
        }
        let token = need_integer(self.history, index, "token")?;
        let earliest = self.ends.entry(token).or_insert(op.call_ns);
        *earliest = (*earliest).min(op.call_ns);
        if op.op == OpKind::Abort {
            return Ok(());
        }
        let value = op
            .value
            .as_str()
            .ok_or_else(|| format!("record {} (complete) sends no string value", index + 1))?;
        if self.sent.insert(value, (index, op.call_ns)).is_some() {
            return Err(format!("two completes send the result {value:?}"));
        }
        let ttl_ms = need_integer(self.history, index, "result_ttl_ms")?;
        self.result_ttl_ms_min = Some(self.result_ttl_ms_min.map_or(ttl_ms, |m| m.min(ttl_ms)));
        if op.status() == Status::Ok {
            let owner = need_text(self.history, index, "owner")?;
            self.ok_completes.push((index, owner, token));
            self.add_seen(index)?;
        }
        Ok(())
    }

    fn add_get(&mut self, index: usize) -> Result<(), String> {
        if self.history[index].status() != Status::Ok {
            return Ok(());
        }
        match need_text(self.history, index, "state")? {
            "completed" => self.add_seen(index),
            _ => Ok(()),
        }
    }

    fn add_seen(&mut self, index: usize) -> Result<(), String> {
        let return_ns = self.history[index]
            .return_ns
            .expect("an ok op has returned");
        self.seen.push(Seen {
            index,
            result: need_text(self.history, index, "result")?,
            return_ns,
        });
        Ok(())
    }

    /// Unknown unless every result sent outlives the id's ops: (a) assumes one result per id.
    fn results_outlive(&self, indices: &[usize]) -> Result<(), String> {
        let Some(ttl_ms) = self.result_ttl_ms_min else {
            return Ok(());
        };
        let ops = indices.iter().map(|&index| &self.history[index]);
        let first_ns = ops.clone().map(|op| op.call_ns).min().unwrap_or(0);
        let last_ns = ops
            .map(|op| op.return_ns.unwrap_or(op.call_ns))
            .max()
            .unwrap_or(0);
        if ttl_ms.saturating_mul(NS_PER_MS) <= last_ns - first_ns {
            return Err(format!(
                "a result kept {ttl_ms} ms may expire within the {} ms the id's ops span; the \
                 checker needs results to outlive the run",
                ms_between(first_ns, last_ns)
            ));
        }
        Ok(())
    }

    /// (a): every result seen was sent by a complete called before it was seen, all are the
    /// same, and no start is called after one was seen.
    pub(super) fn one_result(&self) -> Result<(), Value> {
        let Some(first) = self.seen.first() else {
            return Ok(());
        };
        for seen in &self.seen {
            let sent = self.sent.get(seen.result);
            if sent.is_none_or(|&(_, call_ns)| call_ns >= seen.return_ns) {
                let explanation = format!(
                    "record {:?} answered the result {:?}, which no complete of it that did not \
                     fail sent before that answer returned",
                    self.id, seen.result
                );
                return Err(self.evidence(explanation, &[("answer", seen.index)]));
            }
            if seen.result != first.result {
                let explanation = format!(
                    "record {:?} has two results: {:?} was answered {} ms after {:?} had been",
                    self.id,
                    seen.result,
                    ms_between(first.return_ns, seen.return_ns),
                    first.result
                );
                return Err(self.evidence(
                    explanation,
                    &[("first", first.index), ("second", seen.index)],
                ));
            }
        }
        let restart = self
            .starts
            .iter()
            .find(|start| start.call_ns > first.return_ns);
        if let Some(start) = restart {
            let explanation = format!(
                "record {:?} was started again (token {}, {}) {} ms after it was seen completed \
                 with {:?}",
                self.id,
                start.token,
                start.owner,
                ms_between(first.return_ns, start.call_ns),
                first.result
            );
            return Err(self.evidence(
                explanation,
                &[("completed", first.index), ("started", start.index)],
            ));
        }
        Ok(())
    }

    /// (b): an ok complete's token was started for the complete's owner.
    pub(super) fn completes_by_owner(&self) -> Result<(), Value> {
        let started: HashSet<(u64, &str)> = self
            .starts
            .iter()
            .map(|start| (start.token, start.owner))
            .collect();
        for &(index, owner, token) in &self.ok_completes {
            if !started.contains(&(token, owner)) {
                let explanation = format!(
                    "record {:?}: a complete by {owner} with token {token} was acknowledged, but \
                     no begin started the record for {owner} with that token",
                    self.id
                );
                return Err(self.evidence(explanation, &[("complete", index)]));
            }
        }
        Ok(())
    }

    /// (c): a start that returned before another was called has the lower token. One sweep
    /// over starts by call time, keeping the highest token returned so far.
    pub(super) fn tokens_rise(&self) -> Result<(), Value> {
        let mut by_return = self.starts.clone();
        by_return.sort_by_key(|start| start.return_ns);
        let mut top: Option<Start> = None;
        let mut next = 0;
        for start in &self.starts {
            while next < by_return.len() && by_return[next].return_ns < start.call_ns {
                let candidate = by_return[next];
                if top.is_none_or(|top| candidate.token > top.token) {
                    top = Some(candidate);
                }
                next += 1;
            }
            if let Some(earlier) = top.filter(|top| top.token >= start.token) {
                let explanation = format!(
                    "record {:?}: {} was started with token {} {} ms after {} had been started \
                     with token {}",
                    self.id,
                    start.owner,
                    start.token,
                    ms_between(earlier.return_ns, start.call_ns),
                    earlier.owner,
                    earlier.token
                );
                return Err(self.evidence(
                    explanation,
                    &[("earlier", earlier.index), ("later", start.index)],
                ));
            }
        }
        Ok(())
    }

    /// (d): no start returns while an earlier start for another owner is surely in
    /// progress. Looks, for each start, at the starts called within the longest TTL before
    /// it returned.
    pub(super) fn one_owner(&self, clocks: &ClockFaults, stats: &mut Stats) -> Result<(), Value> {
        let excused = &mut stats.pairs_excused_by_clock_faults;
        match second_owner(&self.starts, clocks, excused, |earlier, later| {
            self.still_in_progress(earlier, later)
        }) {
            Some((earlier, later)) => Err(self.two_owners(earlier, later)),
            None => Ok(()),
        }
    }

    /// Whether no complete or abort of `earlier`'s token had been called when `later`
    /// started the record for another owner.
    fn still_in_progress(&self, earlier: &Start, later: &Start) -> bool {
        self.ends
            .get(&earlier.token)
            .is_none_or(|&call_ns| call_ns >= later.return_ns)
    }

    fn two_owners(&self, earlier: &Start, later: &Start) -> Value {
        let explanation = format!(
            "record {:?} started twice: {} was started with token {} {} ms after {} began it \
             (token {}, TTL {} ms), before that could expire, and with no complete or abort of \
             it called",
            self.id,
            later.owner,
            later.token,
            ms_between(earlier.call_ns, later.return_ns),
            earlier.owner,
            earlier.token,
            earlier.ttl_ms
        );
        self.evidence(
            explanation,
            &[("owner", earlier.index), ("second_owner", later.index)],
        )
    }

    fn evidence(&self, explanation: String, ops: &[(&str, usize)]) -> Value {
        let quoted: Vec<(&str, Value)> = ops
            .iter()
            .map(|&(name, index)| (name, quote(self.history, index)))
            .collect();
        evidence(self.id, explanation, &quoted)
    }
}
