//! The availability measure (issue 25): for each fault event, how long after the fault began
//! the first read and the first write succeeded, how long after it was healed (for `kill-all`:
//! after the last node was restarted), and the longest time without any successful op in its
//! window. A measure, not a checker: it gives no verdict and never makes a run invalid. Knows
//! nothing about files, reports or how faults are made.
//!
//! The rules (jepsen/README.md, *Availability*):
//! - a **success** is an op with `ok: true` and a return; failed and indeterminate ops never
//!   count. It counts at its return time, and only for windows that began at or before its
//!   call: an op sent before the fault may have been served before it, so it proves nothing
//!   about the faulted cluster;
//! - **reads** are `get` and `read` (follower gets included); **writes** are every op that
//!   changes state: `put`, `cas`, `del`, `append`, `incr`, `acquire`, `fput`, `release`,
//!   `begin`, `complete`, `abort`;
//! - an event's **window** runs from its start to the earliest of: its stop plus `SETTLE_MS`,
//!   the start of the next fault, the end of the workload (run.json's time limit, else the
//!   last time in the history). A fault never healed has no stop: its window ends at the next
//!   fault or the end of the workload;
//! - **first read / first write**: from the start to the return of the first successful read
//!   (write) called at or after the start and returned by the window's end; null = none;
//! - **healed read / healed write**: the same from the stop, for ops called at or after the
//!   stop; null = none, or a window that ends before the stop;
//! - **gap**: the longest stretch of the window without the return of a success of any kind
//!   called at or after the start: from the start to the first such return, between two, or
//!   from the last to the window's end (the whole window when there is none).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::fault::FaultEvent;
use crate::history::{Op, OpKind, Status};

/// How long an event's window goes on after the fault is healed (unless the next fault
/// starts or the workload ends first).
pub const SETTLE_MS: u64 = 5_000;

/// What an op does to the store, for this measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
}

/// The windows of every fault event, and the worst of each fault kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Availability {
    /// `SETTLE_MS` when measured.
    pub settle_ms: u64,
    /// One per fault event, in order of start.
    pub events: Vec<EventWindows>,
    /// Per fault kind, the worst of its events.
    pub worst: BTreeMap<String, Worst>,
}

/// What one fault event's window holds; times in ns of the history's clock, durations in ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventWindows {
    pub fault: String,
    pub target: String,
    #[serde(rename = "start")]
    pub start_ns: u64,
    #[serde(rename = "stop")]
    pub stop_ns: Option<u64>,
    /// Where the window ends.
    #[serde(rename = "end")]
    pub end_ns: u64,
    pub first_read_ms: Option<f64>,
    pub first_write_ms: Option<f64>,
    pub healed_read_ms: Option<f64>,
    pub healed_write_ms: Option<f64>,
    /// The longest stretch without a success, and where it lies.
    pub gap_ms: f64,
    #[serde(rename = "gap_start")]
    pub gap_start_ns: u64,
    #[serde(rename = "gap_end")]
    pub gap_end_ns: u64,
}

/// The worst of one fault kind's events: the largest value among the events that have one,
/// and how many events had no successful read (write) in their window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Worst {
    pub events: usize,
    pub first_read_ms: Option<f64>,
    pub first_write_ms: Option<f64>,
    pub healed_read_ms: Option<f64>,
    pub healed_write_ms: Option<f64>,
    pub gap_ms: f64,
    pub without_read: usize,
    pub without_write: usize,
}

/// Which ops count as reads and which as writes; None for kinds this crate does not know.
pub fn access(kind: &OpKind) -> Option<Access> {
    match kind {
        OpKind::Get | OpKind::Read => Some(Access::Read),
        OpKind::Put
        | OpKind::Cas
        | OpKind::Del
        | OpKind::Append
        | OpKind::Incr
        | OpKind::Acquire
        | OpKind::Fput
        | OpKind::Release
        | OpKind::Begin
        | OpKind::Complete
        | OpKind::Abort => Some(Access::Write),
        OpKind::Other(_) => None,
    }
}

/// Measures every fault event of `faults` against `history`. `workload_end_ns` is when the
/// clients stopped (run.json's time limit); None = the last time in the history.
pub fn measure(
    history: &[Op],
    faults: &[FaultEvent],
    workload_end_ns: Option<u64>,
) -> Availability {
    let successes = Successes::new(history);
    let history_end_ns = history
        .iter()
        .map(|op| op.return_ns.unwrap_or(op.call_ns))
        .max()
        .unwrap_or(0);
    let run_end_ns = workload_end_ns.unwrap_or(history_end_ns);
    let mut order: Vec<&FaultEvent> = faults.iter().collect();
    order.sort_by_key(|event| event.start_ns);
    let events: Vec<EventWindows> = order
        .iter()
        .enumerate()
        .map(|(index, event)| {
            let next_start_ns = order[index + 1..]
                .iter()
                .map(|next| next.start_ns)
                .find(|start_ns| *start_ns > event.start_ns);
            let end_ns = window_end(event, next_start_ns, run_end_ns);
            measure_event(event, end_ns, &successes)
        })
        .collect();
    let worst = worst_per_kind(&events);
    Availability {
        settle_ms: SETTLE_MS,
        events,
        worst,
    }
}

impl Availability {
    /// The event with the longest gap (the first of equals), for one-line summaries.
    pub fn worst_event(&self) -> Option<&EventWindows> {
        self.events
            .iter()
            .reduce(|worst, event| match event.gap_ms > worst.gap_ms {
                true => event,
                false => worst,
            })
    }
}

impl Availability {
    /// One line for people and for jepsen/matrix.sh: the longest gap (and its event), then
    /// the slowest first read and first write of any event (`none` when an event had none).
    pub fn summary(&self) -> String {
        let Some(worst) = self.worst_event() else {
            return "availability: no fault events".to_string();
        };
        let slowest = |first: fn(&EventWindows) -> Option<f64>| {
            let values: Vec<Option<f64>> = self.events.iter().map(first).collect();
            match values.iter().any(Option::is_none) {
                true => "none".to_string(),
                false => {
                    let max = values.into_iter().flatten().fold(0.0, f64::max);
                    format!("{:.3} s", max / 1e3)
                }
            }
        };
        format!(
            "availability: longest gap {:.3} s ({} {} at {:.3} s); slowest first read {}, \
             first write {} ({} events)",
            worst.gap_ms / 1e3,
            worst.fault,
            worst.target,
            worst.start_ns as f64 / 1e9,
            slowest(|event| event.first_read_ms),
            slowest(|event| event.first_write_ms),
            self.events.len()
        )
    }
}

/// The successful reads and writes, by return time: (return, call, access).
struct Successes(Vec<(u64, u64, Access)>);

impl Successes {
    fn new(history: &[Op]) -> Successes {
        let mut found: Vec<(u64, u64, Access)> = history
            .iter()
            .filter(|op| op.status() == Status::Ok)
            .filter_map(|op| Some((op.return_ns?, op.call_ns, access(&op.op)?)))
            .collect();
        found.sort_unstable();
        Successes(found)
    }

    /// Successes called at or after `from_ns` that returned by `to_ns`, by return time.
    fn between(&self, from_ns: u64, to_ns: u64) -> impl Iterator<Item = (u64, Access)> + '_ {
        let first = self
            .0
            .partition_point(|(return_ns, _, _)| *return_ns < from_ns);
        self.0[first..]
            .iter()
            .take_while(move |(return_ns, _, _)| *return_ns <= to_ns)
            .filter(move |(_, call_ns, _)| *call_ns >= from_ns)
            .map(|(return_ns, _, access)| (*return_ns, *access))
    }

    /// ms from `from_ns` to the first success of `access` called at or after it and returned
    /// by `to_ns`.
    fn first(&self, access: Access, from_ns: u64, to_ns: u64) -> Option<f64> {
        self.between(from_ns, to_ns)
            .find(|(_, kind)| *kind == access)
            .map(|(return_ns, _)| ms(return_ns - from_ns))
    }
}

fn window_end(event: &FaultEvent, next_start_ns: Option<u64>, run_end_ns: u64) -> u64 {
    let settled_ns = event.stop_ns.map_or(u64::MAX, |stop_ns| {
        stop_ns.saturating_add(SETTLE_MS * 1_000_000)
    });
    settled_ns
        .min(next_start_ns.unwrap_or(u64::MAX))
        .min(run_end_ns)
        .max(event.start_ns)
}

fn measure_event(event: &FaultEvent, end_ns: u64, successes: &Successes) -> EventWindows {
    let start_ns = event.start_ns;
    let healed = |access| {
        let stop_ns = event.stop_ns.filter(|stop_ns| *stop_ns < end_ns)?;
        successes.first(access, stop_ns, end_ns)
    };
    let (gap_start_ns, gap_end_ns) = longest_gap(successes, start_ns, end_ns);
    EventWindows {
        fault: event.fault.clone(),
        target: event.target.clone(),
        start_ns,
        stop_ns: event.stop_ns,
        end_ns,
        first_read_ms: successes.first(Access::Read, start_ns, end_ns),
        first_write_ms: successes.first(Access::Write, start_ns, end_ns),
        healed_read_ms: healed(Access::Read),
        healed_write_ms: healed(Access::Write),
        gap_ms: ms(gap_end_ns - gap_start_ns),
        gap_start_ns,
        gap_end_ns,
    }
}

/// The longest stretch of `[start_ns, end_ns]` without the return of a success called at or
/// after `start_ns`; the first of equals.
fn longest_gap(successes: &Successes, start_ns: u64, end_ns: u64) -> (u64, u64) {
    let mut longest = (start_ns, start_ns);
    let mut previous_ns = start_ns;
    let returns = successes.between(start_ns, end_ns).map(|(at_ns, _)| at_ns);
    for at_ns in returns.chain([end_ns]) {
        if at_ns - previous_ns > longest.1 - longest.0 {
            longest = (previous_ns, at_ns);
        }
        previous_ns = at_ns;
    }
    longest
}

fn worst_per_kind(events: &[EventWindows]) -> BTreeMap<String, Worst> {
    let mut worst: BTreeMap<String, Worst> = BTreeMap::new();
    for event in events {
        let kind = worst.entry(event.fault.clone()).or_insert(Worst {
            events: 0,
            first_read_ms: None,
            first_write_ms: None,
            healed_read_ms: None,
            healed_write_ms: None,
            gap_ms: 0.0,
            without_read: 0,
            without_write: 0,
        });
        kind.events += 1;
        kind.first_read_ms = larger(kind.first_read_ms, event.first_read_ms);
        kind.first_write_ms = larger(kind.first_write_ms, event.first_write_ms);
        kind.healed_read_ms = larger(kind.healed_read_ms, event.healed_read_ms);
        kind.healed_write_ms = larger(kind.healed_write_ms, event.healed_write_ms);
        kind.gap_ms = kind.gap_ms.max(event.gap_ms);
        kind.without_read += usize::from(event.first_read_ms.is_none());
        kind.without_write += usize::from(event.first_write_ms.is_none());
    }
    worst
}

fn larger(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// ns as ms, to the µs.
fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e3).round() / 1e3
}

#[cfg(test)]
mod tests;
