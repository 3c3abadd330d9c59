//! What changed between two range tables, in words: splits, merges, ranges that appeared or
//! went, and voter, leader, epoch and conf_version changes. Knows nothing about where the
//! tables came from or where the words go.

use std::collections::HashMap;

use super::{RangeEntry, key_text, leader_text, nodes_text};

/// One line per change from `previous` to `next`, in key order, e.g. `split r2 at r01 ->
/// r2,r7`, `r3 voters 1,2,3 -> 1,2,4`, `r3 leader 1 -> 2`; empty when the tables are equal.
/// Both must be valid tables (`super::validate`).
pub fn describe_changes(previous: &[RangeEntry], next: &[RangeEntry]) -> Vec<String> {
    let before: HashMap<u64, &RangeEntry> = previous.iter().map(|r| (r.id, r)).collect();
    let mut lines = Vec::new();
    for (old, new) in overlapping_groups(previous, next) {
        let kept = old.len() == 1 && new.len() == 1 && old[0].id == new[0].id;
        if kept && old[0].start == new[0].start && old[0].end == new[0].end {
            attribute_changes(old[0], new[0], true, &mut lines);
            continue;
        }
        lines.push(span_change(&old, &new));
        for entry in &new {
            if let Some(earlier) = before.get(&entry.id) {
                attribute_changes(earlier, entry, false, &mut lines);
            }
        }
    }
    lines
}

/// Entries of both tables grouped by overlap: each group is a smallest key span that both
/// tables cut into whole ranges (one side may be empty where the other table has no range).
/// Groups come in key order.
fn overlapping_groups<'a>(
    previous: &'a [RangeEntry],
    next: &'a [RangeEntry],
) -> Vec<(Vec<&'a RangeEntry>, Vec<&'a RangeEntry>)> {
    // Both sides in start order; within one side no two entries overlap, so a sweep that
    // starts a group whenever an entry starts at or after every end seen so far finds the
    // groups of entries joined by overlaps across the sides.
    let mut tagged: Vec<(bool, &RangeEntry)> = previous
        .iter()
        .map(|r| (false, r))
        .chain(next.iter().map(|r| (true, r)))
        .collect();
    tagged.sort_by(|a, b| a.1.start.cmp(&b.1.start).then(a.0.cmp(&b.0)));
    let mut groups: Vec<(Vec<&RangeEntry>, Vec<&RangeEntry>)> = Vec::new();
    // The furthest end of the current group; None = unbounded.
    let mut reach: Option<Option<&str>> = None;
    for (is_next, entry) in tagged {
        let starts_new = match reach {
            None => true,
            Some(None) => false,
            Some(Some(end)) => entry.start.as_str() >= end,
        };
        if starts_new {
            groups.push((Vec::new(), Vec::new()));
            reach = Some(Some(entry.start.as_str()));
        }
        let end = entry.end.as_deref();
        reach = reach.map(|r| match (r, end) {
            (None, _) | (_, None) => None,
            (Some(a), Some(b)) => Some(a.max(b)),
        });
        let group = groups.last_mut().expect("a group was just pushed");
        match is_next {
            false => group.0.push(entry),
            true => group.1.push(entry),
        }
    }
    groups
}

/// The line for a group whose spans changed.
fn span_change(old: &[&RangeEntry], new: &[&RangeEntry]) -> String {
    let ids = |entries: &[&RangeEntry]| {
        let texts: Vec<String> = entries.iter().map(|r| format!("r{}", r.id)).collect();
        texts.join(",")
    };
    let spans = |entries: &[&RangeEntry]| {
        let texts: Vec<String> = entries
            .iter()
            .map(|r| format!("r{} {}", r.id, r.span_text()))
            .collect();
        texts.join(", ")
    };
    let same_outline = !old.is_empty()
        && !new.is_empty()
        && old[0].start == new[0].start
        && old[old.len() - 1].end == new[new.len() - 1].end;
    let cuts = |entries: &[&RangeEntry]| {
        let texts: Vec<String> = entries[1..].iter().map(|r| key_text(&r.start)).collect();
        texts.join(",")
    };
    match (old.len(), new.len()) {
        (0, _) => format!("new {}", spans(new)),
        (_, 0) => format!("gone {}", spans(old)),
        (1, n) if n > 1 && same_outline && new.iter().any(|r| r.id == old[0].id) => {
            format!("split r{} at {} -> {}", old[0].id, cuts(new), ids(new))
        }
        (n, 1) if n > 1 && same_outline && old.iter().any(|r| r.id == new[0].id) => {
            format!("merge {} -> r{}", ids(old), new[0].id)
        }
        _ => format!("{} -> {}", spans(old), spans(new)),
    }
}

/// Voter and leader changes of one range; with `same_span`, epoch and conf_version changes
/// too (when spans changed, the epoch's change is the split itself).
fn attribute_changes(old: &RangeEntry, new: &RangeEntry, same_span: bool, lines: &mut Vec<String>) {
    let id = new.id;
    if old.voters != new.voters {
        let (from, to) = (nodes_text(&old.voters), nodes_text(&new.voters));
        lines.push(format!("r{id} voters {from} -> {to}"));
    } else if same_span && old.conf_version != new.conf_version {
        let (from, to) = (old.conf_version, new.conf_version);
        lines.push(format!("r{id} conf_version {from} -> {to}"));
    }
    if old.leader != new.leader {
        let (from, to) = (leader_text(old.leader), leader_text(new.leader));
        lines.push(format!("r{id} leader {from} -> {to}"));
    }
    if same_span && old.epoch != new.epoch {
        lines.push(format!("r{id} epoch {} -> {}", old.epoch, new.epoch));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `spec` is `id:start:end:voters:leader` per range, `,`-free fields, `end` `*` for
    /// unbounded, voters `123`, leader `-` for none.
    fn table(spec: &str) -> Vec<RangeEntry> {
        spec.split_whitespace()
            .map(|range| {
                let fields: Vec<&str> = range.split(':').collect();
                RangeEntry {
                    id: fields[0].parse().unwrap(),
                    start: fields[1].to_string(),
                    end: (fields[2] != "*").then(|| fields[2].to_string()),
                    epoch: 1,
                    conf_version: 1,
                    voters: fields[3]
                        .chars()
                        .map(|c| c.to_digit(10).unwrap().into())
                        .collect(),
                    leader: fields[4].parse().ok(),
                }
            })
            .collect()
    }

    fn check(previous: &str, next: &str, expected: &[&str]) {
        let lines = describe_changes(&table(previous), &table(next));
        assert_eq!(lines, expected, "{previous} -> {next}");
    }

    #[test]
    fn changes_are_named() {
        let two = "2::r01:123:1 5:r01:*:234:-";
        check(two, two, &[]);
        check(
            two,
            "2::m:123:1 7:m:r01:123:1 5:r01:*:234:-",
            &["split r2 at m -> r2,r7"],
        );
        check(
            two,
            "2::m:123:1 7:m:r01:123:1 5:r01:*:234:2",
            &["split r2 at m -> r2,r7", "r5 leader none -> 2"],
        );
        check(
            "2::*:123:1",
            "2::k:123:1 7:k:m:123:1 8:m:*:123:1",
            &["split r2 at k,m -> r2,r7,r8"],
        );
        check(two, "2::*:123:1", &["merge r2,r5 -> r2"]);
        check(
            two,
            "2::r01:124:2 5:r01:*:234:-",
            &["r2 voters 1,2,3 -> 1,2,4", "r2 leader 1 -> 2"],
        );
        check(
            two,
            "2::r01:123:1 9:r01:*:234:-",
            &[r#"r5 ["r01", +inf) -> r9 ["r01", +inf)"#],
        );
        check("2::a:1:1", "2::a:1:1 3:a:b:1:1", &[r#"new r3 ["a", "b")"#]);
        check("2::a:1:1 3:a:b:1:1", "2::a:1:1", &[r#"gone r3 ["a", "b")"#]);
        check(
            "2::jepsen\0id3:1:1 3:jepsen\0id3:*:1:1",
            "2::jepsen\0id1:1:1 3:jepsen\0id1:*:1:1",
            &[
                r#"r2 ["", "jepsen\0id3"), r3 ["jepsen\0id3", +inf) -> r2 ["", "jepsen\0id1"), r3 ["jepsen\0id1", +inf)"#,
            ],
        );
    }

    #[test]
    fn epoch_and_conf_version_alone_are_changes_too() {
        let mut next = table("2::*:123:1");
        next[0].epoch = 2;
        next[0].conf_version = 4;
        let lines = describe_changes(&table("2::*:123:1"), &next);
        assert_eq!(lines, ["r2 conf_version 1 -> 4", "r2 epoch 1 -> 2"]);
    }
}
