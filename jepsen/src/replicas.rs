//! `replicas.json`: what the runner found at the end of a run about the replicas themselves,
//! beside the history: the verdict of a consistency check of every range (`Cluster.Check`),
//! and for each key the `corrupt` fault changed on one replica, what every member's replica
//! serves for it. Knows nothing about how it is judged (`checker::replicas`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub const REPLICAS_FILE: &str = "replicas.json";

/// The end-of-run findings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaReport {
    /// One entry per range the final check covered, in the order checked.
    pub ranges: Vec<RangeVerdict>,
    /// Why the final check did not run at all (the cluster did not answer); empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check_error: String,
    /// The keys the `corrupt` fault changed, in the order changed.
    #[serde(default)]
    pub corrupted: Vec<CorruptedKey>,
}

/// One range's final consistency check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RangeVerdict {
    pub range: u64,
    /// `consistent`, `unconfirmed`, `divergent` or `no-majority`; empty with `error`.
    pub verdict: String,
    #[serde(default)]
    pub divergent: Vec<u64>,
    #[serde(default)]
    pub repaired: Vec<u64>,
    /// Rows the divergent replicas differ in, as the check named them.
    #[serde(default)]
    pub rows: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// A key the `corrupt` fault changed on one replica, and what each member serves for it at
/// the end (a follower read on that node; `None`: the key is absent or the node did not
/// answer).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CorruptedKey {
    pub key: String,
    /// The value written before the fault changed it.
    pub written: String,
    /// The node whose replica was changed (`n1`, ...).
    pub node: String,
    pub reads: BTreeMap<String, Option<String>>,
}

pub fn write(path: &Path, report: &ReplicaReport) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text + "\n")?;
    Ok(())
}

/// Reads `replicas.json`; `Ok(None)` when the run has none (a run of an older build).
pub fn read(path: &Path) -> Result<Option<ReplicaReport>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(format!("{}: {error}", path.display())),
    }
}
