//! What a run was asked to do, as the runner writes it to `run.json`: workload, requested
//! faults, cluster size, seed and time limit. Knows nothing about how a run is carried out.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::limits;

/// The request of a run, e.g.
/// `{"workload":"register","nemesis":["partition","kill"],"nodes":3,"seed":7,"time_limit_s":60}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// register | append | counter | follower-read | fencing | idempotency | watch.
    pub workload: String,
    /// Fault kinds requested; the coverage checker wants a start and a stop of each.
    #[serde(default)]
    pub nemesis: Vec<String>,
    pub nodes: u32,
    pub seed: u64,
    pub time_limit_s: u64,
    /// Fields the runner adds (rate, binary version, ...) are kept as written.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Why run.json could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RunSpecError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: larger than {limit} bytes; limit is {limit}")]
    TooLarge { path: String, limit: u64 },
}

/// Reads and parses run.json.
pub fn read_run_spec(path: &Path) -> Result<RunSpec, RunSpecError> {
    let name = path.display().to_string();
    let io = |source| RunSpecError::Io {
        path: name.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    file.take(limits::RUN_SPEC_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > limits::RUN_SPEC_BYTES_MAX {
        return Err(RunSpecError::TooLarge {
            path: name.clone(),
            limit: limits::RUN_SPEC_BYTES_MAX,
        });
    }
    serde_json::from_str(&text).map_err(|source| RunSpecError::Parse {
        path: name.clone(),
        source,
    })
}
