//! The replicas checker: at the end of a run every range's replicas must agree (its final
//! consistency check is neither `divergent` nor `no-majority`: replicas that diverged during
//! the run, by a bug or by the `corrupt` fault, were found and repaired before the end), and
//! every key the `corrupt` fault changed must read back as written on every member. A range
//! the final check could not reach, or a member that did not answer, makes it `unknown`.
//! Knows nothing about how the findings were gathered (`replicas.json`).

use serde_json::{Map, json};

use super::{Outcome, Verdict, capped};
use crate::replicas::ReplicaReport;

pub fn check(report: Option<&ReplicaReport>) -> Outcome {
    let Some(report) = report else {
        return Outcome::new(Verdict::Unknown, "no replicas.json", Map::new());
    };
    let mut invalid = Vec::new();
    let mut unknown = Vec::new();
    if !report.check_error.is_empty() {
        unknown.push(json!({ "explanation": format!("the final check did not run: {}", report.check_error) }));
    }
    for range in &report.ranges {
        match range.verdict.as_str() {
            "divergent" | "no-majority" => invalid.push(json!({
                "explanation": format!(
                    "range {} was {} at the end of the run (nodes {:?} differ; rows {:?})",
                    range.range, range.verdict, range.divergent, range.rows
                ),
                "range": range,
            })),
            "consistent" | "unconfirmed" => {}
            _ => unknown.push(json!({
                "explanation": format!("range {} was not checked: {}", range.range, range.error),
            })),
        }
    }
    for key in &report.corrupted {
        for (node, read) in &key.reads {
            match read {
                Some(value) if *value == key.written => {}
                Some(value) => invalid.push(json!({
                    "explanation": format!(
                        "{node} serves {:?} for {:?}, written {:?} (changed on {}): never repaired",
                        value, key.key, key.written, key.node
                    ),
                })),
                None => unknown.push(json!({
                    "explanation": format!("{node} did not answer for {:?}", key.key),
                })),
            }
        }
    }
    let mut fields = Map::new();
    fields.insert("ranges".into(), json!(report.ranges.len()));
    fields.insert("corrupted".into(), json!(report.corrupted.len()));
    let (result, problems) = match (invalid.is_empty(), unknown.is_empty()) {
        (false, _) => (Verdict::Invalid, invalid),
        (true, false) => (Verdict::Unknown, unknown),
        (true, true) => {
            let summary = format!(
                "{} range(s) agree at the end; {} corrupted key(s) read back as written everywhere",
                report.ranges.len(),
                report.corrupted.len()
            );
            return Outcome::new(Verdict::Valid, summary, fields);
        }
    };
    let summary = format!(
        "{} problem(s); first: {}",
        problems.len(),
        problems[0]["explanation"].as_str().unwrap_or("")
    );
    fields.insert("problems".into(), capped(problems));
    Outcome::new(result, summary, fields)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::replicas::{CorruptedKey, RangeVerdict};

    fn range(verdict: &str) -> RangeVerdict {
        RangeVerdict {
            range: 1,
            verdict: verdict.to_string(),
            ..RangeVerdict::default()
        }
    }

    fn corrupted(reads: &[(&str, Option<&str>)]) -> CorruptedKey {
        CorruptedKey {
            key: "jepsen-corrupt/1".into(),
            written: "written 1".into(),
            node: "n2".into(),
            reads: reads
                .iter()
                .map(|(node, value)| (node.to_string(), value.map(String::from)))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn agreeing_replicas_and_repaired_keys_are_valid() {
        let report = ReplicaReport {
            ranges: vec![range("consistent"), range("unconfirmed")],
            check_error: String::new(),
            corrupted: vec![corrupted(&[
                ("n1", Some("written 1")),
                ("n2", Some("written 1")),
            ])],
        };
        assert_eq!(check(Some(&report)).result, Verdict::Valid);
    }

    #[test]
    fn a_divergent_range_or_an_unrepaired_key_is_invalid() {
        let divergent = ReplicaReport {
            ranges: vec![range("consistent"), range("divergent")],
            ..ReplicaReport::default()
        };
        assert_eq!(check(Some(&divergent)).result, Verdict::Invalid);
        let unrepaired = ReplicaReport {
            ranges: vec![range("consistent")],
            corrupted: vec![corrupted(&[
                ("n1", Some("written 1")),
                ("n2", Some("written 0")),
            ])],
            ..ReplicaReport::default()
        };
        let outcome = check(Some(&unrepaired));
        assert_eq!(outcome.result, Verdict::Invalid);
        assert!(
            outcome.summary().contains("never repaired"),
            "{}",
            outcome.summary()
        );
    }

    #[test]
    fn what_could_not_be_seen_is_unknown() {
        let silent = ReplicaReport {
            ranges: vec![RangeVerdict {
                range: 3,
                error: "no leader".into(),
                ..RangeVerdict::default()
            }],
            corrupted: vec![corrupted(&[("n1", None)])],
            ..ReplicaReport::default()
        };
        assert_eq!(check(Some(&silent)).result, Verdict::Unknown);
        assert_eq!(check(None).result, Verdict::Unknown);
    }
}
