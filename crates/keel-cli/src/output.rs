//! What the client commands print and which exit code they end with, as pure functions of
//! their results. Knows nothing of the network or of clap.

use keel_client::{DeleteResult, GetResult, IncrementResult, PutResult};
use keel_proto::v1;
use keel_types::{ConditionFailed, Event, EventKind, KeyValue, KvError, validate::show_key};
use serde_json::{Value, json};

use crate::duration;

pub mod backup;
pub mod cluster;
pub mod idem;
pub mod lock;

/// Exit codes of the `keel` binary.
pub mod code {
    pub const OK: u8 = 0;
    /// The request failed on the state it found: `get` found no key, `cas` found its
    /// condition false, `incr` found no counter or would overflow, a fenced write found its
    /// lock taken over, `lock acquire` found the lock held, a renew or release found the
    /// token not holding it, `idem complete`/`abort` found the record not owned, `idem get`
    /// found no record (with `--raw`, no result yet), `cluster split` found the key starting
    /// a range already (or the range changed).
    pub const NOT_FOUND_OR_FAILED: u8 = 1;
    /// Bad usage or an argument refused, by the cluster or before anything is sent (a value
    /// or result on stdin over its limit, an unreadable stdin).
    pub const USAGE: u8 = 2;
    /// Unavailable, overloaded, timed out, outcome unknown (also a request id that expired
    /// while being retried: it may have been applied once), or a node stopped.
    pub const UNAVAILABLE: u8 = 3;
    /// Refused for the caller's token: none or an unknown one, a call it may not make, or
    /// one of its tenant's quotas reached.
    pub const NOT_ALLOWED: u8 = 4;
    /// `keel serve` only: the node's data failed its checks when the node started (a
    /// damaged store file, or the snapshot an unfinished install needs). It refuses to serve
    /// from it; restarting will not help: wipe the data dir and add the node back with a
    /// new id.
    pub const DATA_DAMAGED: u8 = 5;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// How a text answer shows a stored value or result: as a line for a person, or as its bytes
/// exactly (no newline, no state word) for a file, a pipe or `--raw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueForm {
    Line,
    Exact,
}

/// `keel get`'s form: exact with `--raw` or when stdout is not a terminal, so that
/// `keel get KEY > FILE` gives back the stored bytes.
pub fn value_form(raw: bool, stdout_is_terminal: bool) -> ValueForm {
    if raw || !stdout_is_terminal {
        ValueForm::Exact
    } else {
        ValueForm::Line
    }
}

/// What one command prints and how it exits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub stdout: Vec<u8>,
    /// One line (or empty); printed to stderr.
    pub stderr: String,
    pub code: u8,
}

impl Report {
    fn ok(stdout: Vec<u8>) -> Report {
        Report {
            stdout,
            ..Report::default()
        }
    }
}

pub fn exit_code(error: &KvError) -> u8 {
    match error {
        KvError::ConditionFailed(_)
        | KvError::NotACounter { .. }
        | KvError::Overflow { .. }
        | KvError::FencedOut { .. }
        | KvError::LockNotHeld { .. }
        | KvError::RecordNotOwned { .. }
        | KvError::EpochMismatch { .. }
        | KvError::FutureRevision { .. }
        | KvError::Compacted { .. }
        | KvError::LeaseNotFound { .. } => code::NOT_FOUND_OR_FAILED,
        KvError::InvalidArgument { .. } => code::USAGE,
        // The client retries it through a refreshed range table; seen here only when that
        // ran out of attempts.
        KvError::KeyOutOfRange { .. }
        | KvError::NotLeader { .. }
        | KvError::Unavailable { .. }
        | KvError::Overloaded { .. }
        | KvError::Timeout { .. }
        | KvError::OutcomeUnknown { .. }
        | KvError::RequestIdExpired { .. }
        | KvError::Fatal { .. } => code::UNAVAILABLE,
        KvError::Unauthenticated { .. }
        | KvError::PermissionDenied { .. }
        | KvError::QuotaExceeded { .. } => code::NOT_ALLOWED,
    }
}

/// An error as one stderr line (and, for a failed condition in json mode, the current state
/// on stdout).
pub fn error(error: &KvError, output: Output) -> Report {
    let (stdout, stderr) = match error {
        KvError::ConditionFailed(failed) => (
            condition_failed_json(failed, output),
            condition_failed_line(failed),
        ),
        error => (Vec::new(), format!("error: {error}")),
    };
    Report {
        stdout,
        stderr,
        code: exit_code(error),
    }
}

/// A read: the value alone in text, as `form` says (the remaining TTL, if any, on stderr),
/// or one JSON object.
pub fn get(key: &[u8], result: &GetResult, output: Output, form: ValueForm) -> Report {
    let ttl_ms = result
        .ttl_remaining
        .map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
    let mut report = match (&result.kv, output) {
        (Some(kv), Output::Text) => Report {
            stderr: ttl_ms.map_or_else(String::new, |ms| {
                format!("key {} expires in {}", show_key(key), duration::show_ms(ms))
            }),
            ..Report::ok(match form {
                ValueForm::Line => line(&kv.value),
                ValueForm::Exact => kv.value.clone(),
            })
        },
        (None, Output::Text) => Report::default(),
        (kv, Output::Json) => {
            let mut value = json!({
                "key": bytes(key),
                "found": kv.is_some(),
                "revision": result.revision,
                "served_by": result.served_by,
            });
            if let Some(kv) = kv {
                value["value"] = bytes(&kv.value);
                value["create_revision"] = json!(kv.create_revision);
                value["mod_revision"] = json!(kv.mod_revision);
                value["version"] = json!(kv.version);
                value["ttl_remaining_ms"] = json!(ttl_ms);
            }
            Report::ok(json_line(&value))
        }
    };
    if result.kv.is_none() {
        report.stderr = format!("key {} not found", show_key(key));
        report.code = code::NOT_FOUND_OR_FAILED;
    }
    report
}

/// A put or a successful cas.
pub fn put(result: &PutResult, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => line(format!("OK (revision {})", result.revision).as_bytes()),
        Output::Json => json_line(&json!({ "succeeded": true, "revision": result.revision })),
    })
}

/// An increment: the new value alone in text.
pub fn increment(key: &[u8], result: &IncrementResult, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => line(result.value.to_string().as_bytes()),
        Output::Json => json_line(&json!({
            "key": bytes(key),
            "value": result.value,
            "revision": result.revision,
        })),
    })
}

pub fn delete(key: &[u8], result: &DeleteResult, output: Output) -> Report {
    Report::ok(match output {
        Output::Text if result.deleted => {
            line(format!("deleted (revision {})", result.revision).as_bytes())
        }
        Output::Text => line(format!("key {} was absent", show_key(key)).as_bytes()),
        Output::Json => {
            json_line(&json!({ "deleted": result.deleted, "revision": result.revision }))
        }
    })
}

/// Rows of a scan page: `key<TAB>value` lines (raw bytes) or one JSON object per line.
pub fn scan_rows(kvs: &[KeyValue], output: Output) -> Vec<u8> {
    let mut out = Vec::new();
    for kv in kvs {
        match output {
            Output::Text => {
                out.extend_from_slice(&kv.key);
                out.push(b'\t');
                out.extend_from_slice(&kv.value);
                out.push(b'\n');
            }
            Output::Json => out.extend(json_line(&kv_json(kv))),
        }
    }
    out
}

/// `history` events: `revision<TAB>put<TAB>value` or `revision<TAB>delete` lines, or one
/// JSON object per event (`kind`, the state after and the state before as `prev`).
pub fn history_rows(events: &[Event], output: Output) -> Vec<u8> {
    event_rows(events, output, (false, false))
}

/// `watch`: as `history_rows`, with each text line naming its key after the kind.
/// Watched events: as history rows, with each event's key, and with the value before when
/// `prev_kv` (text; JSON always has `prev`).
pub fn watch_rows(events: &[Event], output: Output, prev_kv: bool) -> Vec<u8> {
    event_rows(events, output, (true, prev_kv))
}

fn event_rows(events: &[Event], output: Output, (with_key, with_prev): (bool, bool)) -> Vec<u8> {
    let mut out = Vec::new();
    for event in events {
        if let Some(line) = reclaim_row(event, output) {
            out.extend(line);
            continue;
        }
        let prev = event.before.as_ref().filter(|_| with_prev);
        let mut text_line = |kind: &str, value: Option<&[u8]>| {
            out.extend_from_slice(format!("{}\t{kind}", event.revision).as_bytes());
            if with_key {
                out.push(b'\t');
                out.extend_from_slice(&event.key);
            }
            for value in value.into_iter().chain(prev.map(|kv| kv.value.as_slice())) {
                out.push(b'\t');
                out.extend_from_slice(value);
            }
            out.push(b'\n');
        };
        match (output, &event.after) {
            (Output::Text, Some(after)) => text_line("put", Some(&after.value)),
            (Output::Text, None) => text_line("delete", None),
            (Output::Json, after) => {
                let state = |kv: &Option<KeyValue>| {
                    kv.as_ref().map_or(Value::Null, |kv| {
                        let mut value = kv_json(kv);
                        value["expires_at_ms"] = json!(kv.expires_at_ms);
                        value
                    })
                };
                let value = json!({
                    "revision": event.revision,
                    "key": bytes(&event.key),
                    "kind": if after.is_some() { "put" } else { "delete" },
                    "kv": state(after),
                    "prev": state(&event.before),
                    "clock_ms": event.clock_ms,
                });
                out.extend(json_line(&value));
            }
        }
    }
    out
}

/// The row of a reclaim (`None` for a key's event): `revision<TAB>lock-reclaimed<TAB>name
/// <TAB>token` or `revision<TAB>record-reclaimed<TAB>scope<TAB>id<TAB>token`, or a JSON
/// object with the kind, the key, the token and (for a record) its scope and id.
fn reclaim_row(event: &Event, output: Output) -> Option<Vec<u8>> {
    let (kind, token, parts) = match event.kind {
        EventKind::Key => return None,
        EventKind::LockReclaimed { token } => ("lock-reclaimed", token, vec![&event.key[..]]),
        EventKind::RecordReclaimed { token } => {
            // scope, a 0 byte, id (a key without one is all scope).
            let zero = event.key.iter().position(|&byte| byte == 0);
            let (scope, id) = zero.map_or((&event.key[..], &[][..]), |at| {
                (&event.key[..at], &event.key[at + 1..])
            });
            ("record-reclaimed", token, vec![scope, id])
        }
    };
    Some(match output {
        Output::Text => {
            let mut line = format!("{}\t{kind}", event.revision).into_bytes();
            for part in parts {
                line.push(b'\t');
                line.extend_from_slice(part);
            }
            line.extend_from_slice(format!("\t{token}\n").as_bytes());
            line
        }
        Output::Json => {
            let mut value = json!({
                "revision": event.revision,
                "key": bytes(&event.key),
                "kind": kind,
                "token": token,
                "clock_ms": event.clock_ms,
            });
            if let [scope, id] = parts[..] {
                value["scope"] = bytes(scope);
                value["id"] = bytes(id);
            }
            json_line(&value)
        }
    })
}

/// The answer of one endpoint to `cluster status`.
pub type StatusRow = (String, Result<v1::StatusResponse, KvError>);

/// `cluster status`: a table (one row per node and range) or a JSON array; exit 3 when no
/// endpoint answered.
pub fn status(rows: &[StatusRow], output: Output) -> Report {
    let stdout = match output {
        Output::Text => status_table(rows),
        Output::Json => json_line(&Value::Array(rows.iter().map(status_json).collect())),
    };
    let answered = rows.iter().any(|(_, answer)| answer.is_ok());
    let mut report = Report::ok(stdout);
    if !answered {
        report.stderr = "error: no endpoint answered".to_string();
        report.code = code::UNAVAILABLE;
    }
    report
}

fn status_table(rows: &[StatusRow]) -> Vec<u8> {
    let header = [
        "node", "addr", "healthy", "ready", "role", "leader", "term", "commit", "applied",
        "revision",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    let mut notes = String::new();
    for (endpoint, answer) in rows {
        match answer {
            Ok(status) => {
                table.extend(status_cells(status));
                if ready_cell(status) == "no" {
                    notes.push_str(&format!(
                        "{endpoint}: not ready: {}\n",
                        status.ready_message
                    ));
                }
                for alarm in &status.consistency_alarms {
                    notes.push_str(&format!(
                        "{endpoint}: consistency alarm: range {} {} at index {} (differing: {:?})\n",
                        alarm.range_id, alarm.verdict, alarm.index, alarm.divergent
                    ));
                }
            }
            Err(error) => {
                table.push(unreachable_cells(endpoint));
                notes.push_str(&format!("{endpoint}: {error}\n"));
            }
        }
    }
    (align(&table) + &notes).into_bytes()
}

fn status_cells(status: &v1::StatusResponse) -> Vec<Vec<String>> {
    let node = |range: Option<&v1::RangeStatus>| {
        let leader = range
            .and_then(|r| r.leader_id)
            .map_or("-".to_string(), |id| id.to_string());
        let number =
            |f: fn(&v1::RangeStatus) -> u64| range.map_or("-".to_string(), |r| f(r).to_string());
        vec![
            status.node_id.to_string(),
            status.addr.clone(),
            if status.healthy { "yes" } else { "no" }.to_string(),
            ready_cell(status).to_string(),
            range.map_or("-".to_string(), |r| r.role.clone()),
            leader,
            number(|r| r.term),
            number(|r| r.commit_index),
            number(|r| r.applied_index),
            number(|r| r.revision),
        ]
    };
    if status.ranges.is_empty() {
        return vec![node(None)];
    }
    status
        .ranges
        .iter()
        .map(|range| node(Some(range)))
        .collect()
}

/// Whether the node says it is ready; `?` for a node of a release before `ready` (never
/// ready without a reason).
fn ready_cell(status: &v1::StatusResponse) -> &'static str {
    match (status.ready, status.ready_message.is_empty()) {
        (true, _) => "yes",
        (false, false) => "no",
        (false, true) => "?",
    }
}

fn unreachable_cells(endpoint: &str) -> Vec<String> {
    let mut cells = vec![
        "?".to_string(),
        endpoint.to_string(),
        "unreachable".to_string(),
    ];
    cells.extend(std::iter::repeat_n("-".to_string(), 7));
    cells
}

/// Columns padded to their widest cell; the last column is not padded.
fn align(table: &[Vec<String>]) -> String {
    let columns = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            table
                .iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in table {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c + 1 == row.len() {
                    cell.clone()
                } else {
                    format!("{cell:<width$}", width = widths[c])
                }
            })
            .collect();
        text.push_str(&cells.join("  "));
        text.push('\n');
    }
    text
}

fn status_json((endpoint, answer): &StatusRow) -> Value {
    let status = match answer {
        Ok(status) => status,
        Err(error) => return json!({ "endpoint": endpoint, "error": error.to_string() }),
    };
    let ranges: Vec<Value> = status
        .ranges
        .iter()
        .map(|r| {
            json!({
                "range_id": r.range_id, "role": r.role, "leader": r.leader_id, "term": r.term,
                "commit": r.commit_index, "applied": r.applied_index,
                "last_log_index": r.last_log_index, "revision": r.revision,
                "quiesced": r.quiesced,
                "members": r.members.iter().map(|m| json!({"node_id": m.node_id, "addr": m.addr, "voter": m.voter})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "endpoint": endpoint, "node_id": status.node_id, "addr": status.addr,
        "healthy": status.healthy, "message": status.message, "ready": status.ready,
        "ready_message": status.ready_message, "version": status.version,
        "ranges": ranges,
        "consistency_alarms": status.consistency_alarms.iter().map(cluster::check_json).collect::<Vec<_>>(),
    })
}

fn condition_failed_line(failed: &ConditionFailed) -> String {
    let key = show_key(&failed.key);
    match &failed.current {
        Some(kv) => format!(
            "condition failed: key {key} has value {} at revision {}",
            show_key(&kv.value),
            kv.mod_revision
        ),
        None => format!(
            "condition failed: key {key} is absent (range revision {})",
            failed.revision
        ),
    }
}

fn condition_failed_json(failed: &ConditionFailed, output: Output) -> Vec<u8> {
    if output == Output::Text {
        return Vec::new();
    }
    json_line(&json!({
        "succeeded": false,
        "key": bytes(&failed.key),
        "current": failed.current.as_ref().map(kv_json),
        "revision": failed.revision,
    }))
}

fn kv_json(kv: &KeyValue) -> Value {
    json!({
        "key": bytes(&kv.key),
        "value": bytes(&kv.value),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
    })
}

/// Bytes in JSON: a string when they are UTF-8, else `{"hex": "..."}`.
pub fn bytes(data: &[u8]) -> Value {
    match std::str::from_utf8(data) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => {
            let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
            json!({ "hex": hex })
        }
    }
}

fn json_line(value: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(value).expect("a serde_json::Value always serializes");
    out.push(b'\n');
    out
}

fn line(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests;
