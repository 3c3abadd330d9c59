//! The history of a run: one record per completed operation, in the JSON-lines format of
//! DESIGN §7, and the reading and writing of JSON-lines files. Knows nothing about servers,
//! faults or how a history is checked.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::limits;

/// One operation as the runner recorded it. Field order is the order of DESIGN §7; fields
/// that other workloads add are kept in `extra` and written back after the standard ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    pub client: u64,
    pub op: OpKind,
    pub key: String,
    /// What a write writes (put, cas, append), the delta of an `incr`; null otherwise.
    #[serde(default)]
    pub value: Value,
    /// The value a `cas` expects; null = expects the key to be absent.
    #[serde(default)]
    pub expect: Value,
    /// true = confirmed, false = definitely not applied, null = indeterminate.
    #[serde(default)]
    pub ok: Option<bool>,
    /// What a read returned (null on a get = key absent); ignored for writes.
    #[serde(default)]
    pub output: Value,
    /// When the client sent the request, in ns of the runner's monotonic clock.
    #[serde(rename = "call")]
    pub call_ns: u64,
    /// When the answer arrived; null = indeterminate.
    #[serde(rename = "return", default)]
    pub return_ns: Option<u64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The kind of an operation. Kinds this crate does not know are kept as written, so the
/// histories of later workloads still load (their checkers decide what they mean).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum OpKind {
    Get,
    Put,
    Cas,
    Del,
    Append,
    Read,
    Incr,
    /// Fencing: take a lock (`key` is the lock's name).
    Acquire,
    /// Fencing: a put fenced by a lock's token.
    Fput,
    /// Fencing: free a lock (`key` is the lock's name).
    Release,
    /// Idempotency: begin a record (`key` is the record's id).
    Begin,
    /// Idempotency: store a record's result.
    Complete,
    /// Idempotency: drop a record in progress.
    Abort,
    Other(String),
}

/// The outcome of an operation under the client error contract of DESIGN §7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Confirmed.
    Ok,
    /// Definitely not applied.
    Fail,
    /// Indeterminate: may have been applied, at any time after the call, or never.
    Info,
}

/// Why a JSON-lines file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JsonLinesError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {source}")]
    Parse {
        path: String,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Invalid {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("{path}: more than {limit} records; limit is {limit}")]
    TooLarge { path: String, limit: usize },
}

impl Op {
    /// Sets one of the fields other workloads add (`extra`).
    pub fn set(&mut self, name: &str, value: impl Into<Value>) {
        self.extra.insert(name.to_string(), value.into());
    }

    /// The outcome: indeterminate when `ok` or `return` is null, whatever the other says.
    pub fn status(&self) -> Status {
        match (self.ok, self.return_ns) {
            (Some(true), Some(_)) => Status::Ok,
            (Some(false), Some(_)) => Status::Fail,
            _ => Status::Info,
        }
    }

    /// Latency in ns, for operations that returned.
    pub fn latency_ns(&self) -> Option<u64> {
        self.return_ns.map(|r| r.saturating_sub(self.call_ns))
    }

    /// The record as one JSON line, for evidence in reports.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("an op always serializes")
    }
}

impl OpKind {
    pub fn as_str(&self) -> &str {
        match self {
            OpKind::Get => "get",
            OpKind::Put => "put",
            OpKind::Cas => "cas",
            OpKind::Del => "del",
            OpKind::Append => "append",
            OpKind::Read => "read",
            OpKind::Incr => "incr",
            OpKind::Acquire => "acquire",
            OpKind::Fput => "fput",
            OpKind::Release => "release",
            OpKind::Begin => "begin",
            OpKind::Complete => "complete",
            OpKind::Abort => "abort",
            OpKind::Other(name) => name,
        }
    }
}

impl From<String> for OpKind {
    fn from(name: String) -> Self {
        match name.as_str() {
            "get" => OpKind::Get,
            "put" => OpKind::Put,
            "cas" => OpKind::Cas,
            "del" => OpKind::Del,
            "append" => OpKind::Append,
            "read" => OpKind::Read,
            "incr" => OpKind::Incr,
            "acquire" => OpKind::Acquire,
            "fput" => OpKind::Fput,
            "release" => OpKind::Release,
            "begin" => OpKind::Begin,
            "complete" => OpKind::Complete,
            "abort" => OpKind::Abort,
            _ => OpKind::Other(name),
        }
    }
}

impl From<OpKind> for String {
    fn from(kind: OpKind) -> Self {
        kind.as_str().to_string()
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads a history file and checks what every checker relies on: `return >= call`.
pub fn read_history(path: &Path) -> Result<Vec<Op>, JsonLinesError> {
    let ops: Vec<Op> = read_json_lines(path, limits::HISTORY_OPS_MAX)?;
    for (index, op) in ops.iter().enumerate() {
        if let Some(return_ns) = op.return_ns
            && return_ns < op.call_ns
        {
            return Err(JsonLinesError::Invalid {
                path: path.display().to_string(),
                line: index + 1,
                reason: format!("return {return_ns} is before call {}", op.call_ns),
            });
        }
    }
    Ok(ops)
}

/// Reads a JSON-lines file: one record a line, blank lines skipped, at most `limit` records.
/// Line numbers in errors count from 1.
pub fn read_json_lines<T: DeserializeOwned>(
    path: &Path,
    limit: usize,
) -> Result<Vec<T>, JsonLinesError> {
    let name = path.display().to_string();
    let io = |source| JsonLinesError::Io {
        path: name.clone(),
        source,
    };
    let reader = BufReader::new(File::open(path).map_err(io)?);
    let mut records = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        if records.len() == limit {
            return Err(JsonLinesError::TooLarge {
                path: name.clone(),
                limit,
            });
        }
        let record = serde_json::from_str(&line).map_err(|source| JsonLinesError::Parse {
            path: name.clone(),
            line: index + 1,
            source,
        })?;
        records.push(record);
    }
    Ok(records)
}

/// Writes records as JSON lines, replacing the file.
pub fn write_json_lines<T: Serialize>(path: &Path, records: &[T]) -> Result<(), JsonLinesError> {
    let io = |source| JsonLinesError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut writer = BufWriter::new(File::create(path).map_err(io)?);
    for record in records {
        serde_json::to_writer(&mut writer, record).map_err(|source| JsonLinesError::Io {
            path: path.display().to_string(),
            source: source.into(),
        })?;
        writer.write_all(b"\n").map_err(io)?;
    }
    writer.flush().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, status: Status, round_trip: &str) {
        let op: Op = serde_json::from_str(line).unwrap();
        assert_eq!(op.status(), status, "{line}");
        assert_eq!(op.to_line(), round_trip, "{line}");
    }

    #[test]
    fn records_parse_and_write_back_in_the_design_format() {
        let full = r#"{"client":3,"op":"get","key":"k17","value":null,"expect":null,"ok":true,"output":"v42","call":10,"return":20}"#;
        check(full, Status::Ok, full);
        check(
            r#"{"client":1,"op":"put","key":"k","value":"v","ok":false,"call":1,"return":2}"#,
            Status::Fail,
            r#"{"client":1,"op":"put","key":"k","value":"v","expect":null,"ok":false,"output":null,"call":1,"return":2}"#,
        );
        check(
            r#"{"client":1,"op":"put","key":"k","value":"v","ok":true,"call":1,"return":null}"#,
            Status::Info,
            r#"{"client":1,"op":"put","key":"k","value":"v","expect":null,"ok":true,"output":null,"call":1,"return":null}"#,
        );
        check(
            r#"{"client":1,"op":"lock","key":"l","ok":null,"call":1,"return":5,"token":7}"#,
            Status::Info,
            r#"{"client":1,"op":"lock","key":"l","value":null,"expect":null,"ok":null,"output":null,"call":1,"return":5,"token":7}"#,
        );
    }
}
