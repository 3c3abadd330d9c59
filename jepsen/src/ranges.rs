//! The range table as the runner observed it, from `ranges.jsonl`: snapshots of every range's
//! span, epoch, voters and leader over time, which range held a key at a given time, and the
//! key an op is routed by. Knows nothing about how the table was observed or how it is shown.

mod change;

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::history::{self, JsonLinesError, Op, OpKind};
use crate::limits;

pub use change::describe_changes;

/// The range table at one time, e.g. `{"at":5123000000,"cause":"split","ranges":[...]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RangeSnapshot {
    /// When the runner saw this table, in ns of the history's clock.
    #[serde(rename = "at")]
    pub at_ns: u64,
    /// Why it was taken, free text: `start`, `change`, `split`, `move`, `membership`, `disk`,
    /// `final`.
    #[serde(default)]
    pub cause: String,
    /// The ranges in key order, each starting where the one before ends.
    pub ranges: Vec<RangeEntry>,
}

/// One range of a snapshot: its span `[start, end)` and its replication state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeEntry {
    #[serde(rename = "range")]
    pub id: u64,
    /// The first key (lossy UTF-8 of its bytes).
    pub start: String,
    /// The exclusive end; null = unbounded.
    pub end: Option<String>,
    #[serde(default)]
    pub epoch: u64,
    #[serde(default)]
    pub conf_version: u64,
    /// Nodes holding a voting replica.
    #[serde(default)]
    pub voters: Vec<u64>,
    /// The node that leads the range's group, null when none was known.
    #[serde(default)]
    pub leader: Option<u64>,
}

impl RangeEntry {
    /// Whether `key` lies in `[start, end)`. Strings compare by their UTF-8 bytes, as keys do.
    pub fn contains(&self, key: &str) -> bool {
        key >= self.start.as_str() && self.end.as_deref().is_none_or(|end| key < end)
    }

    /// The span for people: `["", "r01")`, `+inf` for an unbounded end.
    pub fn span_text(&self) -> String {
        let end = self
            .end
            .as_deref()
            .map_or("+inf".to_string(), |end| format!("\"{}\"", key_text(end)));
        format!("[\"{}\", {end})", key_text(&self.start))
    }

    /// The whole entry for people: `r2 ["", "r01") voters 1,2,3 leader 1`.
    pub fn text(&self) -> String {
        format!(
            "r{} {} voters {} leader {}",
            self.id,
            self.span_text(),
            nodes_text(&self.voters),
            leader_text(self.leader)
        )
    }
}

/// Reads `ranges.jsonl` and checks each snapshot's table (see `validate`) and that `at` never
/// goes back. A file that breaks either is refused, like any malformed input.
pub fn read_ranges(path: &Path) -> Result<Vec<RangeSnapshot>, JsonLinesError> {
    let snapshots: Vec<RangeSnapshot> =
        history::read_json_lines(path, limits::RANGE_SNAPSHOTS_MAX)?;
    let mut previous_ns = 0;
    for (index, snapshot) in snapshots.iter().enumerate() {
        let invalid = |reason: String| JsonLinesError::Invalid {
            path: path.display().to_string(),
            line: index + 1,
            reason,
        };
        if snapshot.at_ns < previous_ns {
            let at_ns = snapshot.at_ns;
            return Err(invalid(format!(
                "at {at_ns} is before the previous snapshot's {previous_ns}"
            )));
        }
        previous_ns = snapshot.at_ns;
        validate(&snapshot.ranges).map_err(invalid)?;
    }
    Ok(snapshots)
}

/// Checks one table: at most `limits::RANGES_PER_SNAPSHOT_MAX` ranges, ids unique, every span
/// non-empty, and each range starting where the one before ends (so sorted, without gaps or
/// overlaps, and only the last unbounded). The table need not start at the empty key nor end
/// unbounded: a key outside it has no range.
pub fn validate(ranges: &[RangeEntry]) -> Result<(), String> {
    if ranges.len() > limits::RANGES_PER_SNAPSHOT_MAX {
        return Err(format!(
            "{} ranges in one snapshot; limit is {}",
            ranges.len(),
            limits::RANGES_PER_SNAPSHOT_MAX
        ));
    }
    let mut ids = HashSet::new();
    for (index, entry) in ranges.iter().enumerate() {
        if !ids.insert(entry.id) {
            return Err(format!("range {} appears twice", entry.id));
        }
        if let Some(end) = &entry.end
            && *end <= entry.start
        {
            return Err(format!(
                "range {} has an empty span {}",
                entry.id,
                entry.span_text()
            ));
        }
        let Some(before) = index.checked_sub(1).map(|i| &ranges[i]) else {
            continue;
        };
        if before.end.as_deref() != Some(entry.start.as_str()) {
            return Err(format!(
                "range {} {} does not start where range {} {} ends",
                entry.id,
                entry.span_text(),
                before.id,
                before.span_text()
            ));
        }
    }
    Ok(())
}

/// The range holding `routing_key` in the latest snapshot taken at or before `at_ns` (the
/// first snapshot when all are later); None when there is no snapshot or the key lies
/// outside that table. `snapshots` must be in `at` order, as `read_ranges` returns them.
pub fn range_of(snapshots: &[RangeSnapshot], routing_key: &str, at_ns: u64) -> Option<u64> {
    let taken = snapshots.partition_point(|s| s.at_ns <= at_ns);
    let snapshot = snapshots.get(taken.saturating_sub(1))?;
    let ranges = &snapshot.ranges;
    let after = ranges.partition_point(|r| r.start.as_str() <= routing_key);
    let entry = &ranges[after.checked_sub(1)?];
    entry.contains(routing_key).then_some(entry.id)
}

/// The key keel routes an op by: a kv op's `key`; a lock's name (`acquire`/`release` record
/// it as `key`); for an idempotency op (`begin`, `complete`, `abort`, and the final `get`s,
/// which carry `scope` and `id` too) the record's stored key `scope` + "\0" + `id`
/// (`keel_types::coordination::idempotency_key`). None for a `begin`, `complete` or `abort`
/// without `scope` and `id`, and for kinds this crate does not know.
pub fn routing_key(op: &Op) -> Option<String> {
    let text = |name: &str| op.extra.get(name).and_then(Value::as_str);
    let record = text("scope").zip(text("id"));
    let record_key = |(scope, id): (&str, &str)| {
        let key = keel_types::coordination::idempotency_key(scope.as_bytes(), id.as_bytes());
        String::from_utf8_lossy(&key).into_owned()
    };
    match op.op {
        OpKind::Begin | OpKind::Complete | OpKind::Abort => record.map(record_key),
        OpKind::Get => Some(record.map_or_else(|| op.key.clone(), record_key)),
        OpKind::Put
        | OpKind::Cas
        | OpKind::Del
        | OpKind::Append
        | OpKind::Read
        | OpKind::Incr
        | OpKind::Fput
        | OpKind::Acquire
        | OpKind::Release => Some(op.key.clone()),
        OpKind::Other(_) => None,
    }
}

/// A key for people: control characters and quotes escaped (`jepsen\0id3`), cut after
/// `KEY_TEXT_CHARS_MAX` characters.
pub fn key_text(key: &str) -> String {
    let mut text: String = key.chars().take(KEY_TEXT_CHARS_MAX).collect();
    let cut = text.len() < key.len();
    text = text.escape_debug().to_string();
    if cut {
        text.push('…');
    }
    text
}

/// Node ids for people: `1,2,3`.
fn nodes_text(nodes: &[u64]) -> String {
    let texts: Vec<String> = nodes.iter().map(u64::to_string).collect();
    texts.join(",")
}

/// A leader for people: its node id, or `none`.
fn leader_text(leader: Option<u64>) -> String {
    leader.map_or("none".to_string(), |node| node.to_string())
}

/// Characters of a key shown by `key_text`.
const KEY_TEXT_CHARS_MAX: usize = 64;

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const GOOD: &str = r#"{"at": 5, "cause": "start", "ranges": [
{"range": 2, "start": "", "end": "r01", "epoch": 1, "conf_version": 3, "voters": [1,2,3], "leader": 1},
{"range": 5, "start": "r01", "end": null, "epoch": 0, "conf_version": 3, "voters": [2,3,4], "leader": null}]}"#;

    /// Writes `lines` (one snapshot each, newlines inside removed) to a file and reads it.
    fn read(lines: &[&str]) -> Result<Vec<RangeSnapshot>, JsonLinesError> {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        for line in lines {
            writeln!(file, "{}", line.replace('\n', "")).unwrap();
        }
        read_ranges(file.path())
    }

    fn entry(id: u64, start: &str, end: Option<&str>) -> RangeEntry {
        RangeEntry {
            id,
            start: start.to_string(),
            end: end.map(str::to_string),
            epoch: 0,
            conf_version: 0,
            voters: vec![1, 2, 3],
            leader: Some(1),
        }
    }

    fn snapshot(at_ns: u64, ranges: Vec<RangeEntry>) -> RangeSnapshot {
        RangeSnapshot {
            at_ns,
            cause: "change".to_string(),
            ranges,
        }
    }

    /// `read` fails with an error whose text contains `needle`.
    fn refused(lines: &[&str], needle: &str) {
        let error = read(lines).unwrap_err().to_string();
        assert!(error.contains(needle), "{error} lacks {needle:?}");
    }

    #[test]
    fn a_good_file_loads_with_every_field() {
        let later = GOOD
            .replace("\"at\": 5", "\"at\": 9")
            .replace("\"cause\": \"start\"", "\"cause\": \"final\"");
        let snapshots = read(&[GOOD, "", &later]).unwrap();
        assert_eq!(snapshots.len(), 2);
        assert_eq!(snapshots[0].at_ns, 5);
        assert_eq!(snapshots[0].cause, "start");
        assert_eq!(snapshots[1].cause, "final");
        let first = &snapshots[0].ranges[0];
        assert_eq!(
            (first.id, first.epoch, first.conf_version, first.leader),
            (2, 1, 3, Some(1))
        );
        assert_eq!(first.voters, [1, 2, 3]);
        assert_eq!(snapshots[0].ranges[1].end, None);
        assert_eq!(snapshots[0].ranges[1].leader, None);
    }

    #[test]
    fn malformed_files_are_refused() {
        let unsorted = r#"{"at":1,"ranges":[{"range":5,"start":"r01","end":null},{"range":2,"start":"","end":"r01"}]}"#;
        refused(&[unsorted], "does not start where range 5");
        let gap = r#"{"at":1,"ranges":[{"range":2,"start":"","end":"r01"},{"range":5,"start":"r02","end":null}]}"#;
        refused(
            &[gap],
            r#"range 5 ["r02", +inf) does not start where range 2 ["", "r01") ends"#,
        );
        let overlap = r#"{"at":1,"ranges":[{"range":2,"start":"","end":"r05"},{"range":5,"start":"r02","end":null}]}"#;
        refused(&[overlap], "does not start where");
        let after_unbounded = r#"{"at":1,"ranges":[{"range":2,"start":"","end":null},{"range":5,"start":"r02","end":null}]}"#;
        refused(&[after_unbounded], "does not start where");
        let empty_span = r#"{"at":1,"ranges":[{"range":2,"start":"b","end":"a"}]}"#;
        refused(&[empty_span], "empty span");
        let twice = r#"{"at":1,"ranges":[{"range":2,"start":"","end":"a"},{"range":2,"start":"a","end":null}]}"#;
        refused(&[twice], "range 2 appears twice");
        let earlier = GOOD.replace("\"at\": 5", "\"at\": 4");
        refused(
            &[GOOD, &earlier],
            ":2: at 4 is before the previous snapshot's 5",
        );
        refused(&[GOOD, "{\"at\": 6, \"ranges\": [{\"range\": 1"], ":2:");
        refused(&[r#"{"at":1,"ranges":[{"range":2,"end":null}]}"#], "start");
        refused(&[r#"{"at":-1,"ranges":[]}"#], ":1:");
    }

    #[test]
    fn range_of_takes_the_latest_snapshot_at_or_before_the_time() {
        let before = snapshot(100, vec![entry(2, "", Some("r01")), entry(5, "r01", None)]);
        let split = snapshot(
            200,
            vec![
                entry(2, "", Some("m")),
                entry(7, "m", Some("r01")),
                entry(5, "r01", None),
            ],
        );
        let bounded = snapshot(
            300,
            vec![entry(2, "a", Some("m")), entry(7, "m", Some("s"))],
        );
        let snapshots = [before, split, bounded];
        let cases: &[(&str, u64, Option<u64>)] = &[
            // Before the first snapshot: the first one.
            ("k", 0, Some(2)),
            ("r02", 99, Some(5)),
            // At a snapshot's time: that snapshot.
            ("m", 100, Some(2)),
            ("m", 200, Some(7)),
            // Between snapshots: the earlier one.
            ("m", 199, Some(2)),
            ("m", 250, Some(7)),
            // At the split boundary: the key belongs to the right-hand range.
            ("lzzz", 250, Some(2)),
            ("r01", 250, Some(5)),
            ("r00\u{10ffff}", 250, Some(7)),
            // Unbounded end.
            ("zzzz\u{10ffff}", 250, Some(5)),
            ("", 250, Some(2)),
            // Outside a table that neither starts at "" nor is unbounded.
            ("", 300, None),
            ("s", 300, None),
            ("r", u64::MAX, Some(7)),
        ];
        for &(key, at_ns, expected) in cases {
            assert_eq!(
                range_of(&snapshots, key, at_ns),
                expected,
                "{key:?} at {at_ns}"
            );
        }
        assert_eq!(range_of(&[], "k", 0), None);
        assert_eq!(range_of(&[snapshot(1, vec![])], "k", 0), None);
    }

    fn op(line: &str) -> Op {
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn routing_keys_of_every_workload() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"{"client":0,"op":"get","key":"k1","call":0}"#, Some("k1")),
            (
                r#"{"client":0,"op":"put","key":"k1","value":3,"call":0}"#,
                Some("k1"),
            ),
            (r#"{"client":0,"op":"cas","key":"k2","call":0}"#, Some("k2")),
            (r#"{"client":0,"op":"del","key":"k2","call":0}"#, Some("k2")),
            (
                r#"{"client":0,"op":"append","key":"a","call":0}"#,
                Some("a"),
            ),
            (r#"{"client":0,"op":"read","key":"a","call":0}"#, Some("a")),
            (r#"{"client":0,"op":"incr","key":"c","call":0}"#, Some("c")),
            (
                r#"{"client":0,"op":"acquire","key":"lock-fk0","owner":"c0-h1","call":0}"#,
                Some("lock-fk0"),
            ),
            (
                r#"{"client":0,"op":"fput","key":"fk0","lock":"lock-fk0","call":0}"#,
                Some("fk0"),
            ),
            (
                r#"{"client":0,"op":"release","key":"lock-fk0","call":0}"#,
                Some("lock-fk0"),
            ),
            (
                r#"{"client":0,"op":"begin","key":"id3","scope":"jepsen","id":"id3","call":0}"#,
                Some("jepsen\0id3"),
            ),
            (
                r#"{"client":0,"op":"complete","key":"id3","scope":"jepsen","id":"id3","call":0}"#,
                Some("jepsen\0id3"),
            ),
            (
                r#"{"client":0,"op":"abort","key":"id3","scope":"s","id":"x","call":0}"#,
                Some("s\0x"),
            ),
            // The idempotency workload's final reads.
            (
                r#"{"client":0,"op":"get","key":"id3","scope":"jepsen","id":"id3","call":0}"#,
                Some("jepsen\0id3"),
            ),
            // A record op without its scope cannot be routed.
            (
                r#"{"client":0,"op":"begin","key":"id3","id":"id3","call":0}"#,
                None,
            ),
            (
                r#"{"client":0,"op":"abort","key":"id3","scope":"jepsen","call":0}"#,
                None,
            ),
            (r#"{"client":0,"op":"lock","key":"l","call":0}"#, None),
        ];
        for (line, expected) in cases {
            assert_eq!(routing_key(&op(line)).as_deref(), *expected, "{line}");
        }
    }

    #[test]
    fn keys_are_shown_escaped_and_cut() {
        assert_eq!(key_text("jepsen\0id3"), "jepsen\\0id3");
        assert_eq!(key_text("a\"b"), "a\\\"b");
        let long = "x".repeat(100);
        assert_eq!(key_text(&long), format!("{}…", "x".repeat(64)));
    }
}
