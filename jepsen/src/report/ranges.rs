//! The range table in the report: which range each op went to (by its routing key, in the
//! table at its call), the table's changes as markers in a lane of the timeline and as a
//! list, ops per range, and the ranges of the ops a checker quoted. Shown only for runs with
//! a ranges.jsonl. Knows nothing about checkers beyond the record numbers they quote.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

use super::{Frame, MARGIN_LEFT_PX, escape, status_colour};
use crate::history::{Op, Status};
use crate::limits;
use crate::ranges::{self, RangeSnapshot, key_text};

/// Half the width (and height) of a change marker, in px.
const MARKER_HALF_PX: f64 = 5.0;

/// What the report shows of the range table, worked out once per page.
pub(super) struct RangeView<'a> {
    pub(super) snapshots: &'a [RangeSnapshot],
    /// The first snapshot, then every one whose table differs from the one before.
    pub(super) changes: Vec<Change>,
    /// The range of each op of the history, by index; None when it routes nowhere known.
    pub(super) of_op: Vec<Option<u64>>,
}

/// One marker: the table as first seen, or what changed since the snapshot before.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Change {
    pub(super) at_ns: u64,
    pub(super) cause: String,
    /// True for the first snapshot, whose lines are its ranges rather than changes.
    pub(super) first: bool,
    pub(super) lines: Vec<String>,
}

/// Ops of one range, as counted for the ops-per-range table.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct RangeOps {
    pub(super) ok: usize,
    pub(super) fail: usize,
    pub(super) info: usize,
    pub(super) keys: BTreeSet<String>,
}

impl<'a> RangeView<'a> {
    /// None for a run without snapshots: the page then shows nothing of ranges.
    pub(super) fn new(snapshots: &'a [RangeSnapshot], history: &[Op]) -> Option<RangeView<'a>> {
        if snapshots.is_empty() {
            return None;
        }
        let of_op = history
            .iter()
            .map(|op| {
                let key = ranges::routing_key(op)?;
                ranges::range_of(snapshots, &key, op.call_ns)
            })
            .collect();
        Some(RangeView {
            snapshots,
            changes: changes(snapshots),
            of_op,
        })
    }

    /// `range N` for op `index`, or `no range`.
    pub(super) fn op_text(&self, index: usize) -> String {
        self.of_op[index].map_or("no range".to_string(), |id| format!("range {id}"))
    }
}

/// The first snapshot's table and every later change of it.
pub(super) fn changes(snapshots: &[RangeSnapshot]) -> Vec<Change> {
    let mut changes = Vec::new();
    let Some(first) = snapshots.first() else {
        return changes;
    };
    changes.push(Change {
        at_ns: first.at_ns,
        cause: first.cause.clone(),
        first: true,
        lines: first.ranges.iter().map(|r| r.text()).collect(),
    });
    for pair in snapshots.windows(2) {
        if pair[0].ranges == pair[1].ranges {
            continue;
        }
        changes.push(Change {
            at_ns: pair[1].at_ns,
            cause: pair[1].cause.clone(),
            first: false,
            lines: ranges::describe_changes(&pair[0].ranges, &pair[1].ranges),
        });
    }
    changes
}

/// Ops counted per range (None: ops that route nowhere known), with their routing keys.
pub(super) fn ops_per_range(
    history: &[Op],
    of_op: &[Option<u64>],
) -> BTreeMap<Option<u64>, RangeOps> {
    let mut counts: BTreeMap<Option<u64>, RangeOps> = BTreeMap::new();
    for (op, range) in history.iter().zip(of_op) {
        let row = counts.entry(*range).or_default();
        match op.status() {
            Status::Ok => row.ok += 1,
            Status::Fail => row.fail += 1,
            Status::Info => row.info += 1,
        }
        if let Some(key) = ranges::routing_key(op) {
            row.keys.insert(key);
        }
    }
    counts
}

/// The markers of the ranges lane, `top` to `top + height`, with a hover text each.
pub(super) fn lane(svg: &mut String, view: &RangeView, frame: &Frame, top: f64, height: f64) {
    let _ = write!(
        svg,
        "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">ranges</text>",
        MARGIN_LEFT_PX - 6.0,
        top + height * 0.75
    );
    let y = top + height / 2.0;
    for change in view.changes.iter().take(limits::REPORT_RANGE_CHANGES_MAX) {
        let x = frame.x(change.at_ns);
        let fill = if change.first { "#fff" } else { "#333" };
        let _ = write!(
            svg,
            "<polygon class=\"range-change\" points=\"{x:.1},{:.1} {:.1},{y:.1} {x:.1},{:.1} \
             {:.1},{y:.1}\" fill=\"{fill}\" stroke=\"#333\"><title>{}</title></polygon>",
            y - MARKER_HALF_PX,
            x + MARKER_HALF_PX,
            y + MARKER_HALF_PX,
            x - MARKER_HALF_PX,
            escape(&hover_text(change, frame))
        );
    }
}

/// A marker's hover text: time, cause, then one line per change.
fn hover_text(change: &Change, frame: &Frame) -> String {
    let what = if change.first {
        "table"
    } else {
        "range change"
    };
    let mut text = format!(
        "{what} at {:.3} s ({})",
        frame.seconds(change.at_ns),
        change.cause
    );
    for line in shown_lines(change) {
        text.push('\n');
        text.push_str(&line);
    }
    text
}

/// A change's lines, the last saying how many more there are after
/// `limits::REPORT_RANGE_CHANGE_LINES_MAX`.
fn shown_lines(change: &Change) -> Vec<String> {
    let shown = limits::REPORT_RANGE_CHANGE_LINES_MAX;
    let mut lines: Vec<String> = change.lines.iter().take(shown).cloned().collect();
    if change.lines.len() > shown {
        lines.push(format!("… and {} more", change.lines.len() - shown));
    }
    lines
}

/// The ops-per-range table and the list of changes.
pub(super) fn section(page: &mut String, history: &[Op], view: &RangeView, frame: &Frame) {
    page.push_str("<h2>Ops per range</h2>");
    per_range_table(page, history, view);
    page.push_str("<h2>Range changes</h2>");
    changes_table(page, view, frame);
}

fn per_range_table(page: &mut String, history: &[Op], view: &RangeView) {
    page.push_str(
        "<table class=\"ops-per-range\"><tr><th>range</th><th>span (last seen)</th>\
         <th>ops</th><th>ok</th><th>fail</th><th>indeterminate</th><th>keys</th></tr>",
    );
    let rows = ops_per_range(history, &view.of_op);
    let spans = last_spans(view.snapshots);
    for (range, row) in rows.iter().take(limits::REPORT_RANGE_ROWS_MAX) {
        let (name, span) = match range {
            Some(id) => (format!("r{id}"), spans.get(id).cloned().unwrap_or_default()),
            None => ("none".to_string(), String::new()),
        };
        let _ = write!(
            page,
            "<tr><td>{name}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td></tr>",
            escape(&span),
            row.ok + row.fail + row.info,
            row.ok,
            row.fail,
            row.info,
            escape(&keys_text(&row.keys))
        );
    }
    page.push_str("</table><p class=\"note\">");
    if rows.len() > limits::REPORT_RANGE_ROWS_MAX {
        let _ = write!(
            page,
            "Only the first {} of {} ranges (by id) are listed. ",
            limits::REPORT_RANGE_ROWS_MAX,
            rows.len()
        );
    }
    page.push_str(
        "Each op counts for the range holding its routing key (a kv \
         op's key, a lock's name, an idempotency record's scope\\0id) in the last snapshot of \
         ranges.jsonl taken at or before its call (the first snapshot for earlier ops). \
         <i>none</i>: ops of a kind the report does not route, or keys outside the table.</p>",
    );
}

/// The span of every range in the last snapshot that has it.
fn last_spans(snapshots: &[RangeSnapshot]) -> HashMap<u64, String> {
    let mut last = HashMap::new();
    for entry in snapshots.iter().flat_map(|s| &s.ranges) {
        last.insert(entry.id, entry);
    }
    last.into_iter()
        .map(|(id, entry)| (id, entry.span_text()))
        .collect()
}

/// `3: a, b, c`, naming at most `limits::REPORT_RANGE_KEYS_SHOWN_MAX` keys.
fn keys_text(keys: &BTreeSet<String>) -> String {
    let shown: Vec<String> = keys
        .iter()
        .take(limits::REPORT_RANGE_KEYS_SHOWN_MAX)
        .map(|key| key_text(key))
        .collect();
    let more = if keys.len() > shown.len() {
        ", …"
    } else {
        ""
    };
    format!("{}: {}{more}", keys.len(), shown.join(", "))
}

fn changes_table(page: &mut String, view: &RangeView, frame: &Frame) {
    page.push_str("<table><tr><th>time</th><th>cause</th><th>what changed</th></tr>");
    for change in view.changes.iter().take(limits::REPORT_RANGE_CHANGES_MAX) {
        let lines: Vec<String> = shown_lines(change).iter().map(|l| escape(l)).collect();
        let what = match change.first {
            true => format!("table: {}", lines.join("<br>")),
            false => lines.join("<br>"),
        };
        let _ = write!(
            page,
            "<tr><td>{:.3} s</td><td>{}</td><td>{what}</td></tr>",
            frame.seconds(change.at_ns),
            escape(&change.cause)
        );
    }
    page.push_str("</table>");
    let _ = write!(
        page,
        "<p class=\"note\">{} snapshots in ranges.jsonl, {} of them changing the table.",
        view.snapshots.len(),
        view.changes.len() - 1
    );
    if view.changes.len() > limits::REPORT_RANGE_CHANGES_MAX {
        let _ = write!(
            page,
            " Only the first {} are marked and listed.",
            limits::REPORT_RANGE_CHANGES_MAX
        );
    }
    page.push_str("</p>");
}

/// The ops a checker quoted (by record number, 1-based) with the range each went to.
pub(super) fn quoted_ops(
    page: &mut String,
    history: &[Op],
    view: &RangeView,
    records: &BTreeSet<usize>,
    frame: &Frame,
) {
    let known: Vec<usize> = records
        .iter()
        .copied()
        .filter(|record| (1..=history.len()).contains(record))
        .collect();
    if known.is_empty() {
        return;
    }
    page.push_str(
        "<table class=\"quoted-ops\"><tr><th>record</th><th>range</th><th>client</th>\
         <th>op</th><th>key</th><th>outcome</th><th>call</th></tr>",
    );
    for &record in known.iter().take(limits::REPORT_QUOTED_OPS_MAX) {
        let op = &history[record - 1];
        let range = view.of_op[record - 1].map_or("none".to_string(), |id| format!("r{id}"));
        let status = op.status();
        let _ = write!(
            page,
            "<tr><td>{record}</td><td>{range}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td style=\"color:{}\">{}</td><td>{:.3} s</td></tr>",
            op.client,
            escape(op.op.as_str()),
            escape(&key_text(&op.key)),
            status_colour(status),
            status_text(status),
            frame.seconds(op.call_ns)
        );
    }
    page.push_str("</table>");
    if known.len() > limits::REPORT_QUOTED_OPS_MAX {
        let _ = write!(
            page,
            "<p class=\"note\">Only the first {} of {} quoted ops are listed.</p>",
            limits::REPORT_QUOTED_OPS_MAX,
            known.len()
        );
    }
}

fn status_text(status: Status) -> &'static str {
    match status {
        Status::Ok => "ok",
        Status::Fail => "fail",
        Status::Info => "indeterminate",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranges::RangeEntry;

    fn entry(id: u64, start: &str, end: Option<&str>, leader: u64) -> RangeEntry {
        RangeEntry {
            id,
            start: start.to_string(),
            end: end.map(str::to_string),
            epoch: 1,
            conf_version: 1,
            voters: vec![1, 2, 3],
            leader: Some(leader),
        }
    }

    fn snapshots() -> Vec<RangeSnapshot> {
        let snapshot = |at_ns, cause: &str, ranges| RangeSnapshot {
            at_ns,
            cause: cause.to_string(),
            ranges,
        };
        let whole = vec![entry(2, "", None, 1)];
        let split = vec![entry(2, "", Some("k2"), 1), entry(7, "k2", None, 1)];
        let moved = vec![entry(2, "", Some("k2"), 1), entry(7, "k2", None, 3)];
        vec![
            snapshot(0, "start", whole.clone()),
            snapshot(50, "change", whole),
            snapshot(100, "split", split.clone()),
            snapshot(150, "change", split),
            snapshot(200, "change", moved),
        ]
    }

    fn op(client: u64, key: &str, call_ns: u64, ok: Option<bool>) -> Op {
        let line = format!(
            r#"{{"client":{client},"op":"put","key":"{key}","ok":{},"call":{call_ns},"return":{}}}"#,
            ok.map_or("null".to_string(), |ok| ok.to_string()),
            call_ns + 5
        );
        serde_json::from_str(&line).unwrap()
    }

    #[test]
    fn only_snapshots_that_change_the_table_are_changes() {
        let changes = changes(&snapshots());
        let summary: Vec<(u64, bool, Vec<String>)> = changes
            .into_iter()
            .map(|c| (c.at_ns, c.first, c.lines))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    0,
                    true,
                    vec![r#"r2 ["", +inf) voters 1,2,3 leader 1"#.to_string()]
                ),
                (100, false, vec!["split r2 at k2 -> r2,r7".to_string()]),
                (200, false, vec!["r7 leader 1 -> 3".to_string()]),
            ]
        );
    }

    #[test]
    fn long_changes_are_cut_and_counted() {
        let change = Change {
            at_ns: 0,
            cause: "split".to_string(),
            first: false,
            lines: (0..25).map(|i| format!("line {i}")).collect(),
        };
        let lines = shown_lines(&change);
        assert_eq!(lines.len(), limits::REPORT_RANGE_CHANGE_LINES_MAX + 1);
        assert_eq!(lines[19], "line 19");
        assert_eq!(lines[20], "… and 5 more");
    }

    #[test]
    fn ops_count_for_the_range_holding_their_key_at_their_call() {
        let snapshots = snapshots();
        let history = [
            op(0, "k3", 10, Some(true)),
            op(1, "k3", 120, Some(false)),
            op(2, "k1", 120, None),
            op(0, "k5", 300, Some(true)),
            serde_json::from_str(r#"{"client":0,"op":"lock","key":"k1","call":5}"#).unwrap(),
        ];
        let view = RangeView::new(&snapshots, &history).unwrap();
        assert_eq!(view.of_op, [Some(2), Some(7), Some(2), Some(7), None]);
        assert_eq!(view.op_text(1), "range 7");
        assert_eq!(view.op_text(4), "no range");
        let counts = ops_per_range(&history, &view.of_op);
        let keys = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect();
        let row = |ok, fail, info, names: &[&str]| RangeOps {
            ok,
            fail,
            info,
            keys: keys(names),
        };
        let expected = BTreeMap::from([
            (None, row(0, 0, 1, &[])),
            (Some(2), row(1, 0, 1, &["k1", "k3"])),
            (Some(7), row(1, 1, 0, &["k3", "k5"])),
        ]);
        assert_eq!(counts, expected);
        assert!(RangeView::new(&[], &history).is_none());
    }
}
