//! `keel-jepsen check DIR`: loads a run directory, picks and runs the checkers, measures
//! availability around the faults, and writes `results.json`. Knows nothing about how the
//! run was made or how the report looks.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checker::availability::{self, Availability};
use crate::checker::{self, Budget, CheckerName, Input, Verdict};
use crate::fault::{self, FaultEvent};
use crate::history::{self, JsonLinesError, Op};
use crate::ranges::{self, RangeSnapshot};
use crate::replicas::{self, REPLICAS_FILE, ReplicaReport};
use crate::spec::{self, RunSpec, RunSpecError};

pub const HISTORY_FILE: &str = "history.jsonl";
pub const FAULTS_FILE: &str = "faults.jsonl";
pub const RUN_SPEC_FILE: &str = "run.json";
pub const RANGES_FILE: &str = "ranges.jsonl";
pub const RESULTS_FILE: &str = "results.json";
pub const REPORT_FILE: &str = "report.html";

/// What a run directory holds. A missing faults.jsonl reads as no faults; a missing history
/// or run.json is an error only for checkers that need it; ranges.jsonl is only for the
/// report (runs of older builds and single-range runs have none).
#[derive(Debug, Clone, Default)]
pub struct RunDir {
    pub history: Option<Vec<Op>>,
    pub faults: Vec<FaultEvent>,
    pub spec: Option<RunSpec>,
    pub ranges: Option<Vec<RangeSnapshot>>,
    /// The runner's end-of-run findings about the replicas (runs of older builds have none).
    pub replicas: Option<ReplicaReport>,
}

/// The verdict of a whole check, as written to results.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub valid: Verdict,
    /// How the run's workload clients reached the cluster (`routed` or `spread`, from run.json;
    /// runs from before `--clients` were routed); absent without run.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<String>,
    pub checkers: BTreeMap<String, CheckerResult>,
    /// The availability measure of every fault event (never a verdict); absent without a
    /// history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability: Option<Availability>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckerResult {
    pub result: Verdict,
    pub details: Value,
    pub elapsed_ms: f64,
}

/// Why a check could not be carried out (exit code 3).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    JsonLines(#[from] JsonLinesError),
    #[error(transparent)]
    RunSpec(#[from] RunSpecError),
    #[error("{path} is missing; name the checkers with --checker or write run.json")]
    MissingRunSpec { path: String },
    #[error("{path} is missing; the {checker} checker needs it")]
    MissingHistory { path: String, checker: &'static str },
    #[error(
        "workload {workload:?} has no checkers yet; known: register, append, counter, follower-read, fencing, idempotency, watch"
    )]
    UnknownWorkload { workload: String },
    #[error("{reason}")]
    Replicas { reason: String },
    #[error("{path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// Reads whatever of history.jsonl, faults.jsonl, run.json, ranges.jsonl and replicas.json is
/// in `dir`.
pub fn load(dir: &Path) -> Result<RunDir, CheckError> {
    let history_path = dir.join(HISTORY_FILE);
    let faults_path = dir.join(FAULTS_FILE);
    let spec_path = dir.join(RUN_SPEC_FILE);
    let ranges_path = dir.join(RANGES_FILE);
    Ok(RunDir {
        history: match history_path.exists() {
            true => Some(history::read_history(&history_path)?),
            false => None,
        },
        faults: match faults_path.exists() {
            true => fault::read_faults(&faults_path)?,
            false => Vec::new(),
        },
        spec: match spec_path.exists() {
            true => Some(spec::read_run_spec(&spec_path)?),
            false => None,
        },
        ranges: match ranges_path.exists() {
            true => Some(ranges::read_ranges(&ranges_path)?),
            false => None,
        },
        replicas: replicas::read(&dir.join(REPLICAS_FILE))
            .map_err(|reason| CheckError::Replicas { reason })?,
    })
}

/// The checkers to run: the forced ones if any, else those of run.json's workload. Fails when
/// a chosen checker lacks its input.
pub fn select(
    dir: &Path,
    run: &RunDir,
    forced: &[CheckerName],
) -> Result<Vec<CheckerName>, CheckError> {
    let chosen = if !forced.is_empty() {
        let mut chosen = forced.to_vec();
        chosen.sort();
        chosen.dedup();
        chosen
    } else {
        let spec = run
            .spec
            .as_ref()
            .ok_or_else(|| CheckError::MissingRunSpec {
                path: path_text(&dir.join(RUN_SPEC_FILE)),
            })?;
        let mut chosen =
            checker::for_workload(&spec.workload).ok_or_else(|| CheckError::UnknownWorkload {
                workload: spec.workload.clone(),
            })?;
        if run.replicas.is_some() {
            chosen.push(CheckerName::Replicas);
        }
        chosen
    };
    for name in &chosen {
        if name.needs_history() && run.history.is_none() {
            return Err(CheckError::MissingHistory {
                path: path_text(&dir.join(HISTORY_FILE)),
                checker: name.as_str(),
            });
        }
        if *name == CheckerName::Coverage && run.spec.is_none() {
            return Err(CheckError::MissingRunSpec {
                path: path_text(&dir.join(RUN_SPEC_FILE)),
            });
        }
    }
    Ok(chosen)
}

/// Runs the checkers one after the other, timing each.
pub fn run(run: &RunDir, checkers: &[CheckerName], budget: &Budget) -> Results {
    let input = Input {
        history: run.history.as_deref().unwrap_or(&[]),
        faults: &run.faults,
        spec: run.spec.as_ref(),
        replicas: run.replicas.as_ref(),
    };
    let mut results = BTreeMap::new();
    for name in checkers {
        let start = Instant::now();
        let outcome = name.run(input, budget);
        let elapsed_ms = (start.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        let result = CheckerResult {
            result: outcome.result,
            details: outcome.details,
            elapsed_ms,
        };
        results.insert(name.as_str().to_string(), result);
    }
    Results {
        valid: Verdict::all(results.values().map(|r| r.result)),
        clients: run.spec.as_ref().map(client_mode),
        checkers: results,
        availability: measure_availability(run),
    }
}

/// The availability measure of the run's fault events, with the workload's end from run.json
/// (its time limit on the history's clock); None without a history.
pub fn measure_availability(run: &RunDir) -> Option<Availability> {
    let history = run.history.as_deref()?;
    let workload_end_ns = run
        .spec
        .as_ref()
        .map(|spec| spec.time_limit_s.saturating_mul(1_000_000_000));
    Some(availability::measure(history, &run.faults, workload_end_ns))
}

/// The `clients` of run.json; `routed` when it has none (written before `--clients`).
pub fn client_mode(spec: &RunSpec) -> String {
    spec.extra
        .get("clients")
        .and_then(|mode| mode.as_str())
        .unwrap_or("routed")
        .to_string()
}

/// Writes results.json (pretty-printed, for people and tools alike).
pub fn write_results(path: &Path, results: &Results) -> Result<(), CheckError> {
    let text = serde_json::to_string_pretty(results).expect("results always serialize");
    write_file(path, &text)
}

/// Writes a whole file, naming it in the error.
pub fn write_file(path: &Path, text: &str) -> Result<(), CheckError> {
    std::fs::write(path, text).map_err(|source| CheckError::Write {
        path: path_text(path),
        source,
    })
}

fn path_text(path: &Path) -> String {
    path.display().to_string()
}
