//! Fault events as the runner logs them to `faults.jsonl`: which fault, on what, from when to
//! when. Knows nothing about how faults are injected or checked.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::history::{self, JsonLinesError};
use crate::limits;

/// One fault occurrence, e.g.
/// `{"fault":"partition","target":"n1|n2,n3","start":5000000000,"stop":9000000000}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultEvent {
    /// The fault kind, as named in run.json's `nemesis` list.
    pub fault: String,
    /// What it hit, free text for people (a node, a partition, a range).
    #[serde(default)]
    pub target: String,
    /// When the fault began, in ns of the history's clock.
    #[serde(rename = "start")]
    pub start_ns: u64,
    /// When it was healed; null = never healed.
    #[serde(rename = "stop", default)]
    pub stop_ns: Option<u64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Reads `faults.jsonl`, checking `stop >= start`.
pub fn read_faults(path: &Path) -> Result<Vec<FaultEvent>, JsonLinesError> {
    let events: Vec<FaultEvent> = history::read_json_lines(path, limits::FAULT_EVENTS_MAX)?;
    for (index, event) in events.iter().enumerate() {
        if let Some(stop_ns) = event.stop_ns
            && stop_ns < event.start_ns
        {
            return Err(JsonLinesError::Invalid {
                path: path.display().to_string(),
                line: index + 1,
                reason: format!("stop {stop_ns} is before start {}", event.start_ns),
            });
        }
    }
    Ok(events)
}
