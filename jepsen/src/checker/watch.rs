//! The watch checker. Writers put values unique per key (and delete keys); watchers record
//! the events they receive (`watch` ops: `[key, revision, value or null]` each) and how they
//! ended (`watch-end`). Invalid when a watcher
//! - receives an event twice (the same key and revision),
//! - receives a key's events out of revision order,
//! - receives a value no put of the key may have written (never written, or written by a put
//!   that definitely failed),
//! - disagrees with another watcher on what a key's revision holds,
//! - caught up (its watch reported every key complete at or past its last acknowledged
//!   write) yet misses an acknowledged put's value, or ends on a key's value other than the
//!   final read's;
//!
//! and when a read of a key at the revision of an acknowledged write of it (`read-at`) gives
//! anything but the value that write left.
//!
//! A watcher that did not catch up (its watch failed, or the drain ran out of time) is
//! checked for the first four only, and makes the verdict unknown when it missed an
//! acknowledged put: the run cannot tell a lost event from a slow one.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Map, Value, json};

use crate::checker::{Outcome, Verdict, capped, quote};
use crate::history::{Op, OpKind, Status};

/// What the writes of one key may have left: each value with whether its put was
/// acknowledged, and values of puts that definitely failed.
#[derive(Debug, Default)]
struct Writes {
    acknowledged: BTreeSet<String>,
    maybe: BTreeSet<String>,
    failed: BTreeSet<String>,
}

/// What one watcher saw.
#[derive(Debug, Default)]
struct Seen {
    /// Per key: (revision, value) in the order received.
    events: BTreeMap<String, Vec<(u64, Value)>>,
    end: Option<String>,
}

pub fn check(history: &[Op]) -> Outcome {
    let mut writes: HashMap<&str, Writes> = HashMap::new();
    let mut finals: HashMap<&str, Value> = HashMap::new();
    let mut watchers: BTreeMap<u64, Seen> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut reads_at = 0u64;
    for (index, op) in history.iter().enumerate() {
        match &op.op {
            OpKind::Put => {
                let writes = writes.entry(op.key.as_str()).or_default();
                let value = op.value.to_string();
                match op.status() {
                    Status::Ok => writes.acknowledged.insert(value),
                    Status::Info => writes.maybe.insert(value),
                    Status::Fail => writes.failed.insert(value),
                };
            }
            OpKind::Get if op.status() == Status::Ok => {
                // The last successful read of a key is the final read (the run reads last).
                finals.insert(op.key.as_str(), op.output.clone());
            }
            OpKind::Other(kind) if kind == "watch" => {
                let seen = watchers.entry(op.client).or_default();
                received(seen, op, index, history, &mut problems);
            }
            OpKind::Other(kind) if kind == "watch-end" => {
                let seen = watchers.entry(op.client).or_default();
                seen.end = op.output.as_str().map(str::to_string);
            }
            OpKind::Other(kind) if kind == "read-at" && op.status() == Status::Ok => {
                reads_at += 1;
                if op.output != op.expect {
                    problems.push(json!({
                        "kind": "read-at-revision-wrong", "key": op.key,
                        "revision": op.extra.get("revision"), "expected": op.expect,
                        "read": op.output, "evidence": quote(history, index),
                    }));
                }
            }
            _ => {}
        }
    }
    let mut revisions: HashMap<(&str, u64), (u64, &Value)> = HashMap::new();
    let mut incomplete = Vec::new();
    for (watcher, seen) in &watchers {
        for (key, events) in &seen.events {
            let key_writes = writes.get(key.as_str());
            for (revision, value) in events {
                match revisions.insert((key.as_str(), *revision), (*watcher, value)) {
                    Some((other, theirs)) if theirs != value => problems.push(json!({
                        "kind": "watchers-disagree", "key": key, "revision": revision,
                        "watchers": [other, watcher], "values": [theirs, value],
                    })),
                    _ => {}
                }
                if value.is_null() {
                    continue;
                }
                let text = value.to_string();
                let written = key_writes
                    .is_some_and(|w| w.acknowledged.contains(&text) || w.maybe.contains(&text));
                if !written {
                    let failed = key_writes.is_some_and(|w| w.failed.contains(&text));
                    problems.push(json!({
                        "kind": if failed { "failed-write-seen" } else { "phantom-value" },
                        "watcher": watcher, "key": key, "revision": revision, "value": value,
                    }));
                }
            }
        }
        let caught_up = seen.end.as_deref() == Some("caught-up");
        for (key, key_writes) in &writes {
            let values: BTreeSet<String> = seen
                .events
                .get(*key)
                .map(|events| events.iter().map(|(_, v)| v.to_string()).collect())
                .unwrap_or_default();
            let missed: Vec<&String> = key_writes
                .acknowledged
                .iter()
                .filter(|value| !values.contains(*value))
                .collect();
            if missed.is_empty() {
                continue;
            }
            let item = json!({
                "kind": "acknowledged-put-missed", "watcher": watcher, "key": key,
                "values": missed, "end": seen.end,
            });
            match caught_up {
                true => problems.push(item),
                false => incomplete.push(item),
            }
        }
        if caught_up {
            for (key, events) in &seen.events {
                let last = events.last().map(|(_, value)| value);
                if let (Some(last), Some(read)) = (last, finals.get(key.as_str()))
                    && last != read
                {
                    problems.push(json!({
                        "kind": "last-event-not-final-read", "watcher": watcher, "key": key,
                        "last_event": last, "final_read": read,
                    }));
                }
            }
        }
    }
    let events: usize = watchers
        .values()
        .flat_map(|seen| seen.events.values())
        .map(Vec::len)
        .sum();
    let mut fields = Map::new();
    fields.insert("watchers".into(), Value::from(watchers.len()));
    fields.insert("events".into(), Value::from(events));
    fields.insert("reads_at_revision".into(), Value::from(reads_at));
    let ends: Vec<Value> = watchers
        .iter()
        .map(|(watcher, seen)| json!({"watcher": watcher, "end": seen.end}))
        .collect();
    fields.insert("ends".into(), Value::Array(ends));
    if !problems.is_empty() {
        let summary = format!(
            "{} problem(s) in what the watchers received or the reads at a revision gave \
             (first: {})",
            problems.len(),
            problems[0]["kind"]
        );
        fields.insert("problems".into(), capped(problems));
        return Outcome::new(Verdict::Invalid, summary, fields);
    }
    if watchers.is_empty() {
        return Outcome::new(Verdict::Unknown, "no watcher recorded anything", fields);
    }
    if !incomplete.is_empty() {
        let short: BTreeSet<u64> = incomplete
            .iter()
            .filter_map(|item| item["watcher"].as_u64())
            .collect();
        let summary = format!(
            "{} watcher(s) did not catch up and missed acknowledged puts",
            short.len()
        );
        fields.insert("incomplete".into(), capped(incomplete));
        return Outcome::new(Verdict::Unknown, summary, fields);
    }
    let summary = format!(
        "{} watchers received {events} events: each once, each key's in order, every \
         acknowledged put, no value that was not written; {reads_at} reads at a write's \
         revision gave its value",
        watchers.len()
    );
    Outcome::new(Verdict::Valid, summary, fields)
}

/// Takes a `watch` op's events into what its watcher saw, noting repeats and disorder.
fn received(seen: &mut Seen, op: &Op, index: usize, history: &[Op], problems: &mut Vec<Value>) {
    let Some(events) = op.output.as_array() else {
        problems.push(json!({"kind": "malformed-watch-op", "evidence": quote(history, index)}));
        return;
    };
    for event in events {
        let (Some(key), Some(revision)) = (event[0].as_str(), event[1].as_u64()) else {
            problems.push(json!({"kind": "malformed-watch-op", "evidence": quote(history, index)}));
            return;
        };
        let key_events = seen.events.entry(key.to_string()).or_default();
        if let Some((last, _)) = key_events.last()
            && *last >= revision
        {
            let kind = match key_events.iter().any(|(r, _)| *r == revision) {
                true => "event-repeated",
                false => "events-out-of-order",
            };
            problems.push(json!({
                "kind": kind, "watcher": op.client, "key": key, "revision": revision,
                "after": last, "evidence": quote(history, index),
            }));
        }
        key_events.push((revision, event[2].clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::OpKind;

    fn op(client: u64, kind: OpKind, key: &str, value: Value, ok: Option<bool>) -> Op {
        Op {
            client,
            op: kind,
            key: key.into(),
            value,
            expect: Value::Null,
            ok,
            output: Value::Null,
            call_ns: 0,
            return_ns: ok.map(|_| 1),
            extra: Map::new(),
        }
    }

    fn put(key: &str, value: u64, ok: Option<bool>) -> Op {
        op(0, OpKind::Put, key, Value::from(value), ok)
    }

    fn watch(client: u64, events: Value) -> Op {
        let mut op = op(
            client,
            OpKind::Other("watch".into()),
            "",
            Value::Null,
            Some(true),
        );
        op.output = events;
        op
    }

    fn end(client: u64, how: &str) -> Op {
        let mut op = op(
            client,
            OpKind::Other("watch-end".into()),
            "",
            Value::Null,
            Some(true),
        );
        op.output = Value::from(how);
        op
    }

    fn get(key: &str, value: Value) -> Op {
        let mut op = op(9, OpKind::Get, key, Value::Null, Some(true));
        op.output = value;
        op
    }

    /// Two puts, an indeterminate one that took effect, a failed one, a delete; two
    /// watchers that saw it all.
    fn valid() -> Vec<Op> {
        let events = json!([["w1", 3, 1], ["w1", 5, 2], ["w2", 6, 3], ["w1", 7, null]]);
        vec![
            put("w1", 1, Some(true)),
            put("w1", 2, None),
            put("w2", 3, Some(true)),
            put("w2", 4, Some(false)),
            watch(100, events.clone()),
            watch(101, json!([["w1", 3, 1], ["w1", 5, 2]])),
            watch(101, json!([["w2", 6, 3], ["w1", 7, null]])),
            end(100, "caught-up"),
            end(101, "caught-up"),
            get("w1", Value::Null),
            get("w2", Value::from(3)),
        ]
    }

    fn verdict(history: &[Op]) -> (Verdict, String) {
        let outcome = check(history);
        (outcome.result, outcome.summary().to_string())
    }

    #[test]
    fn a_watch_of_every_write_once_in_order_is_valid() {
        assert_eq!(
            verdict(&valid()).0,
            Verdict::Valid,
            "{:?}",
            verdict(&valid())
        );
    }

    #[test]
    fn a_repeat_a_disorder_a_phantom_and_a_failed_write_are_each_invalid() {
        let cases = [
            (json!([["w1", 3, 1], ["w1", 3, 1]]), "event-repeated"),
            (json!([["w1", 5, 2], ["w1", 3, 1]]), "events-out-of-order"),
            (json!([["w1", 4, 9]]), "phantom-value"),
            (json!([["w2", 8, 4]]), "failed-write-seen"),
        ];
        for (events, kind) in cases {
            let mut history = valid();
            history.push(watch(102, events));
            let outcome = check(&history);
            assert_eq!(outcome.result, Verdict::Invalid, "{kind}");
            assert!(
                outcome.summary().contains(kind),
                "{kind}: {}",
                outcome.summary()
            );
        }
    }

    #[test]
    fn a_caught_up_watcher_that_missed_an_acknowledged_put_is_invalid() {
        let mut history = valid();
        history[5] = watch(101, json!([["w1", 5, 2]]));
        let (result, summary) = verdict(&history);
        assert_eq!(result, Verdict::Invalid);
        assert!(summary.contains("acknowledged-put-missed"), "{summary}");
        // One that did not catch up leaves the verdict unknown.
        history[8] = end(101, "timeout");
        assert_eq!(verdict(&history).0, Verdict::Unknown);
    }

    #[test]
    fn a_read_at_a_writes_revision_must_give_its_value() {
        let read_at = |expected: Value, read: Value| {
            let mut op = op(
                9,
                OpKind::Other("read-at".into()),
                "w1",
                Value::Null,
                Some(true),
            );
            op.expect = expected;
            op.output = read;
            op.extra.insert("revision".into(), Value::from(5));
            op
        };
        let mut history = valid();
        history.push(read_at(Value::from(2), Value::from(2)));
        history.push(read_at(Value::Null, Value::Null));
        assert_eq!(
            verdict(&history).0,
            Verdict::Valid,
            "{:?}",
            verdict(&history)
        );
        history.push(read_at(Value::from(2), Value::from(1)));
        let (result, summary) = verdict(&history);
        assert_eq!(result, Verdict::Invalid);
        assert!(summary.contains("read-at-revision-wrong"), "{summary}");
    }

    #[test]
    fn watchers_that_disagree_or_end_off_the_final_read_are_invalid() {
        let mut history = valid();
        history[5] = watch(101, json!([["w1", 3, 1], ["w1", 5, 1]]));
        assert!(verdict(&history).1.contains("watchers-disagree"));
        let mut history = valid();
        history[10] = get("w2", Value::from(4));
        assert!(verdict(&history).1.contains("last-event-not-final-read"));
    }
}
