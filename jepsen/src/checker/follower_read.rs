//! The follower-read checker: puts of values unique per key, gets served by single nodes from
//! their own applied state (`"consistency":"follower"`, `"node":N`), and after the heal final
//! reads (`"final":true`) on every node and one linearizable. Checks, per key:
//!
//! - (a) no phantom values: every value a get returns was written to that key by a put that
//!   did not fail (ok or indeterminate) and was called before the get returned;
//! - (b) no going back: on one node, a follower get called after another returned never
//!   returns an older value, in the order of acknowledged writes (the `revision` each ok put
//!   recorded; absence is older than every write). Compared only within one process lifetime
//!   of the node: a crash rolls the applied state back to re-apply it from the log
//!   (ARCHITECTURE, life of a write), so pairs with a `kill` of that node or a `kill-all`
//!   starting between them are not compared. Gets of values without a known revision
//!   (written by indeterminate puts) are not compared either;
//! - (c) convergence: each node's last successful final follower get equals the last
//!   successful final linearizable get. A key without them is unknown;
//! - (d) bounds: a successful follower get with `"min_revision":R` returns a value no older
//!   than revision R, and one with `"max_staleness_ms":T` a value no older than every put of
//!   the key acknowledged more than T ms before the get was called. Gets of values without a
//!   known revision are not judged.
//!
//! Knows nothing about servers or how the history was made.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::{CheckerName, Outcome, check_by_key, quote};
use crate::fault::FaultEvent;
use crate::history::{Op, OpKind, Status};

/// Checks the history; `faults` tells where nodes restarted (for (b)).
pub fn check(history: &[Op], faults: &[FaultEvent]) -> Outcome {
    let crashes = Crashes::new(faults);
    check_by_key(
        CheckerName::FollowerRead,
        history,
        &[OpKind::Get, OpKind::Put],
        "without phantom or backward follower reads, within their bounds, converged",
        |history, indices| judge_key(history, indices, &crashes),
    )
}

/// Whether a get was served from one node's own state.
pub fn is_follower(op: &Op) -> bool {
    op.extra.get("consistency").and_then(Value::as_str) == Some("follower")
}

/// Whether the op is one of the final reads after the heal.
pub fn is_final(op: &Op) -> bool {
    op.extra.get("final").and_then(Value::as_bool) == Some(true)
}

/// The node that served a follower get.
pub fn node(op: &Op) -> Option<u64> {
    op.extra.get("node").and_then(Value::as_u64)
}

fn judge_key(
    history: &[Op],
    indices: &[usize],
    crashes: &Crashes,
) -> Result<Result<(), Value>, String> {
    let writes = Writes::new(history, indices);
    for &index in indices {
        if let Err(evidence) = no_phantom(history, index, &writes) {
            return Ok(Err(evidence));
        }
        if let Err(evidence) = within_bounds(history, index, &writes) {
            return Ok(Err(evidence));
        }
    }
    if let Err(evidence) = no_going_back(history, indices, &writes, crashes) {
        return Ok(Err(evidence));
    }
    converged(history, indices)
}

/// The puts of one key by value: the first put of each value, and the revision of each
/// acknowledged one; and the acknowledged puts in the order they returned.
struct Writes {
    puts: HashMap<String, usize>,
    revisions: HashMap<String, u64>,
    /// (returned, the highest revision acknowledged up to then, index of that put), in the
    /// order the acknowledged puts returned.
    acked: Vec<(u64, u64, usize)>,
}

impl Writes {
    fn new(history: &[Op], indices: &[usize]) -> Writes {
        let mut puts = HashMap::new();
        let mut revisions = HashMap::new();
        let mut acked = Vec::new();
        for &index in indices {
            let op = &history[index];
            if op.op != OpKind::Put || op.status() == Status::Fail {
                continue;
            }
            let value = op.value.to_string();
            let first = puts.entry(value.clone()).or_insert(index);
            if history[*first].call_ns > op.call_ns {
                *first = index;
            }
            let revision = op.extra.get("revision").and_then(Value::as_u64);
            if let (Status::Ok, Some(revision)) = (op.status(), revision) {
                revisions.insert(value, revision);
                let returned = op.return_ns.expect("an ok op has returned");
                acked.push((returned, revision, index));
            }
        }
        acked.sort_unstable();
        let mut highest: Option<(u64, usize)> = None;
        for entry in &mut acked {
            if highest.is_none_or(|(revision, _)| entry.1 > revision) {
                highest = Some((entry.1, entry.2));
            }
            let (revision, index) = highest.expect("set above");
            (entry.1, entry.2) = (revision, index);
        }
        Writes {
            puts,
            revisions,
            acked,
        }
    }

    /// The highest revision of an acknowledged put that returned before `at`, and that put.
    fn acknowledged_before(&self, at: u64) -> Option<(u64, usize)> {
        let before = self
            .acked
            .partition_point(|&(returned, _, _)| returned < at);
        before
            .checked_sub(1)
            .map(|last| (self.acked[last].1, self.acked[last].2))
    }

    /// Where a read's output stands in the order of acknowledged writes: 0 for absence.
    fn revision(&self, output: &Value) -> Option<u64> {
        match output {
            Value::Null => Some(0),
            value => self.revisions.get(&value.to_string()).copied(),
        }
    }
}

/// (a) for one op: a successful get returns absence or a value some not-failed put of the key
/// wrote, called before the get returned.
fn no_phantom(history: &[Op], index: usize, writes: &Writes) -> Result<(), Value> {
    let op = &history[index];
    if op.op != OpKind::Get || op.status() != Status::Ok || op.output.is_null() {
        return Ok(());
    }
    let returned = op.return_ns.expect("an ok op has returned");
    let explanation = match writes.puts.get(&op.output.to_string()) {
        None => format!(
            "phantom value: a get of key {:?} returned {}, which no put that did not fail wrote",
            op.key, op.output
        ),
        Some(&put) if history[put].call_ns > returned => format!(
            "phantom value: a get of key {:?} returned {} before the put of it was called",
            op.key, op.output
        ),
        Some(_) => return Ok(()),
    };
    let mut evidence =
        json!({ "explanation": explanation, "key": op.key, "read": quote(history, index) });
    if let Some(&put) = writes.puts.get(&op.output.to_string()) {
        evidence["put"] = quote(history, put);
    }
    Err(evidence)
}

/// (d) for one op: a successful follower get with bounds returns a value no older than its
/// `min_revision` and than the puts acknowledged `max_staleness_ms` before its call.
fn within_bounds(history: &[Op], index: usize, writes: &Writes) -> Result<(), Value> {
    let op = &history[index];
    if op.op != OpKind::Get || op.status() != Status::Ok || !is_follower(op) {
        return Ok(());
    }
    let Some(read) = writes.revision(&op.output) else {
        return Ok(());
    };
    let min_revision = op.extra.get("min_revision").and_then(Value::as_u64);
    if let Some(asked) = min_revision.filter(|asked| read < *asked) {
        let explanation = format!(
            "a follower get of key {:?} at revision {asked} returned {} (revision {read})",
            op.key, op.output
        );
        return Err(
            json!({ "explanation": explanation, "key": op.key, "read": quote(history, index) }),
        );
    }
    let Some(max_ms) = op.extra.get("max_staleness_ms").and_then(Value::as_u64) else {
        return Ok(());
    };
    let cutoff = op.call_ns.saturating_sub(max_ms.saturating_mul(1_000_000));
    match writes.acknowledged_before(cutoff) {
        Some((acked, put)) if read < acked => {
            let explanation = format!(
                "a follower get of key {:?} within {max_ms} ms returned {} (revision {read}), older than a put acknowledged more than {max_ms} ms before it (revision {acked})",
                op.key, op.output
            );
            Err(json!({
                "explanation": explanation,
                "key": op.key,
                "read": quote(history, index),
                "put": quote(history, put),
            }))
        }
        _ => Ok(()),
    }
}

/// (node, its lifetime: crashes before).
type Lifetime = (u64, usize);
/// (time, revision read, index of the get).
type Stamped = (u64, u64, usize);

/// (b): per node and process lifetime, follower gets never go back in revision order.
fn no_going_back(
    history: &[Op],
    indices: &[usize],
    writes: &Writes,
    crashes: &Crashes,
) -> Result<(), Value> {
    // Gets as "earlier" reads (grouped by the lifetime of their call, keyed by return) and as
    // "later" reads (by the lifetime of their return, keyed by call); a pair is compared only
    // when both fall in one group.
    let mut earlier: BTreeMap<Lifetime, Vec<Stamped>> = BTreeMap::new();
    let mut later: BTreeMap<Lifetime, Vec<Stamped>> = BTreeMap::new();
    for &index in indices {
        let op = &history[index];
        if op.op != OpKind::Get || op.status() != Status::Ok || !is_follower(op) {
            continue;
        }
        let (Some(node), Some(revision)) = (node(op), writes.revision(&op.output)) else {
            continue;
        };
        let returned = op.return_ns.expect("an ok op has returned");
        let as_earlier = (node, crashes.lifetime(node, op.call_ns));
        let as_later = (node, crashes.lifetime(node, returned));
        earlier
            .entry(as_earlier)
            .or_default()
            .push((returned, revision, index));
        later
            .entry(as_later)
            .or_default()
            .push((op.call_ns, revision, index));
    }
    for (group, mut reads) in later {
        let Some(mut before) = earlier.remove(&group) else {
            continue;
        };
        before.sort_unstable();
        reads.sort_unstable();
        let mut newest: Option<(u64, usize)> = None;
        let mut next = 0;
        for (call, revision, index) in reads {
            while next < before.len() && before[next].0 < call {
                let (_, seen, seen_index) = before[next];
                if newest.is_none_or(|(top, _)| seen > top) {
                    newest = Some((seen, seen_index));
                }
                next += 1;
            }
            if let Some((top, top_index)) = newest.filter(|(top, _)| revision < *top) {
                let op = &history[index];
                let explanation = format!(
                    "follower read went back: node {} returned {} (revision {revision}) for key {:?} after returning {} (revision {top})",
                    group.0, op.output, op.key, history[top_index].output
                );
                return Err(json!({
                    "explanation": explanation,
                    "key": op.key,
                    "earlier": quote(history, top_index),
                    "later": quote(history, index),
                }));
            }
        }
    }
    Ok(())
}

/// (c): the last successful final follower get of each node equals the last successful final
/// linearizable get.
fn converged(history: &[Op], indices: &[usize]) -> Result<Result<(), Value>, String> {
    let finals = indices.iter().copied().filter(|&index| {
        let op = &history[index];
        op.op == OpKind::Get && is_final(op)
    });
    let mut linearizable: Option<usize> = None;
    let mut nodes: BTreeMap<u64, Option<usize>> = BTreeMap::new();
    for index in finals {
        let op = &history[index];
        let ok = op.status() == Status::Ok;
        let later = |last: Option<usize>| last.is_none_or(|l| history[l].call_ns <= op.call_ns);
        match (is_follower(op), node(op)) {
            (false, _) if ok && later(linearizable) => linearizable = Some(index),
            (false, _) => {}
            (true, Some(node)) => {
                let last = nodes.entry(node).or_default();
                if ok && later(*last) {
                    *last = Some(index);
                }
            }
            (true, None) => return Err(format!("record {} has no node", index + 1)),
        }
    }
    if nodes.is_empty() {
        return Err("no final follower reads".into());
    }
    let Some(truth) = linearizable else {
        return Err("no successful final linearizable read".into());
    };
    for (node, last) in nodes {
        let Some(last) = last else {
            return Err(format!("node {node}: no successful final follower read"));
        };
        if history[last].output != history[truth].output {
            let explanation = format!(
                "node {node} did not converge on key {:?}: its last final read returned {}, the final linearizable read {}",
                history[truth].key, history[last].output, history[truth].output
            );
            return Ok(Err(json!({
                "explanation": explanation,
                "key": history[truth].key,
                "follower": quote(history, last),
                "linearizable": quote(history, truth),
            })));
        }
    }
    Ok(Ok(()))
}

/// When each node crashed: kill -9 of that node or of all (their start times, sorted).
struct Crashes {
    nodes: HashMap<u64, Vec<u64>>,
    all: Vec<u64>,
}

impl Crashes {
    fn new(faults: &[FaultEvent]) -> Crashes {
        let mut nodes: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut all = Vec::new();
        for fault in faults {
            match fault.fault.as_str() {
                "kill-all" => all.push(fault.start_ns),
                "kill" => {
                    if let Some(node) = killed_node(&fault.target) {
                        nodes.entry(node).or_default().push(fault.start_ns);
                    }
                }
                _ => {}
            }
        }
        for starts in nodes.values_mut() {
            starts.extend(&all);
            starts.sort_unstable();
        }
        all.sort_unstable();
        Crashes { nodes, all }
    }

    /// Which lifetime of `node` time `at` falls in: the number of its crashes up to `at`.
    fn lifetime(&self, node: u64, at: u64) -> usize {
        let starts = self.nodes.get(&node).unwrap_or(&self.all);
        starts.partition_point(|&start| start <= at)
    }
}

/// The node of a `kill` target such as `n2` or `n2 (leader)`.
fn killed_node(target: &str) -> Option<u64> {
    let name = target.split_whitespace().next()?;
    name.strip_prefix('n')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_targets_name_their_node() {
        assert_eq!(killed_node("n2"), Some(2));
        assert_eq!(killed_node("n3 (leader)"), Some(3));
        assert_eq!(killed_node("all"), None);
    }

    #[test]
    fn a_crash_starts_a_new_lifetime() {
        let fault = |kind: &str, target: &str, start_ns| FaultEvent {
            fault: kind.into(),
            target: target.into(),
            start_ns,
            stop_ns: Some(start_ns + 10),
            extra: Default::default(),
        };
        let crashes = Crashes::new(&[fault("kill", "n2", 100), fault("kill-all", "all", 200)]);
        let lifetimes: Vec<usize> = [50, 100, 150, 250]
            .iter()
            .map(|&at| crashes.lifetime(2, at))
            .collect();
        assert_eq!(lifetimes, [0, 1, 1, 2]);
        assert_eq!(crashes.lifetime(1, 150), 0);
        assert_eq!(crashes.lifetime(1, 250), 1);
    }
}
