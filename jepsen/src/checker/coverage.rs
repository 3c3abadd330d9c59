//! The coverage checker: every fault kind that run.json requested must have started at least
//! once (an event in faults.jsonl) and every occurrence must have been healed (a stop time).
//! A run whose faults never happened proves nothing, so it must not pass. Knows nothing about
//! how faults are injected.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{Outcome, Verdict, capped};
use crate::fault::FaultEvent;
use crate::spec::RunSpec;

/// Checks the fault log against the request. Without run.json the answer is `unknown`.
pub fn check(spec: Option<&RunSpec>, faults: &[FaultEvent]) -> Outcome {
    let Some(spec) = spec else {
        return Outcome::new(
            Verdict::Unknown,
            "no run.json: the requested faults are not known",
            Map::new(),
        );
    };
    let mut problems = Vec::new();
    let mut counts = Map::new();
    for kind in &spec.nemesis {
        let events: Vec<&FaultEvent> = faults.iter().filter(|f| &f.fault == kind).collect();
        counts.insert(kind.clone(), json!(events.len()));
        if events.is_empty() {
            problems.push(json!({
                "fault": kind,
                "explanation": format!("requested fault {kind:?} never happened"),
            }));
        }
        for event in events.iter().filter(|e| e.stop_ns.is_none()) {
            problems.push(json!({
                "fault": kind,
                "explanation": format!(
                    "fault {kind:?} on {:?} started at {} ns and was never healed",
                    event.target, event.start_ns
                ),
                "event": event,
            }));
        }
    }
    let unrequested = unrequested_counts(spec, faults);
    let mut fields = Map::new();
    fields.insert("requested".into(), json!(spec.nemesis));
    fields.insert("occurrences".into(), Value::Object(counts));
    fields.insert("unrequested".into(), json!(unrequested));
    fields.insert("outcomes".into(), json!(outcome_counts(faults)));
    if let Some(first) = problems.first() {
        let summary = format!(
            "{} problem(s); first: {}",
            problems.len(),
            first["explanation"].as_str().unwrap_or("")
        );
        fields.insert("problems".into(), capped(problems));
        return Outcome::new(Verdict::Invalid, summary, fields);
    }
    let summary = format!(
        "all {} requested fault kinds happened and healed ({} events)",
        spec.nemesis.len(),
        faults.len()
    );
    Outcome::new(Verdict::Valid, summary, fields)
}

/// Per fault kind, how many events ended with each `outcome` the runner noted (e.g. a `disk`
/// fault's node `refused` to start or kept `running`); kinds without outcomes are left out.
fn outcome_counts(faults: &[FaultEvent]) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for event in faults {
        if let Some(outcome) = event.extra.get("outcome").and_then(|o| o.as_str()) {
            let kind = counts.entry(event.fault.clone()).or_default();
            *kind.entry(outcome.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// Fault kinds that happened without being requested, with their counts (not an error: the
/// runner may log side effects, such as a restart after a kill).
fn unrequested_counts(spec: &RunSpec, faults: &[FaultEvent]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for event in faults.iter().filter(|f| !spec.nemesis.contains(&f.fault)) {
        *counts.entry(event.fault.clone()).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::*;

    fn event(fault: &str, outcome: Option<&str>) -> FaultEvent {
        let mut extra = Map::new();
        if let Some(outcome) = outcome {
            extra.insert("outcome".into(), json!(outcome));
        }
        FaultEvent {
            fault: fault.to_string(),
            target: "n1".to_string(),
            start_ns: 1,
            stop_ns: Some(2),
            extra,
        }
    }

    #[test]
    fn outcomes_are_counted_per_kind() {
        let faults = [
            event("disk", Some("refused")),
            event("disk", Some("running")),
            event("disk", Some("refused")),
            event("kill", None),
        ];
        let counts = outcome_counts(&faults);
        assert_eq!(counts.len(), 1, "{counts:?}");
        assert_eq!(counts["disk"]["refused"], 2);
        assert_eq!(counts["disk"]["running"], 1);
    }
}
